"""Reading a job's metrics on (`GET /metrics?after_step=N`, `towerboard metrics
--after-step N`): the worker writes a step's `progress` line, then evaluates that step
and writes its `eval` line, a moment to seconds later. A read between the two must not
give the step without its eval, or a client reading on after it never gets that eval.

A resumed job can change steps a client has read: a resume from a checkpoint older than
its newest step trains the steps after it again, and a resume after a stop during an eval
adds that eval to a step a cancelled job had given without it. Each such change makes
the series a revision newer, and a read on past it from an older revision is refused
(`Rewound`, a 409), saying the step to read again after."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from service.progress import fold_progress, restarted_at
from service.store import JobState, JobStore, MetricPoint, Rewound, UnknownRevision
from tests.service.harness import job_spec, stand_in_service
from tests.service.test_client import towerboard
from trainer.spec import JobSpec

# The tiny job's cadence: 40 steps, an eval every 20 (and the final one, at 40).
SPEC = JobSpec.model_validate(job_spec()).model_dump(mode="json")

Point = tuple[str, int, float]


class Worker:
    """Progress lines folded into the store as the supervisor folds a worker's."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        self.progress: dict[str, Any] | None = None
        self.eval: dict[str, Any] | None = None
        self.offset = 0

    def write(self, event: str, step: int, **fields: Any) -> None:
        line = {"event": event, "step": step, "time": float(step), "total": 40, **fields}
        progress, eval, points = fold_progress(self.progress, self.eval, [line])
        self.offset += 1
        self.store.record_progress(
            self.job_id,
            offset=self.offset,
            progress=progress,
            eval=eval,
            points=points,
            forget_after=restarted_at([line]),
        )
        self.progress, self.eval = progress, eval

    def report(self, step: int, **fields: Any) -> None:
        self.write("progress", step, loss=1 / step, accuracy=step / 100, **fields)

    def evaluate(self, step: int, **fields: Any) -> None:
        self.write("eval", step, eval_loss=2 / step, eval_accuracy=step / 200, **fields)

    def restart(self, step: int, **fields: Any) -> None:
        """The job's next attempt starts, its worker restoring the checkpoint of `step`."""
        assert self.store.mark_running(self.job_id, devices=["cpu:0"])
        self.write("start", step, phase="starting", **fields)


def read(
    store: JobStore,
    job_id: str,
    after: int | None = None,
    names: tuple[str, ...] = (),
    revision: int | None = None,
) -> list[Point]:
    """An exact read, as `GET /metrics` without `points` reads: (series, step, value)."""
    rows = store.stream_metrics(job_id, names=names, after_step=after, revision=revision)
    return [(name, step, value) for name, step, _, value in rows]


