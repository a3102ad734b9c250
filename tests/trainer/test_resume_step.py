"""What a run does at the step it resumes from: past its total, it fails saying so; at an
eval step whose eval never ended, it evaluates first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.trainer.progress_lines import progress_lines
from tests.trainer.test_resume import BASE, finished  # noqa: F401 - the shared fixture
from tests.trainer.test_run import run_worker, with_


def test_resume_past_the_total_fails_saying_so(finished, tmp_path):  # noqa: F811
    # Its spec shortened after the fact (`epochs` lowered on resume, say): not "succeeded"
    # at step 30 of 20.
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir)
    (job_dir / "result.json").unlink()
    kept = sorted(path.name for path in (job_dir / "checkpoints").iterdir())

    code, result, log = run_worker(job_dir, with_(BASE, steps=20))

    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"] == (
        "Cannot resume: the latest checkpoint is at step 30, past this job's total of 20 "
        "steps. Give a larger total (steps or epochs), or start a new job to train from the "
        "start."
    )
    assert (result["step"], result["total"]) == (30, 20)
    assert sorted(path.name for path in (job_dir / "checkpoints").iterdir()) == kept
    end = json.loads((job_dir / "progress.jsonl").read_text().splitlines()[-1])
    assert (end["event"], end["outcome"], end["step"], end["total"]) == ("end", "failed", 30, 20)


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
    assert result["metrics"]["loss"] == reported[20]["loss"]
    assert result["metrics"]["accuracy"] == reported[20]["accuracy"]
