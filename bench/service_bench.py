"""Benchmark: GET /api/v1/jobs/{id} under a bounded loopback load, idle and while a job trains
on every core, against a bare Starlette JSON endpoint measured in the same run.

    .venv/bin/python bench/service_bench.py [--connections 8] [--seconds 5] [--rounds 2]

Both servers are uvicorn with the same options (one process, no access log); the service
adds its deadline for request heads (service/headtimeout.py: a timer armed after each
response and cancelled by the next request), which it pays in these figures. The bare
endpoint returns the same job JSON (decoded once at start, encoded per request by
Starlette's JSONResponse), without a store, routing of 12 routes, or validation. The load
is C keep-alive HTTP/1.1 connections from one asyncio client in this process, each sending
its next request when the previous answer is complete (a closed loop, so the load is
bounded by C). Rounds alternate bare and service so drift in the host hits both alike.
Results go to stdout as a Markdown table and to bench/out/service_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT))
from tests.service.harness import job_spec  # noqa: E402 - the tests' tiny synthetic job

TINY_JOB = job_spec(name="bench-status")

# Trains until cancelled, on two towers, with the CPU split between them: every core busy.
TRAINING_JOB = {
    "name": "bench-load",
    "model": {"name": "cnn"},
    "data": {"format": "synthetic", "params": {"shape": [28, 28, 1], "classes": 10, "size": 8192}},
    "towers": 2,
    "batch_size": 256,
    "steps": 10_000_000,
    "eval": {"every_steps": 0, "batches": 1},
    "summaries": {"trace_steps": []},
    "checkpoint": {"every_steps": 0, "every_seconds": 600, "keep": 1},
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_bare(port: int, payload_file: Path) -> None:
    """The bare endpoint: Starlette, one route, a JSON body."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    payload = json.loads(payload_file.read_text())

    async def job(request: Request) -> JSONResponse:
        return JSONResponse(payload)

    app = Starlette(routes=[Route("/job", job)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


async def _connection(
    port: int, path: str, stop_at: float, latencies: list[float], failures: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not head.startswith(b"HTTP/1.1 200"):
                failures.append(int(head[9:12]))
    finally:
        writer.close()


async def _load(port: int, path: str, connections: int, seconds: float) -> dict[str, Any]:
    # A short warm-up first, not counted.
    await asyncio.gather(
        *(_connection(port, path, time.perf_counter() + 0.5, [], []) for _ in range(connections))
    )
    latencies: list[float] = []
    failures: list[int] = []
    start = time.perf_counter()
    await asyncio.gather(
        *(_connection(port, path, start + seconds, latencies, failures) for _ in range(connections))
    )
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "failures": len(failures),
        "latencies": latencies,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    latencies = sorted(x for run in runs for x in run["latencies"])
    requests = sum(run["requests"] for run in runs)
    seconds = sum(run["seconds"] for run in runs)

    def pct(q: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "requests_per_sec": requests / seconds,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": 1000 * latencies[-1],
        "requests": requests,
        "failures": sum(run["failures"] for run in runs),
    }


def _measure(
    label: str, targets: dict[str, tuple[int, str]], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for _ in range(args.rounds):
        for name, (port, path) in targets.items():
            runs[name].append(asyncio.run(_load(port, path, args.connections, args.seconds)))
    result = {name: _summary(r) for name, r in runs.items()}
    print(f"measured {label}: " + json.dumps(result), file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per target")
    parser.add_argument(
        "--serve-bare", nargs=2, metavar=("PORT", "PAYLOAD"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(int(args.serve_bare[0]), Path(args.serve_bare[1]))
        return 0

    data_dir = Path(tempfile.mkdtemp(prefix="towerboard-bench-"))
    service_port, bare_port = _free_port(), _free_port()
    env = {**os.environ, "TOWERBOARD_POLL_SECONDS": "0.2"}
    service = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(service_port),
         "--data-dir", str(data_dir / "data"), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    bare = None
    base = f"http://127.0.0.1:{service_port}"
    try:
        _wait_http(f"{base}/healthz")
        client = httpx.Client(base_url=base, timeout=60.0)
        job_id = client.post("/api/v1/jobs", json=TINY_JOB).json()["id"]
        while client.get(f"/api/v1/jobs/{job_id}").json()["state"] in ("queued", "running"):
            time.sleep(0.5)
        payload = data_dir / "job.json"
        payload.write_text(client.get(f"/api/v1/jobs/{job_id}").text)
        bare = subprocess.Popen(
            [sys.executable, __file__, "--serve-bare", str(bare_port), str(payload)],
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{bare_port}/job")
        status_path = f"/api/v1/jobs/{job_id}"
        targets = {"bare": (bare_port, "/job"), "status": (service_port, status_path)}

        results = {"idle": _measure("idle", targets, args)}

        load_id = client.post("/api/v1/jobs", json=TRAINING_JOB).json()["id"]
        while (client.get(f"/api/v1/jobs/{load_id}").json()["progress"] or {}).get(
            "phase"
        ) != "training":
            time.sleep(0.5)  # fmt: skip
        time.sleep(2.0)
        # While training, the status route reads the training job, which is being updated.
        targets["status"] = (service_port, f"/api/v1/jobs/{load_id}")
        results["training"] = _measure("training", targets, args)
        examples = client.get(f"/api/v1/jobs/{load_id}").json()["progress"]["examples_per_sec"]
        client.post(f"/api/v1/jobs/{load_id}/cancel")
        while client.get(f"/api/v1/jobs/{load_id}").json()["state"] == "running":
            time.sleep(0.5)
    finally:
        for process in (service, bare):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)

    machine = {
        "cpus": os.cpu_count(),
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        ),  # fmt: skip
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    report = {
        "machine": machine,
        "connections": args.connections,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "training_examples_per_sec": examples,
        "results": results,
    }
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "service_bench.json").write_text(json.dumps(report, indent=2))

    print(f"Machine: {machine['cpus']} x {machine['cpu']}, Python {machine['python']}")
    print(f"Load: {args.connections} keep-alive connections, {args.rounds} x {args.seconds:g} s "
          "per target, alternating\n")  # fmt: skip
    print("| condition | endpoint | req/s | p50 ms | p99 ms | max ms | ratio to bare |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for condition, result in results.items():
        bare_rps = result["bare"]["requests_per_sec"]
        for name, label in (("bare", "bare Starlette JSON"), ("status", "GET /api/v1/jobs/{id}")):
            r = result[name]
            print(f"| {condition} | {label} | {r['requests_per_sec']:.0f} | {r['p50_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {r['max_ms']:.1f} | {r['requests_per_sec'] / bare_rps:.2f} |")  # fmt: skip
    print(f"\nTraining during the 'training' rows: {examples:.0f} examples/sec (2 towers, cnn).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
