"""Input pipeline throughput: examples/sec of the training pipeline alone, beside what a
towers step consumes (not a test: run it by hand).

    .venv/bin/python bench/input_bench.py [--rounds 15] [--batches 20] [--batch 256]
    git show REV:trainer/data.py > data_rev.py    # then, side by side with that version:
    .venv/bin/python bench/input_bench.py --baseline data_rev.py

The pipeline is the one a worker iterates: `load_arrays` and `train_dataset` of a job
spec, built under `/CPU:0` after `setup_devices` as `trainer.run` builds it, with the
worker's thread settings (it sets none: TensorFlow's defaults, its op and tf.data thread
pools as large as the host has cores). Nothing trains while it is timed: the batches are pulled and
dropped. Sets:

- MNIST (IDX, 28x28x1 uint8), from `../shared/data/mnist-t10k` beside the checkout
  (`--mnist`; said and left out where it is absent);
- `synthetic` data of 32x32x3 (float32 pixels: no scaling);
- an .npz file and a TFRecord file of the same number of 32x32x3 uint8 images, written
  here first: once loaded, all data is in memory and fed by index, so these two differ
  from each other only in their load time, which is printed too.

Each with no augmentation, each augmentation of the spec alone, and all of them.

Beside them, the rate at which a towers step of the `cnn` (2 towers, the spec's default
optimizer, the same global batch) consumes examples on this host, fed the same batch
again and again, and per set the ratio pipeline / step: above 1, the step bounds
training here; below, the input does. On a CPU host both share the cores while training,
so the figure that says what the input costs is its CPU time: "per CPU-second" is the
examples a second of this process's CPU time (what one core gives), and "cores at the
step's rate" the cores the pipeline keeps busy to feed the step at its rate.

Method: every round runs each configuration once, in rotating order: a fresh iterator
of the pipeline (its start, `--warmup` batches, untimed), then `--batches` batches timed,
wall-clock and this process's CPU time; the iterator is dropped before the next, so no
pipeline prefetches in the background of another's timing. The steps likewise, `--steps`
of them a round.
Rates are medians over rounds; a ratio is taken per round (both timed within a second or
two, so the machine's drift cancels) and its median reported with a 95% interval.
`--baseline FILE` also times the pipelines of another version of `trainer/data.py` on the
same loaded arrays, in the same rounds, and prints this checkout's rate over its.
`--split-gpu-mb M` puts the towers on logical GPUs split from the first GPU, as
`bench/towers_bench.py` does: the pipeline stays on the host's cores, as in a worker.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

MNIST = REPO.parent / "shared" / "data" / "mnist-t10k"
COLOUR = (32, 32, 3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from towers_bench import add_device_arguments

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=15, help="rounds; each runs every configuration")
    p.add_argument("--batches", type=int, default=20, help="batches timed per pipeline per round")
    p.add_argument("--warmup", type=int, default=10, help="batches pulled untimed first")
    p.add_argument("--steps", type=int, default=2, help="towers steps timed per round")
    p.add_argument("--batch", type=int, default=256, help="global batch (the spec's default)")
    p.add_argument(
        "--examples", type=int, default=10_000, help="examples of each 32x32x3 set (all kinds)"
    )
    p.add_argument("--mnist", type=Path, default=MNIST, help="folder of the MNIST IDX files")
    p.add_argument("--crop", type=int, default=4, help="random_crop_padding")
    p.add_argument("--brightness", type=float, default=0.2)
    p.add_argument("--contrast", type=float, default=0.2)
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another trainer/data.py (git show REV:trainer/data.py > FILE), timed beside this one",
    )
    add_device_arguments(p)
    return p.parse_args(argv)


def augmentations(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The spec's augmentations: none, each alone, and all of them."""
    alone: dict[str, dict[str, Any]] = {
        "flip_left_right": {"flip_left_right": True},
        f"random_crop_padding {args.crop}": {"random_crop_padding": args.crop},
        f"brightness {args.brightness:g}": {"brightness": args.brightness},
        f"contrast {args.contrast:g}": {"contrast": args.contrast},
    }
    every = {key: value for augment in alone.values() for key, value in augment.items()}
    return {"none": {}, **alone, "all": every}


