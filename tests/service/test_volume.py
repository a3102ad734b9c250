"""The service at volume: what one request, one tick or one failed job may read and keep is
bounded, however long a job ran or however much it wrote. Each test asserts the work done
(bytes, rows, points, calls), never how long it took."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.devices import DevicePool
from service.progress import PROGRESS_READ_BYTES
from service.settings import Settings
from service.store import JobState, JobStore, MetricPoint
from service.supervisor import Supervisor
from tests.service.harness import Service, fake_worker_env, job_spec, kill_processes_under
from trainer.spec import JobSpec

# `python -m volume_worker run --job-dir DIR`: what its spec's name says, then exits 1.
#   "long-line": 8 MB on one line of stdout (worker.log), then a traceback's last line.
VOLUME_WORKER = """\
import json, sys
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
if name == "long-line":
    sys.stdout.write("[" + "0.123, " * (8 * 2**20 // 7) + "]\\n")
    sys.stdout.write("ValueError: the array above was wrong\\n")
    sys.stdout.flush()
sys.exit(1)
"""


def volume_service(make_service: Callable[..., Service], tmp_path: Path) -> Service:
    folder = tmp_path / "stand-in"
    folder.mkdir()
    (folder / "volume_worker.py").write_text(VOLUME_WORKER)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return make_service(env={"TOWERBOARD_WORKER_MODULE": "volume_worker", "PYTHONPATH": path})


def test_a_failed_jobs_log_tail_is_bounded_whatever_its_lines(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A worker that printed 8 MB on one line and failed: the job's error keeps the lines
    that fit in a bounded read of the log, not the 8 MB, which every list of jobs would
    then have carried."""
    service = volume_service(make_service, tmp_path)
    service.start()
    job = service.submit(job_spec(name="long-line"))
    failed = service.wait_state(job["id"], "failed")
    tail = failed["error"]["log_tail"]
    assert tail[-1] == "ValueError: the array above was wrong"
    assert len(json.dumps(failed)) < 20_000
    listed = service.client.get("/api/v1/jobs").json()
    assert len(json.dumps(listed)) < 20_000


def test_progress_written_while_nobody_watched_is_stored_a_bounded_part_at_a_time(
    tmp_path: Path,
) -> None:
    """A worker that wrote 4 MB of progress while the service was down, and is gone: the
    supervisor reads and stores it a part at a time (each at most PROGRESS_READ_BYTES),
    every line once, and then requeues the job. Read whole, 50 MB held half a GB and kept
    the service from answering for 18 s."""
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    job = store.create(JobSpec.model_validate(job_spec(name="gone")).model_dump(mode="json"))
    assert store.mark_running(job.id, devices=["cpu:0"])  # its worker never recorded: gone
    run = settings.runs_dir / job.id
    run.mkdir(parents=True)
    reports = 25_000
    with open(run / "progress.jsonl", "w") as f:
        f.write(json.dumps({"time": 1.0, "event": "start", "step": 0, "total": 10**6}) + "\n")
        for step in range(1, reports + 1):
            line = {"time": 2.0, "event": "progress", "step": step, "total": 10**6,
                    "loss": 1.0 / step, "phase": "training", "padding": "p" * 100}  # fmt: skip
            f.write(json.dumps(line) + "\n")
    size = (run / "progress.jsonl").stat().st_size
    assert size > 3 * PROGRESS_READ_BYTES
    parts: list[int] = []
    record = store.record_progress

    def recording(job_id: str, *, offset: int, **kwargs: Any) -> None:
        parts.append(offset)
        record(job_id, offset=offset, **kwargs)

    store.record_progress = recording  # type: ignore[method-assign]
    published: list[Any] = []
    supervisor = Supervisor(
        settings=settings,
        store=store,
        pool=DevicePool.from_settings(settings),
        publish=published.append,
    )
    supervisor.stop_starting()  # no worker is started for the requeued job
    supervisor.recover()
    for _ in range(100):
        if store.get(job.id).state is not JobState.RUNNING:  # type: ignore[union-attr]
            break
        supervisor.tick()
    requeued = store.get(job.id)
    assert requeued is not None and requeued.state is JobState.QUEUED
    assert requeued.attempts == 2 and requeued.progress_offset == size
    assert parts[-1] == size
    assert all(0 < b - a <= PROGRESS_READ_BYTES for a, b in zip([0, *parts], parts, strict=False))
    assert len(store.metrics(job.id, names=["loss"])) == reports
    assert sum(event.event == "progress" for event in published) == reports
    store.close()


def test_a_page_of_one_state_reads_the_page_not_every_job_in_that_state(tmp_path: Path) -> None:
    """GET /api/v1/jobs?state=succeeded (the dashboard's filter chips) read and sorted every
    succeeded job to answer 50: 61 ms of 10,000 jobs, and growing with the store. The
    queries a page makes must walk an index in the page's order, sorting nothing."""
    store = JobStore(tmp_path / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="done")).model_dump(mode="json")
    for _ in range(3):
        job = store.create(spec)
        store.mark_running(job.id, devices=[])
        store.finish(job.id, JobState.SUCCEEDED, result=None, error=None)
    statements: list[str] = []
    reader = store._reader()  # noqa: SLF001 - the connection the page is read on
    reader.set_trace_callback(statements.append)
    page, count = store.page(states=[JobState.SUCCEEDED], limit=2)
    cursor = page[-1].seq
    store.page(states=[JobState.SUCCEEDED], limit=2, before_seq=cursor)
    reader.set_trace_callback(None)
    assert len(page) == 2 and count == 3
    selects = [sql for sql in statements if sql.lstrip().upper().startswith("SELECT *")]
    assert len(selects) == 2
    for sql in selects:
        plan = [row[3] for row in reader.execute(f"EXPLAIN QUERY PLAN {sql}")]
        assert not any("TEMP B-TREE" in step for step in plan), (sql, plan)
    store.close()


def test_a_page_of_several_states_sorts_their_seqs_not_their_rows(tmp_path: Path) -> None:
    """GET /api/v1/jobs?state=failed&state=cancelled (`towerboard status --state ...`):
    no index holds several states in the page's order, and SQLite sorted every job in them
    whole, each with its spec (a custom model's params may fill a MiB), to answer 50: 7-17 ms
    of 20,000 jobs. What is sorted must come from an index (their seqs) alone."""
    store = JobStore(tmp_path / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="done")).model_dump(mode="json")
    for state in (JobState.FAILED, JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED):
        job = store.create(spec)
        store.mark_running(job.id, devices=[])
        store.finish(job.id, state, result=None, error=None)
    statements: list[str] = []
    reader = store._reader()  # noqa: SLF001 - the connection the page is read on
    reader.set_trace_callback(statements.append)
    ended = [JobState.FAILED, JobState.CANCELLED]
    page, count = store.page(states=ended, limit=2)
    rest, _ = store.page(states=ended, limit=2, before_seq=page[-1].seq)
    reader.set_trace_callback(None)
    assert [job.state for job in page + rest] == [
        JobState.FAILED, JobState.CANCELLED, JobState.FAILED
    ] and count == 3  # fmt: skip
    assert [job.seq for job in page + rest] == [3, 2, 1]
    selects = [sql for sql in statements if sql.lstrip().upper().startswith("SELECT *")]
    assert len(selects) == 2
    for sql in selects:
        plan = list(reader.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for _, parent, _, step in plan:
            if "TEMP B-TREE" in step:
                beside = [row[3] for row in plan if row[1] == parent]
                assert any("COVERING INDEX" in row for row in beside), (sql, plan)
    store.close()


def test_metrics_for_a_chart_come_thinned_to_a_bounded_number_of_points(
    make_service: Callable[..., Service],
) -> None:
    """A job of 200k steps has some 100k points a series: /metrics sent all of them, 32 MB
    in 4 s with the service at 300 MB, for a chart that draws 1,200. With ?points=N each
    series comes as at most N + 2 of its points, its ends and extremes among them."""
    service = make_service()
    data = service.data_dir
    store = JobStore(data / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="long")).model_dump(mode="json"))
    reports = 20_000
    points = [MetricPoint("loss", 2 * k, float(k), 1.0 / k) for k in range(1, reports + 1)]
    points += [MetricPoint("eval_loss", 500 * k, float(k), 0.5) for k in range(1, 81)]
    store.record_progress(job.id, offset=0, progress=None, eval=None, points=points)
    store.close()
    service.start()
    url = f"/api/v1/jobs/{job.id}/metrics"
    whole = service.client.get(url).json()["series"]
    assert len(whole["loss"]) == reports and len(whole["eval_loss"]) == 80
    thinned = service.client.get(url, params={"points": 500})
    assert thinned.status_code == 200, thinned.text
    series = thinned.json()["series"]
    assert 250 <= len(series["loss"]) <= 502
    assert series["loss"][0] == whole["loss"][0] and series["loss"][-1] == whole["loss"][-1]
    assert series["eval_loss"] == whole["eval_loss"]  # 80 points: whole
    assert all(point in whole["loss"] for point in series["loss"][::50])


