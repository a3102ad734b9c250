"""Tower trainer throughput, side by side in one run (not a test: run it by hand).

    .venv/bin/python bench/towers_bench.py [--optimizer adam] [--rounds 40] [--steps 5]

1. examples/sec of the towers (N = 1, 2, 4) against a plain single-device `tf.function`
   step and against `tf.distribute.MirroredStrategy` on the same devices, model (the `cnn`
   of the spec), optimizer (the spec's default, Adam) and global batch, each fed by a
   tf.data iterator. Also the towers with their update applied through Keras instead of
   TensorFlow's fused kernels, to show what that part is worth.
   Every round runs each configuration for a few steps, in rotating order; a ratio is
   taken per round and the median over rounds is reported with a 95% confidence
   interval. On a shared machine the speed drifts over seconds: configurations timed in
   the same round see the same drift, and it cancels out of their ratio.
2. The cost of the default monitoring, two ways:
   a. each summary kind's cost per call, timed in this process through the controller's
      own methods on a 2-tower `cnn` (first, before part 1 builds its configurations, so
      that the process is in a worker's state), and the share of a default 1000-step job
      it adds up to (stable: it does not depend on how busy the machine is), with a step's
      time after the device trace beside the one before it. Twice: all of the work
      (what this CPU host pays, its cores busy training), and the loop's share alone
      (histograms and images hand their work to a background thread, and a trace the
      profiler's stop: what a GPU host, whose cores wait on the device, pays);
   b. examples/sec of whole workers (`python -m trainer run`, 1000 steps) with the default
      summaries against all summaries off, interleaved, median of the runs (noisy: on
      2 shared cores, 2-second windows of one run vary by +-15%); with `--attribute`, also
      the defaults less one kind each, to say what each costs a whole worker. Beside each,
      the CPU time its training loop's thread spent a step (`loop_cpu_worker.py`), and
      what the summaries add to it: what they cost a host whose loop bounds it (a short
      step on a GPU; `--worker-model mlp --batch 32` is a stand-in on a CPU). Then, per
      configuration, where its loop's wall-clock time went within each run (each summary
      call, the trace's start and end, the reports, and the steps by kind): what each kind
      costs, from one run, where the rates of runs spread by more than a kind costs.

On a CPU host the towers run on logical CPU devices split from the one CPU; with a GPU,
`--split-gpu-mb M` splits the first GPU into N logical GPUs of M MiB each.
Targets: towers(N) / Mirrored(N) >= 1.05; towers(1) / plain >= 0.97; monitoring >= 0.97.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOWERS = (1, 2, 4)

if TYPE_CHECKING:
    from trainer.devices import Devices
    from trainer.spec import SummariesSpec


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--optimizer",
        choices=("sgd", "momentum", "adam"),
        default="adam",
        help="default: the spec's",
    )
    p.add_argument("--steps", type=int, default=5, help="steps per configuration per round")
    p.add_argument(
        "--rounds", type=int, default=40, help="rounds; every configuration runs once per round"
    )
    p.add_argument("--batch", type=int, default=128, help="global batch")
    add_device_arguments(p)
    p.add_argument(
        "--worker-steps", type=int, default=1000, help="steps of each whole-worker run (0 skips it)"
    )
    p.add_argument(
        "--worker-repeats", type=int, default=5, help="whole-worker runs per configuration"
    )
    p.add_argument(
        "--worker-model",
        choices=("cnn", "mlp"),
        default="cnn",
        help="the whole workers' model: mlp, at a small --batch, is a stand-in on a CPU for a "
        "host whose loop bounds it (a short step on a GPU)",
    )
    p.add_argument("--skip-steps", action="store_true", help="only the monitoring comparison")
    p.add_argument(
        "--attribute",
        action="store_true",
        help="whole workers also with the defaults less one kind (the trace; scalars; "
        "histograms and images), to say what each costs",
    )
    return p.parse_args()


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """`--split-gpu-mb` and `--parameter-device`: where a bench's towers and variables go."""
    p.add_argument(
        "--split-gpu-mb", type=int, default=None, help="split GPU 0 into logical GPUs of this size"
    )
    p.add_argument(
        "--parameter-device",
        choices=("cpu", "gpu0"),
        default="cpu",
        help="where the towers keep the variables (the spec's parameter_device)",
    )