def write_sets(folder: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each set's `data` spec (less its augmentation); the .npz and TFRecord files written
    into `folder`, of the same random colour images."""
    import numpy as np

    from tests.tfrecords import write_tfrecord

    sets: dict[str, dict[str, Any]] = {}
    if (args.mnist / "t10k-images-idx3-ubyte.gz").exists():
        sets["MNIST idx 28x28x1"] = {"format": "idx", "path": str(args.mnist)}
    else:
        print(f"MNIST idx: left out, not found at {args.mnist} (--mnist)")
    shape = "x".join(map(str, COLOUR))
    sets[f"synthetic {shape} float"] = {
        "format": "synthetic",
        "params": {"shape": list(COLOUR), "size": args.examples, "classes": 10},
    }
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (args.examples, *COLOUR), dtype=np.uint8)
    y = rng.integers(0, 10, args.examples).astype(np.int32)
    np.savez(folder / "set.npz", x=x, y=y)
    sets[f"npz {shape} uint8"] = {"format": "npz", "path": str(folder / "set.npz")}
    write_tfrecord(folder / "set.tfrecord", x, y)
    sets[f"TFRecord {shape} uint8"] = {"format": "tfrecord", "path": str(folder / "set.tfrecord")}
    return sets


@dataclass
class Timings:
    """Per round: seconds of wall-clock and of this process's CPU for `examples`."""

    examples: int
    wall: list[float]
    cpu: list[float]

    def rates(self) -> list[float]:
        return [self.examples / s for s in self.wall]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates())

    @property
    def per_cpu_second(self) -> float:
        return statistics.median(self.examples / s for s in self.cpu)

    @property
    def cores_busy(self) -> float:
        return statistics.median(c / w for c, w in zip(self.cpu, self.wall, strict=True))


def timed(fn: Callable[[], None], timings: Timings) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    timings.wall.append(time.perf_counter() - start)
    timings.cpu.append(time.process_time() - cpu)