def _peak_rss_mb(pid: int) -> float:
    """The most memory the process has held so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_every_metric_point_is_sent_without_holding_them_all(
    make_service: Callable[..., Service],
) -> None:
    """/metrics without ?points= sends every point. Held whole (points, dicts, JSON) it
    took some 600 bytes of the service's memory a point: 2.5 GB for a job of a million
    reports. Sent as read, what it holds does not grow with the job."""
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="long")).model_dump(mode="json"))
    reports = 100_000
    for name in ("loss", "accuracy", "examples_per_sec", "learning_rate", "eval_loss"):
        points = [MetricPoint(name, k, float(k), 1.0 / k) for k in range(1, reports + 1)]
        store.record_progress(job.id, offset=0, progress=None, eval=None, points=points)
    store.close()
    service.start()
    assert service.process is not None
    url = f"/api/v1/jobs/{job.id}/metrics"
    service.client.get(url, params={"name": "loss", "after_step": reports - 10})  # warm
    before = _peak_rss_mb(service.process.pid)
    response = service.client.get(url)
    grown = _peak_rss_mb(service.process.pid) - before
    assert response.status_code == 200
    series = response.json()["series"]
    assert sorted(series) == ["accuracy", "eval_loss", "examples_per_sec", "learning_rate", "loss"]
    assert all(len(points) == reports for points in series.values())
    assert series["loss"][0]["step"] == 1 and series["loss"][-1]["step"] == reports
    assert [p["step"] for p in series["accuracy"]] == list(range(1, reports + 1))
    assert grown < 60, f"the service grew by {grown:.0f} MB to send {5 * reports} points"


def stored_long_job(service: Service, names: tuple[str, ...], count: int) -> str:
    """A cancelled job of `count` points a series, stored before `service` starts."""
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="long")).model_dump(mode="json"))
    for name in names:
        points = [MetricPoint(name, k, float(k), 1.0 / k) for k in range(1, count + 1)]
        store.record_progress(job.id, offset=0, progress=None, eval=None, points=points)
    store.cancel_queued(job.id)
    store.close()
    return job.id


def stalled_read_lets_go(service: Service, job_id: str, path: str) -> bool:
    """Whether SQLite can checkpoint its WAL past a write made after a client began a GET
    of `path`, read its first 4 KB, left the rest in the service's socket buffers and
    went away: the answer's read of the store must be closed by then."""
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", service.port))
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.0)  # the service fills the socket's buffers and waits for the client
    # A write after the answer's read began, which a checkpoint must get past.
    assert service.client.post(f"/api/v1/jobs/{job_id}/resume").status_code == 200
    deadline = time.monotonic() + 10
    with sqlite3.connect(service.data_dir / "towerboard.db", timeout=1) as db:
        while db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
    return True


