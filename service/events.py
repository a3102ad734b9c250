"""Fan-out of job events (progress lines, state changes, a deletion, an ended job's worker
gone) to Server-Sent-Events listeners.

The supervisor and the routes publish; each listener is an asyncio queue on the
service's event loop. A publish never blocks: it adds the event to a pending batch, and
the first event of a batch asks the loop (`call_soon_threadsafe`) to hand the whole batch
out, so a listener sees each event as soon as the loop runs. A listener follows one job,
or every job (the dashboard's jobs table).

Batched, because a job's progress.jsonl read on after a while comes as one burst of
lines (hundreds of thousands after a service restart): one loop wake-up each, every one
a write to the loop's self-pipe and a switch between the threads, took 8 s for 200,000
events with 20 listeners. A batch holds at most a listener queue's worth of each job's
events, the newest: a listener would keep no more of them (and one that would have had
more is ended, below).

A listener that falls a queue's worth of events behind (a client reading slower than a
burst comes) has its stream ended rather than left to skip events silently: a skipped
`state` event would leave a page showing a job running that had ended. Its client
reconnects by itself (EventSource does; so does `towerboard submit --watch`), and a reconnected
client reads again what it may have missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import json
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent

from service.schemas import JobPublic
from service.store import JobRecord

log = logging.getLogger(__name__)

# A listener that falls this far behind is ended (LAGGED) rather than holding memory.
_QUEUE_SIZE = 1024
# How long a stream has, once the server is stopping, to end itself (well within the
# 5 s uvicorn gives open connections): ended, its client sees a complete response.
_SHUTDOWN_GRACE_SECONDS = 1.0
_PING_SECONDS = 15
# The most events one write of a stream holds (`ready_events`).
_EVENTS_A_WRITE = 256


@dataclass(frozen=True)
class JobEvent:
    """`event` is a progress.jsonl event name (start, progress, eval, checkpoint, trace,
    end), `state` for a change of the job's state, `deleted` for a job deleted for good, or
    `exited` once an ended job's worker, still exiting at its end, has gone."""

    job_id: str
    event: str
    data: dict[str, Any]

    @classmethod
    def state(cls, job: JobRecord) -> JobEvent:
        """The `state` event of `job` as it is now: the job's public JSON."""
        return cls(job.id, "state", JobPublic.from_record(job).model_dump(mode="json"))

    @classmethod
    def exited(cls, job_id: str, devices: list[str]) -> JobEvent:
        """The `exited` event: the ended job's worker process, which outlived the job's end
        (TensorFlow's teardown), is gone, and `devices`, which the devices list marked
        `exiting` until then, are free (a resume or delete of the job is taken from now).
        Only after an end that left the worker exiting: one that had gone by then held
        nothing past the `state` that ended its job."""
        return cls(job_id, "exited", {"id": job_id, "devices": list(devices)})

    @functools.cached_property
    def all_jobs_sse(self) -> bytes:
        """The event as /api/v1/events sends it (with its `job_id`): encoded once for
        every listener of every job, not once each."""
        data = json.dumps({"job_id": self.job_id, **self.data})
        return ServerSentEvent(event=self.event, data=data).encode()


# What a listener's queue holds once the listener has fallen too far behind: its stream
# ends there (`next_event` returns None), and its client reconnects and reads again.
LAGGED = JobEvent("", "lagged", {})


