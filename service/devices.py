"""The devices the service gives to jobs, and which of them are free.

A GPU host gives whole GPUs (`TOWERBOARD_GPUS`), one per tower, never shared. A CPU-only
host has `TOWERBOARD_CPU_JOBS` job slots; a job takes one slot and its worker splits the
CPU into as many logical devices as it has towers. Who holds what is not kept here: it is
the `devices` of the running jobs in the store, so it can never drift from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from service.settings import Settings


@dataclass(frozen=True)
class DevicePool:
    """The devices of this host, in the order they are given out."""

    devices: tuple[str, ...]
    gpu: bool
    max_towers: int

    @classmethod
    def from_settings(cls, settings: Settings) -> DevicePool:
        if settings.gpus:
            return cls(
                devices=tuple(f"gpu:{gpu}" for gpu in settings.gpus),
                gpu=True,
                max_towers=len(settings.gpus),
            )
        return cls(
            devices=tuple(f"cpu:{slot}" for slot in range(settings.cpu_jobs)),
            gpu=False,
            max_towers=settings.cpu_max_towers,
        )

    def needed(self, towers: int) -> int:
        """How many devices a job with `towers` towers holds."""
        return towers if self.gpu else 1

    @property
    def most_towers(self) -> int | None:
        """The most towers a job can have and ever start here; None: any (a CPU job holds
        one slot, whatever its towers)."""
        return len(self.devices) if self.gpu else None

    def free(self, held: Iterable[str]) -> list[str]:
        taken = set(held)
        return [device for device in self.devices if device not in taken]

    def cuda_visible_devices(self, devices: Iterable[str]) -> str:
        """`CUDA_VISIBLE_DEVICES` for a worker holding `devices` ("" on a CPU-only host)."""
        if not self.gpu:
            return ""
        return ",".join(device.removeprefix("gpu:") for device in devices)

    def describe(self) -> str:
        if self.gpu:
            count = f"{len(self.devices)} GPU{'s' if len(self.devices) != 1 else ''}"
            return f"{count} (TOWERBOARD_GPUS={','.join(d[4:] for d in self.devices)})"
        return f"a CPU-only host (TOWERBOARD_CPU_MAX_TOWERS={self.max_towers})"