def median_interval(
    values: list[float], confidence: float = 0.95
) -> tuple[float, float | None, float | None]:
    """The median and a distribution-free confidence interval for it (order statistics).

    The interval is [x_(j), x_(n+1-j)] for the largest j with P(Binomial(n, 1/2) < j) <=
    (1 - confidence) / 2: it assumes nothing about the shape of the noise. Below 6 values
    no such j exists for 95% (even the whole range covers the median less often), and the
    bounds are None.
    """
    xs, n = sorted(values), len(values)
    tail, j, below = (1 - confidence) / 2, 0, 0.0
    while j < n // 2 and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return statistics.median(xs), None, None
    return statistics.median(xs), xs[j - 1], xs[n - j]


def set_up_devices(args: argparse.Namespace) -> Devices:
    """The towers' devices for every configuration (the most towers any takes); says which
    GPU they are on."""
    import tensorflow as tf

    from trainer.devices import setup_devices

    devices = setup_devices(max(TOWERS), args.parameter_device, split_gpu_mb=args.split_gpu_mb)
    if devices.kind == "GPU":
        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        )
        print(
            f"{details.get('device_name')} (compute capability {details.get('compute_capability')}); "
            f"towers on {', '.join(devices.towers)}; parameters on {devices.parameter}; "
            f"TensorFlow {tf.__version__}\n"
        )
    return devices