class EventBroker:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Keyed by job id; None holds the listeners of every job.
        self._listeners: dict[str | None, set[asyncio.Queue[JobEvent]]] = {}
        # Events published and not yet handed out, by job, each with its place in the order
        # of publishing (to interleave them again for the listeners of every job).
        self._pending: dict[str, deque[tuple[int, JobEvent]]] = {}
        # Jobs whose pending events overflowed the batch: their listeners have missed some.
        self._overflowed: set[str] = set()
        self._order = itertools.count()
        self._pending_lock = threading.Lock()
        # Listeners that fell behind: their queues hold LAGGED alone until they go.
        self._lagged: set[asyncio.Queue[JobEvent]] = set()
        self.lagged_total = 0  # listeners ever ended for falling behind (for /metrics)

    @property
    def listening(self) -> int:
        """Listeners now: the event streams open."""
        return sum(len(queues) for queues in self._listeners.values())

    def publish(self, event: JobEvent) -> None:
        """Hand an event to every listener of its job; callable from any thread."""
        if self._loop.is_closed():
            return
        with self._pending_lock:
            first = not self._pending
            queue = self._pending.get(event.job_id)
            if queue is None:
                queue = self._pending[event.job_id] = deque(maxlen=_QUEUE_SIZE)
            if len(queue) == _QUEUE_SIZE:
                self._overflowed.add(event.job_id)
            queue.append((next(self._order), event))
        if first:
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop stopped meanwhile: nobody listens
                with self._pending_lock:
                    self._pending.clear()
                    self._overflowed.clear()

    def _flush(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            overflowed, self._overflowed = self._overflowed, set()
        for job_id in overflowed:
            for key in (job_id, None):
                for queue in self._listeners.get(key, ()):
                    self._lag(queue)
        for _, event in heapq.merge(*pending.values(), key=lambda item: item[0]):
            self._deliver(event)

    def _deliver(self, event: JobEvent) -> None:
        for key in (event.job_id, None):
            for queue in self._listeners.get(key, ()):
                if queue.full():
                    self._lag(queue)
                elif queue not in self._lagged:
                    queue.put_nowait(event)

    def _lag(self, queue: asyncio.Queue[JobEvent]) -> None:
        """End a listener that has missed events: what its queue holds will not be sent,
        and its stream ends at LAGGED."""
        if queue in self._lagged:
            return
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(LAGGED)
        self._lagged.add(queue)
        self.lagged_total += 1
        log.info(
            "An event stream fell behind by %d events: ended, for its client to reconnect",
            _QUEUE_SIZE,
        )

    @contextlib.contextmanager
    def listen(self, job_id: str | None) -> Iterator[asyncio.Queue[JobEvent]]:
        """A queue of the job's events (every job's, for None) from now on; call on the
        event loop."""
        queue: asyncio.Queue[JobEvent] = asyncio.Queue(_QUEUE_SIZE)
        self._listeners.setdefault(job_id, set()).add(queue)
        try:
            yield queue
        finally:
            self._lagged.discard(queue)
            listeners = self._listeners.get(job_id)
            if listeners is not None:
                listeners.discard(queue)
                if not listeners:
                    del self._listeners[job_id]


def sse_response(
    events: Callable[[anyio.Event], AsyncIterator[ServerSentEvent | bytes]],
) -> EventSourceResponse:
    """A Server-Sent-Events response of `events(stopping)`, which must end soon after
    `stopping` is set (as the server stops; `next_event` does). Cut off instead, a stream
    leaves its client an incomplete response and the server logs an error for it."""
    stopping = anyio.Event()
    return EventSourceResponse(
        events(stopping),
        ping=_PING_SECONDS,
        shutdown_event=stopping,
        shutdown_grace_period=_SHUTDOWN_GRACE_SECONDS,
    )


def ready_events(
    queue: asyncio.Queue[JobEvent], first: JobEvent, most: int = _EVENTS_A_WRITE
) -> list[JobEvent]:
    """`first` and the events already waiting behind it, `most` in all: a stream sends them
    as one write, where a burst (a progress.jsonl read on, thousands of lines) took one
    write per event and listener, and kept the loop from answering anything else."""
    events = [first]
    while len(events) < most and not queue.empty():
        event = queue.get_nowait()
        if event is LAGGED:  # alone in its queue: left there, for next_event to end on
            queue.put_nowait(LAGGED)
            break
        events.append(event)
    return events


async def next_event(queue: asyncio.Queue[JobEvent], stopping: anyio.Event) -> JobEvent | None:
    """The queue's next event, or None once `stopping` is set or the listener has fallen
    too far behind (LAGGED): either way its stream ends there."""
    if stopping.is_set():
        return None
    if not queue.empty():
        event = queue.get_nowait()
        return None if event is LAGGED else event
    getter = asyncio.ensure_future(queue.get())
    stopper = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((getter, stopper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not getter.done():
            getter.cancel()  # a get cancelled while waiting takes nothing from the queue
    if not getter.done() or getter.cancelled() or getter.result() is LAGGED:
        return None
    return getter.result()