class Reader:
    """A client that reads on as the API says: after the last step it got, sending the
    revision its last answer carried; refused for a rewind, it drops its points after the
    step the refusal gives and reads on from there."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        self.points: dict[tuple[str, int], float] = {}
        self.after: int | None = None
        self.revision: int | None = None
        self.rewinds: list[tuple[int, int]] = []  # (step read again after, revision)

    def read(self) -> None:
        while True:
            try:
                rows = self.store.stream_metrics(
                    self.job_id, after_step=self.after, revision=self.revision
                )
            except Rewound as e:
                assert self.after is not None and e.after < self.after
                self.points = {key: v for key, v in self.points.items() if key[1] <= e.after}
                self.after, self.revision = e.after, e.revision
                self.rewinds.append((e.after, e.revision))
                continue
            self.revision = rows.revision
            for name, step, _, value in rows:
                assert (name, step) not in self.points  # a point given once
                self.points[(name, step)] = value
                self.after = step if self.after is None else max(self.after, step)
            return

    def matches(self) -> bool:
        whole = {(name, step): value for name, step, value in read(self.store, self.job_id)}
        return self.points == whole


def steps(points: list[Point]) -> list[int]:
    return sorted({step for _, step, _ in points})


def running(store: JobStore, spec: dict[str, Any] = SPEC) -> tuple[str, Worker]:
    job = store.create(spec)
    assert store.mark_running(job.id, devices=["cpu:0"])
    worker = Worker(store, job.id)
    worker.write("start", 0, phase="starting")
    return job.id, worker


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.db")


def test_a_step_due_an_eval_is_read_once_its_eval_is_in(store: JobStore) -> None:
    job_id, worker = running(store)
    worker.report(10)
    assert steps(read(store, job_id)) == [10]  # no eval due at 10: not held
    worker.report(20)  # an eval is due at 20, and has not come
    assert steps(read(store, job_id)) == [10]
    assert read(store, job_id, after=10) == []
    assert steps(read(store, job_id, after=10, names=("eval_accuracy", "loss"))) == []
    # A read of no eval series has nothing to wait for.
    assert read(store, job_id, after=10, names=("loss",)) == [("loss", 20, 0.05)]
    worker.evaluate(20)
    assert sorted(read(store, job_id, after=10)) == [
        ("accuracy", 20, 0.2), ("eval_accuracy", 20, 0.1), ("eval_loss", 20, 0.1),
        ("loss", 20, 0.05),
    ]  # fmt: skip
    worker.report(30)  # not due: read at once
    assert steps(read(store, job_id, after=20)) == [30]
    worker.report(40)  # the last step: its final eval comes after it
    assert steps(read(store, job_id, after=30)) == []
    worker.evaluate(40)
    assert steps(read(store, job_id, after=30)) == [40]
    assert ("eval_loss", 40, 0.05) in read(store, job_id, after=30)


def test_reading_on_after_every_line_misses_no_point(store: JobStore) -> None:
    job_id, worker = running(store)
    got: list[Point] = []
    last: int | None = None

    def read_on() -> None:
        nonlocal last
        more = read(store, job_id, after=last)
        got.extend(more)
        last = max(steps(more), default=last)

    for step in range(1, 41):
        worker.report(step)
        read_on()
        if step % 20 == 0:
            worker.write("phase", step, phase="eval", phase_done=0, phase_total=2)
            read_on()
            worker.evaluate(step)
            read_on()
        if step % 20 == 0 and step < 40:
            worker.write("checkpoint", step, checkpoint=f"checkpoints/ckpt-{step}")
            read_on()
    worker.write("end", 40, outcome="succeeded", phase="done")
    read_on()
    assert store.finish(job_id, JobState.SUCCEEDED, result={}, error=None)
    read_on()
    everything = read(store, job_id)
    assert sorted(got) == sorted(everything)
    assert [step for name, step, _ in everything if name == "eval_loss"] == [20, 40]


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_an_ended_job_holds_no_step_back(store: JobStore, state: JobState) -> None:
    # Its eval never came (a stop during it, a crash): nothing more will.
    job_id, worker = running(store)
    worker.report(20)
    assert steps(read(store, job_id)) == []
    assert store.finish(job_id, state, result={}, error=None)
    assert steps(read(store, job_id)) == [20]
    assert steps(read(store, job_id, after=10)) == [20]


def test_a_job_that_never_evaluates_holds_no_step_back(store: JobStore) -> None:
    no_cadence = {**SPEC, "eval": {"every_steps": 0, "batches": 1}}
    job_id, worker = running(store, no_cadence)
    worker.report(20)
    worker.report(40)
    assert steps(read(store, job_id)) == [20, 40]
    # No eval examples (its start line says 0): no eval comes either.
    job_id, worker = running(store)
    data = {"train_examples": 256, "eval_examples": 0, "classes": 4, "image_shape": [8, 8, 1]}
    worker.write("start", 0, phase="starting", towers=1, data=data)
    worker.report(20)
    assert steps(read(store, job_id)) == [20]


def test_an_eval_a_stop_cut_short_is_waited_for_on_the_resume(store: JobStore) -> None:
    # The service stopped the worker during the eval of step 20 (one process: checkpoint
    # at 20), and requeued the job. Its next attempt evaluates 20 first.
    job_id, worker = running(store)
    worker.report(20)
    worker.write("checkpoint", 20, checkpoint="checkpoints/ckpt-20")
    assert store.requeue(job_id)
    assert steps(read(store, job_id)) == []  # queued, its eval still to come
    worker.restart(20)
    assert steps(read(store, job_id)) == []
    worker.evaluate(20)
    assert steps(read(store, job_id)) == [20]
    # A cluster stops after the next step: the eval cut short comes of that step, 21.
    job_id, worker = running(store)
    worker.report(20)
    worker.report(21)
    assert store.requeue(job_id)
    assert steps(read(store, job_id)) == [20]
    worker.restart(21)
    worker.evaluate(21)
    assert steps(read(store, job_id, after=20)) == [21]
    worker.report(22)  # evaluated in [20, 21]: 22 is not held
    assert steps(read(store, job_id, after=21)) == [22]


def test_a_resumed_job_is_not_held_for_ever(store: JobStore) -> None:
    # Failed at 37 past its checkpoint at 30, then finished there (`resume --finish`):
    # total 30, whose final eval comes once the new attempt starts.
    job_id, worker = running(store)
    for step in (20, 30, 37):
        worker.report(step)
        if step == 20:
            worker.evaluate(20)
    assert steps(read(store, job_id)) == [20, 30, 37]
    assert store.finish(job_id, JobState.FAILED, result=None, error={"reason": "x"})
    progress = {**(worker.progress or {}), "step": 30, "total": 30}
    assert store.resume(job_id, spec={**SPEC, "steps": 30}, progress=progress)
    assert steps(read(store, job_id)) == [20, 30, 37]  # 37, past its total, gets no eval
    worker.restart(30, total=30)
    assert steps(read(store, job_id)) == [20]  # 30 is its last step now: the final eval
    worker.evaluate(30, total=30)
    assert steps(read(store, job_id, after=20)) == [30]
    # Trained longer after it succeeded: its last step's eval is in, nothing held.
    assert store.finish(job_id, JobState.SUCCEEDED, result={}, error=None)
    progress = {**(worker.progress or {}), "total": 80}
    assert store.resume(job_id, spec={**SPEC, "steps": 80}, progress=progress)
    assert steps(read(store, job_id, after=20)) == [30]


def test_a_resume_from_an_older_checkpoint_is_read_again(store: JobStore) -> None:
    # The worker died at 35 (its eval of 20 in, its checkpoint at 20): the next attempt
    # trains 21-35 again, to other values, which a client read on after 35 never reads.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    for step in (10, 20, 30, 35):
        worker.report(step)
        if step == 20:
            worker.evaluate(20)
            worker.write("checkpoint", 20, checkpoint="checkpoints/ckpt-20")
        reader.read()
    assert reader.after == 35 and reader.revision == 0
    assert store.requeue(job_id, crashed=True)
    worker.restart(20)
    for revision in (None, 0):  # none given: the series as first written
        with pytest.raises(Rewound) as refused:
            read(store, job_id, after=35, revision=revision)
        assert (refused.value.after, refused.value.revision) == (20, 1)
    assert read(store, job_id, after=20, revision=0) == []  # not past the step: no change
    with pytest.raises(UnknownRevision):
        read(store, job_id, after=20, revision=2)
    reader.read()
    assert reader.rewinds == [(20, 1)] and reader.after == 20
    for step in (30, 40):
        worker.write("progress", step, loss=3 / step, accuracy=step / 300)
        reader.read()
    worker.evaluate(40)
    reader.read()
    assert reader.matches() and reader.rewinds == [(20, 1)]
    assert ("loss", 30, 0.1) in read(store, job_id, after=20, revision=1)
    # A client that began after the rewind reads on with its revision, unrefused.
    assert steps(read(store, job_id, after=30, revision=1)) == [40]
    assert store.get(job_id).rewinds == [20]  # type: ignore[union-attr]


def test_an_eval_a_resume_adds_to_a_step_read_is_read_again(store: JobStore) -> None:
    # Cancelled during the eval of step 20 (one process: checkpoint at 20): the ended job
    # gives 20 without its eval, which its resumed attempt does first.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    for step in (10, 20):
        worker.report(step)
        reader.read()
    worker.write("phase", 20, phase="eval", phase_done=0, phase_total=2)
    worker.write("checkpoint", 20, checkpoint="checkpoints/ckpt-20")
    worker.write("end", 20, outcome="cancelled", loss=1 / 20, accuracy=20 / 100)  # as reported
    assert store.finish(job_id, JobState.CANCELLED, result={}, error=None)
    reader.read()
    assert reader.after == 20 and ("eval_loss", 20) not in reader.points
    assert store.resume(job_id)
    worker.restart(20)
    reader.read()  # the eval of 20 is due again, and held: nothing new, nothing changed
    assert reader.revision == 0 and reader.rewinds == []
    worker.evaluate(20)
    with pytest.raises(Rewound) as refused:
        read(store, job_id, after=20, revision=0)
    assert (refused.value.after, refused.value.revision) == (19, 1)
    reader.read()
    assert reader.rewinds == [(19, 1)] and reader.points[("eval_loss", 20)] == 0.1
    for step in (30, 40):
        worker.report(step)
        reader.read()
    worker.evaluate(40)
    reader.read()
    assert reader.matches() and reader.rewinds == [(19, 1)]


def test_a_clusters_cut_short_eval_of_a_step_read_is_read_again(store: JobStore) -> None:
    # A cluster stops after the step past the eval step: the eval comes as step 21.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    for step in (20, 21):
        worker.report(step)
    worker.write("end", 21, outcome="cancelled", loss=1 / 21, accuracy=21 / 100)
    assert store.finish(job_id, JobState.CANCELLED, result={}, error=None)
    reader.read()
    assert reader.after == 21
    assert store.resume(job_id)
    worker.restart(21)
    worker.evaluate(21)
    worker.report(30)
    reader.read()
    assert reader.rewinds == [(20, 1)] and reader.matches()


def test_a_resume_that_changes_no_step_read_keeps_the_revision(store: JobStore) -> None:
    # Cancelled at 30, no eval due: resumed from its checkpoint at 30, it adds steps only.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    for step in (10, 20, 30):
        worker.report(step)
        if step == 20:
            worker.evaluate(20)
        reader.read()
    worker.write("checkpoint", 30, checkpoint="checkpoints/ckpt-30")
    worker.write("end", 30, outcome="cancelled", loss=1 / 30, accuracy=30 / 100)
    assert store.finish(job_id, JobState.CANCELLED, result={}, error=None)
    reader.read()
    assert store.resume(job_id)
    worker.restart(30)
    worker.report(40)
    worker.evaluate(40)
    reader.read()
    assert reader.revision == 0 and reader.rewinds == [] and reader.matches()
    # Died during the eval of 20, nothing past it, resumed there: 20 was held, never read.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    worker.report(10)
    worker.report(20)
    reader.read()
    assert reader.after == 10
    assert store.requeue(job_id, crashed=True)
    worker.restart(20)
    worker.evaluate(20)
    reader.read()
    assert reader.revision == 0 and reader.after == 20 and reader.matches()


def test_finishing_at_an_older_checkpoint_is_read_again(store: JobStore) -> None:
    # Failed at 37 past its checkpoint at 30, then finished there: 31-37 go, and 30, read
    # without an eval, gets its final one. Both are one refusal to a client at 37.
    job_id, worker = running(store)
    reader = Reader(store, job_id)
    for step in (20, 30, 37):
        worker.report(step)
        if step == 20:
            worker.evaluate(20)
    assert store.finish(job_id, JobState.FAILED, result=None, error={"reason": "x"})
    reader.read()
    assert reader.after == 37
    progress = {**(worker.progress or {}), "step": 30, "total": 30}
    assert store.resume(job_id, spec={**SPEC, "steps": 30}, progress=progress)
    worker.restart(30, total=30)
    worker.evaluate(30, total=30)
    worker.write("end", 30, outcome="succeeded", loss=1 / 30, accuracy=30 / 100, total=30)
    assert store.finish(job_id, JobState.SUCCEEDED, result={}, error=None)
    reader.read()
    assert reader.rewinds == [(29, 2)] and reader.matches()
    assert store.get(job_id).rewinds == [30, 29]  # type: ignore[union-attr]


def test_the_step_held_is_found_without_walking_the_points(tmp_path: Path) -> None:
    """The step held is found by a few seeks: the work of a read on of a running job's
    last steps does not grow with the points before them (in SQLite's steps)."""

    class Counted(JobStore):
        ticks = 0

        def _connect(self) -> Any:
            conn = super()._connect()
            conn.set_progress_handler(self._tick, 100)
            return conn

        def _tick(self) -> int:
            self.ticks += 1
            return 0  # go on

    def work(reports: int) -> tuple[int, int]:
        store = Counted(tmp_path / f"{reports}.db")
        job_id, _ = running(store)
        for first in range(0, reports, 5000):
            points = [
                MetricPoint(name, step, float(step), 1.0)
                for step in range(first + 1, first + 5001)
                for name in ("loss", "accuracy")
            ]
            store.record_progress(
                job_id, offset=first, progress={"total": 10**7}, eval=None, points=points
            )
        store.ticks = 0
        held = read(store, job_id, after=reports - 5, revision=0)
        ticks = store.ticks
        assert steps(held) == list(range(reports - 4, reports))  # `reports` is due an eval
        # Its eval stored: whether that changes a step read (`_rewound_after`) is seeks too.
        store.ticks = 0
        evaluated = [MetricPoint("eval_loss", reports, float(reports), 0.5)]
        store.record_progress(
            job_id, offset=reports, progress={"total": 10**7}, eval=None, points=evaluated
        )
        writes = store.ticks
        store.close()
        return ticks, writes

    few, many = work(10_000), work(100_000)
    assert many[0] < 1.5 * few[0], (few, many)
    assert many[1] < 1.5 * few[1], (few, many)


# A stand-in worker that writes the tiny job's lines around its two evals, each eval line
# only once the test releases it (`Service.release`): a client reads between the two lines
# of step 20, and of step 40, as it may any time a real eval takes.
EVALUATING_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 40, **line}) + "\\n")


