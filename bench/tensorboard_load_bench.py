"""Benchmark: how long TensorBoard takes to load long jobs' event files, with the Python
loader the service runs it with (`--load_fast false`) against the Rust data server
(`--load_fast true`), which the service leaves off because it serves the runs on a
loopback gRPC port with no auth (see `service.tensorboard`).

    .venv/bin/python bench/tensorboard_load_bench.py [--jobs 4] [--steps 200000] [--rounds 3]

It writes, once, a logdir of `--jobs` runs as a job writes them at the default cadences
(`tb/train`: 8 scalars every 10 steps, the weights' and gradients' histograms of a `cnn`
and 2 towers' images every 500; `tb/eval`: 2 scalars every 1,000), with TensorBoard's
own event writer and synthetic values. Each round then starts both loaders, one after the
other in alternating order, each on a fresh port, with the service's other flags, and
times from the spawn until TensorBoard first answers, until every job's `loss` series
reaches its last step (what the scalars dashboard needs), and until the last job's
histograms and images do too. The per-round ratios Python / Rust are what the numbers
mean here; results go to stdout and bench/out/tensorboard_load_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SCALARS_EVERY, HISTOGRAMS_EVERY, IMAGES_EVERY, EVAL_EVERY = 10, 500, 500, 1000
TRAIN_SCALARS = (
    "loss", "accuracy", "learning_rate", "gradient_norm", "examples_per_sec", "step_time_ms",
    "tower_0/loss", "tower_1/loss",
)  # fmt: skip
# The `cnn`'s variables (kernels and biases of 2 convolutions and 2 dense layers).
VARIABLES = ("conv1/kernel", "conv1/bias", "conv2/kernel", "conv2/bias",
             "dense1/kernel", "dense1/bias", "dense2/kernel", "dense2/bias")  # fmt: skip
BUCKETS = 30  # TensorBoard's default bucket count, as the trainer writes them


def _write_job(run_dir: Path, steps: int, seed: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.histogram import metadata as histogram_metadata
    from tensorboard.plugins.image import metadata as image_metadata
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    rng = np.random.default_rng(seed)
    scalar_meta = scalar_metadata.create_summary_metadata(display_name="", description="")
    histogram_meta = histogram_metadata.create_summary_metadata(display_name="", description="")
    image_meta = image_metadata.create_summary_metadata(
        display_name="", description="", converted_to_tensor=True
    )
    # One small PNG, written for every image summary: loading reads its bytes, whatever
    # they show.
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
        "0000000a49444154789c6360000000020001e221bc330000000049454e44ae426082"
    )

    def event(step: int, values: list[summary_pb2.Summary.Value]) -> event_pb2.Event:
        return event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
        )

    described: set[tuple[str, str]] = set()

    def meta(subdir: str, tag: str, metadata: summary_pb2.SummaryMetadata) -> dict:
        """The metadata on a tag's first value in its file alone, as the trainer writes."""
        if (subdir, tag) in described:
            return {}
        described.add((subdir, tag))
        return {"metadata": metadata}

    def scalar(tag: str, value: float, subdir: str = "train") -> summary_pb2.Summary.Value:
        return summary_pb2.Summary.Value(
            tag=tag,
            **meta(subdir, tag, scalar_meta),
            tensor=tensor_util.make_tensor_proto(np.float32(value)),
        )

    train = EventFileWriter(str(run_dir / "train"), max_queue_size=1000)
    evals = EventFileWriter(str(run_dir / "eval"), max_queue_size=1000)
    for step in range(SCALARS_EVERY, steps + 1, SCALARS_EVERY):
        train.add_event(event(step, [scalar(t, rng.random()) for t in TRAIN_SCALARS]))
        if step % HISTOGRAMS_EVERY == 0:
            values = []
            for kind in ("weights", "gradients"):
                for name in VARIABLES:
                    edges = np.sort(rng.normal(size=BUCKETS + 1))
                    buckets = np.stack([edges[:-1], edges[1:], rng.random(BUCKETS) * 100], 1)
                    values.append(
                        summary_pb2.Summary.Value(
                            tag=f"{kind}/{name}",
                            **meta("train", f"{kind}/{name}", histogram_meta),
                            tensor=tensor_util.make_tensor_proto(buckets.astype(np.float64)),
                        )
                    )
            train.add_event(event(step, values))
        if step % IMAGES_EVERY == 0:
            train.add_event(
                event(
                    step,
                    [
                        summary_pb2.Summary.Value(
                            tag=f"tower_{i}/inputs",
                            **meta("train", f"tower_{i}/inputs", image_meta),
                            tensor=tensor_util.make_tensor_proto([b"1", b"1", png] * 1),
                        )
                        for i in range(2)
                    ],
                )
            )
        if step % EVAL_EVERY == 0:
            evals.add_event(
                event(step, [scalar("loss", rng.random(), "eval"), scalar("accuracy", 0.9, "eval")])
            )
    train.close()
    evals.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _last_step(client: httpx.Client, url: str) -> int | None:
    try:
        response = client.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    points = response.json()
    return (
        int(points[-1][1] if isinstance(points[-1], list) else points[-1]["step"])
        if points
        else None
    )


