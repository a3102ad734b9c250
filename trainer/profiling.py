"""Device traces: capture with TensorFlow's profiler, and read each tower's time from them.

A capture writes `tb/plugins/profile/<run>/<host>.xplane.pb`, which TensorBoard's profile
plugin shows (trace viewer, one row per device thread, ops named `tower_i/...`). Each
tower's compute time is the sum of the durations of its ops in that trace, per traced
step: measured, never estimated.
"""

from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path

import tensorflow as tf

log = logging.getLogger(__name__)

_TOWER_OP = re.compile(r"^tower_(\d+)/")


def _xplane_pb2():  # noqa: ANN202 - generated protobuf module
    # The XPlane schema ships inside TensorFlow; importing it lazily keeps module import cheap.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


class TraceCapture:
    """Starts and stops the profiler; never fatal (a failure is logged and training goes on)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.active = False
        self._started_at = 0.0

    def start(self) -> bool:
        if self.active:
            return True
        # The profiler names a capture's folder by the wall-clock second: a second capture
        # within the same second would overwrite the first. Rare (close trace steps), and
        # then waiting out the second costs less than losing a trace.
        if math.floor(time.time()) <= math.floor(self._started_at):
            time.sleep(math.ceil(self._started_at) - time.time() + 0.01)
        self._started_at = time.time()
        try:
            options = tf.profiler.experimental.ProfilerOptions(
                host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
            )
            tf.profiler.experimental.start(str(self.logdir), options=options)
        except Exception as e:  # noqa: BLE001 - optional I/O must not stop training
            log.warning("could not start the profiler: %s", e)
            return False
        self.active = True
        return True

    def stop(self) -> Path | None:
        """Stop, and return the trace file written (None if there is none)."""
        if not self.active:
            return None
        self.active = False
        try:
            tf.profiler.experimental.stop()
        except Exception as e:  # noqa: BLE001
            log.warning("could not stop the profiler: %s", e)
            return None
        written = [p for p in self.logdir.glob("plugins/profile/*/*.xplane.pb") if p.stat().st_mtime >= self._started_at - 1]
        return max(written, key=lambda p: p.stat().st_mtime) if written else None


def tower_times_ms(trace: Path, towers: int, steps: int) -> list[float]:
    """Per traced step, the milliseconds each tower's ops ran, summed from the trace."""
    space = _xplane_pb2().XSpace()
    space.ParseFromString(trace.read_bytes())
    total_ps = [0] * towers
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                match = _TOWER_OP.match(names.get(event.metadata_id, ""))
                if match and int(match.group(1)) < towers:
                    total_ps[int(match.group(1))] += event.duration_ps
    return [round(ps / 1e9 / max(steps, 1), 3) for ps in total_ps]


def trace_op_names(trace: Path) -> set[str]:
    """Every event name in a trace (tests look for the towers' names here)."""
    space = _xplane_pb2().XSpace()
    space.ParseFromString(trace.read_bytes())
    return {meta.name for plane in space.planes for meta in plane.event_metadata.values()}
