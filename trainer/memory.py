"""How much memory a worker may still take, so data that cannot fit fails in one line
instead of being killed by the kernel's out-of-memory killer (which the service would
take for a crash and restart, to be killed again).

The least of what the host has available (`MemAvailable` of /proc/meminfo: free memory
plus the page cache it could drop) and what this process's cgroup allows beyond what it
uses (cgroup v2 `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` -
`memory.usage_in_bytes`), as a container's limit is the one that kills.
"""

from __future__ import annotations

from pathlib import Path


class NotEnoughMemory(RuntimeError):
    """The data loaded needs more memory than the worker may take."""


def available_bytes(
    proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes this process may still allocate, or None when nothing says."""
    found = [_mem_available(proc / "meminfo"), *_cgroup_room(proc / "self" / "cgroup", cgroups)]
    known = [room for room in found if room is not None]
    return min(known) if known else None


def check_room(copied_bytes: int, available: int | None) -> None:
    """Refuse data whose start would take more than `available` (None: no check).

    The images loaded are already counted as used, and TensorFlow shares them as they are
    (`trainer.hostarrays`); `copied_bytes` are those it must copy first (an .npz array
    stored in Fortran order)."""
    _check(
        copied_bytes,
        available,
        "TensorFlow copies that much of the images loaded, which it cannot take as they are",
    )


def check_read(nbytes: int, source: str, available: int | None) -> None:
    """Refuse to read `nbytes` from `source` (as its header gives them) into more memory
    than `available`: one line now, where the out-of-memory killer would kill the worker
    halfway through the file (and the service would take that for a crash)."""
    _check(nbytes, available, f"{source} holds that much to read")


def _check(needed: int, available: int | None, why: str) -> None:
    if available is None or needed <= available:
        return
    raise NotEnoughMemory(
        f"Expected room in memory for {_gib(needed)} more: {why}. "
        f"Received: {_gib(available)} available to this worker. Train on fewer or smaller "
        "images (a narrower data.path glob), or run it where it has more memory"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _mem_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(own: Path, cgroups: Path) -> list[int | None]:
    """Limit less usage of each memory cgroup found for this process: v2 (`0::PATH`)
    under `cgroups`, v1 (`N:memory:PATH`) under `cgroups/memory`, and each root itself
    (inside a container's cgroup namespace, the process sees its own cgroup there)."""
    places = [(cgroups, "memory.max", "memory.current")]
    places.append((cgroups / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"))
    folders: list[tuple[Path, str, str]] = []
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            folders.append((cgroups / path.lstrip("/"), *places[0][1:]))
        elif "memory" in controllers.split(","):
            folders.append((places[1][0] / path.lstrip("/"), *places[1][1:]))
    return [_room(*place) for place in dict.fromkeys([*folders, *places])]


def _room(folder: Path, limit_file: str, usage_file: str) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max":
            return None
        limit, usage = int(limit_text), int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    if limit >= 2**60:  # v1's "no limit" is a page-rounded 2**63 - 1
        return None
    return max(limit - usage, 0)
