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


def _amount(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def head_waits_for(towers: int, pool: DevicePool, free: int) -> str:
    """Why the job at the head of the queue, asking for `towers`, has not started with
    `free` devices free: said for people (`GET /api/v1/queue`'s `waiting_for`)."""
    needed = pool.needed(towers)
    noun = "GPU" if pool.gpu else "job slot"
    if needed > len(pool.devices):
        # Only until the supervisor's next pass, which fails it (`Supervisor._schedule`).
        return (
            f"{_amount(needed, noun)}; the service has {len(pool.devices)}, so it never "
            "starts here (the scheduler fails it)"
        )
    if needed > free:
        return f"{_amount(needed, noun)}; {free} free"
    return f"nothing: {_amount(needed, noun)} needed, {free} free; it starts at the next pass"
