"""Reading progress.jsonl a bounded part at a time, and folding its lines into the job's
snapshot and metric series."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from service import progress as progress_module
from service.progress import PROGRESS_READ_BYTES, fold_progress, read_progress_chunk
from service.schemas import JobPublic, ProgressPublic
from service.store import JobStore, MetricPoint


def test_fold_progress_lines() -> None:
    lines = [
        {"time": 1.0, "event": "start", "step": 0, "total": 40, "phase": "starting", "towers": 2},
        {"time": 2.0, "event": "progress", "step": 10, "total": 40, "loss": 1.5, "accuracy": 0.5,
         "examples_per_sec": 100.0, "eta_seconds": 6.0, "learning_rate": 0.01, "phase": "training"},
        {"time": 3.0, "event": "eval", "step": 20, "total": 40, "eval_loss": 1.2,
         "eval_accuracy": 0.6, "eval_examples": 640, "phase": "eval"},
        {"time": 4.0, "event": "checkpoint", "step": 20, "total": 40,
         "checkpoint": "checkpoints/ckpt-20", "phase": "checkpoint"},
        {"time": 5.0, "event": "trace", "step": 21, "tower_ms": [3.0, 4.0], "trace_dir": "x"},
    ]  # fmt: skip
    progress, eval, points = fold_progress(None, None, lines)
    assert progress == {
        "step": 21, "total": 40, "percent": 52.5, "phase": "checkpoint", "towers": 2,
        "loss": 1.5, "accuracy": 0.5, "examples_per_sec": 100.0, "eta_seconds": 6.0,
        "learning_rate": 0.01, "checkpoint": "checkpoints/ckpt-20", "tower_ms": [3.0, 4.0],
        "trace_step": 21, "updated_at": 5.0,
    }  # fmt: skip
    assert eval == {"step": 20, "loss": 1.2, "accuracy": 0.6, "examples": 640, "time": 3.0}
    assert points == [
        MetricPoint("loss", 10, 2.0, 1.5),
        MetricPoint("accuracy", 10, 2.0, 0.5),
        MetricPoint("examples_per_sec", 10, 2.0, 100.0),
        MetricPoint("learning_rate", 10, 2.0, 0.01),
        MetricPoint("eval_loss", 20, 3.0, 1.2),
        MetricPoint("eval_accuracy", 20, 3.0, 0.6),
    ]


@pytest.mark.parametrize("said", [7, 0, True, "7", None], ids=str)
def test_fold_progress_keeps_an_epochs_length_a_start_line_says(said: object) -> None:
    # A resume's `epochs` is checked by it; only a whole number of steps above 0 is one.
    start = {"time": 1.0, "event": "start", "step": 0, "total": 40, "towers": 1}
    progress, _, _ = fold_progress(None, None, [{**start, "steps_per_epoch": said}])
    assert progress is not None
    assert progress.get("steps_per_epoch") == (7 if said == 7 else None)


DATA = {"train_examples": 8000, "eval_examples": 2000, "classes": 10, "image_shape": [28, 28, 1]}


@pytest.mark.parametrize(
    "said",
    [
        DATA,
        {**DATA, "extra": 1},  # kept to what the API says
        {**DATA, "classes": True},
        {**DATA, "train_examples": -1},
        {**DATA, "image_shape": [28, 28]},
        {**DATA, "image_shape": "28x28x1"},
        {key: value for key, value in DATA.items() if key != "classes"},
        "8000",
        None,
    ],
    ids=str,
)
def test_fold_progress_keeps_the_data_a_start_line_says(said: object) -> None:
    # What the job trains on, for its status (it was in worker.log alone).
    start = {"time": 1.0, "event": "start", "step": 0, "total": 40, "towers": 1}
    progress, _, _ = fold_progress(None, None, [{**start, "data": said}])
    assert progress is not None
    well_formed = isinstance(said, dict) and said.items() >= DATA.items()
    assert progress.get("data") == (DATA if well_formed else None)


def test_fold_progress_trace_step_is_the_trace_lines_own() -> None:
    """Every progress line after a trace repeats its tower_ms: the step the times are from
    is the trace line's (a trace asked for at step 81, not the spec's trace_steps)."""
    lines = [
        {"time": 1.0, "event": "trace", "step": 6, "tower_ms": [1.0, 2.0]},
        {"time": 2.0, "event": "progress", "step": 10, "tower_ms": [1.0, 2.0]},
        {"time": 3.0, "event": "trace", "step": 81, "tower_ms": [3.0, 4.0]},
        {"time": 4.0, "event": "progress", "step": 90, "tower_ms": [3.0, 4.0]},
    ]
    progress, _, _ = fold_progress(None, None, lines)
    assert progress is not None
    assert (progress["tower_ms"], progress["trace_step"]) == ([3.0, 4.0], 81)


def test_fold_progress_trace_line_does_not_take_the_job_back_to_its_step() -> None:
    """The worker writes a trace's line once a background thread has read the trace, after
    reports of later steps: the job stays where they put it (it went back to step 22 of
    100 until the next report)."""
    lines = [
        {"time": 1.0, "event": "progress", "step": 30, "total": 100},
        {"time": 2.0, "event": "trace", "step": 22, "tower_ms": [3.0, 4.0]},
    ]
    progress, _, _ = fold_progress(None, None, lines)
    assert progress is not None
    assert (progress["step"], progress["percent"]) == (30, 30.0)
    assert (progress["tower_ms"], progress["trace_step"]) == ([3.0, 4.0], 22)


def test_fold_progress_phase_says_how_far_until_the_phase_changes() -> None:
    eval_lines = [
        {"time": 1.0, "event": "phase", "step": 20, "total": 40, "phase": "eval", "phase_done": 0, "phase_total": 50},
        {"time": 3.0, "event": "phase", "step": 20, "total": 40, "phase": "eval", "phase_done": 31, "phase_total": 50},
    ]  # fmt: skip
    progress, _, _ = fold_progress(None, None, eval_lines)
    assert progress is not None
    assert (progress["phase"], progress["phase_done"], progress["phase_total"]) == ("eval", 31, 50)
    progress, _, _ = fold_progress(
        progress,
        None,
        [
            {
                "time": 4.0,
                "event": "eval",
                "step": 20,
                "total": 40,
                "eval_loss": 1.0,
                "phase": "eval",
            }
        ],
    )
    assert progress is not None and "phase_done" not in progress and "phase_total" not in progress


def test_fold_progress_keeps_the_stage_a_preparing_worker_says_until_its_start() -> None:
    """A worker's preparation (`trainer.preparing`): the stage it is in, with how far where
    it says, in percent as `percent` rounds it; a stage without amounts drops the last
    one's; the `start` line (a phase, no stage) ends it."""

    def stage(at: float, name: str, **amounts: int) -> dict:
        return {"time": at, "event": "phase", "phase": "preparing", "stage": name, **amounts}

    progress, _, points = fold_progress(
        {"phase": "preparing", "step": 40, "total": 100},  # a resumed job's, as it starts
        None,
        [stage(1.0, "importing TensorFlow"), stage(3.0, "loading data", stage_done=0, stage_total=2000),
         stage(4.0, "loading data", stage_done=845, stage_total=2000)],
    )  # fmt: skip
    assert progress is not None and points == []
    assert {k: v for k, v in progress.items() if k != "updated_at"} == {
        "phase": "preparing",
        "stage": "loading data",
        "stage_done": 845,
        "stage_total": 2000,
        "stage_percent": 42.3,  # 42.25, a half rounded up as `percent` rounds
        "step": 40,
        "total": 100,
        "percent": 40.0,
    }
    shown = ProgressPublic.model_validate(progress)  # as the API shows them
    assert (shown.stage, shown.stage_done, shown.stage_total) == ("loading data", 845, 2000)
    progress, _, _ = fold_progress(progress, None, [stage(5.0, "building the model")])
    assert progress is not None and progress["stage"] == "building the model"
    assert not {"stage_done", "stage_total", "stage_percent"} & set(progress)
    # Amounts that are no count of anything (a hand-written line) say no fraction.
    for odd in ({"stage_done": 5, "stage_total": 0}, {"stage_done": -1, "stage_total": 9},
                {"stage_done": True, "stage_total": 9}, {"stage_done": 10, "stage_total": 9},
                {"stage_done": 1.5, "stage_total": 9}):  # fmt: skip
        folded, _, _ = fold_progress(progress, None, [stage(6.0, "loading data", **odd)])
        assert folded is not None and folded["stage"] == "loading data", odd
        assert "stage_percent" not in folded, odd
    start = {"time": 7.0, "event": "start", "step": 40, "total": 100, "phase": "starting"}
    progress, _, _ = fold_progress(progress, None, [start])
    assert progress is not None and progress["phase"] == "starting"
    assert not any(key.startswith("stage") for key in progress)


