"""How much memory each tower's GPU holds, for the `tower_i/memory_mb` scalars and the
progress lines' `memory_mb`: a GPU's headroom is what decides how large a batch or a model
may grow, and a peak that climbs step after step is a leak.

The figures are TensorFlow's allocator's own counters (`tf.config.experimental.
get_memory_info`): what its tensors hold, not what the process or the driver reserves
(memory growth reserves more, in chunks). Reading them runs no op and waits for no device
(about 1 µs a device); `reset_memory_stats` sets a device's peak back to what it holds
now, so each scalars point charts the peak since the point before, and the progress lines
the peak since the worker started.

GPUs alone: each tower's GPU (a logical one split from a card included) has an allocator
of its own that every tensor on it goes through. A CPU's counters count only some of its
tensors (a `cnn`'s, which oneDNN's pool allocates, and none of a small `mlp`'s, measured
here), and a CPU-only host's logical devices share them, so towers on CPUs chart none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tensorflow as tf

from trainer.errors import one_line

log = logging.getLogger(__name__)

_MIB = float(1 << 20)


class TowerMemory:
    """The peak memory of each tower's device (see the module doc); None from every read
    where the towers are not on `counted` devices, and once a read failed (logged once)."""

    def __init__(self, devices: Sequence[str], counted: Sequence[str] = ("GPU",)) -> None:
        """`counted`: the device types whose counters count every tensor; tests count a
        CPU's, whose pool a large tensor goes through, as a GPU's."""
        specs = [tf.DeviceSpec.from_string(device) for device in devices]
        # The local name: a cluster worker's devices are named by their job and task,
        # which `get_memory_info` finds no device for.
        self._names = [f"{spec.device_type}:{spec.device_index or 0}" for spec in specs]
        self._so_far = [0] * len(self._names)
        self._off = not all(spec.device_type in counted for spec in specs)

    def interval_mb(self) -> list[float] | None:
        """Each tower's peak since the last call (or the worker's start), in MiB; the
        peaks start again from what each device holds now."""
        peaks = self._peaks()
        if peaks is None:
            return None
        try:
            for name in self._names:
                tf.config.experimental.reset_memory_stats(name)
        except Exception as error:  # noqa: BLE001 - a counter is never fatal
            self._fail(error)
            return None
        self._so_far = [max(a, b) for a, b in zip(self._so_far, peaks, strict=True)]
        return _mib(peaks)

    def peak_mb(self) -> list[float] | None:
        """Each tower's peak since the worker started, in MiB."""
        peaks = self._peaks()
        if peaks is None:
            return None
        return _mib([max(a, b) for a, b in zip(self._so_far, peaks, strict=True)])

    def _peaks(self) -> list[int] | None:
        if self._off:
            return None
        try:
            return [tf.config.experimental.get_memory_info(name)["peak"] for name in self._names]
        except Exception as error:  # noqa: BLE001 - a counter is never fatal
            self._fail(error)
            return None

    def _fail(self, error: Exception) -> None:
        self._off = True
        log.warning("device memory: not charted, its counters cannot be read: %s", one_line(error))


def _mib(peaks: list[int]) -> list[float]:
    return [round(peak / _MIB, 1) for peak in peaks]