def released():
    release = job_dir / "release"
    while not release.exists():
        time.sleep(0.05)
    release.unlink()


progress(event="start", step=0, phase="starting")
for step in (10, 20, 30, 40):
    progress(event="progress", step=step, loss=1 / step, phase="training")
    if step % 20 == 0:
        progress(event="phase", step=step, phase="eval", phase_done=0, phase_total=2)
        released()
        progress(event="eval", step=step, eval_loss=2 / step, eval_accuracy=step / 200,
                 eval_examples=64, phase="training" if step < 40 else "eval")
progress(event="end", step=40, outcome="succeeded", phase="done")
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "done"}))
"""


def test_reading_on_between_a_steps_line_and_its_eval(tmp_path: Path) -> None:
    worker = ("evaluating_worker", EVALUATING_WORKER)
    with stand_in_service(tmp_path, worker) as service:
        job_id = service.submit(job_spec(name="read-on"))["id"]
        url = f"/api/v1/jobs/{job_id}/metrics"

        def reached(step: int, evaluated: int | None) -> None:
            def there(job: dict[str, Any]) -> bool:
                at = (job["progress"] or {}).get("step")
                return at == step and (job["eval"] or {}).get("step") == evaluated

            service.wait_for(job_id, there, timeout=60, what=f"step {step}, eval {evaluated}")

        def csv_rows(*args: str) -> list[list[str]]:
            names = ("--name", "loss", "--name", "eval_accuracy")
            result = towerboard("metrics", job_id, *names, *args, url=service.base_url)
            assert result.returncode == 0, result.stderr
            return list(csv.reader(io.StringIO(result.stdout)))

        reached(20, None)  # the line of step 20 is in; its eval is not
        series = service.client.get(url).json()["series"]
        assert {name: [p["step"] for p in points] for name, points in series.items()} == {
            "loss": [10]
        }
        assert service.client.get(url, params={"after_step": 10}).json()["series"] == {}
        # `points` (a chart) reads every point there is.
        charted = service.client.get(url, params={"points": 100}).json()["series"]
        assert [p["step"] for p in charted["loss"]] == [10, 20]
        got = csv_rows()
        assert got == [["step", "loss", "eval_accuracy"], ["10", "0.1", ""]]
        assert csv_rows("--after-step", "10", "--no-header") == []

        service.release(job_id)
        reached(40, 20)  # step 20's eval is in; step 40's final eval is not
        more = csv_rows("--after-step", "10", "--no-header")
        assert more == [["20", "0.05", "0.1"], ["30", repr(1 / 30), ""]]
        got += more

        service.release(job_id)
        service.wait_state(job_id, "succeeded", timeout=60)
        more = csv_rows("--after-step", "30", "--no-header")
        assert more == [["40", "0.025", "0.2"]]
        got += more
        assert got == csv_rows()  # read on, line by line, as the whole read now
        answer = json.loads(towerboard("metrics", job_id, "--json", url=service.base_url).stdout)
        assert [p["step"] for p in answer["series"]["eval_loss"]] == [20, 40]
        # A revision to come (a typo, another job's) is refused saying the job's latest:
        # "Expected at most 0" alone, with no word of what it was the most of.
        ahead = towerboard("metrics", job_id, "--after-step", "30", "--revision", "3",
                           url=service.base_url)  # fmt: skip
        assert ahead.returncode == 2
        assert ahead.stderr == (
            "towerboard: error: Invalid request: 1 error: --revision: Expected at most 0, "
            "the latest revision of the job's series (each resume that changed steps already "
            "given made one). Received: 3\n"
        )


# A stand-in worker whose second attempt changes steps its first gave (its job's name
# says how): "crash" dies at step 30 (SIGKILL, so the service runs it again) and its next
# attempt trains on from its checkpoint at 20, to other values; "cancel" is stopped during
# its eval of step 20 and, resumed, does that eval first. Each waits at its step 30 or
# eval of 20 until the test releases it, or stops it.
RESUMING_WORKER = """\
import json, os, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
mode = json.loads((job_dir / "spec.json").read_text())["name"]
again = (job_dir / "attempted").exists()
(job_dir / "attempted").touch()
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 40, **line}) + "\\n")