def test_fold_progress_continues_and_ends() -> None:
    progress, _, _ = fold_progress(
        {"step": 39, "total": 40, "eta_seconds": 1.0}, None,
        [{"time": 9.0, "event": "end", "step": 40, "total": 40, "outcome": "succeeded",
          "phase": "done"}],
    )  # fmt: skip
    assert progress is not None
    assert progress["percent"] == 100.0 and progress["eta_seconds"] == 0.0
    assert progress["phase"] == "done"


@pytest.mark.parametrize("outcome", ["cancelled", "failed"])
def test_fold_progress_of_a_job_that_did_not_finish_has_no_eta(outcome) -> None:
    progress, _, _ = fold_progress(
        {"step": 12, "total": 40, "eta_seconds": 30.0}, None,
        [{"time": 9.0, "event": "end", "step": 12, "total": 40, "outcome": outcome,
          "phase": "done"}],
    )  # fmt: skip
    assert progress is not None and progress["eta_seconds"] is None and progress["step"] == 12


def test_fold_progress_of_a_cancelled_run_ends_with_its_last_steps_numbers() -> None:
    # Its last report (up to 2 s before the stop) was of step 30: the job showed that
    # step's loss beside step 34, and its result another.
    progress, _, points = fold_progress(
        {"step": 30, "total": 40, "loss": 0.5, "accuracy": 0.75}, None,
        [{"time": 9.0, "event": "end", "step": 34, "total": 40, "outcome": "cancelled",
          "phase": "done", "loss": 0.25, "accuracy": 0.875}],
    )  # fmt: skip
    assert progress is not None
    assert (progress["step"], progress["loss"], progress["accuracy"]) == (34, 0.25, 0.875)
    assert {(p.name, p.step, p.value) for p in points} == {
        ("loss", 34, 0.25), ("accuracy", 34, 0.875)
    }  # fmt: skip
    # An end line without them (a failed run's, an older trainer's) leaves the last report's.
    failed, _, none = fold_progress(
        {"step": 30, "loss": 0.5}, None, [{"time": 9.0, "event": "end", "step": 31}]
    )
    assert failed is not None and failed["loss"] == 0.5 and none == []