def _time_load(
    logdir: Path, jobs: int, steps: int, load_fast: str, deadline: float
) -> dict[str, float]:
    """Seconds from the spawn to TensorBoard's first answer ("up": its start, before any
    loading), to every job's loss series complete ("scalars"), and to the last job's
    histograms and images complete as well ("all")."""
    port = _free_port()
    command = [
        sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
        "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "5",
        "--samples_per_plugin", "scalars=5000", "--load_fast", load_fast,
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    base = f"http://127.0.0.1:{port}/data/plugin"
    last = f"job{jobs - 1}/train"
    times: dict[str, float] = {}
    try:
        with httpx.Client() as client:
            while "all" not in times:
                if time.perf_counter() - started > deadline:
                    raise SystemExit(f"--load_fast {load_fast}: not loaded in {deadline:.0f} s")
                if "up" not in times:
                    try:
                        if client.get(f"http://127.0.0.1:{port}/data/runs").status_code == 200:
                            times["up"] = time.perf_counter() - started
                    except httpx.HTTPError:
                        pass
                if (
                    "up" in times
                    and "scalars" not in times
                    and all(
                        _last_step(client, f"{base}/scalars/scalars?run=job{j}/train&tag=loss")
                        == steps
                        for j in range(jobs)
                    )
                ):
                    times["scalars"] = time.perf_counter() - started
                if "scalars" in times and all(
                    _last_step(client, url) == steps
                    for url in (
                        f"{base}/histograms/histograms?run={last}&tag=gradients/dense1/kernel",
                        f"{base}/images/images?run={last}&tag=tower_1/inputs&sample=0",
                    )
                ):
                    times["all"] = time.perf_counter() - started
                time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds a load may take")
    args = parser.parse_args()
    if args.steps % EVAL_EVERY:
        parser.error(f"--steps must be a multiple of {EVAL_EVERY}")

    with tempfile.TemporaryDirectory(prefix="tb-load-bench-") as tmp:
        logdir = Path(tmp)
        began = time.perf_counter()
        for j in range(args.jobs):
            _write_job(logdir / f"job{j}", args.steps, seed=j)
        size = sum(f.stat().st_size for f in logdir.rglob("*") if f.is_file())
        print(
            f"{args.jobs} jobs of {args.steps} steps: {size / 1e6:.1f} MB of events, "
            f"written in {time.perf_counter() - began:.1f} s"
        )
        rows: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            order = ["false", "true"] if r % 2 == 0 else ["true", "false"]
            row = {
                mode: _time_load(logdir, args.jobs, args.steps, mode, args.deadline)
                for mode in order
            }
            rows.append(row)
            print(
                f"round {r + 1}: Python up {row['false']['up']:.1f} s, scalars "
                f"{row['false']['scalars']:.1f} s, all {row['false']['all']:.1f} s; "
                f"Rust up {row['true']['up']:.1f} s, scalars {row['true']['scalars']:.1f} s, "
                f"all {row['true']['all']:.1f} s"
            )
    summary = {
        what: {
            "python_s": statistics.median(row["false"][what] for row in rows),
            "rust_s": statistics.median(row["true"][what] for row in rows),
            "python_over_rust": statistics.median(
                row["false"][what] / row["true"][what] for row in rows
            ),
        }
        for what in ("up", "scalars", "all")
    }
    for what, s in summary.items():
        print(
            f"{what}: Python loader {s['python_s']:.1f} s, Rust data server {s['rust_s']:.1f} s "
            f"(medians); Python / Rust {s['python_over_rust']:.2f} (median of the rounds)"
        )
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "tensorboard_load_bench.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "rounds": rows,
                "summary": summary,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
