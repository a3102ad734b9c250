"""Which devices the towers run on, and where the shared variables live.

Must run before TensorFlow creates any tensor: logical-device configuration and memory
growth can only be set on an uninitialised runtime.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import tensorflow as tf

log = logging.getLogger(__name__)


class GpusMissing(RuntimeError):
    """The service gave the job GPUs that TensorFlow cannot see."""


@dataclass(frozen=True)
class Devices:
    """The tower devices (one per tower) and the parameter device."""

    towers: tuple[str, ...]
    parameter: str
    kind: str  # "GPU" or "CPU"


def setup_devices(
    towers: int,
    parameter_device: str,
    *,
    split_gpu_mb: int | None = None,
    multi_worker: bool = False,
) -> Devices:
    """Give each of `towers` towers a device of its own.

    GPUs when there are enough (memory growth on, so one job does not grab a whole card
    before it needs it); otherwise the CPU split into `towers` logical devices, which
    runs the same multi-device code on a machine without accelerators. `split_gpu_mb`
    splits the first GPU into logical GPUs of that much memory each (benchmarks on a
    single card).

    `multi_worker`: this host is one worker of a cluster, whose strategy takes every
    visible GPU as a tower, or else the one CPU (it does not use logical CPU devices):
    the first `towers` GPUs are made the visible ones, and a host without GPUs runs one
    tower.
    """
    if towers < 1:
        raise ValueError(f"Expected `towers` to be a positive integer. Received: towers={towers}")
    gpus = tf.config.list_physical_devices("GPU")
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not gpus and re.fullmatch(r"\d+(,\d+)*", given):
        # GPUs were given (the service's TOWERBOARD_GPUS) but none works: a driver that does
        # not match, or a container started without them. Training on the CPU instead
        # would run many times slower while the service shows the job on its GPUs.
        message = (
            f"Expected the GPUs given in CUDA_VISIBLE_DEVICES={given!r}, but TensorFlow finds "
            "no GPU (see the CUDA lines above in worker.log; check the NVIDIA driver with "
            "nvidia-smi, or leave TOWERBOARD_GPUS empty to train on the CPU)"
        )
        if os.environ.get("TOWERBOARD_JOB_ID"):  # a job of the service: fail, said as such
            raise GpusMissing(message)
        log.warning("%s; training on the CPU", message)
    if multi_worker and not gpus and towers > 1:
        raise ValueError(
            "Expected towers=1: a worker of a multi-worker job on a host without GPUs "
            f"trains one tower (the CPU). Received: towers={towers}"
        )
    if gpus and split_gpu_mb and not multi_worker:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=split_gpu_mb)] * towers
        )
        kind = "GPU"
    elif gpus:
        if len(gpus) < towers:
            raise ValueError(
                f"Expected at most {len(gpus)} towers, one per visible GPU. Received: towers={towers}"
            )
        if multi_worker:
            gpus = gpus[:towers]
            tf.config.set_visible_devices(gpus, "GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        kind = "GPU"
    elif multi_worker:
        kind = "CPU"
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(towers)]
        )
        kind = "CPU"
        if not given:
            # A CUDA build of TensorFlow probes for a driver at import and logs an error
            # line (`failed call to cuInit`) on every host without one: said here to be the
            # expected probe, so a CPU job's log does not read as a failed one.
            log.info(
                "no GPU visible: training on the CPU (an 'E ... failed call to cuInit' line "
                "above, if any, is TensorFlow's probe for a CUDA driver, expected here)"
            )

    tower_devices = tuple(f"/{kind}:{i}" for i in range(towers))
    if parameter_device == "gpu0" and kind == "GPU":
        parameter = "/GPU:0"
    else:
        if kind == "GPU":
            log.warning(
                "towers on GPUs with the variables on the CPU (parameter_device 'cpu', the "
                "spec's default): every step copies them to the GPUs and the gradients back; "
                "with parameter_device 'gpu0' the same towers ran about 1.4 times as fast on "
                "an H100 (docs/benchmarks.md)"
            )
        elif parameter_device == "gpu0":
            log.warning("parameter_device 'gpu0' asked for, but no GPU is visible: using the CPU")
        parameter = "/CPU:0"
    log.info("towers on %s; parameters on %s", ", ".join(tower_devices), parameter)
    return Devices(towers=tower_devices, parameter=parameter, kind=kind)