def test_fold_progress_ignores_non_numbers() -> None:
    progress, _, points = fold_progress(
        None,
        None,
        [{"time": 1.0, "event": "progress", "step": 1, "loss": "nan?", "accuracy": True}],
    )
    assert progress is not None and progress["loss"] is None and progress["accuracy"] is None
    assert points == []


@pytest.mark.parametrize("event", [["eval"], {"eval": 1}, None, 7, "news"], ids=str)
def test_fold_progress_takes_a_line_of_an_unknown_event_for_where_the_job_is(
    event: object,
) -> None:
    progress, eval, points = fold_progress(
        None, None, [{"time": 1.0, "event": event, "step": 3, "eval_loss": 0.5, "loss": 1.0}]
    )
    assert progress == {"step": 3, "updated_at": 1.0, "percent": None}
    assert (eval, points) == (None, [])


def test_fold_progress_drops_non_finite_numbers_and_keeps_the_rest() -> None:
    # An older worker wrote NaN (json.loads reads it); an eval's loss can be infinite while
    # its accuracy means something. The job's JSON must stay writable, the accuracy kept.
    progress, eval, points = fold_progress(
        None,
        None,
        [
            {"time": 1.0, "event": "progress", "step": 5, "loss": float("nan"), "accuracy": 0.5},
            {"time": 2.0, "event": "eval", "step": 5, "eval_loss": float("inf"),
             "eval_accuracy": 0.75},
        ],
    )  # fmt: skip
    assert progress is not None and progress["loss"] is None and progress["accuracy"] == 0.5
    assert eval is not None and eval["loss"] is None and eval["accuracy"] == 0.75
    assert sorted((p.name, p.value) for p in points) == [
        ("accuracy", 0.5),
        ("eval_accuracy", 0.75),
    ]