def load_baseline(path: Path) -> Any:
    """Another version of `trainer/data.py` (`git show REV:trainer/data.py > FILE`), as a
    module of its own beside this checkout's `trainer.data`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_data", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # A line at a time, also into a pipe or file: what a run cut short had printed stays.
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    import tensorflow as tf
    from towers_bench import median_interval

    from trainer.data import load_arrays, train_dataset
    from trainer.devices import setup_devices
    from trainer.models import build_model
    from trainer.optim import make_optimizer
    from trainer.spec import JobSpec
    from trainer.towers import TowerTrainer

    cores = len(os.sched_getaffinity(0))
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )  # fmt: skip
    print(
        f"machine: {platform.machine()}, {cores} cores ({cpu}), Python "
        f"{platform.python_version()}, TensorFlow {tf.__version__}, {platform.platform()}"
    )
    devices = setup_devices(2, args.parameter_device, split_gpu_mb=args.split_gpu_mb)
    print(
        f"global batch {args.batch}; {args.rounds} rounds of {args.batches} batches a pipeline "
        f"(after {args.warmup} untimed) and {args.steps} steps; towers on "
        f"{', '.join(devices.towers)}, parameters on {devices.parameter}\n"
    )
    baseline = load_baseline(args.baseline) if args.baseline else None
    pipelines: dict[str, tf.data.Dataset] = {}
    shapes: dict[str, tuple[int, int, int]] = {}
    first: dict[tuple[int, int, int], tuple[tf.Tensor, tf.Tensor, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in write_sets(Path(tmp), args).items():
            # Loaded once: the augmentation is the pipeline's alone.
            spec = JobSpec.model_validate({"data": data, "towers": 2, "batch_size": args.batch})
            start = time.perf_counter()
            arrays = load_arrays(spec.data, spec.seed)
            print(f"load_arrays, {name}: {time.perf_counter() - start:.2f} s")
            for augment_name, augment in augmentations(args).items():
                shapes[name] = arrays.image_shape
                augmented = JobSpec.model_validate(
                    {"data": {**data, "augment": augment}, "towers": 2}
                ).data
                # As `trainer.run` builds it: on the host, whatever the towers' devices.
                with tf.device("/CPU:0"):
                    dataset = train_dataset(arrays, augmented, spec.batch_size, spec.seed)
                    pipelines[f"{name} | {augment_name}"] = dataset
                    if baseline is not None:
                        pipelines[f"{name} | {augment_name} | baseline"] = baseline.train_dataset(
                            arrays, augmented, spec.batch_size, spec.seed
                        )
                if arrays.image_shape not in first:
                    x, y = next(iter(dataset))
                    first[arrays.image_shape] = (x, y, arrays.num_classes)

    def pull(dataset: tf.data.Dataset, into: Timings) -> Callable[[], None]:
        def run() -> None:
            iterator = iter(dataset)
            for _ in range(args.warmup):
                next(iterator)

            def batches() -> None:
                for _ in range(args.batches):
                    next(iterator)

            timed(batches, into)

        return run

    def stepper(shape: tuple[int, int, int], into: Timings) -> Callable[[], None]:
        # The spec's model and optimizer, placed as a worker places them, fed one batch of
        # the pipeline again and again through an iterator (a loop's `next`, no input work).
        x, y, classes = first[shape]
        spec = JobSpec.model_validate({"data": {"format": "synthetic"}, "towers": 2})
        with tf.device(devices.parameter):
            trainer = TowerTrainer(
                model=build_model(spec.model, shape, classes).model,
                optimizer=make_optimizer(spec.optimizer),
                tower_devices=devices.towers,
                parameter_device=devices.parameter,
                input_shape=shape,
            )
        batches = iter(tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(tf.data.AUTOTUNE))
        for _ in range(3):  # traced and warm
            trainer.train_step(*next(batches))["loss"].numpy()

        def run() -> None:
            def steps() -> None:
                for _ in range(args.steps):
                    loss = trainer.train_step(*next(batches))["loss"]
                loss.numpy()  # wait for the last step

            timed(steps, into)

        return run

    step_names = {shape: f"towers step {'x'.join(map(str, shape))}" for shape in first}
    configs: dict[str, Callable[[], None]] = {}
    timings: dict[str, Timings] = {}
    for key, dataset in pipelines.items():
        timings[key] = Timings(args.batch * args.batches, [], [])
        configs[key] = pull(dataset, timings[key])
    for shape, step_name in step_names.items():
        timings[step_name] = Timings(args.batch * args.steps, [], [])
        configs[step_name] = stepper(shape, timings[step_name])
    names = list(configs)
    for r in range(args.rounds):
        # Rotate the order so that no configuration always follows the same one.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            configs[name]()
        print(f"  round {r + 1} of {args.rounds} done")

    def ratio(a: Timings, b: Timings) -> str:
        """The median of per-round ratios of a's rate to b's, with its 95% interval."""
        rounds = [x / y for x, y in zip(a.rates(), b.rates(), strict=True)]
        median, low, high = median_interval(rounds)
        return f"{median:.2f} [{low:.2f}, {high:.2f}]" if low is not None else f"{median:.2f}"

    print(
        f"\nexamples/sec: median of {args.rounds} rounds; per CPU-second: examples a second of "
        "this process's CPU time (what a core gives, where the cores are the bound); cores "
        "busy: CPU time / wall-clock time\n"
    )
    print("| towers step | examples/sec | per CPU-second | cores busy |")
    print("|---|---:|---:|---:|")
    for step_name in step_names.values():
        t = timings[step_name]
        print(f"| {step_name} | {t.rate:.0f} | {t.per_cpu_second:.0f} | {t.cores_busy:.2f} |")
    print(
        "\n| set | augmentation | examples/sec | per CPU-second | cores busy | pipeline / step "
        "[95% interval] | cores at the step's rate |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    keys = [key for key in pipelines if not key.endswith(" | baseline")]
    for key in keys:
        t = timings[key]
        name, augment_name = key.split(" | ")
        step = timings[step_names[shapes[name]]]
        print(
            f"| {name} | {augment_name} | {t.rate:.0f} | {t.per_cpu_second:.0f} | "
            f"{t.cores_busy:.2f} | {ratio(t, step)} | {step.rate / t.per_cpu_second:.2f} |"
        )
    if baseline is not None:
        print(
            f"\nthis checkout against the baseline {args.baseline}, side by side in each round:\n"
        )
        print(
            "| set | augmentation | baseline examples/sec | examples/sec | this / baseline "
            "[95% interval] |"
        )
        print("|---|---|---:|---:|---:|")
        for key in keys:
            t, b = timings[key], timings[f"{key} | baseline"]
            name, augment_name = key.split(" | ")
            print(f"| {name} | {augment_name} | {b.rate:.0f} | {t.rate:.0f} | {ratio(t, b)} |")
    if args.rounds < 6:
        print("\n(under 6 rounds: no 95% interval for the ratios)")


if __name__ == "__main__":
    main()
