"""Resuming a job from its run dir after what crashes, full disks and hands leave behind."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator

from tests.trainer.beside import start_beside
from tests.trainer.progress_lines import progress_lines
from tests.trainer.test_run import TINY, run_worker, start_worker, with_

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
    return [e["step"] for e in progress_lines(job_dir / "progress.jsonl") if e["event"] == "start"]


def test_a_full_disk_fails_the_job_in_one_line_naming_the_file(small_disk):
    # The disk fills mid-run: the worker died on a chain of tracebacks (the failed step's
    # error, then progress.jsonl's and result.json's own), its log ending on TensorFlow's
    # stack, with no word of what to do.
    job_dir = small_disk / "job"
    spec = with_(
        BASE,
        steps=100_000,
        summaries={
            "scalars_every": 10,
            "histograms_every": 0,
            "images_every": 0,
            "trace_steps": [],
        },
        checkpoint={"every_steps": 100, "every_seconds": 0, "keep": 2},
    )
    proc = start_worker(job_dir, spec)
    deadline = time.monotonic() + 120
    while not (job_dir / "checkpoints" / "ckpt-100.index").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.01)
    # Unbuffered: nothing left to flush (and fail) on close.
    with open(small_disk / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 65536)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, log
    last = log.rstrip().splitlines()[-1]
    assert " INFO trainer: failed (exit 1): No space left on device writing " in last, log[-3000:]
    assert last.endswith(
        ": free space on its disk, then run the job again: it trains on from its latest "
        "checkpoint (from step 0 where it has none)."
    ), last
    if "could not write result.json: [Errno 28] No space left on device" not in log:
        # The space a failed write had taken came back (a checkpoint's partial file,
        # removed) and result.json took it: it must say how the job ended. The usual
        # case is the line; this one came under a CI run's load.
        result = json.loads((job_dir / "result.json").read_text())
        assert result["outcome"] == "failed" and "No space left" in result["message"], result
    # With space again, the job resumes from its last checkpoint.
    (small_disk / "filler").unlink()
    code, result, log = run_worker(job_dir, with_(spec, steps=300))
    assert code == 0, log
    assert "resumed from step" in log and result["step"] == 300


def _remount_read_only(mount: Path) -> None:
    """Make the bind mount at `mount` read-only. The kernel refuses (EBUSY, "mount point
    is busy") while a file is open for writing through it, as one of the worker's saves
    every 10 steps has: a CI run under load met one. Tried again until a moment between
    saves, for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        done = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(mount)], capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        assert "busy" in done.stderr and time.monotonic() < deadline, done.stderr
        time.sleep(0.005)


def test_a_disk_problem_of_a_service_job_says_to_resume_it(tmp_path, monkeypatch):
    # A worker started by the service is no command the user runs again: its job is
    # resumed (Resume, `towerboard resume`), and says so.
    from trainer.run import _disk_problem
    from trainer.rundir import RunDir

    full = OSError(28, "No space left on device", str(tmp_path / "checkpoints" / "ckpt-5.index"))
    monkeypatch.delenv("TOWERBOARD_JOB_ID", raising=False)
    assert _disk_problem(full, RunDir(tmp_path)) == (
        "No space left on device writing checkpoints/ckpt-5.index: free space on its disk, "
        "then run the job again: it trains on from its latest checkpoint (from step 0 where "
        "it has none)."
    )
    monkeypatch.setenv("TOWERBOARD_JOB_ID", "abc")
    assert ", then resume the job: it trains on from " in (
        _disk_problem(full, RunDir(tmp_path)) or ""
    )


