"""Resuming a job from its run dir after what crashes, full disks and hands leave behind."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.trainer.test_run import TINY, run_worker, with_
from trainer.rundir import read_progress

# Checkpoints at 10, 20 and 30, the last of them final.
BASE = with_(
    TINY,
    towers=1,
    steps=30,
    eval={"every_steps": 0, "batches": 1},
    summaries={"scalars_every": 0, "histograms_every": 0, "images_every": 0, "trace_steps": []},
    checkpoint={"every_steps": 10, "every_seconds": 0, "keep": 3},
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    job_dir = tmp_path_factory.mktemp("finished")
    code, _, log = run_worker(job_dir, BASE)
    assert code == 0, log
    return job_dir


def resumable(finished: Path, to: Path) -> Path:
    """A copy of the finished job with 10 more steps to train: as if stopped at step 30."""
    shutil.copytree(finished, to)
    (to / "result.json").unlink()
    shutil.rmtree(to / "export")
    (to / "spec.json").write_text(json.dumps(with_(BASE, steps=40)))
    return to


def start_steps(job_dir: Path) -> list[int]:
    return [
        e["step"] for e in read_progress(job_dir / "progress.jsonl")[0] if e["event"] == "start"
    ]


DAMAGE = {
    "data-cut-short": lambda c: os.truncate(c / "ckpt-30.data-00000-of-00001", 100),
    "data-missing": lambda c: (c / "ckpt-30.data-00000-of-00001").unlink(),
    "index-missing": lambda c: (c / "ckpt-30.index").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_set_aside_for_the_one_before(finished, tmp_path, damage):
    # A save cut short (SIGKILL, a full disk) or a lost file. The job failed for good,
    # told its spec had changed ("does not fit this job's model"), or with a bare
    # "IndexError: Read less bytes than requested".
    job_dir = resumable(finished, tmp_path / "job")
    DAMAGE[damage](job_dir / "checkpoints")
    left = sorted(p.name for p in (job_dir / "checkpoints").glob("ckpt-30.*"))
    code, result, log = run_worker(job_dir)
    assert code == 0, log
    assert result["outcome"] == "succeeded" and result["step"] == 40
    assert "checkpoints/ckpt-30 is damaged" in log and "resumed from step 20" in log
    assert start_steps(job_dir) == [0, 20]
    # Out of the way of the listing and the rotation, but kept for a look.
    assert sorted(p.name for p in (job_dir / "checkpoints" / "damaged").iterdir()) == left
    assert sorted(p.name for p in (job_dir / "checkpoints").glob("*.index")) == [
        "ckpt-20.index",
        "ckpt-30.index",
        "ckpt-40.index",
    ]


def test_every_checkpoint_damaged_fails_saying_so_and_moves_nothing(finished, tmp_path):
    job_dir = resumable(finished, tmp_path / "job")
    for index in (job_dir / "checkpoints").glob("*.index"):
        index.unlink()
    before = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
    code, result, log = run_worker(job_dir)
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"].startswith(
        "CheckpointDamaged: Cannot resume: every checkpoint in checkpoints/ is damaged "
        "(checkpoints/ckpt-30 is damaged: "
    ), result["message"]
    assert result["message"].endswith(
        "Move checkpoints/ away to train the job again from step 0."
    ), result["message"]
    assert "does not fit" not in result["message"]
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == before


@pytest.mark.parametrize("state", ["missing", "unreadable"])
def test_a_lost_state_file_is_rebuilt_from_the_checkpoint_files(finished, tmp_path, state):
    # TensorFlow ignores a missing or unparsable `checkpoint` file: the job trained again
    # from step 0, over its own checkpoints.
    job_dir = resumable(finished, tmp_path / "job")
    state_file = job_dir / "checkpoints" / "checkpoint"
    if state == "missing":
        state_file.unlink()
    else:
        state_file.write_bytes(b"\x00garbage{")
    code, result, log = run_worker(job_dir)
    assert code == 0, log
    assert result["step"] == 40
    assert start_steps(job_dir) == [0, 30]
    assert f"checkpoints/checkpoint was {state}: rebuilt it" in log
    # Rotation still keeps 3: the rebuilt list is the manager's to rotate.
    assert sorted(p.name for p in (job_dir / "checkpoints").glob("*.index")) == [
        "ckpt-20.index",
        "ckpt-30.index",
        "ckpt-40.index",
    ]