def test_a_metrics_stream_its_client_leaves_stalled_lets_go_of_the_store(
    make_service: Callable[..., Service],
) -> None:
    """A client that stops reading every point of a long job, then goes away (a chart
    left mid-load, a pipe into a pager quit): Starlette cancels the answer and leaves its
    body unclosed, so the stream's read of the store stayed open until Python's cycle
    collector came by, which a quiet service may not do for hours. Meanwhile SQLite
    could not checkpoint its WAL past that read, and the WAL grew with every write."""
    service = make_service()
    job_id = stored_long_job(service, ("loss",), 300_000)
    service.start()
    path = f"/api/v1/jobs/{job_id}/metrics"
    assert stalled_read_lets_go(service, job_id, path), "the read stayed open after its client"


def test_the_queue_a_pass_reads_comes_from_one_index_in_its_order(tmp_path: Path) -> None:
    """The supervisor reads the queue every pass (five a second). Read from the table, it
    sorted every queued job and parsed each one's spec for its towers: 87 ms a pass for 500
    queued jobs whose specs held 50 kB of a custom model's params. The read must walk an
    index in run order and take the towers from it, calling no function on any row."""
    store = JobStore(tmp_path / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="waits")).model_dump(mode="json")
    later = store.create({**spec, "priority": 0})
    first = store.create({**spec, "priority": 5, "towers": 2})
    statements: list[str] = []
    reader = store._reader()  # noqa: SLF001 - the connection the queue is read on
    reader.set_trace_callback(statements.append)
    queued = store.queue()
    reader.set_trace_callback(None)
    assert [(job.id, job.towers) for job in queued] == [(first.id, 2), (later.id, 1)]
    (sql,) = statements
    plan = [row[3] for row in reader.execute(f"EXPLAIN QUERY PLAN {sql}")]
    assert not any("TEMP B-TREE" in step for step in plan), plan
    opcodes = {row[1] for row in reader.execute(f"EXPLAIN {sql}")}
    assert not opcodes & {"Function", "PureFunc"}, sorted(opcodes)
    store.close()


