"""Event streams (Server-Sent Events): as the service stops, each open stream is ended
cleanly, and the stop logs no error for them; a burst of events reaches the listeners in
one hand-over, each listener keeping the newest of what it follows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from service.events import EventBroker, JobEvent
from service.routes.events import stream_all_events
from tests.service.harness import Service, fake_worker_env, job_spec


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


def test_a_burst_of_events_wakes_the_loop_once_and_listeners_keep_the_newest() -> None:
    """A progress.jsonl read on after a restart is a burst of lines: each event woke the
    loop on its own (8 s for 200,000 with 20 listeners). Now a burst is handed over at
    once, and every listener ends with what its own queue would have kept."""
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

        async def drain(queue: asyncio.Queue[JobEvent]) -> list[tuple[str, int]]:
            await asyncio.sleep(0)
            return [(event.job_id, event.data["n"]) for event in iter_queue(queue)]

        got_a, got_b, got_all = run(drain(of_a)), run(drain(of_b)), run(drain(of_all))
        assert woken_by_the_burst == 1
        assert got_b == [("b", -1)]  # not pushed out by the other job's burst
        assert got_a == [("a", n) for n in range(5000 - 1024, 5000)]
        assert got_all == [("a", n) for n in range(5000 - 1024, 5000)]
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
