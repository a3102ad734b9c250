"""Each tower's device memory (`trainer.devicememory`), read from TensorFlow's real
allocator counters. No GPU here: the CPU's, which count a large tensor (its pool's), stand
in for a GPU's (`counted=("CPU",)`), read by the same calls; the logical CPU devices of
tests/conftest.py share them."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

from trainer.devicememory import TowerMemory

MIB = 1 << 20
CPUS = ("CPU",)


def hold(device: str, mib: int) -> tf.Tensor:
    with tf.device(device):
        return tf.fill([mib * MIB // 4], 1.0)  # float32


@pytest.mark.parametrize(
    "devices",
    [
        ["/CPU:0", "/CPU:1"],
        # A cluster worker's names, with its job and task.
        [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in (0, 1)],
    ],
)
def test_a_peak_is_each_intervals_and_the_workers(devices) -> None:
    memory = TowerMemory(devices, counted=CPUS)
    memory.interval_mb()  # from here on

    held = hold("/CPU:1", 64)
    del held  # freed: the peak still counts it
    first = memory.interval_mb()
    second = memory.interval_mb()  # nothing that large held since the first
    so_far = memory.peak_mb()

    assert first is not None and second is not None and so_far is not None
    assert len(first) == len(second) == len(so_far) == 2
    assert first[1] >= 64, first
    assert second[1] <= first[1] - 63, (first, second)
    assert so_far == first, (so_far, first)


def test_the_peak_since_the_start_counts_the_interval_under_way() -> None:
    # From what is held now: an earlier test's peak would hide this one's.
    tf.config.experimental.reset_memory_stats("CPU:0")
    memory = TowerMemory(["/CPU:0", "/CPU:1"], counted=CPUS)
    base = memory.interval_mb()
    held = hold("/CPU:0", 32)
    during = memory.peak_mb()
    del held
    assert base is not None and during is not None
    assert during[0] >= base[0] + 31, (base, during)


def test_towers_on_cpus_chart_none() -> None:
    # A CPU's counters miss a small model's tensors: a figure of theirs would be a lie.
    held = hold("/CPU:0", 8)
    memory = TowerMemory(["/CPU:0", "/CPU:1"])
    assert memory.interval_mb() is None and memory.peak_mb() is None
    del held


def test_a_device_whose_counters_cannot_be_read_is_logged_once(caplog) -> None:
    # No GPU here: TensorFlow finds no device to read, as on one whose type keeps no
    # counters. The job trains on, without the figures.
    memory = TowerMemory(["/GPU:0"])
    with caplog.at_level(logging.WARNING, logger="trainer.devicememory"):
        assert memory.interval_mb() is None
        assert memory.peak_mb() is None
        assert memory.interval_mb() is None
    [message] = caplog.messages
    assert message.startswith("device memory: not charted, its counters cannot be read: ")