def test_a_pass_reads_no_more_of_the_queue_than_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass read the whole queue to start its first jobs, five times a second: 16 ms
    a pass for 5,000 queued jobs with no device free. A pass must read at most as many
    queued jobs as it has free devices, and with none free only the head (whether there is
    a queue at all: an empty one reads no running job's record)."""
    for name, value in fake_worker_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    settings = Settings(data_dir=tmp_path / "data", cpu_jobs=2).resolved()
    store = JobStore(settings.db_path)
    spec = JobSpec.model_validate(job_spec(name="waits")).model_dump(mode="json")
    for _ in range(30):
        store.create(spec)
    supervisor = Supervisor(
        settings=settings, store=store, pool=DevicePool.from_settings(settings),
        publish=lambda _: None,
    )  # fmt: skip
    reader = store._reader()  # noqa: SLF001 - the connection a pass reads on

    def queue_reads_in_a_pass() -> list[int]:
        """Rows each read of the queue in one pass returned (read again after it)."""
        statements: list[str] = []
        reader.set_trace_callback(statements.append)
        supervisor.tick()
        reader.set_trace_callback(None)
        reads = [sql for sql in statements if "state = 'queued'" in sql]
        return [len(reader.execute(sql).fetchall()) for sql in reads]

    try:
        assert max(queue_reads_in_a_pass()) <= 2  # two slots free: two start
        assert store.count_by_state()[JobState.RUNNING] == 2
        assert queue_reads_in_a_pass() == [1]  # none free: the head alone
        assert store.count_by_state()[JobState.QUEUED] == 28
    finally:
        kill_processes_under(settings.data_dir)
        store.close()


def test_a_resumed_jobs_first_batch_does_not_walk_every_point_of_the_job(
    tmp_path: Path,
) -> None:
    """A worker resumed from a checkpoint makes its first batch drop the points past that
    step, and the buckets that held them be read again. Each of those statements walked
    every point of the job, the steps not being the key's next column after the job: 4.2 s
    for a job of 4.2M points, in the write transaction every other write waits behind. The
    work must not grow with the points before the restart (measured in SQLite's steps)."""

    def work(reports: int) -> int:
        store = JobStore(tmp_path / f"{reports}.db")
        job = store.create(JobSpec.model_validate(job_spec()).model_dump(mode="json"))
        every = 64  # steps between reports: both restarts as far into a widest bucket
        for first in range(0, reports, 1024):
            points = [
                MetricPoint(name, k * every, float(k), 1.0 / (k + 1))
                for k in range(first, first + 1024)
                for name in ("loss", "accuracy")
            ]
            store.record_progress(job.id, offset=first, progress=None, eval=None, points=points)
        restart = (reports - 10) * every
        again = [MetricPoint("loss", restart + k, 0.0, 0.5) for k in (1, 2, 3)]
        ticks: list[int] = []
        writer = store._writer  # noqa: SLF001 - the connection the batch is stored on
        writer.set_progress_handler(lambda: ticks.append(1), 100)  # None: go on
        store.record_progress(
            job.id, offset=reports, progress=None, eval=None, points=again, forget_after=restart
        )
        writer.set_progress_handler(None, 100)
        assert [p.step for p in store.metrics(job.id, names=["loss"])][-4:] == [
            restart,
            *(p.step for p in again),
        ]
        assert store.metrics(job.id, names=["accuracy"])[-1].step == restart
        store.close()
        return len(ticks)

    few, many = work(2_048), work(20_480)
    assert many < 1.5 * few, (few, many)


def test_reading_on_after_a_step_does_not_walk_every_point_of_the_job(
    tmp_path: Path,
) -> None:
    """`GET /metrics?after_step=N` (a client reading on, `towerboard metrics
    --after-step`) walked every point of the job to find the few after N: 0.3 s for the
    last 100 steps of a job of 4.2M points, 0.6 s with `points`. The work must not grow
    with the points before N (measured in SQLite's steps)."""

    def work(reports: int) -> int:
        store = JobStore(tmp_path / f"{reports}.db")
        job = store.create(JobSpec.model_validate(job_spec()).model_dump(mode="json"))
        names = ("loss", "accuracy")
        for first in range(0, reports, 1000):
            points = [
                MetricPoint(name, step, float(step), 1.0 / (step + 1))
                for step in range(first, first + 1000)
                for name in names
            ]
            store.record_progress(job.id, offset=first, progress=None, eval=None, points=points)
        ticks: list[int] = []
        reader = store._reader()  # noqa: SLF001 - the connection metrics are read on
        reader.set_progress_handler(lambda: ticks.append(1), 100)  # None: go on
        read = [store.metrics(job.id, after_step=reports - 6, most=most) for most in (None, 50)]
        reader.set_progress_handler(None, 100)
        store.close()
        for points in read:
            assert [(p.name, p.step) for p in points] == [
                (name, step) for name in sorted(names) for step in range(reports - 5, reports)
            ]
        return len(ticks)

    few, many = work(2_000), work(40_000)
    assert many < 1.5 * few, (few, many)