@pytest.mark.parametrize(
    "line",
    [
        {"event": "eval", "step": "x", "eval_loss": 0.5},
        {"event": "eval", "step": 2.5, "eval_loss": 0.5},
        {"event": "progress", "step": 3, "tower_ms": [None]},
        {"event": "progress", "step": 3, "tower_ms": [1.0, "fast"]},
        {"event": "progress", "step": 3, "tower_ms": [[1.0], 2.0]},
        {"event": "trace", "step": 3, "tower_ms": [1.0, float("nan")]},
    ],
    ids=str,
)
def test_fold_progress_keeps_a_hand_written_lines_odd_values_out_of_the_job(
    tmp_path: Path, line: dict[str, object]
) -> None:
    """progress.jsonl may hold lines written by hand. An eval's step or a list of tower
    times of another type, stored as it was, failed the job's API JSON: a 500 for
    GET /jobs/{id}, the list of jobs that held it and the event stream. Folded, stored in a
    real store and read back as the API reads a job, a value of another type is left out:
    no step for the eval, the last good tower times for the snapshot."""
    store = JobStore(tmp_path / "jobs.db")
    job = store.create({"name": "hand-written", "priority": 0})
    before = {"step": 2, "tower_ms": [1.0, 2.0]}
    progress, eval, points = fold_progress(before, None, [{"time": 1.0, **line}])
    store.record_progress(job.id, offset=1, progress=progress, eval=eval, points=points)
    stored = store.get(job.id)
    assert stored is not None
    public = JobPublic.from_record(stored)
    assert public.progress is not None and public.progress.tower_ms == [1.0, 2.0]
    if line["event"] == "eval":
        assert public.eval is not None
        assert (public.eval.step, public.eval.loss) == (None, 0.5)


def test_percent_rounds_a_half_up_as_the_dashboard_does() -> None:
    # The page rounds with Math.round; Python's round() took 245 of 2000 to 12.2, not 12.3.
    from service.progress import percent_done

    assert percent_done(245, 2000) == 12.3
    assert percent_done(5, 400) == 1.3
    assert percent_done(1, 3) == 33.3 and percent_done(2, 3) == 66.7
    assert percent_done(2000, 2000) == 100.0
    assert percent_done(None, 2000) is None and percent_done(5, 0) is None
    snapshot, _, _ = fold_progress(None, None, [{"event": "progress", "step": 245, "total": 2000}])
    assert snapshot is not None and snapshot["percent"] == 12.3


def test_a_resumed_run_drops_the_points_a_lost_run_reported_past_its_start() -> None:
    # A run killed at about step 270 reported 244 and 264; resumed from its checkpoint at
    # 200 it reports 236 and 272, and the series mixed both runs' points. The point at the
    # checkpoint's own step is the resumed run's too: it reports on from there.
    from service.progress import restarted_at

    lost = [{"event": "progress", "step": step, "loss": 1.0} for step in (180, 200, 244, 264)]
    resumed = [
        {"event": "start", "step": 200, "total": 300},
        {"event": "progress", "step": 236, "loss": 0.5},
    ]
    _, _, points = fold_progress(None, None, lost + resumed)
    assert [(p.name, p.step) for p in points] == [("loss", 180), ("loss", 200), ("loss", 236)]
    assert restarted_at(lost + resumed) == 200
    assert restarted_at(lost) is None


def progress_line(step: int) -> bytes:
    return json.dumps({"time": 1.0, "event": "progress", "step": step, "loss": 0.5}).encode()


def test_progress_is_read_a_bounded_part_at_a_time_every_line_once(tmp_path: Path) -> None:
    """50 MB written while the service was down was read, parsed and folded at once; now
    each read takes at most PROGRESS_READ_BYTES, ends at a line's end, and the reads
    after it go on from there."""
    path = tmp_path / "progress.jsonl"
    path.write_bytes(b"".join(progress_line(step) + b"\n" for step in range(60_000)))
    assert path.stat().st_size > 3 * PROGRESS_READ_BYTES
    offset, steps = 0, []
    while True:
        lines, after = read_progress_chunk(path, offset)
        if after == offset:
            break
        assert 0 < after - offset <= PROGRESS_READ_BYTES
        steps += [line["step"] for line in lines]
        offset = after
    assert steps == list(range(60_000)) and offset == path.stat().st_size


def test_progress_read_leaves_an_unfinished_line_and_skips_what_is_no_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "progress.jsonl"
    assert read_progress_chunk(path, 0) == ([], 0)  # no file yet
    path.write_bytes(progress_line(1) + b'\n{"torn": \n[1, 2]\n' + progress_line(2)[:9])
    lines, offset = read_progress_chunk(path, 0)
    assert [line["step"] for line in lines] == [1] and offset == path.stat().st_size - 9
    assert read_progress_chunk(path, offset) == ([], offset)  # still being written
    with open(path, "ab") as f:
        f.write(progress_line(2)[9:] + b"\n")
    lines, end = read_progress_chunk(path, offset)
    assert [line["step"] for line in lines] == [2] and end == path.stat().st_size


