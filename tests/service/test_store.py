"""The SQLite job store, on a real file."""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from service.store import JobState, JobStore, MetricPoint, QueuePlace

SPEC = {"name": "j", "priority": 0, "towers": 1}


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.db")


def test_create_job_is_durable_and_queued(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    job = store.create(SPEC)
    store.close()
    reopened = JobStore(tmp_path / "jobs.db").get(job.id)
    assert reopened is not None
    assert reopened.state is JobState.QUEUED and reopened.attempts == 1
    assert reopened.spec == SPEC
    mode = sqlite3.connect(tmp_path / "jobs.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_read_queued_priority_then_oldest(store: JobStore) -> None:
    low = store.create({**SPEC, "priority": -1})
    first = store.create(SPEC)
    urgent = store.create({**SPEC, "priority": 5})
    second = store.create(SPEC)
    assert [j.id for j in store.queue()] == [urgent.id, first.id, second.id, low.id]


def test_read_the_queues_first_jobs_and_its_count(store: JobStore) -> None:
    low = store.create({**SPEC, "name": "low", "priority": -1})
    first = store.create({**SPEC, "towers": 3})
    urgent = store.create({**SPEC, "priority": 5})
    assert store.mark_running(store.create(SPEC).id, devices=["cpu:0"])  # not queued
    entries, count = store.queue_entries(most=2)
    assert count == 3
    assert [(e.id, e.priority, e.towers) for e in entries] == [(urgent.id, 5, 1), (first.id, 0, 3)]
    assert entries[1].queued_at == first.created_at
    # Cancelled and resumed: it joins the queue when resumed, after the others of its priority.
    assert store.cancel_queued(first.id) and store.resume(first.id)
    entries, count = store.queue_entries(most=10)
    assert [e.id for e in entries] == [urgent.id, first.id, low.id] and count == 3
    resumed = store.get(first.id)
    assert resumed is not None and entries[1].queued_at == resumed.queued_at
    assert entries[2].name == "low"


def test_read_page_newest_first_with_cursor(store: JobStore) -> None:
    ids = [store.create(SPEC).id for _ in range(5)]
    page, count = store.page(limit=2)
    assert [j.id for j in page] == ids[::-1][:2] and count == 5
    page, _ = store.page(limit=2, before_seq=page[-1].seq)
    assert [j.id for j in page] == ids[::-1][2:4]
    store.cancel_queued(ids[0])
    page, count = store.page(states=[JobState.CANCELLED])
    assert [j.id for j in page] == [ids[0]] and count == 1


def test_read_page_of_queued_jobs_in_the_order_they_start(store: JobStore) -> None:
    # The queued jobs alone were listed newest first, the last to start on top.
    low = store.create({**SPEC, "name": "low", "priority": -1})
    first = store.create({**SPEC, "name": "first"})
    urgent = store.create({**SPEC, "name": "urgent", "priority": 5})
    resumed = store.create({**SPEC, "name": "resumed"})
    second = store.create({**SPEC, "name": "second"})
    assert store.cancel_queued(resumed.id) and store.resume(resumed.id)  # behind `second`
    assert store.mark_running(store.create(SPEC).id, devices=["cpu:0"])  # not queued
    order = [urgent.id, first.id, second.id, resumed.id, low.id]
    assert [job.id for job in store.queue()] == order

    page, count = store.page(states=[JobState.QUEUED], limit=10)
    assert [job.id for job in page] == order and count == 5
    # A page at a time, each read on after the last job's place.
    read: list[str] = []
    after = None
    while True:
        page, count = store.page(states=[JobState.QUEUED], limit=2, after_place=after)
        assert count == 5
        read += [job.id for job in page]
        if len(page) < 2:
            break
        after = QueuePlace.of(page[-1])
    assert read == order
    # Past the first page, `second` starts and a job of a higher priority is submitted: the
    # next page reads on after `first`, neither skipping nor repeating a job.
    page, _ = store.page(states=[JobState.QUEUED], limit=2)
    assert store.mark_running(second.id, devices=["cpu:1"])
    store.create({**SPEC, "priority": 9})  # ahead of the rows already read
    page, count = store.page(states=[JobState.QUEUED], limit=2, after_place=QueuePlace.of(page[-1]))
    assert [job.id for job in page] == [resumed.id, low.id] and count == 5
    # With a name, the queued jobs whose names hold it, in the same order.
    named, count = store.page(states=[JobState.QUEUED], name="R")
    assert [job.id for job in named] == [urgent.id, first.id, resumed.id] and count == 3
    # Other states, several states among them queued, and every job: newest first still.
    both, _ = store.page(states=[JobState.QUEUED, JobState.RUNNING])
    assert [job.seq for job in both] == sorted((job.seq for job in both), reverse=True)
    assert len(both) == 7
    every, _ = store.page()
    assert [job.seq for job in every] == sorted((job.seq for job in every), reverse=True)


def test_jobs_queued_at_one_time_page_by_seq(store: JobStore, tmp_path: Path) -> None:
    # Jobs that joined the queue in the same instant (a clock's resolution, or written in
    # bulk) stand in the order of their seq, and a page past one of them finds the rest.
    ids = [store.create(SPEC).id for _ in range(5)]
    with contextlib.closing(sqlite3.connect(tmp_path / "jobs.db")) as db, db:
        db.execute("UPDATE jobs SET created_at = 1000.5")
    page, _ = store.page(states=[JobState.QUEUED], limit=2)
    assert [job.id for job in page] == ids[:2]
    assert QueuePlace.of(page[-1]) == QueuePlace(0, 1000.5, page[-1].seq)
    rest, _ = store.page(states=[JobState.QUEUED], after_place=QueuePlace.of(page[-1]))
    assert [job.id for job in rest] == ids[2:]


def test_cancel_queued_only_once_and_not_when_running(store: JobStore) -> None:
    queued, running = store.create(SPEC), store.create(SPEC)
    assert store.mark_running(running.id, devices=["cpu:0"])
    assert store.cancel_queued(queued.id)
    assert not store.cancel_queued(queued.id)
    assert not store.cancel_queued(running.id)
    assert not store.mark_running(queued.id, devices=["cpu:0"])  # cancelled: never starts
    assert store.request_cancel(running.id)
    assert store.get(running.id).cancel_requested_at is not None  # type: ignore[union-attr]


def test_cancel_before_a_resumed_attempt_starts_puts_the_job_back(store: JobStore) -> None:
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.requeue(job.id, crashed=True)  # a crash count, to keep
    store.mark_running(job.id, devices=["cpu:0"])
    store.record_progress(job.id, offset=9, progress={"step": 7}, eval=None, points=[])
    assert store.request_cancel(job.id)  # and a cancel asked for that the job outran
    assert store.finish(job.id, JobState.SUCCEEDED, result={"outcome": "succeeded"}, error=None)
    before = store.get(job.id)
    assert before is not None and before.resumed_from is None
    assert before.crashes == 1 and before.cancel_requested_at is not None
    longer = {**SPEC, "steps": 90}
    assert store.resume(job.id, spec=longer, progress={"step": 7, "total": 90})
    resumed = store.get(job.id)
    assert resumed is not None and resumed.spec == longer and resumed.attempts == 3
    assert resumed.crashes == 0 and resumed.cancel_requested_at is None
    assert resumed.resumed_from is not None and resumed.resumed_from["state"] == "succeeded"

    assert store.cancel_queued(job.id)
    back = store.get(job.id)
    assert back is not None
    assert before.started_at is not None and resumed.started_at is None  # not started yet
    for field in ("state", "spec", "progress", "result", "error", "started_at", "finished_at",
                  "queued_at", "attempts", "crashes", "cancel_requested_at"):  # fmt: skip
        assert getattr(back, field) == getattr(before, field), field
    assert back.resumed_from is None and back.version > resumed.version

    # Once its attempt has started it is a job like any other: a crash requeues it, and
    # a cancel then cancels it.
    assert store.resume(job.id, spec=longer)
    assert store.mark_running(job.id, devices=["cpu:0"])
    assert store.get(job.id).resumed_from is None  # type: ignore[union-attr]
    assert store.requeue(job.id, crashed=True)
    assert store.cancel_queued(job.id)
    assert store.get(job.id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_cancel_of_a_job_resumed_before_resume_cleared_its_start_keeps_it(
    tmp_path: Path,
) -> None:
    # Resumed by a version whose `resumed_from` held no started_at (the job kept its start
    # while queued): put back, it keeps that start rather than lose it.
    store = JobStore(tmp_path / "jobs.db")
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.finish(job.id, JobState.CANCELLED, result=None, error=None)
    started = store.get(job.id).started_at  # type: ignore[union-attr]
    assert store.resume(job.id)
    store.close()
    conn = sqlite3.connect(tmp_path / "jobs.db")
    with conn:
        conn.execute(
            "UPDATE jobs SET started_at = ?,"
            " resumed_from = json_remove(resumed_from, '$.started_at') WHERE id = ?",
            (started, job.id),
        )
    conn.close()
    store = JobStore(tmp_path / "jobs.db")
    assert store.cancel_queued(job.id)
    back = store.get(job.id)
    assert back is not None and back.state is JobState.CANCELLED
    assert back.started_at == started


def test_requeue_increments_attempts_and_frees_devices(store: JobStore) -> None:
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["gpu:0", "gpu:1"])
    store.set_worker(job.id, pid=1234, pid_started=99)
    assert store.requeue(job.id)
    requeued = store.get(job.id)
    assert requeued is not None
    assert requeued.state is JobState.QUEUED and requeued.attempts == 2
    assert requeued.devices == [] and requeued.pid is None and requeued.crashes == 0
    assert requeued.ran_on == ["gpu:0", "gpu:1"]  # the attempt it waits to run again after
    assert requeued.started_at is None  # its next attempt has not started
    store.mark_running(job.id, devices=["gpu:0"])
    assert store.get(job.id).started_at is not None  # type: ignore[union-attr]
    assert store.requeue(job.id, crashed=True)
    again = store.get(job.id)
    assert again is not None and again.attempts == 3 and again.crashes == 1
    assert again.ran_on == ["gpu:0"]


def test_requeue_refused_once_a_cancel_is_asked_for(store: JobStore) -> None:
    # Queued again, a job asked to cancel had its request cleared as its next attempt
    # started, and trained on: the supervisor ends it instead (test_supervisor.py).
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.request_cancel(job.id)
    assert not store.requeue(job.id, crashed=True)
    kept = store.get(job.id)
    assert kept is not None and (kept.state, kept.attempts) == (JobState.RUNNING, 1)


def test_store_from_before_added_columns_gains_them(tmp_path: Path) -> None:
    # A jobs table as the first version wrote it, with a job in it.
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    job = store.create(SPEC)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX jobs_queued")  # it names queued_at
    conn.execute("CREATE INDEX jobs_by_state ON jobs (state, priority DESC, seq)")
    conn.execute("ALTER TABLE jobs DROP COLUMN crashes")
    conn.execute("ALTER TABLE jobs DROP COLUMN exiting")
    conn.execute("ALTER TABLE jobs DROP COLUMN queued_at")
    conn.execute("ALTER TABLE jobs DROP COLUMN resumed_from")
    for column in ("ran_on", "rewinds", "shown_through"):
        conn.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    conn.commit()
    conn.close()

    reopened = JobStore(path)
    old = reopened.get(job.id)
    assert old is not None and old.crashes == 0 and old.exiting is None and old.spec == SPEC
    assert old.resumed_from is None and old.queued_at is None and old.ran_on is None
    assert old.rewinds is None and old.shown_through is None
    # The queue's index, made once the column it names is there, in place of the old one.
    indexes = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "jobs_queued" in indexes and "jobs_by_state" not in indexes
    assert [queued.id for queued in reopened.queue()] == [job.id]
    reopened.mark_running(job.id, devices=["cpu:0"])
    assert reopened.requeue(job.id, crashed=True)
    assert reopened.get(job.id).crashes == 1  # type: ignore[union-attr]
    assert reopened.get(job.id).ran_on == ["cpu:0"]  # type: ignore[union-attr]


@pytest.mark.parametrize("end", ["finish", "requeue"])
def test_a_job_running_as_its_store_gained_ran_on_keeps_its_devices_as_it_ends(
    store: JobStore, tmp_path: Path, end: str
) -> None:
    # Started before `ran_on` was kept (the column added empty, its worker adopted across
    # the upgrade): its end freed `devices` and left `ran_on` None, so its page and
    # `status ID` said "-", not what it ran on.
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["gpu:0", "gpu:1"])
    with contextlib.closing(sqlite3.connect(tmp_path / "jobs.db")) as conn, conn:
        conn.execute("UPDATE jobs SET ran_on = NULL WHERE id = ?", (job.id,))
    if end == "finish":
        assert store.finish(job.id, JobState.SUCCEEDED, result=None, error=None)
    else:
        assert store.requeue(job.id, crashed=True)
    ended = store.get(job.id)
    assert ended is not None and ended.devices == [] and ended.ran_on == ["gpu:0", "gpu:1"]


def test_exiting_worker_kept_until_it_has_exited(store: JobStore) -> None:
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    exiting = {"pid": 1234, "pid_started": 99, "devices": ["cpu:0"]}
    assert not store.is_exiting(job.id)
    store.finish(job.id, JobState.SUCCEEDED, result=None, error=None, exiting=exiting)
    ended = store.get(job.id)
    assert ended is not None and ended.devices == [] and ended.exiting == exiting
    assert [record.id for record in store.exiting()] == [job.id]
    assert store.is_exiting(job.id) and not store.is_exiting("no-such-job")
    store.exited(job.id)
    assert not store.is_exiting(job.id)
    assert store.exiting() == [] and store.get(job.id).version == ended.version  # type: ignore[union-attr]


def test_finish_records_result_and_error(store: JobStore) -> None:
    job = store.create(SPEC)
    assert store.get(job.id).ran_on is None  # type: ignore[union-attr]  # never started
    store.mark_running(job.id, devices=["cpu:0"])
    error = {"reason": "boom", "exit_code": 1, "signal": None, "log_tail": ["x"]}
    assert store.finish(job.id, JobState.FAILED, result=None, error=error)
    assert not store.finish(job.id, JobState.SUCCEEDED, result=None, error=None)
    done = store.get(job.id)
    assert done is not None
    assert done.state is JobState.FAILED and done.error == error and done.devices == []
    assert done.ran_on == ["cpu:0"]
    assert store.count_by_state()[JobState.FAILED] == 1


@pytest.mark.parametrize(
    ("state", "eta"),
    [(JobState.FAILED, None), (JobState.CANCELLED, None), (JobState.SUCCEEDED, 24.9)],
)
def test_a_job_that_ends_unsucceeded_keeps_no_eta(store: JobStore, state, eta) -> None:
    # Its worker killed (the OOM killer, a cancel past its grace) wrote no `end` line, so
    # the last snapshot still held a running estimate.
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    progress = {"step": 7, "total": 40, "eta_seconds": 24.9, "phase": "checkpoint"}
    store.record_progress(job.id, offset=10, progress=progress, eval=None, points=[])
    assert store.finish(job.id, state, result=None, error=None)
    ended = store.get(job.id)
    assert ended is not None and ended.progress == {**progress, "eta_seconds": eta}


def test_a_job_ended_before_its_worker_reported_was_preparing(store: JobStore) -> None:
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.finish(job.id, JobState.FAILED, result=None, error=None)
    ended = store.get(job.id)
    assert ended is not None and ended.progress == {"phase": "preparing", "eta_seconds": None}


def test_a_started_attempt_is_preparing_not_where_the_last_one_was(store: JobStore) -> None:
    """A worker crashed in an eval: its job, queued again, shows the step it had reached
    and no phase, ETA or speed (they were the dead attempt's: a queued job showed
    "training", an ETA and a speed); started, `preparing` until the new worker reports."""
    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.get(job.id).progress == {"phase": "preparing"}  # type: ignore[union-attr]
    progress = {"step": 40, "total": 100, "loss": 0.5, "phase": "eval", "phase_done": 3,
                "phase_total": 20, "eta_seconds": 110.2, "examples_per_sec": 46726.0}  # fmt: skip
    store.record_progress(job.id, offset=10, progress=progress, eval=None, points=[])
    assert store.requeue(job.id, crashed=True)
    queued = store.get(job.id)
    assert queued is not None and queued.progress == {"step": 40, "total": 100, "loss": 0.5}
    assert store.cancel_queued(job.id)  # it ends with no ETA either
    assert store.get(job.id).progress == queued.progress  # type: ignore[union-attr]

    job = store.create(SPEC)
    store.mark_running(job.id, devices=["cpu:0"])
    store.record_progress(job.id, offset=10, progress=progress, eval=None, points=[])
    assert store.requeue(job.id, crashed=True)
    store.mark_running(job.id, devices=["cpu:0"])
    again = store.get(job.id)
    assert again is not None
    assert again.progress == {"step": 40, "total": 100, "loss": 0.5, "phase": "preparing"}

    # A worker that died loading its data: the next attempt's stage is its own, to come.
    loading = {"stage": "loading data", "stage_done": 5, "stage_total": 9, "stage_percent": 55.6}
    store.record_progress(job.id, offset=20, progress={**progress, "phase": "preparing", **loading},
                          eval=None, points=[])  # fmt: skip
    assert store.requeue(job.id, crashed=True)
    store.mark_running(job.id, devices=["cpu:0"])
    assert store.get(job.id).progress == again.progress  # type: ignore[union-attr]


def test_record_progress_replaces_repeated_steps(store: JobStore) -> None:
    job = store.create(SPEC)
    store.record_progress(
        job.id, offset=10, progress={"step": 2}, eval=None,
        points=[MetricPoint("loss", 1, 1.0, 0.9), MetricPoint("loss", 2, 2.0, 0.8)],
    )  # fmt: skip
    # A resumed attempt reports step 2 again.
    store.record_progress(
        job.id, offset=20, progress={"step": 2}, eval=None,
        points=[MetricPoint("loss", 2, 3.0, 0.7)],
    )  # fmt: skip
    assert [(p.step, p.value) for p in store.metrics(job.id)] == [(1, 0.9), (2, 0.7)]
    assert store.get(job.id).progress_offset == 20  # type: ignore[union-attr]


def test_metrics_by_series_after_step(store: JobStore) -> None:
    job = store.create(SPEC)
    store.record_progress(
        job.id, offset=10, progress={"step": 3}, eval=None,
        points=[MetricPoint(name, step, float(step), step / 10)
                for name in ("loss", "accuracy", "eval_loss") for step in (1, 2, 3)],
    )  # fmt: skip
    picked = store.metrics(job.id, names=["loss", "eval_loss"], after_step=1)
    assert [(p.name, p.step) for p in picked] == [
        ("eval_loss", 2), ("eval_loss", 3), ("loss", 2), ("loss", 3),
    ]  # fmt: skip
    assert len(store.metrics(job.id)) == 9


def test_read_from_many_threads_while_writing(store: JobStore) -> None:
    job = store.create(SPEC)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(200):
                assert store.get(job.id) is not None
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    for step in range(50):
        store.record_progress(job.id, offset=step, progress={"step": step}, eval=None, points=[])
    for reader in readers:
        reader.join()
    assert errors == []


def test_close_closes_readers_of_every_thread(tmp_path: Path) -> None:
    # Readers of other threads (the server's thread pool) that stay open would keep the
    # -wal and -shm files, and their file handles, after close().
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    job = store.create(SPEC)
    opened, closed, release = threading.Barrier(4), threading.Event(), threading.Event()
    after_close: list[BaseException] = []

    def read() -> None:
        assert store.get(job.id) is not None
        opened.wait()
        closed.wait()
        try:
            store.get(job.id)
        except BaseException as error:
            after_close.append(error)
        release.wait()

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    opened.wait()  # three readers are open, on threads that are still alive
    assert Path(f"{path}-wal").exists()
    store.close()
    closed.set()
    try:
        # The last connection to close checkpoints the WAL and removes it; an open reader
        # would have kept it.
        assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    finally:
        release.set()
        for reader in readers:
            reader.join()
    assert len(after_close) == 3
    assert all(isinstance(error, sqlite3.ProgrammingError) for error in after_close)


def _open_handles(path: Path) -> int:
    """This process's file descriptors open on the database at `path` and its -wal."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed since
            count += os.readlink(f"/proc/self/fd/{fd}") in (str(path), f"{path}-wal")
    return count


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """As between the rare full collections of a long-lived service: a connection is in a
    reference cycle (its statement cache refers back to it), freed by a collection alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_finished_threads_reader_is_closed_as_the_next_opens(tmp_path: Path) -> None:
    # The server's pool ends a thread idle for 10 s and starts another when requests come
    # again, which opens a reader of its own. The ended thread's reader was freed only by a
    # full cycle collection (a connection's statement cache refers back to it), rare in an
    # idle service: a soak of 10 jobs left 5 more open, two handles each.
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    job = store.create(SPEC)

    def read_on_a_new_thread() -> None:
        reader = threading.Thread(target=store.get, args=(job.id,))
        reader.start()
        reader.join()

    try:
        with _without_cycle_collection():
            for _ in range(2):  # the last ended thread's reader stays open until the next
                read_on_a_new_thread()
            settled = _open_handles(path)
            for _ in range(8):
                read_on_a_new_thread()
            grown = _open_handles(path) - settled
    finally:
        store.close()
    assert grown == 0, f"Expected no more handles open after 8 more threads. Received: {grown}"


def test_a_reader_of_a_thread_threading_did_not_start_is_closed_by_close(tmp_path: Path) -> None:
    # A thread started outside `threading` is a `_DummyThread` to it, alive for ever, and
    # the next such thread of the same ident (which pthreads reuse) gets the same object:
    # its reader replaced the first in the store's readers, which close() then missed.
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    job = store.create(SPEC)
    idents: list[int] = []

    def read(done: Any) -> None:
        try:
            idents.append(threading.get_ident())
            store.get(job.id)
        finally:
            done.release()

    with _without_cycle_collection():
        for _ in range(3):
            done = _thread.allocate_lock()
            done.acquire()
            _thread.start_new_thread(read, (done,))
            done.acquire()
        store.close()
        left = _open_handles(path)
    assert left == 0, f"Expected no handle open after close(). Received: {left} ({idents})"


def test_a_thread_that_reads_first_after_close_gets_programming_error(tmp_path: Path) -> None:
    # As close() says: a reader opened after it (or as it ran) was never closed.
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    job = store.create(SPEC)
    store.close()

    with ThreadPoolExecutor(1) as pool, pytest.raises(sqlite3.ProgrammingError):
        pool.submit(store.get, job.id).result()  # on a thread that never read before
    assert _open_handles(path) == 0


def test_record_progress_forgets_points_past_a_restart(store: JobStore) -> None:
    job = store.create(SPEC)
    points = [MetricPoint("loss", step, 0.0, 1.0) for step in (100, 200, 244, 264)]
    store.record_progress(job.id, offset=10, progress=None, eval=None, points=points)
    store.record_progress(
        job.id, offset=20, progress=None, eval=None,
        points=[MetricPoint("loss", 236, 0.0, 0.5)], forget_after=200,
    )  # fmt: skip
    assert [(p.step, p.value) for p in store.metrics(job.id)] == [
        (100, 1.0), (200, 1.0), (236, 0.5)
    ]  # fmt: skip


def test_a_deleted_jobs_points_are_purged_in_chunks_even_after_a_stop(tmp_path: Path) -> None:
    """`delete` leaves the points for `purge_points`, due in the store itself: a stop
    between the two leaves them for the next store to remove; other jobs keep theirs."""
    store = JobStore(tmp_path / "jobs.db")
    gone, kept = store.create(SPEC), store.create(SPEC)
    for job in (gone, kept):
        store.record_progress(
            job.id, offset=1, progress=None, eval=None,
            points=[MetricPoint(name, step, 0.0, 1.0) for name in ("loss", "accuracy")
                    for step in range(50)],
        )  # fmt: skip
        assert store.cancel_queued(job.id)
    assert store.delete(gone.id)
    assert store.get(gone.id) is None
    store.close()  # stopped before the purge ran

    store = JobStore(tmp_path / "jobs.db")
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        assert (
            conn.execute("SELECT COUNT(*) FROM metrics WHERE job_id = ?", (gone.id,)).fetchone()[0]
            == 100
        )
    assert store.purge_points(chunk=7) == 100
    assert store.purge_points() == 0  # nothing is due any more
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        assert (
            conn.execute("SELECT COUNT(*) FROM metrics WHERE job_id = ?", (gone.id,)).fetchone()[0]
            == 0
        )
        assert conn.execute("SELECT COUNT(*) FROM purges").fetchone()[0] == 0
    assert len(store.metrics(kept.id)) == 100
