"""What a worker reads for the memory it may still take, and data refused for lack of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.memory import NotEnoughMemory, available_bytes, check_room

GIB = 2**30


def host(tmp_path: Path, available_kb: int, cgroup_line: str) -> tuple[Path, Path]:
    """A /proc and a /sys/fs/cgroup as Linux lays them out, with these values."""
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    cgroups.mkdir()
    (proc / "meminfo").write_text(
        f"MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_kb} kB\n"
    )
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    return proc, cgroups


def test_available_is_the_hosts_without_a_cgroup_limit(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, 8 * GIB // 1024, "0::/")
    (cgroups / "memory.max").write_text("max\n")
    (cgroups / "memory.current").write_text(f"{GIB}\n")
    assert available_bytes(proc, cgroups) == 8 * GIB


def test_available_is_a_v2_containers_room_under_its_limit(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, 20 * GIB // 1024, "0::/system.slice/job.scope")
    job = cgroups / "system.slice" / "job.scope"
    job.mkdir(parents=True)
    (job / "memory.max").write_text(f"{4 * GIB}\n")
    (job / "memory.current").write_text(f"{GIB}\n")
    assert available_bytes(proc, cgroups) == 3 * GIB


def test_available_is_a_v1_containers_room_under_its_limit(tmp_path: Path) -> None:
    proc, cgroups = host(tmp_path, 20 * GIB // 1024, "4:memory:/docker/abc")
    job = cgroups / "memory" / "docker" / "abc"
    job.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    (job / "memory.usage_in_bytes").write_text(f"{2 * GIB}\n")
    # The hierarchy's root says "no limit" (2**63 - 1, page-rounded): not a limit.
    (cgroups / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (cgroups / "memory" / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    assert available_bytes(proc, cgroups) == 4 * GIB


def test_available_on_this_machine_is_at_most_its_memory() -> None:
    total_kb = int(Path("/proc/meminfo").read_text().split()[1])
    available = available_bytes()
    assert available is not None and 0 < available <= total_kb * 1024


def test_data_needing_more_room_than_there_is_is_refused_naming_the_sizes() -> None:
    check_room(4 * GIB, 4 * GIB)  # the copy fits
    check_room(0, 0)  # images TensorFlow shares as loaded need no room beyond their own
    check_room(2 * GIB, None)  # nothing says: no check
    with pytest.raises(NotEnoughMemory) as refused:
        check_room(6 * GIB, 5 * GIB)
    assert str(refused.value) == (
        "Expected room in memory for 6.0 GiB more: TensorFlow copies that much of the images "
        "loaded, which it cannot take as they are. Received: 5.0 GiB available to this "
        "worker. Train on fewer or smaller images (a narrower data.path glob), or run it "
        "where it has more memory"
    )