def released():
    while not (job_dir / "release").exists() and not stopped:
        time.sleep(0.05)


def evaluate(step):
    progress(event="eval", step=step, eval_loss=2 / step, eval_accuracy=step / 200,
             eval_examples=64, phase="training")


def loss(step):  # a crashed job's next attempt trains to other values
    return 3 / step if mode == "crash" and again and step > 20 else 1 / step


def end(outcome, step, code):  # its loss as the step's report said it
    progress(event="end", step=step, outcome=outcome, loss=loss(step), phase="done")
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": outcome}))
    sys.exit(code)


if not again:
    progress(event="start", step=0, phase="starting")
    for step in (10, 20):
        progress(event="progress", step=step, loss=1 / step, phase="training")
    if mode == "cancel":
        progress(event="phase", step=20, phase="eval", phase_done=0, phase_total=2)
        released()
        progress(event="checkpoint", step=20, checkpoint="checkpoints/ckpt-20", phase="eval")
        end("cancelled", 20, 3)
    evaluate(20)
    progress(event="checkpoint", step=20, checkpoint="checkpoints/ckpt-20", phase="training")
    progress(event="progress", step=30, loss=1 / 30, phase="training")
    released()
    os.kill(os.getpid(), signal.SIGKILL)
progress(event="start", step=20, phase="starting")
if mode == "cancel":
    evaluate(20)