def test_a_run_dir_made_read_only_fails_the_job_in_one_line(small_disk):
    # The run dir goes read-only mid-run (a remount after disk errors): here a read-only
    # bind mount over it, so files the worker holds open stay writable and the next
    # checkpoint is the first write to fail.
    job_dir = small_disk / "job"
    proc = start_worker(job_dir, with_(BASE, steps=100_000))
    deadline = time.monotonic() + 120
    while not (job_dir / "checkpoints" / "ckpt-10.index").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.01)
    subprocess.run(["mount", "--bind", str(job_dir), str(job_dir)], check=True)
    try:
        _remount_read_only(job_dir)
        log, _ = proc.communicate(timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(job_dir)], check=False)
    assert proc.returncode == 1, log
    last = log.rstrip().splitlines()[-1]
    # The first write refused is the next checkpoint's, or, when the remount came while
    # step 10's save was still writing its state file after its index, that file.
    assert re.search(
        r" INFO trainer: failed \(exit 1\): Read-only file system writing "
        r"checkpoints/(ckpt-|checkpoint\.tmp)",
        last,
    ), last
    assert last.endswith(
        ": make it writable, then run the job again: it trains on from its latest checkpoint "
        "(from step 0 where it has none)."
    ), last


# --- resumes started beside each other ------------------------------------------------
# Each test below reads one worker resuming a damaged copy of the finished job; the
# resumes start, with the others', when the first of them asks (tests/trainer/beside.py):
# two at a time, as a worker's start-up keeps one core of two busy. They come last in the
# module, after the tests that fill or remount a disk under a running worker. None of them
# depends on how fast its worker goes.

Run = tuple[int, dict, str, Path, list[str]]  # exit code, result, log, run dir, files seen
BESIDE: dict[str, Callable[[Path, Path], Run]] = {}  # test -> its run (finished job, folder)


def beside_run(*tests: str) -> Callable[[Callable[[Path, Path], Run]], Callable[[Path, Path], Run]]:
    """Register the decorated run as the one the named tests read."""

    def register(run: Callable[[Path, Path], Run]) -> Callable[[Path, Path], Run]:
        for test in tests:
            BESIDE[test] = run
        return run

    return register


@pytest.fixture(scope="module")
def beside(request, tmp_path_factory, finished) -> Iterator[dict[str, Future]]:
    runs = {name: partial(run, finished) for name, run in BESIDE.items()}
    yield from start_beside(request, tmp_path_factory, runs)


@pytest.fixture
def run(beside, request) -> Run:
    """This test's run (BESIDE), once it has ended."""
    return beside[request.node.name].result()


DAMAGE = {
    "data-cut-short": lambda c: os.truncate(c / "ckpt-30.data-00000-of-00001", 100),
    "data-missing": lambda c: (c / "ckpt-30.data-00000-of-00001").unlink(),
    "index-missing": lambda c: (c / "ckpt-30.index").unlink(),
}


def _damaged(damage: str) -> Callable[[Path, Path], Run]:
    def resume(finished: Path, folder: Path) -> Run:
        job_dir = resumable(finished, folder / "job")
        DAMAGE[damage](job_dir / "checkpoints")
        left = sorted(p.name for p in (job_dir / "checkpoints").glob("ckpt-30.*"))
        return (*run_worker(job_dir), job_dir, left)

    return resume


for _damage in DAMAGE:
    beside_run(f"test_a_damaged_newest_checkpoint_is_set_aside_for_the_one_before[{_damage}]")(
        _damaged(_damage)
    )


def index_names(job_dir: Path) -> list[str]:
    """The checkpoints the job's folder lists (their .index files), sorted."""
    return sorted(p.name for p in (job_dir / "checkpoints").glob("*.index"))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_set_aside_for_the_one_before(run, damage):
    # A save cut short (SIGKILL, a full disk) or a lost file. The job failed for good,
    # told its spec had changed ("does not fit this job's model"), or with a bare
    # "IndexError: Read less bytes than requested".
    code, result, log, job_dir, left = run
    assert code == 0, log
    assert result["outcome"] == "succeeded" and result["step"] == 40
    assert "checkpoints/ckpt-30 is damaged" in log and "resumed from step 20" in log
    assert start_steps(job_dir) == [0, 20]
    # Out of the way of the listing and the rotation, but kept for a look.
    assert sorted(p.name for p in (job_dir / "checkpoints" / "damaged").iterdir()) == left
    assert index_names(job_dir) == ["ckpt-20.index", "ckpt-30.index", "ckpt-40.index"]


