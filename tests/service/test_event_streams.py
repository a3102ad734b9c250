"""Event streams (Server-Sent Events): as the service stops, each open stream is ended
cleanly, and the stop logs no error for them; a burst of events reaches the listeners in
one hand-over; a listener that falls too far behind has its stream ended, for its client
to reconnect and read again, rather than skipping events without a word; an ended job's
worker that outlived its end says `exited` once it has gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx

from service.events import LAGGED, EventBroker, JobEvent, next_event, ready_events
from service.routes.events import stream_all_events
from tests.service.harness import (
    Service,
    fake_worker_env,
    job_spec,
    processes_under,
    stand_in_service,
)
from tests.service.test_jobs import following


def test_stop_ends_open_streams_cleanly(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A dashboard keeps /api/v1/events open, and a job page its job's stream: every
    # ordinary restart logged "ERROR: ASGI callable returned without completing response."
    # for each, and the client saw the connection cut mid-stream.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="sleepy"))  # the stand-in runs until stopped
    service.wait_state(job["id"], "running")
    ends: dict[str, str] = {}
    opened = threading.Barrier(3)

    def follow(path: str) -> None:
        try:
            with httpx.stream("GET", f"{service.base_url}{path}", timeout=30.0) as response:
                assert response.status_code == 200
                opened.wait(10)
                for _ in response.iter_lines():
                    pass
            ends[path] = "ended"
        except httpx.HTTPError as error:
            ends[path] = f"{type(error).__name__}: {error}"

    paths = ["/api/v1/events", f"/api/v1/jobs/{job['id']}/events"]
    readers = [threading.Thread(target=follow, args=(path,)) for path in paths]
    for reader in readers:
        reader.start()
    opened.wait(10)
    service.stop()
    for reader in readers:
        reader.join(30)
    assert ends == {path: "ended" for path in paths}
    log = service.log.read_text()
    assert "ASGI callable returned without completing response" not in log, log
    assert "Finished server process" in log


@contextlib.contextmanager
def loop_in_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """A running event loop on its own thread, as the service's is beside the supervisor's."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_burst_of_events_wakes_the_loop_once_and_ends_the_listeners_it_overflows() -> None:
    """A progress.jsonl read on after a restart is a burst of lines: each event woke the
    loop on its own (8 s for 200,000 with 20 listeners). Now a burst is handed over at
    once. A listener of the job (or of every job) would miss events in a burst larger than
    its queue: it is ended (LAGGED) instead; a listener of another job keeps its own."""
    with loop_in_thread() as loop:
        broker = EventBroker(loop)
        listening: list[contextlib.AbstractContextManager[asyncio.Queue[JobEvent]]] = []

        async def listen(job_id: str | None) -> asyncio.Queue[JobEvent]:
            listener = broker.listen(job_id)
            listening.append(listener)
            return listener.__enter__()

        def run(coroutine: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result(10)

        of_a, of_b, of_all = run(listen("a")), run(listen("b")), run(listen(None))
        wakes = 0
        schedule = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return schedule(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:  # the loop is busy meanwhile, as a long request keeps it
            busy.set()
            release.wait(10)

        schedule(hold)
        assert busy.wait(10)
        broker.publish(JobEvent("b", "state", {"n": -1}))
        for n in range(5000):
            broker.publish(JobEvent("a", "progress", {"n": n}))
        woken_by_the_burst = wakes
        release.set()

        async def drain(queue: asyncio.Queue[JobEvent]) -> list[JobEvent]:
            await asyncio.sleep(0)
            return list(iter_queue(queue))

        got_a, got_b, got_all = run(drain(of_a)), run(drain(of_b)), run(drain(of_all))
        assert woken_by_the_burst == 1
        assert got_b == [JobEvent("b", "state", {"n": -1})]  # not touched by the other's burst
        assert got_a == [LAGGED]
        assert got_all == [LAGGED]
        for listener in listening:
            listener.__exit__(None, None, None)


def iter_queue(queue: asyncio.Queue[JobEvent]) -> Iterator[JobEvent]:
    while not queue.empty():
        yield queue.get_nowait()


def test_the_all_jobs_stream_sends_a_burst_in_few_writes() -> None:
    """Each event was one write to each listener: 20 dashboards and a burst of thousands
    of lines kept the loop from answering /healthz for seconds. What is waiting goes out
    together (256 events a write at most), each event encoded once for all listeners."""

    async def scenario() -> tuple[list[bytes], list[dict[str, Any]]]:
        broker = EventBroker(asyncio.get_running_loop())
        response = await stream_all_events(SimpleNamespace(broker=broker))  # type: ignore[arg-type]
        body = response.body_iterator
        opened = await anext(body)  # type: ignore[call-overload]
        assert b"following every job" in opened.encode()
        for step in range(1000):
            broker.publish(JobEvent("a", "progress", {"step": step}))
        writes: list[bytes] = []
        events: list[dict[str, Any]] = []
        while len(events) < 1000:
            chunk = await asyncio.wait_for(anext(body), 10)  # type: ignore[call-overload]
            assert isinstance(chunk, bytes)
            writes.append(chunk)
            for block in chunk.decode().split("\r\n\r\n"):
                lines = dict(line.split(": ", 1) for line in block.splitlines() if line)
                if lines:
                    assert lines["event"] == "progress"
                    events.append(json.loads(lines["data"]))
        await body.aclose()  # type: ignore[attr-defined]
        return writes, events

    # On a thread of its own: the session's sync Playwright (tests/conftest.py) keeps an
    # event loop running on the main thread once a dashboard test has started it.
    with ThreadPoolExecutor(1) as thread:
        writes, events = thread.submit(asyncio.run, scenario()).result()
    assert events == [{"job_id": "a", "step": step} for step in range(1000)]
    assert len(writes) <= 4


def test_a_listener_that_falls_behind_is_ended_and_the_others_go_on() -> None:
    """Events arriving in many small hand-overs to a listener that does not read fill its
    queue: it was made to drop its oldest events without a word, so a `state` event among
    them could be lost and a page go on showing an ended job as running. Now the events
    it holds are dropped and its stream ends at LAGGED (once); a listener that reads keeps
    every event, and the listener of another job is not touched."""

    async def scenario() -> None:
        broker = EventBroker(asyncio.get_running_loop())
        stopping = anyio.Event()
        with broker.listen("a") as slow, broker.listen(None) as reader, broker.listen("b") as other:
            got: list[int] = []
            for n in range(3000):
                broker.publish(JobEvent("a", "progress", {"n": n}))
                await asyncio.sleep(0)  # a hand-over each: no batch overflows
                while not reader.empty():
                    got.append(reader.get_nowait().data["n"])
            assert got == list(range(3000))
            assert list(iter_queue(slow)) == [LAGGED]  # once, though it overflowed again
            assert other.empty()
            broker.publish(JobEvent("a", "state", {"state": "succeeded"}))
            await asyncio.sleep(0)
            assert slow.empty()  # nothing more for a listener already ended
            broker.publish(JobEvent("b", "state", {"n": 1}))
            await asyncio.sleep(0)
            assert await next_event(other, stopping) == JobEvent("b", "state", {"n": 1})

            # The stream of a listener ended while it was taking a batch: the events before
            # LAGGED go out, and the next read ends it.
            with broker.listen("c") as late:
                for n in range(3):
                    broker.publish(JobEvent("c", "progress", {"n": n}))
                await asyncio.sleep(0)
                first = await next_event(late, stopping)
                assert first is not None
                for n in range(3, 1030):
                    broker.publish(JobEvent("c", "progress", {"n": n}))
                    await asyncio.sleep(0)
                assert ready_events(late, first, 256) == [first]
                assert await next_event(late, stopping) is None

    with ThreadPoolExecutor(1) as thread:  # see test_the_all_jobs_stream_sends_a_burst
        thread.submit(asyncio.run, scenario()).result()


# `python -m burst_worker run --job-dir DIR`: BURST progress lines in one write, then it
# runs until SIGTERM stops it as the trainer stops.
BURST = 40_000
BURST_WORKER = f"""\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
now, pad = time.time(), "x" * 100
lines = [dict(event="progress", step=k, total={BURST}, time=now, loss=1.0 / k, note=pad)
         for k in range(1, {BURST} + 1)]
(job_dir / "progress.jsonl").write_text("".join(json.dumps(line) + "\\n" for line in lines))
while not stopped:
    time.sleep(0.05)
(job_dir / "result.json").write_text(json.dumps({{"outcome": "cancelled", "message": "stop"}}))
sys.exit(3)
"""


def test_a_client_that_does_not_read_a_burst_gets_its_stream_ended(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A dashboard that does not read while a burst comes (a tab in the background, a slow
    link) fills the kernel's buffers, then its listener's queue. Its stream went on, its
    events past the queue's worth gone without a word; now the stream ends, cleanly (a
    complete response: EventSource reconnects by itself), and a read then finds the job
    as it is. A raw socket with a small receive buffer stands for the slow client."""
    (tmp_path / "burst_worker.py").write_text(BURST_WORKER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    service = make_service(env={"TOWERBOARD_WORKER_MODULE": "burst_worker", "PYTHONPATH": path})
    service.start()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    client.settimeout(30)
    client.connect(("127.0.0.1", service.port))
    with client:
        host = f"127.0.0.1:{service.port}".encode()
        client.sendall(
            b"GET /api/v1/events HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n"
        )
        received = b""
        while b"following every job" not in received:  # subscribed
            received += client.recv(4096)
        assert "towerboard_event_streams 1\n" in service.client.get("/metrics").text
        assert received.startswith(b"HTTP/1.1 200 OK"), received
        job = service.submit(job_spec(name="burst"))
        service.wait_for(job["id"], lambda j: (j["progress"] or {}).get("step") == BURST)
        # To the end of the response, which closes the connection; a stream left open
        # (pinged every 15 s) is still open at the deadline.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (chunk := client.recv(1 << 16)):
            received += chunk
    assert received.endswith(b"0\r\n\r\n"), received[-200:]  # the chunked body's end
    sent = received.count(b"event: progress")
    # Ended where it fell behind: in the kernel's buffers and its queue, or at once where
    # the service took more of the job's lines in one hand-over than a queue holds.
    assert sent < BURST, sent
    assert service.job(job["id"])["progress"]["step"] == BURST  # what a re-read finds
    metrics = service.client.get("/metrics").text  # what an operator sees
    assert "towerboard_event_streams_lagged_total 1\n" in metrics
    assert "towerboard_event_streams 0\n" in metrics


def test_exited_comes_once_the_ended_jobs_worker_has_gone(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A job ends at its result.json, and its worker can take seconds more to exit
    (TensorFlow's teardown), its device held and a resume or delete refused meanwhile: the
    dashboard polled the devices list every 0.5 s to learn when it had gone. `exited` on
    /api/v1/events says so: after the job's end, not while the process is still there,
    and by the time it arrives the process is gone, the devices list no longer marks the
    device `exiting` and the store no longer holds the job back from a resume or delete.
    The stand-in "linger" worker stays after its result until the test releases it."""
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    job = service.submit(job_spec(name="linger"))
    job_id = job["id"]
    store = service.data_dir / "towerboard.db"
    seen: dict[str, Any] = {}  # what held as the `exited` event arrived

    def exited(event: dict[str, Any]) -> bool:
        if event["event"] != "exited" or event["data"]["job_id"] != job_id:
            return False
        seen["workers"] = processes_under(service.data_dir / "runs" / job_id)
        devices = httpx.get(f"{service.base_url}/api/v1/devices", timeout=30.0)
        seen["devices"] = [(d["id"], d["job_id"], d["exiting"]) for d in devices.json()["data"]]
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            seen["exiting"] = db.execute(
                "SELECT exiting FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()[0]
        return True

    reader, events = following(service.client, "/api/v1/events", exited)

    assert service.wait_state(job_id, "succeeded")["state"] == "succeeded"
    workers = processes_under(service.data_dir / "runs" / job_id)
    assert len(workers) == 1, workers  # ended, and its worker still there
    devices = service.client.get("/api/v1/devices").json()["data"]
    assert [(d["id"], d["job_id"], d["exiting"]) for d in devices] == [("cpu:0", job_id, True)]
    time.sleep(1.0)  # ten of the supervisor's passes with the worker still there
    assert [e["event"] for e in events if e["event"] == "exited"] == []
    assert any(e["event"] == "state" and e["data"]["state"] == "succeeded" for e in events)

    service.release(job_id)
    reader.join(30)
    assert not reader.is_alive(), "no `exited` event within 30 s of the worker's release"
    assert events[-1]["event"] == "exited"
    assert events[-1]["data"] == {"job_id": job_id, "id": job_id, "devices": ["cpu:0"]}
    assert seen == {"workers": [], "devices": [("cpu:0", None, False)], "exiting": None}
    ended = [e["data"]["state"] for e in events if e["event"] == "state"]
    assert ended[-1] == "succeeded"  # the end came first, on the same stream
    assert service.client.delete(f"/api/v1/jobs/{job_id}").status_code == 204


# A worker that writes NaN and infinities, as Python's json does by default (the trainer
# writes null), in a progress line, then succeeds.
NON_FINITE_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
with open(job_dir / "progress.jsonl", "a") as f:
    for line in (
        {"event": "start", "step": 0},
        {"event": "progress", "step": 1, "loss": float("nan"), "accuracy": 0.5,
         "tower_ms": [1.0, float("inf")], "extra": {"low": -float("inf")}},
        {"event": "end", "step": 1, "outcome": "succeeded", "phase": "done"},
    ):
        f.write(json.dumps({"time": time.time(), "total": 1, **line}) + "\\n")
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "done"}))
"""


def test_a_worker_lines_nan_and_infinities_go_out_as_null(tmp_path: Path) -> None:
    # Sent as Python's json writes them (NaN, Infinity), a browser's JSON.parse refused
    # the event, and the dashboard dropped it whole: its accuracy and step with it.
    with stand_in_service(tmp_path, ("non_finite_worker", NON_FINITE_WORKER)) as service:
        reader, events = following(service.client, "/api/v1/events", lambda e: e["event"] == "end")
        service.submit(job_spec(name="odd"))
        reader.join(60)
    [line] = [e["data"] for e in events if e["event"] == "progress"]
    assert (line["step"], line["loss"], line["accuracy"]) == (1, None, 0.5), line
    assert (line["tower_ms"], line["extra"]) == ([1.0, None], {"low": None}), line
