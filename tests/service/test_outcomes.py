"""How a worker's end becomes the job's final state."""

from __future__ import annotations

from typing import Any

import pytest

from service.outcomes import FinalState, crashed, final_state, interrupted
from service.store import JobState
from service.workers import WorkerExit

TAIL = ["last line"]


def reason(final: FinalState) -> str:
    assert final.error is not None, final
    return str(final.error["reason"])


def _final(exit: WorkerExit, result: dict[str, Any] | None, cancel: bool = False,
           killed: bool = False) -> FinalState:  # fmt: skip
    return final_state(
        exit, result, cancel_requested=cancel, killed_after_grace=killed, grace_seconds=30,
        log_tail=TAIL,
    )  # fmt: skip


def test_final_state_succeeded() -> None:
    final = _final(WorkerExit(code=0), {"outcome": "succeeded"})
    assert final.state is JobState.SUCCEEDED and final.error is None


def test_final_state_exit_0_without_result_failed() -> None:
    final = _final(WorkerExit(code=0), None)
    assert final.state is JobState.FAILED
    assert reason(final) == "The worker exited with code 0 but result.json is missing."


def test_final_state_failed_with_message_and_log() -> None:
    final = _final(WorkerExit(code=1), {"outcome": "failed", "message": "Loss is NaN at step 7."})
    assert final.state is JobState.FAILED
    assert final.error == {
        "reason": "Loss is NaN at step 7.", "exit_code": 1, "signal": None, "log_tail": TAIL,
    }  # fmt: skip


def test_final_state_invalid_spec_lists_errors() -> None:
    result = {"outcome": "invalid_spec", "message": "Invalid job spec",
              "errors": [{"field": "model.name", "message": "No module named 'x'"}]}  # fmt: skip
    final = _final(WorkerExit(code=2), result)
    assert reason(final) == "The worker rejected the spec: model.name: No module named 'x'"


def test_final_state_invalid_spec_with_errors_not_a_list_says_its_message() -> None:
    # Not the trainer's result.json (a custom model's code may write one): iterating the
    # number raised, every pass, and the job stayed running with its devices held.
    result = {"outcome": "invalid_spec", "message": "Invalid job spec", "errors": 5}
    final = _final(WorkerExit(code=2), result)
    assert reason(final) == "The worker rejected the spec: Invalid job spec"
    result = {"outcome": "invalid_spec", "errors": [{"field": "steps"}]}
    assert reason(_final(WorkerExit(code=2), result)) == (
        "The worker rejected the spec: steps: None"
    )


def test_final_state_result_that_is_no_json_object_is_said() -> None:
    # A result.json that is not a JSON object is judged as none, and the reason says it
    # was there, not that it was missing.
    def unreadable(exit: WorkerExit, cancel: bool = False) -> FinalState:
        return final_state(
            exit, None, cancel_requested=cancel, killed_after_grace=False, grace_seconds=30,
            log_tail=TAIL, result_unreadable=True,
        )  # fmt: skip

    assert reason(unreadable(WorkerExit(code=0))) == (
        "The worker exited with code 0 but result.json is not a JSON object."
    )
    assert reason(unreadable(WorkerExit(code=1))) == (
        "The worker exited with code 1. Its result.json is not a JSON object."
    )
    adopted = unreadable(WorkerExit())
    assert adopted.state is JobState.FAILED
    assert reason(adopted).startswith(
        "The worker ended with a result.json that is not a JSON object while the service "
        "was not its parent"
    )
    cancelled = unreadable(WorkerExit(), cancel=True)
    assert cancelled.state is JobState.CANCELLED
    assert reason(cancelled) == (
        "Cancelled: the worker ended while the service was not its parent, with a "
        "result.json that is not a JSON object."
    )
    assert crashed(WorkerExit(), None, cancel_requested=False, result_unreadable=True) == (
        "its worker (adopted after a restart, so its exit status is unknown) ended with a "
        "result.json that is not a JSON object"
    )


def test_final_state_cancelled_by_sigterm() -> None:
    final = _final(WorkerExit(code=3), {"outcome": "cancelled"}, cancel=True)
    assert final.state is JobState.CANCELLED and final.error is None


@pytest.mark.parametrize(
    "signum, name", [(9, "SIGKILL"), (11, "SIGSEGV"), (6, "SIGABRT"), (15, "SIGTERM")]
)
def test_final_state_signal_is_failed(signum: int, name: str) -> None:
    final = _final(WorkerExit(signal=signum), None)
    assert final.state is JobState.FAILED
    # The kernel's OOM killer says so in its own log only: the reason names it for SIGKILL.
    oom = (
        " A SIGKILL no one sent is most often the kernel's out-of-memory killer (`dmesg` "
        "says so): a job holds its images in memory, three times over as it starts."
        if name == "SIGKILL" else ""
    )  # fmt: skip
    assert final.error == {
        "reason": f"The worker was killed by {name} ({signum}).{oom}", "exit_code": None,
        "signal": name, "log_tail": TAIL,
    }  # fmt: skip


def test_final_state_cancel_killed_after_grace() -> None:
    final = _final(WorkerExit(signal=9), None, cancel=True, killed=True)
    assert final.state is JobState.CANCELLED
    assert reason(final) == (
        "Cancelled: the worker did not exit within 30 s of SIGTERM and was killed with SIGKILL."
    )


def test_final_state_unknown_exit_code() -> None:
    final = _final(WorkerExit(code=137), None)
    assert reason(final) == "The worker exited with code 137."


