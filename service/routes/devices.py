"""/api/v1/devices: the devices the service gives to jobs, and who holds each."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import RuntimeDep
from service.schemas import DevicePublic, DevicesPublic

router = APIRouter(prefix="/devices", tags=["devices"])


@router.get("", response_model=DevicesPublic)
async def read_devices(runtime: RuntimeDep) -> DevicesPublic:
    """Each GPU (or, on a CPU-only host, each job slot) and the job holding it: a running
    one, or one whose worker is still exiting."""
    pool = runtime.pool
    # A job that has ended holds its devices until its worker process is gone.
    held_after = runtime.supervisor.held_after_their_jobs()
    jobs = runtime.store.running()
    running = {device: job.id for job in jobs for device in job.devices}
    holders = held_after | running
    exiting = held_after.keys() - running.keys()
    # By name too: an id alone said nothing to someone looking for their job. An ended
    # job's is read from the store (a worker still exiting: seconds, one job or a few).
    names = {job.id: job.name for job in jobs}
    for job_id in set(held_after.values()) - names.keys():
        if (job := runtime.store.get(job_id)) is not None:
            names[job_id] = job.name
    data = [
        DevicePublic(
            id=device,
            kind="gpu" if pool.gpu else "cpu",
            job_id=job_id,
            job_name=names.get(job_id) if job_id is not None else None,
            exiting=device in exiting,
        )
        for device in pool.devices
        for job_id in [holders.get(device)]
    ]
    # A job adopted after a restart that configured fewer devices (a lower
    # TOWERBOARD_CPU_JOBS, a shorter TOWERBOARD_GPUS) still holds one outside the pool:
    # shown until it ends, as it counts in /metrics' busy devices, and never given out again.
    data += [
        DevicePublic(
            id=device,
            kind=device.split(":")[0],
            job_id=job_id,
            job_name=names.get(job_id),
            exiting=device in exiting,
            configured=False,
        )
        for device, job_id in sorted(holders.items())
        if device not in pool.devices
    ]
    return DevicesPublic(data=data, max_towers=pool.max_towers)