@beside_run("test_every_checkpoint_damaged_fails_saying_so_and_moves_nothing")
def _every_index_lost(finished: Path, folder: Path) -> Run:
    job_dir = resumable(finished, folder / "job")
    for index in (job_dir / "checkpoints").glob("*.index"):
        index.unlink()
    before = sorted(p.name for p in (job_dir / "checkpoints").iterdir())
    return (*run_worker(job_dir), job_dir, before)


def test_every_checkpoint_damaged_fails_saying_so_and_moves_nothing(run):
    code, result, log, job_dir, before = run
    assert code == 1, log
    assert result["outcome"] == "failed"
    assert result["message"].startswith(
        "CheckpointDamaged: Cannot resume: every checkpoint in checkpoints/ is damaged "
        "(checkpoints/ckpt-30 is damaged: "
    ), result["message"]
    assert result["message"].endswith(
        "To train it again from step 0, submit its spec as a new job (or, running it by "
        "hand, move checkpoints/ away)."
    ), result["message"]
    assert "does not fit" not in result["message"]
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == before
    # The job stays at the step it had reached: the failed run's end line has none (it had
    # read none), where a 0 showed the job at step 0 beside its latest checkpoint.
    lines = progress_lines(job_dir / "progress.jsonl")
    assert lines[-1]["event"] == "end" and lines[-1]["outcome"] == "failed"
    assert lines[-1]["phase"] == "failed", lines[-1]  # not "done": it trained nothing
    assert "step" not in lines[-1], lines[-1]
    assert result["step"] is None


def _state_file(state: str) -> Callable[[Path, Path], Run]:
    def resume(finished: Path, folder: Path) -> Run:
        job_dir = resumable(finished, folder / "job")
        state_file = job_dir / "checkpoints" / "checkpoint"
        if state == "missing":
            state_file.unlink()
        else:
            state_file.write_bytes(b"\x00garbage{")
        return (*run_worker(job_dir), job_dir, [])

    return resume


for _state in ("missing", "unreadable"):
    beside_run(f"test_a_lost_state_file_is_rebuilt_from_the_checkpoint_files[{_state}]")(
        _state_file(_state)
    )


@pytest.mark.parametrize("state", ["missing", "unreadable"])
def test_a_lost_state_file_is_rebuilt_from_the_checkpoint_files(run, state):
    # TensorFlow ignores a missing or unparsable `checkpoint` file: the job trained again
    # from step 0, over its own checkpoints.
    code, result, log, job_dir, _ = run
    assert code == 0, log
    assert result["step"] == 40
    assert start_steps(job_dir) == [0, 30]
    assert f"checkpoints/checkpoint was {state}: rebuilt it" in log
    # Rotation still keeps 3: the rebuilt list is the manager's to rotate.
    assert index_names(job_dir) == ["ckpt-20.index", "ckpt-30.index", "ckpt-40.index"]


@beside_run("test_what_a_save_cut_short_left_is_removed")
def _torn_save(finished: Path, folder: Path) -> Run:
    # SIGKILL while TensorFlow writes ckpt-40 leaves ckpt-40_temp/ (as large as a
    # checkpoint, by the time the data is written) that nothing ever removed.
    job_dir = resumable(finished, folder / "job")
    torn = job_dir / "checkpoints" / "ckpt-40_temp"
    torn.mkdir()
    (torn / "part-00000-of-00001.data-00000-of-00001.tempstate8172121586601828615").write_bytes(
        b"\0" * 4096
    )
    return (*run_worker(job_dir), job_dir, [])


def test_what_a_save_cut_short_left_is_removed(run):
    code, result, log, job_dir, _ = run
    assert code == 0, log
    assert "removed ckpt-40_temp, left by a save cut short" in log
    assert "resumed from step 30" in log and result["step"] == 40
    assert not (job_dir / "checkpoints" / "ckpt-40_temp").exists()