def test_progress_read_moves_on_past_a_line_longer_than_a_read(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    long = b'{"event": "progress", "junk": "' + b"x" * 300_000
    path.write_bytes(long)
    assert read_progress_chunk(path, 0, limit=1000) == ([], 0)  # not ended: look again later
    with open(path, "ab") as f:
        f.write(b'"}\n' + progress_line(3) + b"\n")
    skipped = len(long) + 3
    assert read_progress_chunk(path, 0, limit=1000) == ([], skipped)
    lines, end = read_progress_chunk(path, skipped, limit=1000)
    assert [line["step"] for line in lines] == [3] and end == path.stat().st_size


def test_progress_read_skips_what_a_crashed_host_left(tmp_path: Path) -> None:
    # Brackets nested past the JSON parser's depth raise RecursionError, which ended the
    # read (and so the job's tail) at that line on every pass.
    path = tmp_path / "progress.jsonl"
    junk = [b"\x00" * 4093 + progress_line(9), b"[" * 10_000, b"1" + b"0" * 5000]
    path.write_bytes(b"".join(line + b"\n" for line in [progress_line(1), *junk, progress_line(2)]))
    lines, end = read_progress_chunk(path, 0)
    assert [line["step"] for line in lines] == [1, 2] and end == path.stat().st_size


def test_fold_progress_trace_line_is_a_step_the_job_has_done() -> None:
    """A trace line comes late, but its step was done: where no report has said so yet,
    the job is at least there (it showed trace_step 335 at step 330), and never goes back."""
    lines = [
        {"time": 1.0, "event": "progress", "step": 330, "total": 1000},
        {"time": 2.0, "event": "trace", "step": 335, "tower_ms": [3.0, 4.0]},
    ]
    progress, _, _ = fold_progress(None, None, lines)
    assert progress is not None
    assert (progress["step"], progress["percent"], progress["trace_step"]) == (335, 33.5, 335)
    later = [{"time": 3.0, "event": "trace", "step": 340, "tower_ms": [3.0, 4.0]}]
    progress, _, _ = fold_progress({**progress, "step": 350}, None, later)
    assert progress is not None and (progress["step"], progress["trace_step"]) == (350, 340)


def test_fold_progress_trace_without_times_says_why_in_their_place(tmp_path: Path) -> None:
    """A trace written whose times could not be read (no CUPTI on a GPU host) has a line
    with why in place of its times: the older trace's times go (reports after it have
    none), the reason stays until a trace with times; stored and read as the API reads it."""
    why = "Expected the trace to hold the towers' GPU kernels. Received: none"
    lines = [
        {"time": 1.0, "event": "trace", "step": 6, "tower_ms": [1.0, 2.0]},
        {"time": 2.0, "event": "progress", "step": 10, "total": 100, "tower_ms": [1.0, 2.0]},
        {"time": 3.0, "event": "trace", "step": 12, "tower_ms_error": why, "requested": True},
        {"time": 4.0, "event": "progress", "step": 20, "total": 100},
    ]
    progress, _, _ = fold_progress(None, None, lines)
    assert progress is not None
    assert (progress["trace_step"], progress["tower_ms_error"]) == (12, why)
    assert "tower_ms" not in progress
    store = JobStore(tmp_path / "jobs.db")
    job = store.create({"name": "untimed trace", "priority": 0})
    store.record_progress(job.id, offset=1, progress=progress, eval=None, points=[])
    stored = store.get(job.id)
    assert stored is not None
    public = JobPublic.from_record(stored).progress
    assert public is not None
    assert (public.tower_ms, public.tower_ms_error, public.trace_step) == (None, why, 12)
    timed = [{"time": 5.0, "event": "trace", "step": 30, "tower_ms": [3.0, 4.0]}]
    progress, _, _ = fold_progress(progress, None, timed)
    assert progress is not None and "tower_ms_error" not in progress
    assert (progress["tower_ms"], progress["trace_step"]) == ([3.0, 4.0], 30)


# A worker's lines in the order a job writes them, each with every field its event
# carries (`trainer.preparing`, `trainer.controller`): a preparation's stage, the start,
# a report, an eval phase and its eval, a checkpoint, a trace with times and one without,
# the end.
_A_JOBS_LINES = [
    {"time": 1.0, "event": "phase", "phase": "preparing", "stage": "loading data",
     "stage_done": 5, "stage_total": 20},
    {"time": 2.0, "event": "start", "step": 0, "total": 40, "phase": "starting", "towers": 2,
     "steps_per_epoch": 7, "data": {"train_examples": 200, "eval_examples": 56,
                                    "classes": 4, "image_shape": [8, 8, 1]}},
    {"time": 3.0, "event": "progress", "step": 10, "total": 40, "phase": "training",
     "loss": 1.5, "accuracy": 0.5, "examples_per_sec": 100.0, "eta_seconds": 6.0,
     "learning_rate": 0.01, "memory_mb": [12.5, 12.5], "tower_ms": [3.0, 4.0]},
    {"time": 4.0, "event": "phase", "step": 20, "total": 40, "phase": "eval", "phase_done": 1,
     "phase_total": 2},
    {"time": 5.0, "event": "eval", "step": 20, "total": 40, "eval_loss": 1.2,
     "eval_accuracy": 0.6, "eval_examples": 56},
    {"time": 6.0, "event": "checkpoint", "step": 20, "total": 40,
     "checkpoint": "checkpoints/ckpt-20", "phase": "checkpoint"},
    {"time": 7.0, "event": "trace", "step": 21, "tower_ms": [3.0, 4.0]},
    {"time": 8.0, "event": "trace", "step": 22, "tower_ms_error": "no kernels recorded"},
    {"time": 9.0, "event": "end", "step": 40, "total": 40, "outcome": "succeeded",
     "phase": "done", "loss": 1.0, "accuracy": 0.7},
]  # fmt: skip


def test_every_key_a_jobs_progress_keeps_is_declared() -> None:
    """ProgressPublic ignores a key it does not declare, as it must: a store from before
    `memory_shared` went still holds it in jobs' progress, which forbidden would make
    those jobs unreadable. So a key `fold_progress` comes to keep without a field of its
    own would vanish from the API unseen: every key kept after any line of a job's is
    declared, and every declared one is kept after some line (a field added to both gets
    its line above)."""
    declared = set(ProgressPublic.model_fields)
    kept: set[str] = set()
    progress = None
    for line in _A_JOBS_LINES:
        progress, _, _ = fold_progress(progress, None, [line])
        assert progress is not None
        kept |= progress.keys()
    assert kept - declared == set(), "kept in a job's progress, but not in ProgressPublic"
    assert declared - kept == set(), "declared, but no line of _A_JOBS_LINES sets it"


def _snapshot_key(node: ast.AST) -> ast.expr | None:
    """The key of `snapshot[key] = ...` (or `folded.snapshot[key] = ...`); else None."""
    if not isinstance(node, ast.Subscript) or not isinstance(node.ctx, ast.Store):
        return None
    named = node.value.id if isinstance(node.value, ast.Name) else None
    named = node.value.attr if isinstance(node.value, ast.Attribute) else named
    return node.slice if named == "snapshot" else None


def _strings(node: ast.AST | None) -> set[str]:
    """The strings of a tuple of them (`("loss", "accuracy")`)."""
    items = node.elts if isinstance(node, ast.Tuple) else []
    return {
        item.value
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str)
    }


def _names_stored(tree: ast.Module) -> set[str]:
    """The keys service/progress.py stores into a snapshot by name, or by a loop over a
    tuple of names (written there, or a module constant: `_SNAPSHOT_FIELDS`)."""
    constants = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    names = set()
    for node in ast.walk(tree):
        key = _snapshot_key(node)
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            keys = [_snapshot_key(inner) for inner in ast.walk(node)]
            if any(isinstance(key, ast.Name) and key.id == node.target.id for key in keys):
                loop = node.iter
                names |= _strings(constants.get(loop.id) if isinstance(loop, ast.Name) else loop)
    return names


def test_every_key_progress_py_stores_by_name_is_declared() -> None:
    """What no line above sets is still caught where it is written: every key the fold
    stores into a job's progress by name (a new `snapshot["grad_norm"] = ...`) is declared
    by ProgressPublic, whatever line would set it."""
    tree = ast.parse(Path(progress_module.__file__).read_text(encoding="utf-8"))
    stored = _names_stored(tree)
    assert len(stored) >= 20, f"the scan found only {sorted(stored)}: has the code moved?"
    assert stored - set(ProgressPublic.model_fields) == set()
