"""/api/v1/queue: the queued jobs in the order they start, and what the first waits for."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.deps import RuntimeDep
from service.scheduler import head_waits_for
from service.schemas import QueuedJobPublic, QueuePublic

router = APIRouter(prefix="/queue", tags=["queue"])


@router.get("", response_model=QueuePublic)
def read_queue(
    runtime: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="How many jobs to list")] = 100,
) -> QueuePublic:
    """The first `limit` queued jobs in run order, each with its place in the queue; how
    many are queued in all, the devices free, and why the first has not started."""
    # A plain def: a page of 1,000 jobs and the running jobs' records, off the event loop.
    entries, count = runtime.store.queue_entries(most=limit)
    pool = runtime.pool
    free = len(pool.free(runtime.supervisor.held_devices()))
    return QueuePublic(
        data=[
            QueuedJobPublic.from_entry(position, entry, pool.needed(entry.towers))
            for position, entry in enumerate(entries, start=1)
        ],
        count=count,
        free_devices=free,
        devices=len(pool.devices),
        waiting_for=head_waits_for(entries[0].towers, pool, free) if entries else None,
    )
