"""Who runs next: highest priority first, then oldest, when its devices are free.

Strict order: a job at the head of the queue that does not fit yet holds back the jobs
behind it, so a large job is never starved by a stream of small ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.devices import DevicePool
from service.store import QueuedJob


@dataclass(frozen=True)
class Placement:
    job: QueuedJob
    devices: list[str]


def next_placements(queued: list[QueuedJob], pool: DevicePool, held: list[str]) -> list[Placement]:
    """The jobs to start now, in order, with the devices each gets.

    `queued` must already be in run order (the store's `queue()`); `held` are the devices
    the running jobs hold.
    """
    free = pool.free(held)
    placements = []
    for job in queued:
        needed = pool.needed(job.towers)
        if needed > len(free):
            break
        placements.append(Placement(job, free[:needed]))
        free = free[needed:]
    return placements
