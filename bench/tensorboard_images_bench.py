"""Benchmark: what the service's TensorBoard holds in memory for jobs' input images, at
each count of image steps it keeps a tag (`--samples_per_plugin images=N`).

    .venv/bin/python bench/tensorboard_images_bench.py --shape 28x28x1 --towers 1
        [--runs 8] [--image-steps 200] [--max-images 8] [--keep 1,10,100,200]
        [--mnist t10k-images-idx3-ubyte.gz]

It writes, once, a logdir of `--runs` runs, each `tb/train` holding `--image-steps`
image steps of `tower_i/inputs` for each of `--towers` towers, `--max-images` images a
tag, encoded as the trainer encodes them (`trainer.summaries._png_images`). The images
are the trainer's synthetic data (class prototypes plus noise, clipped to [0, 1]: near
the worst case for PNG), or with `--mnist`, 28x28 digits from an IDX file (gzip'd or
not), which PNG compresses some 3 times. Then, for each `--keep`, a fresh TensorBoard
with the service's own command line (`service.tensorboard._command`, its images count
set to that value) loads the logdir; once every run's last tower's tag shows its last
step and as many steps as it keeps, its resident memory (VmRSS in /proc/PID/status) and
peak (VmHWM) are read. `--keep 1` is the baseline: every image read and dropped but one a
tag. Results go to stdout and bench/out/tensorboard_images_bench.json (appended to).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POOL = 16  # distinct batches a shape: each event is parsed, and held, on its own anyway


def _batches(args: argparse.Namespace, shape: tuple[int, int, int]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    count = POOL * args.max_images
    if args.mnist:
        opener = gzip.open if str(args.mnist).endswith(".gz") else open
        with opener(args.mnist, "rb") as f:
            raw = f.read()
        digits = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28, 1)
        pixels = digits[:count].astype(np.float32) / 255.0
    else:
        prototypes = rng.uniform(0.0, 1.0, size=(10, *shape)).astype(np.float32)
        pixels = prototypes[rng.integers(0, 10, size=count)]
        pixels += 0.3 * rng.standard_normal(pixels.shape, dtype=np.float32)
        np.clip(pixels, 0.0, 1.0, out=pixels)
    return [pixels[i : i + args.max_images] for i in range(0, count, args.max_images)]


def _write(logdir: Path, args: argparse.Namespace, shape: tuple[int, int, int]) -> int:
    """The logdir's runs; the bytes of its event files."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.image import metadata as image_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from trainer.summaries import _png_images

    protos = [_png_images(batch) for batch in _batches(args, shape)]
    meta = image_metadata.create_summary_metadata(
        display_name="", description="", converted_to_tensor=True
    )
    every = 2
    for r in range(args.runs):
        writer = EventFileWriter(str(logdir / f"run{r}" / "train"), max_queue_size=100)
        for s in range(args.image_steps):
            values = [
                summary_pb2.Summary.Value(
                    tag=f"tower_{t}/inputs",
                    **({"metadata": meta} if s == 0 else {}),
                    tensor=protos[(s * args.towers + t + r) % POOL],
                )
                for t in range(args.towers)
            ]
            event = event_pb2.Event(
                wall_time=time.time(),
                step=1 + s * every,
                summary=summary_pb2.Summary(value=values),
            )
            writer.add_event(event)
        writer.close()
    return sum(f.stat().st_size for f in logdir.rglob("*") if f.is_file())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _memory(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024  # kB to MiB
    return fields


def _load(logdir: Path, args: argparse.Namespace, keep: int) -> dict[str, Any]:
    from service.guarded_tensorboard import SECRET_ENV, SECRET_HEADER
    from service.tensorboard import _command

    port = _free_port()
    command = _command(sys.executable, logdir, port)
    at = command.index("--samples_per_plugin") + 1
    samples = dict(kv.split("=") for kv in command[at].split(","))
    samples["images"] = str(keep)
    command[at] = ",".join(f"{k}={v}" for k, v in samples.items())
    secret = secrets.token_hex(16)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), **{SECRET_ENV: secret})
    last_step = 1 + (args.image_steps - 1) * 2
    wanted = min(keep, args.image_steps) if keep else args.image_steps
    tag = f"tower_{args.towers - 1}/inputs"
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    base = f"http://127.0.0.1:{port}/tensorboard/data/plugin/images/images"
    try:
        with httpx.Client(headers={SECRET_HEADER: secret}, timeout=30) as client:
            loaded: set[int] = set()
            while len(loaded) < args.runs:
                if time.perf_counter() - started > args.deadline:
                    raise SystemExit(f"images={keep}: not loaded in {args.deadline:.0f} s")
                for r in set(range(args.runs)) - loaded:
                    try:
                        reply = client.get(base, params={"run": f"run{r}/train", "tag": tag})
                    except httpx.HTTPError:
                        break
                    shown = reply.json() if reply.status_code == 200 else []
                    if shown and shown[-1]["step"] == last_step and len(shown) == wanted:
                        loaded.add(r)
                time.sleep(0.5)
            seconds = time.perf_counter() - started
            time.sleep(2.0)  # the reload's own garbage settles
            memory = _memory(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"keep": keep, "steps_shown": wanted, "load_s": round(seconds, 1), **memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="28x28x1", help="HxWxC")
    parser.add_argument("--towers", type=int, default=1)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--image-steps", type=int, default=200)
    parser.add_argument("--max-images", type=int, default=8)
    parser.add_argument("--keep", default="1,10,100,200", help="images= values to load with")
    parser.add_argument("--mnist", type=Path, help="an IDX file of 28x28 digits to show")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds a load may take")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    if len(shape) != 3 or (args.mnist and shape != (28, 28, 1)):
        parser.error("--shape is HxWxC, and 28x28x1 with --mnist")

    with tempfile.TemporaryDirectory(prefix="tb-images-bench-") as tmp:
        size = _write(Path(tmp), args, shape)
        tags = args.runs * args.towers
        print(
            f"{args.runs} runs x {args.towers} towers x {args.image_steps} image steps of "
            f"{args.max_images} {args.shape} {'MNIST' if args.mnist else 'synthetic'} images: "
            f"{size / 2**20:.1f} MiB of events, {size / 2**10 / tags / args.image_steps:.1f} "
            "KiB a tag's step"
        )
        rows = []
        for keep in (int(k) for k in args.keep.split(",")):
            row = _load(Path(tmp), args, keep)
            rows.append(row)
            print(
                f"images={keep}: {row['steps_shown']} steps a tag shown, loaded in "
                f"{row['load_s']} s; VmRSS {row['VmRSS']:.0f} MiB, VmHWM {row['VmHWM']:.0f} MiB"
            )
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    with open(out / "tensorboard_images_bench.json", "a") as f:
        record = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "events_bytes": size,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "rows": rows,
        }
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