def step_benchmarks(
    args: argparse.Namespace, devices: Devices
) -> tuple[dict[str, list[float]], int]:
    """Seconds per round of each configuration; and the examples each round trains."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.models import build_model
    from trainer.optim import make_optimizer
    from trainer.spec import ModelSpec, OptimizerSpec
    from trainer.towers import TowerTrainer

    kind = devices.kind
    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.int32)
    # Every configuration pulls its batches from a tf.data iterator, as a training loop
    # does: the same batch again and again, so data cost is the same for all of them.
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(tf.data.AUTOTUNE)

    def model() -> keras.Model:
        keras.utils.set_random_seed(0)
        return build_model(ModelSpec(name="cnn"), (28, 28, 1), 10).model

    def optimizer() -> keras.optimizers.Optimizer:
        return make_optimizer(OptimizerSpec(name=args.optimizer, learning_rate=0.001))

    def plain_step():
        with tf.device(f"/{kind}:0"):
            net, opt = model(), optimizer()
            opt.build(net.trainable_variables)
        batches = iter(dataset)

        @tf.function
        def step(images, labels):
            with tf.GradientTape() as tape:
                logits = net(images, training=True)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
                )
            opt.apply_gradients(
                zip(
                    tape.gradient(loss, net.trainable_variables),
                    net.trainable_variables,
                    strict=True,
                )
            )
            return loss

        return lambda: step(*next(batches))

    def tower_step(n: int, fused_updates: bool = True):
        with tf.device(devices.parameter):
            trainer = TowerTrainer(
                model=model(), optimizer=optimizer(), tower_devices=devices.towers[:n],
                parameter_device=devices.parameter, fused_updates=fused_updates,
            )  # fmt: skip
        batches = iter(dataset)
        return lambda: trainer.train_step(*next(batches))["loss"]

    def mirrored_step(n: int):
        # On whole GPUs Mirrored keeps its default all-reduce (NCCL). On logical CPUs its
        # default collectives clash between strategies of different sizes in one process,
        # and NCCL refuses logical GPUs split from one card (one physical GPU twice in a
        # communicator): there it reduces to one device, the shape of our towers'
        # parameter-device average.
        one_device = kind == "CPU" or args.split_gpu_mb
        cross_device_ops = tf.distribute.ReductionToOneDevice() if one_device else None
        strategy = tf.distribute.MirroredStrategy(
            devices=list(devices.towers[:n]), cross_device_ops=cross_device_ops
        )
        with strategy.scope():
            net, opt = model(), optimizer()
            opt.build(net.trainable_variables)  # slots mirrored now, not lazily inside the step
        batches = iter(strategy.experimental_distribute_dataset(dataset))

        def replica(images, labels):
            with tf.GradientTape() as tape:
                logits = net(images, training=True)
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=labels, logits=logits
                )
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
            opt.apply_gradients(
                zip(
                    tape.gradient(loss, net.trainable_variables),
                    net.trainable_variables,
                    strict=True,
                )
            )
            return loss

        @tf.function
        def step(batch):
            return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

        return lambda: step(next(batches))

    configs = {"plain": plain_step(), "towers(1), Keras update": tower_step(1, fused_updates=False)}
    for n in TOWERS:
        configs[f"towers({n})"] = tower_step(n)
        configs[f"mirrored({n})"] = mirrored_step(n)
    for fn in configs.values():  # trace and warm up everything before timing anything
        for _ in range(3):
            fn().numpy()

    seconds: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(args.rounds):
        # Rotate the order so that no configuration always follows the same one.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = configs[name]
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = fn()
            loss.numpy()  # wait for the last step
            seconds[name].append(time.perf_counter() - start)
    return seconds, args.batch * args.steps


def print_step_benchmarks(seconds: dict[str, list[float]], examples: int) -> None:
    print(f"{'configuration':<26}{'examples/sec (median round)':>28}")
    for name, s in seconds.items():
        print(f"{name:<26}{examples / statistics.median(s):>28.1f}")

    def ratio(faster: str, than: str, target: float) -> None:
        # Per-round ratios: both ran within the same few hundred milliseconds, so a slow
        # spell of the machine slows both and cancels out of their ratio.
        rounds = [t / f for f, t in zip(seconds[faster], seconds[than], strict=True)]
        median, low, high = median_interval(rounds)
        label = f"{faster} / {than}"
        if low is None or high is None:
            print(
                f"{label:<34}= {median:.3f}  (too few rounds for a 95% interval; target >= {target}: not judged)"
            )
            return
        verdict = "met" if low >= target else "not met" if high < target else "within the interval"
        print(
            f"{label:<34}= {median:.3f}  (95% CI {low:.3f}-{high:.3f}; target >= {target}: {verdict})"
        )

    print(f"\nmedian of per-round ratios over {len(next(iter(seconds.values())))} rounds")
    ratio("towers(1)", "plain", 0.97)
    for n in TOWERS:
        ratio(f"towers({n})", f"mirrored({n})", 1.05)
    ratio("towers(1)", "towers(1), Keras update", 1.0)
    ratio("towers(1), Keras update", "plain", 0.97)


def monitoring_costs(args: argparse.Namespace, devices: Devices) -> None:
    """Per-call cost of each summary kind, through the controller's own methods, on a
    2-tower trainer placed as a worker places it."""
    import tempfile
    import threading

    import numpy as np
    import tensorflow as tf

    from trainer.checkpoints import Checkpointer
    from trainer.controller import Controller
    from trainer.models import build_model
    from trainer.optim import make_optimizer
    from trainer.profiling import TraceCapture
    from trainer.rundir import ProgressWriter, RunDir
    from trainer.spec import JobSpec, ModelSpec, OptimizerSpec, SummariesSpec
    from trainer.summaries import SummaryManager
    from trainer.towers import TowerTrainer

    # No trace steps: the trace is timed below, and a job of 0 steps would warn of them.
    spec = JobSpec.model_validate(
        {
            "data": {"format": "synthetic"},
            "towers": 2,
            "batch_size": args.batch,
            "summaries": {"trace_steps": []},
        }
    )
    rng = np.random.default_rng(1)
    x = tf.constant(rng.random((args.batch, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, args.batch).astype(np.int32))
    with tf.device(devices.parameter):
        trainer = TowerTrainer(
            model=build_model(ModelSpec(name="cnn"), (28, 28, 1), 10).model,
            optimizer=make_optimizer(spec.optimizer if spec.optimizer else OptimizerSpec()),
            tower_devices=devices.towers[:2],
            parameter_device=devices.parameter,
        )
    tmp = Path(tempfile.mkdtemp())
    summaries = SummaryManager(tmp / "tb")
    controller = Controller(
        spec=spec, trainer=trainer, train_batches=iter(()), eval_data=None, total_steps=0,
        rundir=RunDir(tmp), progress=ProgressWriter(tmp / "progress.jsonl"), summaries=summaries,
        checkpointer=cast(Checkpointer, None),  # the summary methods timed here never checkpoint
        stop=threading.Event(),
    )  # fmt: skip

    def seconds(fn, repeats: int = 1) -> float:
        """Best of `repeats` timings of fn() (interference only ever adds time)."""
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best

    def handed_over(fn, repeats: int = 1) -> tuple[float, float]:
        """(on the loop, in all): a call that hands its work to the summaries' background
        thread, timed to its return and to the end of that work (best of `repeats`)."""
        loop = whole = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            returned = time.perf_counter()
            summaries.flush()
            loop = min(loop, returned - start)
            whole = min(whole, time.perf_counter() - start)
        return loop, whole

    def steps(n: int, **kw) -> None:
        for _ in range(n):
            out = trainer.train_step(x, y, **kw)
            float(out["loss"])

    steps(5)
    step = seconds(lambda: steps(10), repeats=8) / 10
    out = trainer.train_step(x, y, with_scalars=True)

    def scalars_step() -> None:
        # A scalars step as a job runs it: the step computes the gradient norm too, and
        # the loop reads its loss, then writes its scalars.
        launched = trainer.train_step(x, y, with_scalars=True)
        float(launched["loss"])
        controller._write_scalars(10, launched, step, args.batch / step)

    scalars_step()

    # What it adds to a step: the median of 60 paired differences, each pair's two steps
    # back to back (in alternating order) so that both see the same spell of the machine.
    # The difference of the best of 20 of each moved by 0.5 ms between runs of a 7 ms step
    # on this CPU.
    def added(fn) -> float:
        differences = []
        for i in range(60):
            if i % 2:
                plain = seconds(lambda: steps(1))
                with_it = seconds(fn)
            else:
                with_it = seconds(fn)
                plain = seconds(lambda: steps(1))
            differences.append(with_it - plain)
        return max(0.0, statistics.median(differences))

    scalars = added(scalars_step)
    # Its parts: the step's own (the gradient norm and the pack, on the devices), and the
    # rest, the loop reading the values back and writing them.
    scalars_in_step = min(scalars, added(lambda: steps(1, with_scalars=True)))
    graph = seconds(
        lambda: summaries.graph("train", trainer.train_function.get_concrete_function().graph)
    )
    # Each kind's cost (on the loop, in all); the first images encode their first PNGs.
    costs: dict[str, tuple[float, float]] = {
        "scalars (+ grad norm)": (scalars, scalars),
        "histograms": handed_over(lambda: controller._write_histograms(500, out["grads"], x), 3),
        "images, first call": handed_over(lambda: controller._write_images(500, x)),
        "images": handed_over(lambda: controller._write_images(500, x), 3),
        "graph (once)": (graph, graph),
    }
    capture = TraceCapture(tmp / "tb")
    from trainer.profiling import STEP_MARKER, tower_times_ms

    # The trace's parts: starting the profiler, the 3 steps it adds to, stopping it (which
    # collects and writes the trace), and reading the towers' times from the file.
    marks = [time.perf_counter()]
    capture.start()
    marks.append(time.perf_counter())
    for number in range(1, 4):  # marked as the loop marks them: the times are of these
        with tf.profiler.experimental.Trace(STEP_MARKER, step_num=number, _r=1):
            steps(1)
    marks.append(time.perf_counter())
    path = capture.stop()
    marks.append(time.perf_counter())
    if path is None:
        raise RuntimeError(
            "Expected the profiler to write a trace. Received: none (see the log above)"
        )
    tower_times_ms(path, 2, range(1, 4))
    marks.append(time.perf_counter())
    start_s, steps_s, stop_s, parse_s = (b - a for a, b in itertools.pairwise(marks))
    # A profiler that left its hooks in (CUPTI not finalized) would slow every later step,
    # which the trace's own cost above does not show.
    step_after = seconds(lambda: steps(10), repeats=8) / 10
    extra_s = max(0.0, steps_s - 3 * step)  # what tracing added to the 3 steps
    trace = start_s + extra_s + stop_s + parse_s
    # A job's loop hands the stop and the reading to a thread (`TraceCapture.end`) and goes
    # on. The stop releases the GIL; the reading is Python and holds it, which a loop bound
    # by its launches waits for: the loop's share counts it, and not the stop.
    costs["trace of 3 steps (once)"] = (start_s + extra_s + parse_s, trace)
    summaries.close()
    # The job spec's default cadences, trace steps included (the `spec` above has none, so
    # that the controller's calls here start no trace).
    s = SummariesSpec()
    job_steps = 1000

    def per_job(which: int) -> float:
        return job_seconds({name: pair[which] for name, pair in costs.items()}, s, job_steps)

    print(
        f"\nmonitoring cost per call (cnn on 2 towers, batch {args.batch}; one step = {step * 1000:.1f} ms)"
    )
    print(f"  {'':<26}{'on the loop':>12}{'in all':>11}")
    for name, (loop, whole) in costs.items():
        print(f"  {name:<26}{loop * 1000:>9.2f} ms{whole * 1000:>8.2f} ms")
    print(
        f"  (the scalars: the step's gradient norm and pack {scalars_in_step * 1000:.2f} ms, "
        f"reading and writing them {(scalars - scalars_in_step) * 1000:.2f} ms)"
    )
    print(
        f"  (the trace: profiler start {start_s * 1000:.1f} ms, the steps "
        f"{extra_s * 1000:.1f} ms over 3 plain ones, stop and write "
        f"{stop_s * 1000:.1f} ms, reading the towers' times {parse_s * 1000:.1f} ms; "
        f"a step after it {step_after * 1000:.1f} ms)"
    )
    for which, meaning in (
        (1, "all of the work, as a host whose cores all train (this one) pays it"),
        (0, "the loop's share, as a GPU host whose cores wait on the device pays it"),
    ):
        share = per_job(which) / (job_steps * step)
        print(
            f"default cadences over a {job_steps}-step job, {meaning}:\n"
            f"  {per_job(which):.3f} s of {job_steps * step:.3f} s = {share * 100:.1f}%, "
            f"throughput ratio {1 / (1 + share):.3f}   (target >= 0.97)"
        )


def job_seconds(cost: dict[str, float], s: SummariesSpec, job_steps: int) -> float:
    """What each kind's cost a call adds up to over a job of `job_steps` at the cadences
    of `s`: scalars, histograms and images every so many steps and at the job's first and
    last (the first images call apart), the graph once and one trace; a kind turned off
    costs nothing."""

    def calls(every: int) -> int:
        if not every:
            return 0
        return len({1, job_steps}.union(range(every, job_steps + 1, every)))

    images = calls(s.images_every)
    return (
        cost["scalars (+ grad norm)"] * calls(s.scalars_every)
        + cost["histograms"] * calls(s.histograms_every)
        + (cost["images, first call"] + cost["images"] * (images - 1) if images else 0.0)
        + (cost["graph (once)"] if s.graph else 0.0)
        + (cost["trace of 3 steps (once)"] if s.trace_steps else 0.0)
    )


# One run's parts of the loop's time: name -> {"calls": n, "seconds": s} (`loop_cpu_worker.py`).
Parts = dict[str, dict[str, float]]


def whole_worker(spec: dict, job_dir: Path, env: dict[str, str]) -> tuple[float, float, Parts]:
    """A whole worker run: its examples/sec from its first progress report to its last
    step, its loop thread's CPU time a step in µs, and where the loop's wall-clock time
    went (`loop_cpu_worker.py`)."""
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "loop_cpu_worker.py"), "--job-dir", str(job_dir)],
        cwd=REPO,
        check=True,
        capture_output=True,
        env=env,
    )
    events = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    progress = [e for e in events if e["event"] == "progress"]
    first, last = progress[0], progress[-1]
    rate = (last["step"] - first["step"]) * spec["batch_size"] / (last["time"] - first["time"])
    loop = json.loads((job_dir / "loop_cpu.json").read_text())
    return rate, loop["seconds"] / loop["steps"] * 1e6, loop["parts"]


# The defaults less one kind each (`--attribute`): what a whole worker gains without it
# says what that kind costs, its time off the loop included, which the per-call sum
# cannot see (the summaries' thread taking the host from a launch-bound loop, say).
LESS_ONE_KIND = {
    "less the trace": {"trace_steps": []},
    "less scalars": {"scalars_every": 0},
    "less histograms, images": {"histograms_every": 0, "images_every": 0},
}


def worker_specs(args: argparse.Namespace) -> dict[str, dict]:
    """The whole workers' job specs by name: the default summaries, none, and with
    `--attribute` the defaults less one kind each."""
    base = {
        "name": "bench-monitoring",
        "model": {"name": args.worker_model},
        "data": {
            "format": "synthetic",
            "params": {"shape": [28, 28, 1], "classes": 10, "size": 8192},
        },
        "towers": 2,
        "parameter_device": args.parameter_device,
        "batch_size": args.batch,
        "steps": args.worker_steps,
        "eval": {"every_steps": 0, "batches": 1},
        "checkpoint": {"every_steps": 0, "every_seconds": 0, "keep": 1},
    }
    off = {
        "scalars_every": 0,
        "histograms_every": 0,
        "images_every": 0,
        "trace_steps": [],
        "graph": False,
    }
    specs = {"default summaries": base, "no summaries": {**base, "summaries": off}}
    if args.attribute:
        specs |= {
            f"defaults {name}": {**base, "summaries": less} for name, less in LESS_ONE_KIND.items()
        }
    return specs


def monitoring_benchmark(
    args: argparse.Namespace,
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[Parts]]]:
    """Per configuration, each run's (examples/sec, loop CPU µs a step), and each run's
    parts of the loop's time."""
    specs = worker_specs(args)
    names = list(specs)
    print(
        f"\nwhole workers, {args.worker_model} on 2 towers, batch {args.batch}, {args.worker_steps} steps, {args.worker_repeats} "
        f"runs of each of {len(specs)} configurations, in rotating order"
    )
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in specs}
    parts: dict[str, list[Parts]] = {name: [] for name in specs}
    env = dict(os.environ)
    if args.split_gpu_mb:  # the workers' towers on logical GPUs of the one card, as above
        from trainer.run import SPLIT_GPU_ENV

        env[SPLIT_GPU_ENV] = str(args.split_gpu_mb)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.worker_repeats):
            # Rotate which runs first, so a drift of the machine favours none.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rate, loop_us, run = whole_worker(specs[name], Path(tmp) / f"{name}-{r}", env)
                samples[name].append((rate, loop_us))
                parts[name].append(run)
                # Each run as it ends: a bench cut off by a time limit keeps what it measured.
                print(
                    f"  whole worker, {name}, run {r + 1}: {rate:.0f} examples/sec, "
                    f"loop CPU {loop_us:.1f} µs a step"
                )
    return samples, parts


