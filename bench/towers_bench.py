"""Tower trainer throughput, side by side in one run (not a test: run it by hand).

    .venv/bin/python bench/towers_bench.py [--steps 40] [--repeats 3] [--batch 128]

1. examples/sec of the towers (N = 1, 2, 4) against a plain single-device `tf.function`
   step and against `tf.distribute.MirroredStrategy` on the same devices, model (the `cnn`
   of the spec) and global batch. Configurations are interleaved and repeated, and the
   best repeat is kept: on a shared 2-core machine interference only ever slows a run
   down, so the fastest repeat is the closest to what each configuration can do.
2. examples/sec of a whole worker (`python -m trainer run`) with the default summaries
   against all summaries off.

On a CPU host the towers run on logical CPU devices split from the one CPU; with a GPU,
`--split-gpu-mb M` splits the first GPU into N logical GPUs of M MiB each.
Targets: towers(N) / Mirrored(N) >= 1.05; towers(1) / plain >= 0.97; monitoring >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOWERS = (1, 2, 4)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--repeats", type=int, default=8, help="interleaved repeats; the best is kept")
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--split-gpu-mb", type=int, default=None, help="split GPU 0 into logical GPUs of this size")
    p.add_argument("--worker-steps", type=int, default=600, help="steps of each whole-worker run (0 skips it)")
    p.add_argument("--worker-repeats", type=int, default=3, help="whole-worker runs per configuration")
    p.add_argument("--skip-steps", action="store_true", help="only the monitoring comparison")
    return p.parse_args()


def step_benchmarks(args: argparse.Namespace) -> dict[str, float]:
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.devices import setup_devices
    from trainer.models import build_model
    from trainer.optim import make_optimizer
    from trainer.spec import ModelSpec, OptimizerSpec
    from trainer.towers import TowerTrainer

    devices = setup_devices(max(TOWERS), "cpu", split_gpu_mb=args.split_gpu_mb)
    kind = devices.kind
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((args.batch, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, args.batch).astype(np.int32))

    def model() -> keras.Model:
        keras.utils.set_random_seed(0)
        return build_model(ModelSpec(name="cnn"), (28, 28, 1), 10)

    def optimizer() -> keras.optimizers.Optimizer:
        return make_optimizer(OptimizerSpec(name="momentum", learning_rate=0.01))

    def plain_step():
        with tf.device(f"/{kind}:0"):
            net, opt = model(), optimizer()
            opt.build(net.trainable_variables)

        @tf.function
        def step(images, labels):
            with tf.GradientTape() as tape:
                logits = net(images, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables, strict=True))
            return loss

        return lambda: step(x, y)

    def tower_step(n: int):
        with tf.device(devices.parameter):
            trainer = TowerTrainer(
                model=model(), optimizer=optimizer(), tower_devices=devices.towers[:n], parameter_device=devices.parameter
            )
        return lambda: trainer.train_step(x, y)["loss"]

    def mirrored_step(n: int):
        # On GPUs Mirrored keeps its default all-reduce (NCCL). On logical CPUs its default
        # collectives clash between strategies of different sizes in one process, so it
        # reduces to one device, the shape of our towers' parameter-device average.
        cross_device_ops = tf.distribute.ReductionToOneDevice() if kind == "CPU" else None
        strategy = tf.distribute.MirroredStrategy(devices=list(devices.towers[:n]), cross_device_ops=cross_device_ops)
        with strategy.scope():
            net, opt = model(), optimizer()
            opt.build(net.trainable_variables)  # slots mirrored now, not lazily inside the step
        batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)).repeat()))

        def replica(images, labels):
            with tf.GradientTape() as tape:
                logits = net(images, training=True)
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch)
            opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables, strict=True))
            return loss

        @tf.function
        def step(batch):
            return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

        return lambda: step(next(batches))

    configs = {"plain": plain_step()}
    for n in TOWERS:
        configs[f"towers({n})"] = tower_step(n)
        configs[f"mirrored({n})"] = mirrored_step(n)
    for fn in configs.values():  # trace and warm up everything before timing anything
        for _ in range(3):
            fn().numpy()

    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, fn in configs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = fn()
            loss.numpy()  # wait for the last step
            samples[name].append(args.batch * args.steps / (time.perf_counter() - start))
    return {name: max(s) for name, s in samples.items()}


def worker_examples_per_sec(spec: dict, job_dir: Path) -> float:
    """Examples/sec of a whole worker run, from its first progress report to its last step."""
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)], cwd=REPO, check=True, capture_output=True)
    events = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
    progress = [e for e in events if e["event"] == "progress"]
    first, last = progress[0], progress[-1]
    return (last["step"] - first["step"]) * spec["batch_size"] / (last["time"] - first["time"])


def monitoring_benchmark(args: argparse.Namespace) -> dict[str, float]:
    base = {
        "name": "bench-monitoring",
        "model": {"name": "cnn"},
        "data": {"format": "synthetic", "params": {"shape": [28, 28, 1], "classes": 10, "size": 8192}},
        "towers": 2,
        "batch_size": args.batch,
        "steps": args.worker_steps,
        "eval": {"every_steps": 0, "batches": 1},
        "checkpoint": {"every_steps": 0, "every_seconds": 0, "keep": 1},
    }
    off = {"scalars_every": 0, "histograms_every": 0, "images_every": 0, "trace_steps": [], "graph": False}
    samples: dict[str, list[float]] = {"default summaries": [], "no summaries": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.worker_repeats):
            samples["default summaries"].append(worker_examples_per_sec(base, Path(tmp) / f"default{r}"))
            samples["no summaries"].append(worker_examples_per_sec({**base, "summaries": off}, Path(tmp) / f"off{r}"))
    return {name: max(s) for name, s in samples.items()}


def main() -> None:
    args = parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}")
    print(f"model cnn, global batch {args.batch}, {args.steps} steps x {args.repeats} repeats (best)\n")
    if not args.skip_steps:
        rates = step_benchmarks(args)
        print(f"{'configuration':<16}{'examples/sec':>14}")
        for name, rate in rates.items():
            print(f"{name:<16}{rate:>14.1f}")
        print()
        print(f"towers(1) / plain        = {rates['towers(1)'] / rates['plain']:.3f}   (target >= 0.97)")
        for n in TOWERS:
            ratio = rates[f"towers({n})"] / rates[f"mirrored({n})"]
            print(f"towers({n}) / mirrored({n}) = {ratio:.3f}   (target >= 1.05)")
    if args.worker_steps:
        rates = monitoring_benchmark(args)
        print(f"\nwhole worker, cnn on 2 towers, {args.worker_steps} steps")
        for name, rate in rates.items():
            print(f"{name:<20}{rate:>10.1f} examples/sec")
        ratio = rates["default summaries"] / rates["no summaries"]
        print(f"default / none       = {ratio:.3f}   (target >= 0.97)")


if __name__ == "__main__":
    main()
