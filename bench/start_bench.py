"""Benchmark: the service's start, from spawning `towerboard serve` to its first /healthz
answer, against the floor any FastAPI service on uvicorn has: a one-route FastAPI app.

    .venv/bin/python bench/start_bench.py [--rounds 15]

Each round starts both, one after the other, in alternating order, each on a fresh port
(the service on a fresh data dir), polling /healthz every 10 ms, and stops them. Reported:
each one's median and best time, and the median of the per-round ratios service / floor,
which drift on a shared host hits alike. Results go to stdout and bench/out/start_bench.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]

# The floor: FastAPI, uvicorn and one route, as small as a FastAPI service gets.
FLOOR = """
import sys
import uvicorn
from fastapi import FastAPI

app = FastAPI()


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _time_start(command: list[str], port: int) -> float:
    """Seconds from spawning `command` to its first 200 on /healthz; then stops it."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            if process.poll() is not None:
                _, err = process.communicate()
                raise RuntimeError(f"{command[:3]} exited: {err.decode()[-2000:]}")
            if time.perf_counter() - started > 60:
                raise RuntimeError(f"{command[:3]} did not answer within 60 s")
            time.sleep(0.01)
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"service": [], "floor": []}
    with tempfile.TemporaryDirectory() as tmp:
        floor_script = Path(tmp) / "floor.py"
        floor_script.write_text(FLOOR)
        for r in range(args.rounds):
            order = ["service", "floor"] if r % 2 == 0 else ["floor", "service"]
            for name in order:
                port = _free_port()
                command = (
                    [sys.executable, "-m", "service.cli", "serve", "--port", str(port),
                     "--data-dir", f"{tmp}/data{r}", "--no-access-log"]
                    if name == "service"
                    else [sys.executable, str(floor_script), str(port)]
                )  # fmt: skip
                times[name].append(_time_start(command, port))
    ratios = [s / f for s, f in zip(times["service"], times["floor"], strict=True)]
    result = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "rounds": args.rounds,
        **{
            name: {"median_s": statistics.median(values), "best_s": min(values)}
            for name, values in times.items()
        },
        "ratio_median": statistics.median(ratios),
    }
    print("| start to first /healthz | median s | best s |")
    print("|---|---:|---:|")
    for name in ("service", "floor"):
        print(f"| {name} | {result[name]['median_s']:.3f} | {result[name]['best_s']:.3f} |")
    print(
        f"\nservice / floor, median of {args.rounds} per-round ratios: {result['ratio_median']:.3f}"
    )
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "start_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