def print_loop_parts(parts: dict[str, list[Parts]]) -> None:
    """Where each configuration's loop spent its wall-clock time, per part: the median
    over its runs of the ms a job and of the µs a call. Within one run, so the machine's
    drift between runs is not in it; the step kinds say what the steps themselves took
    (a scalars step reads the unread steps' losses with its own, as every tenth step of
    a job with none does). Then, for a configuration with summaries, what they added to
    its loop within each run (`added_by_monitoring`): the figure that resolves the target
    where the runs' rates spread by more than it."""
    for name, runs in parts.items():
        print(f"where the loop's time went, {name} (median of {len(runs)} runs):")
        for part in sorted({part for run in runs for part in run}):
            got = [run.get(part, {"calls": 0, "seconds": 0.0}) for run in runs]
            ms = statistics.median(p["seconds"] * 1000 for p in got)
            calls = statistics.median(p["calls"] for p in got)
            each = statistics.median(p["seconds"] / p["calls"] * 1e6 for p in got if p["calls"])
            print(f"  {part:<26}{ms:>9.1f} ms a job{calls:>8.0f} calls{each:>10.1f} µs a call")
        if name != "no summaries":
            shares = [added_by_monitoring(run) for run in runs]
            added = statistics.median(ms for ms, _ in shares)
            share, low, high = median_interval([share for _, share in shares])
            interval = (
                f"95% CI {low:.1%}-{high:.1%}"
                if low is not None
                else "too few runs for a 95% interval"
            )
            print(
                f"  adds {added:.1f} ms a job to its loop, {share:.1%} of the loop's time: "
                f"throughput ratio {1 - share:.3f}   (median of its runs, {interval}; target >= 0.97)"
            )


