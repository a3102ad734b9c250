"""Benchmark: what saying how far a restore and a TFRecord walk are costs them.

    .venv/bin/python bench/preparation_bench.py [--rounds 5] [--dir DIR]

Side by side in one process, the files in the page cache, each round taking the variants
in turn (their order turned each round):

- a restore (`tf.train.Checkpoint.restore`) of a 200 MB checkpoint (50 float32 variables
  of 1024 x 1024): bare; inside `Preparation.reads` as the worker runs it (a sample every
  `EVERY_SECONDS`); and inside it sampling every 10 ms, 100 times as often, so the
  sampler's own cost shows over the restore's. Each says how many bytes the process read
  meanwhile by `/proc/self/io`'s count, against the checkpoint's data files.
- the walk of every record header of 4 TFRecord files (100,000 32x32x3 records, 300 MB
  plain; and the same gzip'd): `check_tfrecord_framing` of each file bare, and
  `trainer.data._check_framing`, the worker's `checking data` stage, writing its lines.

Reported: each variant's median and range of seconds over the rounds. Results go to stdout
and bench/out/preparation_bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tfrecords import write_tfrecord  # noqa: E402
from trainer.checkpoints import data_bytes  # noqa: E402
from trainer.data import _check_framing, _Meter  # noqa: E402
from trainer.datafiles import check_tfrecord_framing, resolve_files  # noqa: E402
from trainer.preparing import RESTORING, Preparation, read_bytes  # noqa: E402
from trainer.rundir import RunDir  # noqa: E402
from trainer.spec import DataSpec  # noqa: E402


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def restore_variants(folder: Path) -> tuple[dict[str, Callable[[], object]], dict[str, int]]:
    variables = [tf.Variable(tf.random.normal([1024, 1024], seed=i)) for i in range(50)]
    checkpoint = tf.train.Checkpoint(v=variables)
    path = checkpoint.save(str(folder / "ckpt"))
    total = data_bytes(path)
    read: dict[str, int] = {"checkpoint data bytes": total}

    def restore(reading: contextlib.AbstractContextManager[None], name: str) -> None:
        before = read_bytes()
        with reading:
            checkpoint.restore(path).assert_existing_objects_matched()
        after = read_bytes()
        if before is not None and after is not None:
            read[f"{name}: bytes read"] = after - before

    def sampled(every: float, name: str) -> Callable[[], None]:
        def run() -> None:
            runs = folder / f"run-{name}"
            shutil.rmtree(runs, ignore_errors=True)
            preparation = Preparation(RunDir(runs), every=every)
            restore(preparation.reads(RESTORING, total), name)
            preparation.close()

        return run

    return {
        "restore, bare": lambda: restore(contextlib.nullcontext(), "bare"),
        "restore, reads (1 s)": sampled(1.0, "reads-1s"),
        "restore, reads (10 ms)": sampled(0.01, "reads-10ms"),
    }, read


def tfrecord_files(folder: Path, suffix: str) -> DataSpec:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        # 4 bits of each byte: images that gzip to about half, as real ones do.
        x = rng.integers(0, 256, (25_000, 32, 32, 3), np.uint8) & 0xF0
        write_tfrecord(folder / f"part-{i}.tfrecord{suffix}", x, rng.integers(0, 10, 25_000))
    return DataSpec(format="tfrecord", path=str(folder))


def walk_variants(folder: Path, spec: DataSpec, name: str) -> dict[str, Callable[[], object]]:
    files = resolve_files(spec)

    def bare() -> None:
        for path in [*files.train, *files.eval]:
            check_tfrecord_framing(path)

    def reported() -> None:
        runs = folder / f"run-{name}"
        shutil.rmtree(runs, ignore_errors=True)
        preparation = Preparation(RunDir(runs))
        _check_framing(files, _Meter(files, preparation))
        preparation.close()

    return {f"walk {name}, bare": bare, f"walk {name}, checking data": reported}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        restores, read = restore_variants(folder)
        plain = tfrecord_files(folder / "plain", "")
        gzipped = tfrecord_files(folder / "gzip", ".gz")
        variants = {
            **restores,
            **walk_variants(folder, plain, "plain"),
            **walk_variants(folder, gzipped, "gzip'd"),
        }
        sizes = {
            name: sum(p.stat().st_size for p in (folder / name).iterdir())
            for name in ("plain", "gzip")
        }
        for run in variants.values():  # into the page cache, and TensorFlow warmed up
            run()
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                times[name].append(timed(variants[name]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results = {
        name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}
        for name, t in times.items()
    }
    for name, r in results.items():
        print(f"{name:32} {r['median_s']:.3f} s ({r['min_s']:.3f}-{r['max_s']:.3f})")
    print(json.dumps({"read": read, "file_bytes": sizes}, indent=1))
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "preparation_bench.json").write_text(
        json.dumps(
            {"host": platform.node(), "rounds": args.rounds, "results": results, "read": read},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