for step in (30, 40):
    progress(event="progress", step=step, loss=loss(step), phase="training")
evaluate(40)
end("succeeded", 40, 0)
"""


def test_reading_on_through_a_resume_that_changed_the_steps_read(tmp_path: Path) -> None:
    with stand_in_service(tmp_path, ("resuming_worker", RESUMING_WORKER)) as service:

        def csv_rows(job_id: str, *args: str, code: int = 0) -> list[list[str]]:
            names = ("--name", "loss", "--name", "eval_loss")
            result = towerboard("metrics", job_id, *names, *args, url=service.base_url)
            assert result.returncode == code, result.stderr
            return list(csv.reader(io.StringIO(result.stdout)))

        def refused(job_id: str, after: int, again: int) -> None:
            result = towerboard(
                "metrics", job_id, "--name", "loss", "--name", "eval_loss",
                "--after-step", str(after), "--no-header", url=service.base_url,
            )  # fmt: skip
            assert (result.returncode, result.stdout) == (1, ""), result.stderr
            command = (
                f"towerboard metrics {job_id} --name loss --name eval_loss --after-step "
                f"{again} --revision 1 --no-header"
            )
            assert f"Drop your rows after step {again}, then read on with `{command}`" in (
                result.stderr
            ), result.stderr
            answer = service.client.get(
                f"/api/v1/jobs/{job_id}/metrics", params={"after_step": after}
            )
            assert answer.status_code == 409
            assert (answer.json()["read_again_after"], answer.json()["revision"]) == (again, 1)

        # Case 2: the worker dies at 30; its next attempt trains 21-30 again, to 0.1.
        crashed = service.submit(job_spec(name="crash"))["id"]
        service.wait_for(crashed, lambda job: (job["progress"] or {}).get("step") == 30,
                         timeout=60, what="step 30")  # fmt: skip
        got = csv_rows(crashed)
        assert got == [["step", "loss", "eval_loss"], ["10", "0.1", ""], ["20", "0.05", "0.1"],
                       ["30", repr(1 / 30), ""]]  # fmt: skip
        service.release(crashed)
        job = service.wait_state(crashed, "succeeded", timeout=60)
        assert job["attempts"] == 2
        refused(crashed, 30, 20)
        got = [row for row in got if row[0] == "step" or int(row[0]) <= 20]
        got += csv_rows(crashed, "--after-step", "20", "--revision", "1", "--no-header")
        assert got == csv_rows(crashed) and ["30", "0.1", ""] in got
        assert csv_rows(crashed, "--after-step", "30", "--revision", "1", "--no-header") == [
            ["40", "0.075", "0.05"]
        ]

        # Case 1: cancelled in its eval of 20, which its resumed attempt then does.
        cancelled = service.submit(job_spec(name="cancel"))["id"]
        service.wait_for(cancelled, lambda job: (job["progress"] or {}).get("phase") == "eval",
                         timeout=60, what="the eval of 20")  # fmt: skip
        assert service.client.post(f"/api/v1/jobs/{cancelled}/cancel").status_code == 202
        service.wait_state(cancelled, "cancelled", timeout=60)
        got = csv_rows(cancelled)  # ended: 20 is given, without the eval it never had
        assert got[-1] == ["20", "0.05", ""]
        service.wait_exited(cancelled)
        assert service.client.post(f"/api/v1/jobs/{cancelled}/resume").status_code == 200
        service.wait_state(cancelled, "succeeded", timeout=60)
        refused(cancelled, 20, 19)
        rows = csv_rows(cancelled, "--after-step", "19", "--revision", "1", "--no-header")
        assert rows[0] == ["20", "0.05", "0.1"]
        assert got[:-1] + rows == csv_rows(cancelled)
        # A read as the job now is, without --revision, says the revision to read on with.
        result = towerboard("metrics", cancelled, url=service.base_url)
        assert "read on with --revision 1" in result.stderr, result.stderr