# Parts every configuration has, summaries or none: not the monitoring's.
_NOT_MONITORING = ("progress reported",)


def added_by_monitoring(run: Parts) -> tuple[float, float]:
    """What the summaries added to one run's loop, within the run (ms, and its share of the
    loop's time): its summary calls, and what its scalars and traced steps took over its
    other steps (the run's own, so the machine's drift between runs is not in it)."""
    other = run.get("steps, other", {"calls": 0, "seconds": 0.0})
    per_other = other["seconds"] / other["calls"] if other["calls"] else 0.0
    added = total = 0.0
    for part, got in run.items():
        total += got["seconds"]
        if part.startswith("steps, ") and part != "steps, other":
            added += got["seconds"] - got["calls"] * per_other
        elif not part.startswith("steps, ") and part not in _NOT_MONITORING:
            added += got["seconds"]
    return added * 1000, (added / total if total else 0.0)


def print_whole_workers(samples: dict[str, list[tuple[float, float]]], batch: int) -> None:
    """Each configuration's median examples/sec and loop CPU a step; each one's ratio to no
    summaries, per repeat; and what it adds to the loop's CPU a step, as a share of a step
    with none (what it costs a host whose loop is what bounds it)."""
    none = samples["no summaries"]
    none_step_us = statistics.median(batch / rate * 1e6 for rate, _ in none)
    for name, runs in samples.items():
        rates = [rate for rate, _ in runs]
        print(
            f"{name:<41}{statistics.median(rates):>10.1f} examples/sec (median; runs {', '.join(f'{r:.0f}' for r in rates)})"
        )
    for name, runs in samples.items():
        loops = [loop for _, loop in runs]
        print(
            f"{name:<41}{statistics.median(loops):>10.1f} µs of loop CPU a step (median; runs {', '.join(f'{u:.0f}' for u in loops)})"
        )
    labels = {name: "default" if name == "default summaries" else name for name in samples}
    width = max(41, *(len(f"{label} adds to the loop ") for label in labels.values()))
    for name, runs in samples.items():
        if name == "no summaries":
            continue
        label = labels[name]
        # Each repeat ran every configuration once: its ratio to that repeat's none.
        pairs = [d / n for (d, _), (n, _) in zip(runs, none, strict=True)]
        median, low, high = median_interval(pairs)
        interval = (
            f"95% CI {low:.3f}-{high:.3f}"
            if low is not None
            else "too few repeats for a 95% interval"
        )
        target = "; target >= 0.97" if name == "default summaries" else ""
        print(
            f"{label + ' / none':<{width}}= {median:.3f}   (median of per-repeat ratios, {interval}{target})"
        )
        added = [d - n for (_, d), (_, n) in zip(runs, none, strict=True)]
        median, low, high = median_interval(added)
        interval = (
            f"95% CI {low:.1f}-{high:.1f}"
            if low is not None
            else "too few repeats for a 95% interval"
        )
        print(
            f"{label + ' adds to the loop':<{width}}= {median:.1f} µs a step, {median / none_step_us:.1%} "
            f"of a step with none   (median of per-repeat differences, {interval})"
        )


def main() -> None:
    args = parse_args()
    # A line at a time, also into a pipe or file: what a run cut short had printed stays.
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    )
    print(
        f"model cnn, optimizer {args.optimizer}, global batch {args.batch}; {args.rounds} rounds of {args.steps} steps\n"
    )
    if not args.skip_steps:
        devices = set_up_devices(args)
        # The monitoring costs first, in a process that has built one trainer, as a worker
        # has. After the step configurations' eight models and strategies, the summaries'
        # thread page-faulted through every histogram (33,000 faults a call against none):
        # 101 ms a call against 27 in a worker, on this CPU, 2026-11-26.
        monitoring_costs(args, devices)
        print()
        print_step_benchmarks(*step_benchmarks(args, devices))
    if args.worker_steps:
        samples, parts = monitoring_benchmark(args)
        print_whole_workers(samples, args.batch)
        print_loop_parts(parts)


if __name__ == "__main__":
    main()
