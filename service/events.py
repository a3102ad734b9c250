"""Fan-out of job events (progress lines, state changes) to Server-Sent-Events listeners.

The supervisor publishes from its thread; each listener is an asyncio queue on the
service's event loop, fed through `call_soon_threadsafe`, so a publish never blocks and
a listener sees each event as soon as the loop runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# A listener that falls this far behind loses its oldest events rather than holding memory.
_QUEUE_SIZE = 1024


@dataclass(frozen=True)
class JobEvent:
    """`event` is a progress.jsonl event name (start, progress, eval, checkpoint, trace,
    end) or `state` for a change of the job's state."""

    job_id: str
    event: str
    data: dict[str, Any]


class EventBroker:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._listeners: dict[str, set[asyncio.Queue[JobEvent]]] = {}

    def publish(self, event: JobEvent) -> None:
        """Hand an event to every listener of its job; callable from any thread."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile: nobody listens
            self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: JobEvent) -> None:
        for queue in self._listeners.get(event.job_id, ()):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)

    @contextlib.contextmanager
    def listen(self, job_id: str) -> Iterator[asyncio.Queue[JobEvent]]:
        """A queue of the job's events from now on; call on the event loop."""
        queue: asyncio.Queue[JobEvent] = asyncio.Queue(_QUEUE_SIZE)
        self._listeners.setdefault(job_id, set()).add(queue)
        try:
            yield queue
        finally:
            listeners = self._listeners.get(job_id)
            if listeners is not None:
                listeners.discard(queue)
                if not listeners:
                    del self._listeners[job_id]
