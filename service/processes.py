"""Recognising a process again by pid after a restart, without trusting a reused pid; and
naming the signal that killed one.

A pid alone is not an identity: after a reboot or a long time the number is reused. A
process is the one we started when /proc shows the same pid, the same start time (clock
ticks since boot, fixed for the life of a process) and a command line holding a marker
we put there (a job dir, a TensorBoard logdir).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def signal_name(signum: int) -> str:
    """`SIGKILL` for 9; `signal 99` for a number this platform has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it do not.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def start_time(pid: int) -> int | None:
    """The start time of a process in clock ticks since boot, or None when it is gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def is_same_process(pid: int, started: int | None, marker: str) -> bool:
    """True when `pid` is alive, started at `started` and has `marker` in its argv."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):  # a zombie has ended; it only awaits reaping
        return False
    if started is not None and stat[1] != started:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return os.fsencode(marker) in argv


def find_by_argv(*args: str) -> list[int]:
    """Living processes whose argv holds `args` in a row (`"--job-dir", path`, say)."""
    wanted = [os.fsencode(arg) for arg in args]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        holds = any(argv[i : i + len(wanted)] == wanted for i in range(len(argv) - len(wanted) + 1))
        stat = _proc_stat(int(entry.name)) if holds else None
        if stat is not None and stat[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)
