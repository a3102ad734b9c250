"""How a worker's end becomes a job's final state, or another attempt.

The exit code decides (0 succeeded, 1 failed, 2 invalid spec, 3 cancelled; a signal is a
crash), `result.json` supplies the message and metrics, and a failure carries the last
lines of worker.log. A worker adopted after a restart is not our child, so its exit code
is unknown and `result.json` alone decides; without one it crashed. A result.json that is
not a JSON object (the worker runs a custom model's code in its run directory, which may
write anything there) counts as none, and the reason says which it was
(`result_unreadable`).

Exit 3 means "stopped by SIGTERM after a checkpoint", and the service sends SIGTERM only
to cancel. A worker that stopped that way with no cancel requested was stopped by someone
else (a service manager stopping the whole control group, a shutdown): its job is not
over, so `interrupted` says why it runs again, from that checkpoint.

A worker killed by a signal nobody sent on purpose (the OOM killer's SIGKILL, a
segfault) lost only the steps since its last checkpoint: `crashed` says so, and the
supervisor restarts the job from there a bounded number of times (the same kill again
and again would otherwise loop forever) before `final_state` fails it.

A worker that failed without result.json on a disk with next to no space left
(`free_bytes`, measured as it ended) most likely failed for that: its result.json and its
log's last lines (the trainer's one line naming the full disk) are on that disk too, so
its error would otherwise say only "exited with code 1", over a log cut off mid-line.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from service.processes import signal_name
from service.store import JobState
from service.workers import WorkerExit
from trainer.rundir import ExitCode, Outcome

# Free space under which a disk is said to be the likely cause of a failure without a
# result: a save that found no room leaves its part-written files behind, so the disk stays
# about this full; a checkpoint is tens of MB and more.
LOW_DISK_BYTES = 64 * 2**20

_OUTCOME_STATES = {
    Outcome.SUCCEEDED.value: JobState.SUCCEEDED,
    Outcome.CANCELLED.value: JobState.CANCELLED,
    Outcome.FAILED.value: JobState.FAILED,
    Outcome.INVALID_SPEC.value: JobState.FAILED,
}


@dataclass(frozen=True)
class FinalState:
    state: JobState
    result: dict[str, Any] | None
    error: dict[str, Any] | None


def _no_result(unreadable: bool) -> str:
    """How a worker ended without a result it could be judged by."""
    if unreadable:
        return "with a result.json that is not a JSON object"
    return "without writing result.json"


def _result_reason(result: dict[str, Any]) -> str:
    message = str(result.get("message") or "").strip()
    errors = result.get("errors")
    if not isinstance(errors, list):  # not the trainer's: iterating it could raise
        errors = []
    if result.get("outcome") == Outcome.INVALID_SPEC.value:
        details = "; ".join(
            f"{e['field']}: {e.get('message')}" if isinstance(e, dict) and "field" in e else str(e)
            for e in errors
        )
        details = details or message
        return f"The worker rejected the spec: {details}"
    return message or f"The worker reported outcome {result.get('outcome')!r}."


def interrupted(
    exit: WorkerExit, result: dict[str, Any] | None, *, cancel_requested: bool
) -> str | None:
    """Why a worker's job is to be requeued rather than finished, or None when its end is
    final: it checkpointed and stopped on a SIGTERM that no cancel asked for."""
    if cancel_requested:
        return None
    if exit.code == ExitCode.CANCELLED:
        return "its worker was stopped by a SIGTERM that no cancel asked for (exit 3, after a checkpoint)"
    if (
        exit.code is None
        and exit.signal is None
        and result is not None
        and result.get("outcome") == Outcome.CANCELLED.value
    ):  # adopted, or ended while no service watched: result.json says how
        return (
            "its worker was stopped by a SIGTERM that no cancel asked for (result.json: cancelled)"
        )
    return None


def _restarts(restarts_after_kills: int) -> str:
    """What a failure after the last restart TOWERBOARD_CRASH_RETRIES allows adds to its
    reason ("" before any)."""
    if not restarts_after_kills:
        return ""
    times = "once" if restarts_after_kills == 1 else f"{restarts_after_kills} times"
    return (
        f" The job had already been restarted from its checkpoint {times} after its worker "
        "was killed, the most TOWERBOARD_CRASH_RETRIES allows."
    )


def _disk_hint(free_bytes: int | None) -> str:
    """What a failure without a result adds when its run directory's disk was (about)
    full as the worker ended ("" otherwise, or when unknown)."""
    if free_bytes is None or free_bytes >= LOW_DISK_BYTES:
        return ""
    free = f"{free_bytes} bytes" if free_bytes < 2**20 else f"{free_bytes / 2**20:.1f} MiB"
    return (
        f" The disk of its run directory had {free} free when its end was seen: a full "
        "disk fails a checkpoint, worker.log and result.json alike. Free space on it, then "
        "resume the job from its last checkpoint."
    )


# What a SIGKILL nobody sent (not the service's cancel) most often is; the kernel's log
# alone says so. Said in a failed job's error (`_oom_hint`) and in a requeue's reason.
_OOM_KILLER = "the kernel's out-of-memory killer (`dmesg` says so)"


def _oom_hint(signum: int) -> str:
    if signum != signal.SIGKILL:
        return ""
    return (
        f" A SIGKILL no one sent is most often {_OOM_KILLER}: a job holds its images in "
        "memory, three times over as it starts."
    )


def crashed(
    exit: WorkerExit,
    result: dict[str, Any] | None = None,
    *,
    cancel_requested: bool,
    result_unreadable: bool = False,
) -> str | None:
    """Why a worker's job may run again from its checkpoint (it was killed by a signal
    that was not the service's cancel, or, adopted after a restart so that its exit status
    is unknown, it ended without writing result.json: the same kill seen from outside), or
    None. `result_unreadable`: there is a result.json, but not a JSON object (`result` is
    None)."""
    if cancel_requested:
        return None
    if exit.signal is None and exit.code is None and result is None:
        return (
            "its worker (adopted after a restart, so its exit status is unknown) ended "
            + _no_result(result_unreadable)
        )
    if exit.signal is None:
        return None
    # For the requeue's log lines: a job requeued again and again after each start's
    # SIGKILL said only the signal until its retries ran out.
    oom = f", most often {_OOM_KILLER}" if exit.signal == signal.SIGKILL else ""
    return f"its worker was killed by {signal_name(exit.signal)} ({exit.signal}){oom}"


def final_state(
    exit: WorkerExit,
    result: dict[str, Any] | None,
    *,
    cancel_requested: bool,
    killed_after_grace: bool,
    grace_seconds: float,
    log_tail: list[str],
    restarts_after_kills: int = 0,
    result_unreadable: bool = False,
    free_bytes: int | None = None,
) -> FinalState:
    """The terminal state, result and error for a worker that has ended (ask `interrupted`
    first: a cancelled outcome without a cancel request is not terminal).
    `result_unreadable`: there is a result.json, but not a JSON object (`result` is None).
    `free_bytes`: the space left on its run directory's disk as it ended, if known."""

    def failed(reason: str) -> FinalState:
        return FinalState(
            JobState.FAILED,
            result,
            {
                "reason": reason,
                "exit_code": exit.code,
                "signal": signal_name(exit.signal) if exit.signal is not None else None,
                "log_tail": log_tail,
            },
        )

    if exit.signal is not None:
        name = signal_name(exit.signal)
        if cancel_requested:
            how = (
                f"did not exit within {grace_seconds:g} s of SIGTERM and was killed with {name}"
                if killed_after_grace
                else f"was stopped by {name} before it could write a checkpoint"
            )
            return FinalState(
                JobState.CANCELLED,
                result,
                {
                    "reason": f"Cancelled: the worker {how}.",
                    "exit_code": None,
                    "signal": name,
                    "log_tail": log_tail,
                },
            )
        return failed(
            f"The worker was killed by {name} ({exit.signal}).{_oom_hint(exit.signal)}"
            f"{_restarts(restarts_after_kills)}"
        )

    if exit.code is None:  # adopted: only result.json can tell
        if result is None and cancel_requested:
            return FinalState(
                JobState.CANCELLED,
                None,
                {
                    "reason": "Cancelled: the worker ended while the service was not its "
                    f"parent, {_no_result(result_unreadable)}.",
                    "exit_code": None,
                    "signal": None,
                    "log_tail": log_tail,
                },
            )
        if result is None:
            return failed(
                f"The worker ended {_no_result(result_unreadable)} while the service was not "
                "its parent, so its exit status is unknown; it most likely crashed."
                + _restarts(restarts_after_kills)
                + _disk_hint(free_bytes)
            )
        state = _OUTCOME_STATES.get(str(result.get("outcome")), JobState.FAILED)
        if state is JobState.FAILED:
            return failed(_result_reason(result))
        return FinalState(state, result, None)

    if exit.code == ExitCode.SUCCEEDED:
        if result is not None and result.get("outcome") == Outcome.SUCCEEDED.value:
            return FinalState(JobState.SUCCEEDED, result, None)
        if result is not None:
            said = f"says {result.get('outcome')!r}."
        else:
            said = "is not a JSON object." if result_unreadable else "is missing."
        hint = _disk_hint(free_bytes) if result is None else ""
        return failed(f"The worker exited with code 0 but result.json {said}{hint}")
    if exit.code == ExitCode.CANCELLED:
        return FinalState(JobState.CANCELLED, result, None)
    if exit.code in (ExitCode.FAILED, ExitCode.INVALID_SPEC) and result is not None:
        return failed(_result_reason(result))
    unreadable = " Its result.json is not a JSON object." if result_unreadable else ""
    hint = _disk_hint(free_bytes) if result is None else ""
    return failed(f"The worker exited with code {exit.code}.{unreadable}{hint}")
