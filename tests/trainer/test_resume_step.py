"""What a run does at the step it resumes from: past its total, it is refused saying so; at an
eval step whose eval never ended, it evaluates first."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.trainer.progress_lines import progress_lines
from tests.trainer.test_resume import BASE, finished  # noqa: F401 - the shared fixture
from tests.trainer.test_run import run_worker, start_worker, with_


def files_of(job_dir: Path) -> dict[str, bytes]:
    """Every file under `job_dir` with its bytes."""
    return {
        str(path.relative_to(job_dir)): path.read_bytes()
        for path in sorted(job_dir.rglob("*"))
        if path.is_file()
    }


PAST_20 = (
    "Cannot resume: the latest checkpoint is at step 30, past this job's total of 20 steps. "
    "Give a larger total (steps or epochs), or start a new job to train from the start."
)


@pytest.mark.parametrize("given", ["spec-file", "spec-json"])
def test_a_run_past_the_total_is_refused_and_changes_nothing(finished, tmp_path, given):  # noqa: F811
    # Run again by hand with fewer steps than its checkpoints have: the refusal replaced
    # the finished job's spec.json with the refused spec and its succeeded result.json
    # with a failure, and added lines to its progress.jsonl. Nothing is lost now.
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    short = tmp_path / "short.json"
    short.write_text(json.dumps(with_(BASE, steps=20)))
    if given == "spec-json":  # its own spec.json says so (a hand edit, say)
        shutil.copy(short, job_dir / "spec.json")
    before = files_of(job_dir)
    assert {"spec.json", "result.json", "progress.jsonl"} <= set(before)

    proc = start_worker(job_dir, spec_file=short if given == "spec-file" else None)
    log, _ = proc.communicate(timeout=300)

    assert proc.returncode == 2, log
    assert f"ERROR trainer: {PAST_20}" in log
    assert log.rstrip().endswith("INFO trainer: invalid_spec (exit 2): nothing written"), log
    assert "tensorflow" not in log.lower(), log  # refused before TensorFlow's import
    after = files_of(job_dir)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []


def test_a_run_of_fewer_epochs_than_trained_is_refused_keeping_its_spec(finished, tmp_path):  # noqa: F811
    # Its spec shortened after the fact (`epochs` lowered on resume, say): not "succeeded"
    # at step 30 of 12. An epoch's steps are known once the data is loaded: the refusal
    # comes then, as the job's spec's (exit 2), with the result.json and end line the
    # service reads it from (it removes the last result.json before a worker starts).
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    spec_json = (job_dir / "spec.json").read_bytes()
    kept = sorted(path.name for path in (job_dir / "checkpoints").iterdir())
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps(with_(BASE, steps=None, epochs=1)))

    proc = start_worker(job_dir, spec_file=fewer)
    log, _ = proc.communicate(timeout=300)

    assert proc.returncode == 2, log
    result = json.loads((job_dir / "result.json").read_text())
    assert result["outcome"] == "invalid_spec"
    per_epoch = result["total"]
    assert 0 < per_epoch < 30, result
    message = (
        f"Cannot resume: the latest checkpoint is at step 30, past this job's total of 1 "
        f"epochs, {per_epoch} steps. Give a larger total (steps or epochs), or start a new "
        "job to train from the start."
    )
    assert result["message"] == message
    assert result["errors"] == [{"field": "epochs", "message": message}]
    assert result["step"] == 30
    assert (job_dir / "spec.json").read_bytes() == spec_json  # the refused spec is not its
    assert sorted(path.name for path in (job_dir / "checkpoints").iterdir()) == kept
    end = json.loads((job_dir / "progress.jsonl").read_text().splitlines()[-1])
    assert (end["event"], end["outcome"], end["phase"]) == ("end", "failed", "failed")
    assert (end["step"], end["total"]) == (30, per_epoch)


def eval_steps(job_dir: Path) -> list[int]:
    lines = (job_dir / "progress.jsonl").read_text().splitlines()
    return [line["step"] for line in map(json.loads, lines) if line["event"] == "eval"]


@pytest.mark.parametrize("evaluated", [False, True], ids=["eval-lost", "eval-done"])
def test_resume_at_an_eval_step_evaluates_it_once(finished, tmp_path, evaluated):  # noqa: F811
    # A stop during the eval of step 30 skips that eval and checkpoints step 30 (here: the
    # finished run had no eval at all). The resumed run evaluates step 30 first, unless
    # the run before it did.
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    if evaluated:
        with open(job_dir / "progress.jsonl", "a") as f:
            line = {"event": "eval", "step": 30, "total": 30, "eval_loss": 1.0, "time": 0.0}
            f.write(json.dumps(line) + "\n")

    code, result, log = run_worker(
        job_dir, with_(BASE, steps=40, eval={"every_steps": 10, "batches": 1})
    )

    assert code == 0, log
    assert eval_steps(job_dir) == [30, 40]


def test_finish_at_a_checkpoint_carries_the_loss_reported_of_its_step(finished, tmp_path):  # noqa: F811
    # Each checkpoint's step is reported, however quick the steps: a job finished at one
    # later ("finish here", `steps` set to its step) has that step's loss and accuracy as
    # its result. Steps of milliseconds reported about every 0.25 s, so the checkpoints of
    # 10 and 20 had no line of their own and such a finish's result said null.
    lines = progress_lines(finished / "progress.jsonl")
    reported = {line["step"]: line for line in lines if line["event"] == "progress"}
    assert {10, 20, 30} <= set(reported), sorted(reported)
    assert all(reported[step]["loss"] is not None for step in (10, 20, 30))

    # As if the run failed past step 20 and lost its later checkpoint: finished at 20.
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    shutil.rmtree(job_dir / "export")
    checkpoints = job_dir / "checkpoints"
    for path in [*checkpoints.glob("ckpt-30.*"), checkpoints / "checkpoint"]:
        path.unlink()

    code, result, log = run_worker(job_dir, with_(BASE, steps=20))

    assert code == 0, log
    assert (result["outcome"], result["step"]) == ("succeeded", 20)
    # Said as what this run did: "Trained 20 steps." read as if it had trained them.
    assert result["message"] == "Finished at step 20, its checkpoint: no step trained."
    assert result["metrics"]["loss"] == reported[20]["loss"]
    assert result["metrics"]["accuracy"] == reported[20]["accuracy"]


def test_a_torn_newest_checkpoint_past_the_total_is_set_aside_not_refused(finished, tmp_path):  # noqa: F811
    # A save of step 30 cut short (its index written in place, torn by a kill): the service
    # lists no such checkpoint, and resumes the job to step 25, past its whole step 20. Its
    # worker refused that run by the torn one's name (exit 2, and with nothing written, no
    # result.json for the service); it sets the torn one aside and trains from step 20.
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    shutil.rmtree(job_dir / "export")
    index = job_dir / "checkpoints" / "ckpt-30.index"
    os.truncate(index, index.stat().st_size // 2)

    code, result, log = run_worker(job_dir, with_(BASE, steps=25))

    assert code == 0, log
    assert (result["outcome"], result["step"]) == ("succeeded", 25)
    assert (job_dir / "checkpoints" / "damaged" / "ckpt-30.index").exists()
