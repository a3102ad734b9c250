"""/api/v1/events: every job's events in one Server-Sent-Events stream.

One connection for a whole jobs table, where one per job would soon run into the
browser's six connections per host.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from service.deps import RuntimeDep
from service.events import next_event, ready_events, sse_response

router = APIRouter(prefix="/events", tags=["jobs"])


@router.get(
    "",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "The events of /jobs/{id}/events for every job, from now on, each "
            "with its `job_id`: `state` (the job as JSON; also when a job is submitted) and "
            "the workers' `start`, `progress`, `eval`, `checkpoint`, `trace`, `end`; and two "
            "that come after a job's own stream has ended: `deleted` (`id`: the job was "
            "deleted for good) and `exited` (`id`, `devices`: a job ended while its worker "
            "was still exiting, the one time /devices marks its devices `exiting`, and that "
            "worker has now gone: the devices are free, a resume or delete is taken). It "
            "opens with a comment line once subscribed and stays open until the client "
            "closes it.",
        },
    },
)
async def stream_all_events(runtime: RuntimeDep) -> EventSourceResponse:
    """Server-Sent Events of every job's progress and state changes, live."""

    async def events(stopping: anyio.Event) -> AsyncIterator[ServerSentEvent | bytes]:
        with runtime.broker.listen(None) as queue:
            # A comment (browsers skip it) that says the stream is subscribed: whatever
            # happens after a client reads it reaches that client.
            yield ServerSentEvent(comment="following every job")
            while (event := await next_event(queue, stopping)) is not None:
                # What is already waiting goes in the same write (sse_starlette sends bytes
                # as they are).
                events = ready_events(queue, event)
                yield b"".join(event.all_jobs_sse for event in events)

    return sse_response(events)