# Scalars every 5 steps, histograms and evals every 10, checkpoints at 20 and 40.
CHARTED = with_(
    TINY,
    towers=1,
    eval={"every_steps": 10, "batches": 1},
    summaries={
        "scalars_every": 5,
        "histograms_every": 10,
        "images_every": 0,
        "trace_steps": [],
    },
    checkpoint={"every_steps": 20, "every_seconds": 0, "keep": 3},
)


def charted_past_its_checkpoint(tmp_path: Path) -> Path:
    """A run of CHARTED to its end, then as if killed at its last step before it saved:
    its latest checkpoint at step 20, its charts on to step 40."""
    job_dir = tmp_path / "job"
    code, _, log = run_worker(job_dir, CHARTED)
    assert code == 0, log
    for lost in [
        *(job_dir / "checkpoints").glob("ckpt-40.*"),
        job_dir / "checkpoints" / "checkpoint",
    ]:
        lost.unlink()
    (job_dir / "result.json").unlink()
    return job_dir


def test_a_run_resumed_from_an_older_checkpoint_draws_each_step_once_in_tensorboard(tmp_path):
    # A worker killed past its latest checkpoint (the OOM killer): its next attempt trains
    # those steps again. TensorBoard's Python loader, the service's (--load_fast false),
    # drew them twice: every chart went back from where the dead worker got to.
    job_dir = charted_past_its_checkpoint(tmp_path)
    code, result, log = run_worker(job_dir)
    assert code == 0 and "resumed from step 20" in log, log
    for run, every in (("train", 5), ("eval", 10)):
        tags = tensorboard_steps(job_dir, run)
        assert tags
        for tag, steps in tags.items():
            histograms = ("weights/", "gradients/", "activations/", "zero_fraction/")
            due = 10 if tag.startswith(histograms) else every
            # The job's first step writes each kind too, but the times: it is untimed.
            untimed = run == "eval" or tag in ("step_time_ms", "examples_per_sec")
            first = [] if untimed else [1]
            assert steps == [*first, *range(due, 41, due)], (run, tag, steps)


def tensorboard_steps(job_dir: Path, run: str) -> dict[str, list[int]]:
    """Each tag's steps in `run` as TensorBoard's Python loader (the service's) reads them:
    what a later process's START drops, dropped. The graph each process writes (step 0)
    aside: the graphs plugin shows the last."""
    loaded = plugin_event_accumulator.EventAccumulator(
        str(job_dir / "tb" / run), size_guidance={plugin_event_accumulator.TENSORS: 0}
    )
    loaded.Reload()
    return {
        tag: [event.step for event in loaded.Tensors(tag)]
        for tag in loaded.Tags()["tensors"]
        if tag != "__run_graph__"
    }


def test_a_job_finished_at_a_checkpoint_charts_nothing_past_it(tmp_path):
    # "Finish here": a run that went on past its checkpoint of step 20 (failed at 40, its
    # later checkpoint lost), resumed with `steps` 20, trains no step. TensorBoard kept
    # that run's train points past 20, for a job that succeeded at 20 of 20 (HParams
    # showed them as its last values), and drew the eval of step 20 twice.
    job_dir = charted_past_its_checkpoint(tmp_path)
    shutil.rmtree(job_dir / "export")

    code, result, log = run_worker(job_dir, with_(CHARTED, steps=20))

    assert code == 0, log
    assert (result["outcome"], result["step"], result["eval"]["step"]) == ("succeeded", 20, 20)
    train = tensorboard_steps(job_dir, "train")
    assert train["loss"] == [1, 5, 10, 15, 20], train["loss"]
    assert train["weights/dense/kernel"] == [1, 10, 20], train["weights/dense/kernel"]
    assert tensorboard_steps(job_dir, "eval") == {"loss": [10, 20], "accuracy": [10, 20]}