def test_final_state_adopted_worker_from_result() -> None:
    assert _final(WorkerExit(), {"outcome": "succeeded"}).state is JobState.SUCCEEDED
    assert _final(WorkerExit(), {"outcome": "cancelled"}).state is JobState.CANCELLED
    crashed = _final(WorkerExit(), None)
    assert crashed.state is JobState.FAILED
    assert reason(crashed).startswith("The worker ended without writing result.json")


def test_final_state_adopted_worker_cancelled_without_result() -> None:
    final = _final(WorkerExit(), None, cancel=True)
    assert final.state is JobState.CANCELLED
    assert reason(final) == (
        "Cancelled: the worker ended while the service was not its parent, without writing "
        "result.json."
    )


def test_interrupted_exit_3_without_cancel_request_requeues() -> None:
    # SIGTERM from someone else (a service manager stopping the control group): the worker
    # checkpointed and exited 3, but nobody asked to cancel, so the job is not over.
    why = interrupted(WorkerExit(code=3), {"outcome": "cancelled"}, cancel_requested=False)
    assert why == (
        "its worker was stopped by a SIGTERM that no cancel asked for (exit 3, after a checkpoint)"
    )


def test_interrupted_adopted_result_cancelled_without_cancel_request_requeues() -> None:
    why = interrupted(WorkerExit(), {"outcome": "cancelled"}, cancel_requested=False)
    assert why == (
        "its worker was stopped by a SIGTERM that no cancel asked for (result.json: cancelled)"
    )


@pytest.mark.parametrize(
    "exit, result, cancel",
    [
        (WorkerExit(code=3), {"outcome": "cancelled"}, True),  # a real cancel
        (WorkerExit(), {"outcome": "cancelled"}, True),
        (WorkerExit(code=0), {"outcome": "succeeded"}, False),
        (WorkerExit(code=1), {"outcome": "failed"}, False),
        (WorkerExit(), {"outcome": "succeeded"}, False),
        (WorkerExit(), None, False),  # adopted, no result: a crash, not an interruption
        (WorkerExit(signal=9), None, False),  # death by a signal stays a failure
        (WorkerExit(signal=15), None, False),  # SIGTERM before a handler: no checkpoint
    ],
)
def test_interrupted_only_for_an_unasked_sigterm_stop(
    exit: WorkerExit, result: dict[str, Any] | None, cancel: bool
) -> None:
    assert interrupted(exit, result, cancel_requested=cancel) is None


def test_crashed_only_for_a_signal_that_was_not_a_cancel() -> None:
    assert crashed(WorkerExit(signal=9), cancel_requested=False) == (
        "its worker was killed by SIGKILL (9), most often the kernel's out-of-memory killer "
        "(`dmesg` says so)"
    )
    assert crashed(WorkerExit(signal=11), cancel_requested=False) == (
        "its worker was killed by SIGSEGV (11)"
    )
    assert crashed(WorkerExit(signal=9), cancel_requested=True) is None
    assert crashed(WorkerExit(code=1), cancel_requested=False) is None
    # Adopted (no exit status known): a result.json decides; without one it was killed.
    assert crashed(WorkerExit(), {"outcome": "failed"}, cancel_requested=False) is None
    assert crashed(WorkerExit(), None, cancel_requested=True) is None
    assert crashed(WorkerExit(), None, cancel_requested=False) == (
        "its worker (adopted after a restart, so its exit status is unknown) ended "
        "without writing result.json"
    )


def test_final_state_signal_after_restarts_says_so() -> None:
    final = final_state(
        WorkerExit(signal=9), None, cancel_requested=False, killed_after_grace=False,
        grace_seconds=30, log_tail=[], restarts_after_kills=2,
    )  # fmt: skip
    assert final.state is JobState.FAILED and final.error is not None
    assert reason(final) == (
        "The worker was killed by SIGKILL (9). A SIGKILL no one sent is most often the "
        "kernel's out-of-memory killer (`dmesg` says so): a job holds its images in memory, "
        "three times over as it starts. The job had already been restarted from its "
        "checkpoint 2 times after its worker was killed, the most TOWERBOARD_CRASH_RETRIES allows."
    )


def test_final_state_without_a_result_on_a_full_disk_says_so() -> None:
    # Its result.json and its log's last lines (the trainer's line naming the full disk)
    # are on that disk too: the error said "exited with code 1" over a log cut mid-line.
    def failed(exit: WorkerExit, result: dict[str, Any] | None, free: int) -> str:
        return reason(
            final_state(
                exit,
                result,
                cancel_requested=False,
                killed_after_grace=False,
                grace_seconds=30,
                log_tail=TAIL,
                free_bytes=free,
            )  # fmt: skip
        )

    said = "The disk of its run directory had 4096 bytes free when its end was seen"
    assert failed(WorkerExit(code=1), None, 4096).startswith(
        f"The worker exited with code 1. {said}: a full disk fails a checkpoint"
    )
    assert "then resume the job" in failed(WorkerExit(code=1), None, 4096)
    assert said in failed(WorkerExit(code=0), None, 4096)
    assert said in failed(WorkerExit(), None, 4096)  # adopted
    assert "3.0 MiB free" in failed(WorkerExit(code=1), None, 3 * 2**20)
    # Room enough, or the worker said why in its result: no word of the disk.
    assert "disk" not in failed(WorkerExit(code=1), None, 2**30)
    assert "disk" not in failed(WorkerExit(code=1), {"outcome": "failed", "message": "m"}, 0)
    assert "disk" not in failed(WorkerExit(signal=9), None, 0)
