"""A worker's peak memory for the images it loads (not a test: run it by hand).

    .venv/bin/python bench/memory_bench.py [--mb 400] [--format npz] [--checkout DIR]

Runs whole workers (`python -m trainer run`, a few steps of `mlp`) on a data file of
about `--mb` MiB of 28x28 uint8 images, and on the same file format with 1,000 examples,
and prints each one's peak RSS (the kernel's own, from `wait4`). The difference, over the
images' size, is how many times the job held its images at its peak. `--checkout` runs
the trainer of another checkout (an older commit's, say) on the same files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mb", type=int, default=400, help="MiB of images in the large file")
    p.add_argument("--format", choices=("npz", "idx", "idx.gz"), default="npz")
    p.add_argument("--checkout", type=Path, default=REPO, help="whose trainer runs")
    p.add_argument("--repeats", type=int, default=2, help="runs of each (the lowest peak counts)")
    p.add_argument("--write", nargs=2, metavar=("DIR", "N"), help=argparse.SUPPRESS)
    return p.parse_args()


def write_data(folder: Path, fmt: str, n: int) -> Path:
    """`n` 28x28 images (every page of them different from zero) and labels, as `fmt`."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, 256, size=(n, 28, 28), dtype=np.uint8)
    y = (np.arange(n) % 10).astype(np.uint8)
    folder.mkdir(parents=True)
    if fmt == "npz":
        np.savez(folder / "set.npz", x=x, y=y)
        return folder / "set.npz"
    gz = fmt == "idx.gz"
    for name, array in (("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y)):
        head = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
        path = folder / (name + (".gz" if gz else ""))
        with gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb") as f:
            f.write(head + array.tobytes())
    return folder


def written(folder: Path, fmt: str, n: int) -> Path:
    """`write_data` in a process of its own: a worker started from a process holding the
    images would count them in its peak (the kernel keeps the peak across exec)."""
    subprocess.run(
        [sys.executable, __file__, "--format", fmt, "--write", str(folder), str(n)], check=True
    )
    return folder / "set.npz" if fmt == "npz" else folder


def peak_rss_mib(checkout: Path, data: Path, fmt: str, job_dir: Path) -> float:
    """The peak RSS of one worker run, in MiB."""
    spec = {
        "model": {"name": "mlp"},
        "data": {"format": fmt.split(".")[0], "path": str(data)},
        "towers": 1,
        "batch_size": 64,
        "steps": 20,
        "eval": {"every_steps": 0, "batches": 1},
        "checkpoint": {"every_steps": 0, "every_seconds": 0, "keep": 1},
        "summaries": {
            "scalars_every": 0,
            "histograms_every": 0,
            "images_every": 0,
            "trace_steps": [],
            "graph": False,
        },
    }
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TOWERBOARD_DATA_ROOTS": str(data.parent)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job_dir)],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(worker.pid, 0)
    worker.returncode = os.waitstatus_to_exitcode(status)
    if worker.returncode != 0:
        raise RuntimeError(
            f"Expected the worker to succeed. Received: exit {worker.returncode} "
            f"({(job_dir / 'result.json').read_text()})"
        )
    return usage.ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    args = parse_args()
    if args.write:
        write_data(Path(args.write[0]), args.format, int(args.write[1]))
        return
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"trainer of {args.checkout}"
    )
    n = args.mb * 2**20 // 784
    with tempfile.TemporaryDirectory() as tmp:
        large = written(Path(tmp) / "large", args.format, n)
        small = written(Path(tmp) / "small", args.format, 1000)
        images_mib = n * 784 / 2**20
        peaks = {}
        for name, data in (("1,000 images", small), (f"{images_mib:.0f} MiB of images", large)):
            peaks[name] = min(
                peak_rss_mib(args.checkout, data, args.format, Path(tmp) / f"job-{name}-{r}")
                for r in range(args.repeats)
            )
            print(f"{args.format}, {name:<24} peak RSS {peaks[name]:>8.0f} MiB")
        base, loaded = peaks.values()
        print(
            f"peak above the small run: {loaded - base:.0f} MiB = "
            f"{(loaded - base) / images_mib:.2f} x the images"
        )


if __name__ == "__main__":
    main()
