"""The job store: one SQLite file in WAL mode, the service's only record of jobs.

Every state change is committed (synchronous=FULL) before the call returns, so a job the
API acknowledged survives a crash of the service. Writes go through one connection under
a lock; each thread reads through its own connection, and WAL lets reads run beside a
write. The API is small and synchronous; it is safe to call from any thread. `close` closes
every connection, the readers other threads opened included.
"""

from __future__ import annotations

import contextlib
import enum
import heapq
import itertools
import json
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service import rollups
from service.series import Row, Span, thin
from trainer.spec import EvalSpec


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# A running job's phase from its start until its worker's first progress line.
PREPARING = "preparing"
# What a job's progress says of one attempt alone: its phase, ETA and speed. A job
# requeued for another attempt drops them (the API and the page showed a queued job, its
# worker dead, "training" with an ETA and a speed), as does one resumed by a user
# (`routes/jobs.py`); a started attempt is `preparing` until its worker reports.
ATTEMPT_FIELDS = (
    "phase",
    "phase_done",
    "phase_total",
    "eta_seconds",
    "examples_per_sec",
    # The stage of its preparation (`service.progress.fold_stage`).
    "stage",
    "stage_done",
    "stage_total",
    "stage_percent",
)
_ATTEMPT_PATHS = ", ".join(f"'$.{key}'" for key in ATTEMPT_FIELDS)

# Short, URL-safe, unambiguous (no 0/o, 1/l) and never starting with '-'.
_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"
_ID_LENGTH = 10


def new_job_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


@dataclass(frozen=True)
class JobRecord:
    """One row of the store, decoded."""

    seq: int
    id: str
    name: str
    state: JobState
    priority: int
    spec: dict[str, Any]
    devices: list[str]
    attempts: int
    # Attempts that ended with the worker killed by a signal nobody sent on purpose, or an
    # adopted worker gone with no result.json (`service.outcomes.crashed`).
    crashes: int
    pid: int | None
    pid_started: int | None  # the worker's start time in clock ticks, from /proc/<pid>/stat
    cancel_requested_at: float | None
    created_at: float
    # When its latest attempt started; None while it is queued (a resumed or requeued job
    # waits for its next attempt, which has not started), as `finished_at` is None until
    # that attempt ends.
    started_at: float | None
    finished_at: float | None
    updated_at: float
    progress: dict[str, Any] | None
    eval: dict[str, Any] | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    progress_offset: int
    version: int  # +1 on every write to the row: a cheap test of whether it changed
    # An ended job's worker process that had not exited yet ({"pid", "pid_started",
    # "devices"}): its devices stay held until it has, across a service restart too.
    exiting: dict[str, Any] | None = None
    # When a user last put the ended job back in the queue (`resume`): it waits behind
    # the jobs submitted before then, as a job submitted then would. None: never resumed.
    queued_at: float | None = None
    # A resumed job, until its attempt starts: how it was when it was resumed (its state,
    # spec, progress, result, error, crashes, started_at, finished_at, queued_at,
    # cancel_requested_at),
    # for a cancel to put back.
    resumed_from: dict[str, Any] | None = None
    # The devices its latest attempt was given as it started, kept once it ends and as it
    # waits for its next attempt (`devices` holds them only while it runs; an attempt
    # started before this column was kept has them kept as it ends). None: no attempt has
    # started (or it ended before this column was kept).
    ran_on: list[str] | None = None
    # The job's rewinds (`_rewound_after`): each the step after which a later attempt
    # replaced points a read may have given, or added to them; the series' revision is
    # how many there are. None: none yet.
    rewinds: list[int] | None = None
    # The newest step a read may have given while the job had ended, as of its last resume
    # (lowered to a rewind's step): all of an ended job's steps are read, none held back.
    shown_through: int | None = None


@dataclass(frozen=True)
class QueuedJob:
    """A queued job as the scheduler sees it: its id and how many towers it asks for."""

    id: str
    towers: int


@dataclass(frozen=True)
class QueueEntry:
    """A queued job as the queue's view shows it (`JobStore.queue_entries`)."""

    id: str
    name: str
    priority: int
    towers: int
    # When it joined the queue, the time that places it among its priority's jobs: its
    # submission, or its latest resume (a requeue after its worker died keeps its place).
    queued_at: float


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued job stands in the queue's order (`_QUEUE_ORDER`): its priority, when
    it joined the queue, and its seq for a tie. A page of the queue's jobs (`page`) reads
    on after the last one's."""

    priority: int
    since: float
    seq: int

    @classmethod
    def of(cls, job: JobRecord) -> QueuePlace:
        since = job.queued_at if job.queued_at is not None else job.created_at
        return cls(job.priority, since, job.seq)


def in_run_order(states: Iterable[str]) -> bool:
    """Whether `page` lists jobs of these states in the order they start rather than newest
    first: the queued jobs alone (their order is the one people look for among them)."""
    return set(states) == {JobState.QUEUED}


@dataclass(frozen=True)
class MetricPoint:
    name: str
    step: int
    time: float
    value: float


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    spec TEXT NOT NULL,
    devices TEXT NOT NULL DEFAULT '[]',
    attempts INTEGER NOT NULL DEFAULT 1,
    crashes INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    pid_started INTEGER,
    cancel_requested_at REAL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    updated_at REAL NOT NULL,
    progress TEXT,
    eval TEXT,
    result TEXT,
    error TEXT,
    progress_offset INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 1,
    exiting TEXT,
    queued_at REAL,
    resumed_from TEXT,
    ran_on TEXT,
    rewinds TEXT,
    shown_through INTEGER
);
-- A page of jobs in one state, newest first, walks this one instead of sorting them all.
CREATE INDEX IF NOT EXISTS jobs_by_state_seq ON jobs (state, seq);
CREATE TABLE IF NOT EXISTS metrics (
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    time REAL NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (job_id, name, step)
) WITHOUT ROWID;
-- Deleted jobs whose points are still to be removed (`purge_points`).
CREATE TABLE IF NOT EXISTS purges (job_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

# The queue in run order (`queue`), each job's towers in the index beside it: the
# supervisor reads the queue every pass (five a second), and read from the table it sorted
# every queued job and parsed each one's spec for its towers, 87 ms a pass for 500 queued
# jobs whose specs held 50 kB of a custom model's params (44% of a core, the queue idle).
# Made after the added columns, which it names; it replaces `jobs_by_state`, which served
# only the queue and still sorted it. `_QUEUE` must name its expressions and its state as
# it does. Of queued jobs alone: over every job, each change of any job's state parsed its
# spec twice (a MiB, 4.5 ms each) in the write transaction, and a store from before it
# parsed every job's spec to build it as the service started; now only a job entering or
# leaving the queue has its spec read for it. It keeps `state` first all the same: without
# it, SQLite (no statistics) took `jobs_by_state_seq` for the queue and sorted it.
_QUEUE_ORDER = "priority DESC, COALESCE(queued_at, created_at), seq"
_TOWERS = "json_extract(spec, '$.towers')"
_QUEUE_INDEX = f"""
CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (state, {_QUEUE_ORDER}, {_TOWERS})
    WHERE state = 'queued';
DROP INDEX IF EXISTS jobs_queue;
DROP INDEX IF EXISTS jobs_by_state;
"""
_QUEUE = f"SELECT id, {_TOWERS} FROM jobs WHERE state = 'queued'"
# Past a queued job's place (`QueuePlace`) in `_QUEUE_ORDER`: `priority <= ?` lets SQLite
# start its walk of `jobs_queued` at that priority.
_SINCE = "COALESCE(queued_at, created_at)"
_AFTER_PLACE = f"priority <= ? AND (priority < ? OR {_SINCE} > ? OR ({_SINCE} = ? AND seq > ?))"
# The queue's view (`queue_entries`): the same walk of the index, a few columns more.
_QUEUE_ENTRIES = (
    f"SELECT id, name, priority, {_TOWERS}, COALESCE(queued_at, created_at) FROM jobs"
    f" WHERE state = 'queued' ORDER BY {_QUEUE_ORDER} LIMIT ?"
)

# Columns added since the first schema, for stores made before them.
_ADDED_COLUMNS = {
    "crashes": "INTEGER NOT NULL DEFAULT 0",
    "exiting": "TEXT",
    "queued_at": "REAL",
    "resumed_from": "TEXT",
    "ran_on": "TEXT",
    "rewinds": "TEXT",
    "shown_through": "INTEGER",
}

_JSON_COLUMNS = (
    "spec", "devices", "progress", "eval", "result", "error", "exiting", "resumed_from",
    "ran_on", "rewinds",
)  # fmt: skip

# What `resume` keeps of the ended job it queues again, for a cancel before the attempt
# starts to put back (`cancel_queued`): computed from the row as it was, in the same UPDATE.
# Times as text of 17 digits (`%!.17g`, whose `!` lifts SQLite's 16): json_object writes
# a REAL with 15, and the time put back would differ from the one taken.
_EXACT = "CASE WHEN {0} IS NULL THEN NULL ELSE printf('%!.17g', {0}) END"
_RESUMED_FROM = (
    "resumed_from = json_object('state', state, 'spec', json(spec), 'progress', "
    "json(progress), 'result', json(result), 'error', json(error), 'crashes', crashes, "
    f"'started_at', {_EXACT.format('started_at')}, "
    f"'finished_at', {_EXACT.format('finished_at')}, 'queued_at', "
    f"{_EXACT.format('queued_at')}, 'cancel_requested_at', "
    f"{_EXACT.format('cancel_requested_at')})"
)
# Each column as `resume` found it: JSON columns as JSON text, as they are stored.
_PUT_BACK = (
    "state = json_extract(resumed_from, '$.state'), "
    "spec = json(json_extract(resumed_from, '$.spec')), "
    "progress = json(json_extract(resumed_from, '$.progress')), "
    "result = json(json_extract(resumed_from, '$.result')), "
    "error = json(json_extract(resumed_from, '$.error')), "
    # (A job resumed before `resume` cleared its start kept it, and keeps it.)
    "started_at = CASE WHEN json_type(resumed_from, '$.started_at') IS NULL THEN started_at"
    " ELSE CAST(json_extract(resumed_from, '$.started_at') AS REAL) END, "
    "finished_at = CAST(json_extract(resumed_from, '$.finished_at') AS REAL), "
    "queued_at = CAST(json_extract(resumed_from, '$.queued_at') AS REAL), "
    "cancel_requested_at = CAST(json_extract(resumed_from, '$.cancel_requested_at') AS REAL), "
    "crashes = json_extract(resumed_from, '$.crashes'), "
    # Its priority as its spec put back has it (a resume, or a change while it waited for
    # its attempt, may have set another): the column and the spec always agree.
    "priority = COALESCE(json_extract(resumed_from, '$.spec.priority'), priority), "
    "attempts = attempts - 1, resumed_from = NULL"
)


# A rewind recorded (`record_progress`): the series a revision newer, and the job's ended
# steps no longer shown past it (the points there are the new attempt's to come).
_REWIND = (
    "UPDATE jobs SET rewinds = json_insert(COALESCE(rewinds, '[]'), '$[#]', ?),"
    " shown_through = MIN(COALESCE(shown_through, ?), ?) WHERE id = ?"
)


def _row_to_record(row: sqlite3.Row) -> JobRecord:
    values = dict(row)
    for column in _JSON_COLUMNS:
        raw = values[column]
        values[column] = json.loads(raw) if raw is not None else None
    values["state"] = JobState(values["state"])
    return JobRecord(**values)


def _metrics_where(
    conn: sqlite3.Connection,
    job_id: str,
    names: Sequence[str],
    after_step: int | None,
    before_step: int | None = None,
) -> tuple[str, list[Any]]:
    """The WHERE clause, and its arguments, of a read of the job's metric points (read on
    `conn` in the transaction that reads the points, so the series named are all there):
    steps after `after_step` and before `before_step`, each when given. Steps after
    `after_step` are read a series at a time, every series named: `step > ?` alone walked
    every point of the job, 0.3 s to read on a long job's last 100 steps."""
    where = " WHERE job_id = ?"
    args: list[Any] = [job_id]
    if after_step is not None and not names:
        names = rollups.series_names(conn, job_id)
    if names:
        where += f" AND name IN ({', '.join('?' * len(names))})"
        args += names
    if after_step is not None:
        where += " AND step > ?"
        args.append(after_step)
    if before_step is not None:
        where += " AND step < ?"
        args.append(before_step)
    return where, args


# The series a worker's `eval` line adds (`service.progress`). It writes that line after
# the `progress` line of the step it evaluates, a moment to seconds later (`trainer.
# controller`: the eval of a step due one, and the final eval after the last step's line).
EVAL_SERIES = ("eval_loss", "eval_accuracy")
# A stored spec names its eval cadence (a model dump); one that does not has the default.
_EVAL_EVERY = EvalSpec.model_fields["every_steps"].default
# What `_held_step` reads of the job: whether it has ended, its eval cadence, its total
# steps, and its eval examples (a start line's `data`; 0: it never evaluates).
_EVAL_FACTS = (
    "SELECT state IN ('succeeded', 'failed', 'cancelled'),"
    " json_extract(spec, '$.eval.every_steps'), json_extract(progress, '$.total'),"
    " json_extract(progress, '$.data.eval_examples') FROM jobs WHERE id = ?"
)
_EVAL_BETWEEN = (
    f"SELECT 1 FROM metrics WHERE job_id = ? AND name IN ({', '.join('?' * len(EVAL_SERIES))})"
    " AND step BETWEEN ? AND ? LIMIT 1"
)


def _newest_step(conn: sqlite3.Connection, job_id: str) -> int | None:
    """The job's newest step with a point in any series: a seek of the key per series
    (`MAX(step)` over the job alone walks every point it has, the key's next column being
    the name)."""
    sql = "SELECT MAX(step) FROM metrics WHERE job_id = ? AND name = ?"
    steps = [
        conn.execute(sql, (job_id, name)).fetchone()[0]
        for name in rollups.series_names(conn, job_id)
    ]
    return max((step for step in steps if step is not None), default=None)


def _held_step(conn: sqlite3.Connection, job_id: str, names: Sequence[str]) -> int | None:
    """The step whose points an exact read of the job (`stream_metrics`) leaves out, or
    None: its newest, while the job has not ended and an eval of that step may still come
    with none stored yet. A client reads on after the last step it got (`after_step`), and
    one that got a step before its eval line came never got that eval; left out, the
    step comes whole in a later read, once a later step is stored or the job has ended.

    An eval may come where the trainer runs one: at a step of the cadence (`eval.
    every_steps`) and at the job's last step (its final eval); and on a resume from a
    step past the last one of the cadence whose eval never ended (a stop during it), at
    that step (`_evaluate_if_cut_short`). So: at the newest step N when it is the total,
    else when no eval point lies from the cadence's last step at or before N through N.
    Nothing is held for a read of no eval series, nor for a job that never evaluates
    (cadence 0, or no eval examples). A few index seeks: no point is walked."""
    if names and not set(names) & set(EVAL_SERIES):
        return None
    facts = conn.execute(_EVAL_FACTS, (job_id,)).fetchone()
    if facts is None:
        return None
    ended, every, total, examples = facts
    if ended or examples == 0:
        return None
    every = every if isinstance(every, int) else _EVAL_EVERY
    newest = _newest_step(conn, job_id)
    if every <= 0 or newest is None:
        return None
    total = total if isinstance(total, int) else None
    if total is not None and newest > total:
        return None  # of a run past a total resumed lower (`--finish`): none comes there
    due = newest if newest == total else newest - newest % every
    if due <= 0:
        return None
    stored = conn.execute(_EVAL_BETWEEN, (job_id, *EVAL_SERIES, due, newest)).fetchone()
    return None if stored is not None else newest


def _step_before(conn: sqlite3.Connection, job_id: str, step: int) -> int | None:
    """The job's newest step before `step` with a point in any series: a seek per series."""
    sql = "SELECT MAX(step) FROM metrics WHERE job_id = ? AND name = ? AND step < ?"
    steps = [
        conn.execute(sql, (job_id, name, step)).fetchone()[0]
        for name in rollups.series_names(conn, job_id)
    ]
    return max((found for found in steps if found is not None), default=None)


def _rewound_after(
    conn: sqlite3.Connection, job_id: str, rows: Sequence[Row], forget_after: int | None
) -> int | None:
    """The step after which storing `rows` (and forgetting the points past `forget_after`
    first) changes points a read may already have given, or None: a rewind, which makes
    the job's series a revision newer (`record_progress`; read on the writer, in its
    transaction, before the change).

    A read may have given every step but the one `_held_step` holds now, and every step
    of the job as it last ended (`shown_through`): a later attempt's points there are news
    to a client that read on past them. So: `forget_after` when points it forgets were
    shown (a resume from a checkpoint older than the newest step: its steps are trained
    again); and the step before any point stored at a shown step where that series had
    none or another value (a resumed attempt's eval of a step a cancelled job had shown,
    whose eval the stop cut short; the final eval of a job finished at its checkpoint). A
    point stored again with its value (a cancelled run's `end` line repeats its last
    step's loss) changes nothing. A few index seeks, and none at all when every point is
    past the newest step and nothing is forgotten, as for nearly every batch."""
    newest = _newest_step(conn, job_id)
    if newest is None or (forget_after is None and all(row[1] > newest for row in rows)):
        return None
    shown = conn.execute("SELECT shown_through FROM jobs WHERE id = ?", (job_id,)).fetchone()
    held = _held_step(conn, job_id, ())
    readable = newest if held != newest else _step_before(conn, job_id, newest)
    seen = max((step for step in (shown and shown[0], readable) if step is not None), default=None)
    if seen is None:
        return None
    lowest = forget_after if forget_after is not None and seen > forget_after else None
    value_at = "SELECT value FROM metrics WHERE job_id = ? AND name = ? AND step = ?"
    for name, step, _, value in rows:
        if step > seen or (lowest is not None and step > lowest):
            continue  # news to every reader; or no lower than the rewind found already
        stored = conn.execute(value_at, (job_id, name, step)).fetchone()
        if stored is None or stored[0] != value:
            lowest = max(step - 1, 0)
    return lowest


class Rewound(Exception):
    """A read on past a step whose points have changed since the client's revision: its
    points after `after` are not the ones it holds (`JobStore.stream_metrics`)."""

    def __init__(self, job_id: str, since: int, after: int, revision: int) -> None:
        super().__init__(job_id, since, after, revision)
        self.job_id, self.since, self.after, self.revision = job_id, since, after, revision


class UnknownRevision(ValueError):
    """A read on from a revision the job's series has not reached (`revision`: its own)."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


def _revision(
    conn: sqlite3.Connection, job_id: str, after_step: int | None, since: int | None
) -> int:
    """The job's series revision (how many rewinds it has had: `_rewound_after`), checked
    against a read on after `after_step` by a client that holds revision `since` (0 when
    not given: the series as first written): `Rewound` when a rewind since then reaches
    back to or before `after_step`, whose points the client holds are no longer the job's;
    `UnknownRevision` for one past the job's. One lookup of the job's row."""
    row = conn.execute("SELECT rewinds FROM jobs WHERE id = ?", (job_id,)).fetchone()
    rewinds: list[int] = json.loads(row[0]) if row is not None and row[0] else []
    if after_step is None:
        return len(rewinds)
    since = since or 0
    if since > len(rewinds):
        raise UnknownRevision(len(rewinds))
    after = min(rewinds[since:], default=None)
    if after is not None and after < after_step:
        raise Rewound(job_id, since, after, len(rewinds))
    return len(rewinds)


def _series_points(
    conn: sqlite3.Connection, job_id: str, name: str, rest: str = "ORDER BY step", *args: Any
) -> list[Row]:
    """One series' points; `rest` (with its `args`) narrows, orders or limits them."""
    sql = f"SELECT name, step, time, value FROM metrics WHERE job_id = ? AND name = ? {rest}"
    return conn.execute(sql, (job_id, name, *args)).fetchall()


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


class MetricRows:
    """An exact read's points as (series, step, time, value) rows, read as they are
    iterated, and the series' `revision` they are of (`JobStore.stream_metrics`). Its
    connection is closed when the rows run out or `close` is called, whichever is first
    (an answer whose client went away never iterates them all). `series`: the series
    the read has points of, by name, where it was read in step order (`by_step`); else
    None, as the rows say it as they come."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        cursors: Sequence[sqlite3.Cursor],
        revision: int,
        rows: Iterable[Row] | None = None,
        series: list[str] | None = None,
    ) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._cursors, self.revision = cursors, revision
        self._rows: Iterable[Row] = cursors[0] if rows is None else rows
        self.series = series

    def __iter__(self) -> Iterator[Row]:
        try:
            # Not `yield from`: closing this would close the cursor, on a closed database.
            for row in self._rows:  # noqa: UP028
                yield row
        finally:
            self.close()

    def close(self) -> None:
        """The cursors first: a connection closed with a statement of its unfinished is
        closed only once that statement is, and kept its read open (and the WAL from a
        checkpoint past it) until the cursor was collected."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            for cursor in self._cursors:
                with contextlib.suppress(sqlite3.ProgrammingError):  # closed already, elsewhere
                    cursor.close()
            conn.close()


class JobStore:
    """Thread-safe access to the jobs in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        # Every reader, by the thread that opened it, so that close() reaches them all, and
        # a finished thread's reader is closed as the next one opens. Left to the thread's
        # end, it stayed open: a connection is in a reference cycle (its statement cache
        # holds it), freed only by a full cycle collection, which an idle service seldom
        # runs; the server's pool ends a thread idle for 10 s, and each new one opened
        # another reader, two file handles and up to 2 MB of page cache more each time.
        self._readers: dict[threading.Thread, sqlite3.Connection] = {}
        self._readers_lock = threading.Lock()
        self._closed = False  # by close(), under `_readers_lock`
        self._writer = self._connect()
        with self._write_lock:
            self._writer.executescript(_SCHEMA + rollups.SCHEMA)
            self._add_missing_columns()
            self._writer.executescript(_QUEUE_INDEX)

    def _add_missing_columns(self) -> None:
        # A store written by an earlier version: add what it lacks (SQLite adds a column
        # with a constant default in place, without rewriting the table).
        have = {row["name"] for row in self._writer.execute("PRAGMA table_info(jobs)")}
        for column, declaration in _ADDED_COLUMNS.items():
            if column not in have:
                self._writer.execute(f"ALTER TABLE jobs ADD COLUMN {column} {declaration}")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            isolation_level=None,
            check_same_thread=False,
            timeout=30.0,
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before it returns, so an acknowledged job is never lost.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                if self._closed:
                    # Opened as close() ran, or after: kept, it was never closed.
                    conn.close()
                    self._local.conn = None
                    raise sqlite3.ProgrammingError("Cannot operate on a closed JobStore.")
                ended = [thread for thread in self._readers if not thread.is_alive()]
                for thread in ended:
                    # Its thread is gone: nothing uses it any more, from any thread.
                    self._readers.pop(thread).close()
                # A thread's key holding a reader already is another thread's that ended:
                # a thread threading did not start (a `_DummyThread`, alive as far as it
                # can tell) whose ident this one reuses, and so its object.
                if (orphan := self._readers.pop(threading.current_thread(), None)) is not None:
                    orphan.close()
                self._readers[threading.current_thread()] = conn
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._writer
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    def close(self) -> None:
        """Close the writer and every thread's reader (a thread that reads after this gets
        sqlite3.ProgrammingError)."""
        with self._readers_lock:
            self._closed = True
            readers = list(self._readers.values())
            self._readers.clear()
        for conn in readers:
            conn.close()
        self._local.conn = None
        with self._write_lock:
            self._writer.close()

    # --- reads -------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        row = self._reader().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row_to_record(row) if row is not None else None

    def version(self, job_id: str) -> int | None:
        """The job's row version (None when there is no such job): one indexed lookup."""
        row = self._reader().execute("SELECT version FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else int(row[0])

    def is_exiting(self, job_id: str) -> bool:
        """Whether the job's worker is still exiting after its end (see `exiting`): one
        indexed lookup, with no record parsed (a spec may be a MiB)."""
        row = (
            self._reader()
            .execute("SELECT exiting IS NOT NULL FROM jobs WHERE id = ?", (job_id,))
            .fetchone()
        )
        return row is not None and bool(row[0])

    def page(
        self,
        *,
        states: Iterable[JobState] = (),
        name: str | None = None,
        limit: int = 50,
        before_seq: int | None = None,
        after_place: QueuePlace | None = None,
    ) -> tuple[list[JobRecord], int]:
        """Newest first; jobs with seq below `before_seq` when given; with `name`, jobs
        whose name holds it, in any case (ASCII). The queued jobs alone (`in_run_order`)
        come in the order they start instead, as `queue` has them, and those past
        `after_place` when given (`before_seq` is not for them). Returns (page, count)."""
        if name and "\x00" in name:
            # No name holds one (the spec refuses control characters), and SQLite's LIKE
            # ends its pattern at a NUL: `?name=%00` listed every job.
            return [], 0
        where: list[str] = []
        params: list[str | float] = []
        state_values = [state.value for state in states]
        run_order = in_run_order(state_values)
        if run_order:
            # As the queue's partial index (`jobs_queued`) names it: with `state IN (?)`,
            # SQLite walked `jobs_by_state_seq` and sorted the queue.
            where.append("state = 'queued'")
        elif state_values:
            where.append(f"state IN ({','.join('?' * len(state_values))})")
            params.extend(state_values)
        if name:
            # A scan of the names: fine for the thousands of jobs one store holds.
            where.append("name LIKE ? ESCAPE '\\'")
            params.append("%" + re.sub(r"([\\%_])", r"\\\1", name) + "%")
        filter_sql = f"WHERE {' AND '.join(where)}" if where else ""
        conn = self._reader()
        count = conn.execute(f"SELECT COUNT(*) FROM jobs {filter_sql}", params).fetchone()[0]
        if run_order:
            # The queue's order, walked in its index from the place given.
            if after_place is not None:
                place = after_place
                where.append(_AFTER_PLACE)
                params += [place.priority, place.priority, place.since, place.since, place.seq]
            where_sql = " AND ".join(where)
            select = f"SELECT * FROM jobs WHERE {where_sql} ORDER BY {_QUEUE_ORDER} LIMIT ?"
            return self._records(select, [*params, limit]), count
        if before_seq is not None:
            where.append("seq < ?")
            params.append(before_seq)
        page_sql = f"WHERE {' AND '.join(where)}" if where else ""
        select = f"SELECT * FROM jobs {page_sql} ORDER BY seq DESC LIMIT ?"
        if len(state_values) > 1:
            # No one index holds several states in the page's order: they are sorted, and
            # only their seqs, from an index. Sorted whole, each row with its spec, a page
            # of 200 of 3,900 failed or cancelled jobs took 7 to 18 ms (6 ms so, in
            # docs/benchmarks.md's "The service at scale", the machine busy).
            select = (
                f"SELECT * FROM jobs WHERE seq IN (SELECT seq FROM jobs {page_sql}"
                " ORDER BY seq DESC LIMIT ?) ORDER BY seq DESC"
            )
        page = self._records(select, [*params, limit])
        return page, count

    def _records(self, sql: str, params: list[object] | None = None) -> list[JobRecord]:
        """The jobs a SELECT * query returns, decoded, read on this thread's connection."""
        return [_row_to_record(row) for row in self._reader().execute(sql, params or []).fetchall()]

    def queue(self, *, most: int | None = None, towers_over: int | None = None) -> list[QueuedJob]:
        """The queued jobs' ids and towers, in the order they should run: highest priority,
        then oldest (a resumed job by when it was resumed); the first `most` of them when
        given; with `towers_over`, only those with more towers than that. All the scheduler
        needs, read without decoding each job's row: the supervisor reads it every pass, and
        decoding 3,000 queued jobs took 0.6 s each time, a CPU kept busy by an idle queue.
        Read from one index (`jobs_queued`), in its order, the towers in it: no spec is
        parsed, and `most` rows are all that is read."""
        sql, args = _QUEUE, []
        if towers_over is not None:
            sql += f" AND {_TOWERS} > ?"
            args.append(towers_over)
        sql += f" ORDER BY {_QUEUE_ORDER} LIMIT ?"
        args.append(-1 if most is None else most)
        rows = self._reader().execute(sql, args)
        return [QueuedJob(job_id, int(towers)) for job_id, towers in rows]

    def queue_entries(self, *, most: int) -> tuple[list[QueueEntry], int]:
        """The first `most` queued jobs in run order (as `queue`), each with its name,
        priority and when it joined the queue, and how many are queued in all: one
        snapshot, read from the queue's index (0.7 ms for 500 queued jobs with 59 kB
        specs), no spec parsed."""
        conn = self._reader()
        conn.execute("BEGIN")  # the count and the page: one snapshot
        try:
            count = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
            rows = conn.execute(_QUEUE_ENTRIES, (most,)).fetchall()
        finally:
            conn.execute("COMMIT")
        entries = [
            QueueEntry(job_id, name, priority, int(towers), since)
            for job_id, name, priority, towers, since in rows
        ]
        return entries, count

    def running(self) -> list[JobRecord]:
        return self._records("SELECT * FROM jobs WHERE state = 'running' ORDER BY seq")

    def exiting(self) -> list[JobRecord]:
        """Ended jobs whose worker had not exited when last seen (see JobRecord.exiting)."""
        return self._records("SELECT * FROM jobs WHERE exiting IS NOT NULL ORDER BY seq")

    def count_by_state(self) -> dict[JobState, int]:
        rows = self._reader().execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        counts = dict.fromkeys(JobState, 0)
        for state, count in rows:
            counts[JobState(state)] = count
        return counts

    def metrics(
        self,
        job_id: str,
        *,
        names: Sequence[str] = (),
        after_step: int | None = None,
        most: int | None = None,
    ) -> list[MetricPoint]:
        """The job's points by series and step: only the series in `names` (all when
        empty), only steps after `after_step` (all when None); with `most`, at most about
        that many a series (`service.series.thin`: each span's lowest and highest point,
        and the series' first and last), read as a stream rather than all held."""
        return self.read_metrics(job_id, names=names, after_step=after_step, most=most)[1]

    def read_metrics(
        self,
        job_id: str,
        *,
        names: Sequence[str] = (),
        after_step: int | None = None,
        most: int | None = None,
        revision: int | None = None,
    ) -> tuple[int, list[MetricPoint]]:
        """`metrics`, and the series' revision they are of; refused, as `stream_metrics`
        is, where the points up to `after_step` changed since the client's `revision`."""
        conn = self._reader()
        # One read transaction: every statement sees the same snapshot, so a series stored
        # between the spans' read and the points' (or a job deleted) cannot split them.
        conn.execute("BEGIN")
        try:
            current = _revision(conn, job_id, after_step, revision)
            if most is not None and after_step is None and rollups.kept(conn, job_id):
                thinned = self._thinned(conn, job_id, names, most)
                return current, [MetricPoint(*row) for row in thinned]
            where, args = _metrics_where(conn, job_id, names, after_step)
            spans: dict[str, Span] = {}
            if most is not None:
                spans = {
                    name: Span(first, last, count)
                    for name, first, last, count in conn.execute(
                        f"SELECT name, MIN(step), MAX(step), COUNT(*) FROM metrics{where}"
                        " GROUP BY name",
                        args,
                    )
                }
            rows = conn.execute(
                f"SELECT name, step, time, value FROM metrics{where} ORDER BY name, step", args
            )
            return current, [
                MetricPoint(*row) for row in (rows if most is None else thin(rows, spans, most))
            ]
        finally:
            conn.execute("COMMIT")

    def _thinned(
        self, conn: sqlite3.Connection, job_id: str, names: Sequence[str], most: int
    ) -> list[Row]:
        """`metrics` with `most`, from the rollups where a series is long enough for them
        (`service.rollups`); a shorter series from its points."""
        spans: dict[str, Span] = {}
        parts: list[Iterable[Row]] = []
        for name, count in rollups.counts(conn, job_id, names).items():
            first, last = self._ends(conn, job_id, name)
            spans[name] = Span(first[1], last[1], count)
            width = None if count <= most + 2 else rollups.width_for(first[1], last[1], most)
            if width is None:
                parts.append(_series_points(conn, job_id, name))
                continue
            # The buckets that hold the series' ends are read as points: `thin` keeps the
            # ends whatever their value and takes a span's extremes from the rest, and a
            # bucket whose lowest or highest is an end (a loss's first point, nearly
            # always) hides the next one of its points (100: 0.14 after 50: 0.68 was drawn
            # as 1000: 0.0003). Two buckets of points: at most `width` each, and a job
            # reports every 2 s, so a few hundred at the widths long jobs are read at.
            after_head = (first[1] // width + 1) * width
            tail_from = max(after_head, last[1] // width * width)
            rows = [
                row
                for row in rollups.candidates(conn, job_id, name, width)
                if after_head <= row[1] < tail_from
            ]
            head = _series_points(conn, job_id, name, "AND step < ? ORDER BY step", after_head)
            tail = _series_points(conn, job_id, name, "AND step >= ? ORDER BY step", tail_from)
            parts.append(head + rows + tail)
        return thin(itertools.chain.from_iterable(parts), spans, most)

    @staticmethod
    def _ends(conn: sqlite3.Connection, job_id: str, name: str) -> tuple[Row, Row]:
        """A series' first and last point (two lookups in the metrics' key)."""
        first = _series_points(conn, job_id, name, "ORDER BY step LIMIT 1")
        last = _series_points(conn, job_id, name, "ORDER BY step DESC LIMIT 1")
        return tuple(first[0]), tuple(last[0])  # type: ignore[return-value]

    def stream_metrics(
        self,
        job_id: str,
        *,
        names: Sequence[str] = (),
        after_step: int | None = None,
        revision: int | None = None,
        by_step: bool = False,
    ) -> MetricRows:
        """`metrics` without `most`, as (series, step, time, value) rows read as they are
        sent: a long job's millions of points, held whole, took GBs of the service's
        memory (2.5 GB for 4 million). An exact read, which a client reads on from: less
        the newest step while its eval may still come (`_held_step`), and refused where
        the points up to `after_step` changed since the client's `revision` (`_revision`:
        `Rewound`, `UnknownRevision`). On a connection of its own, closed when the rows run
        out or they are closed, as no other read of this thread can share it while open.

        `by_step`: the rows in step order instead (a step's in series order), as a CSV's
        rows are (`service.metricscsv`), and `MetricRows.series` the series that have
        points in the read: each series is read in step order along the metrics' key by a
        cursor of its own, and the cursors merged, one row of each held (an ORDER BY step
        had SQLite sort every point of the job before the first came)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN")  # the series named, the step held, the points: one snapshot
            current = _revision(conn, job_id, after_step, revision)
            held = _held_step(conn, job_id, names)
            if by_step:
                return self._by_step(conn, job_id, names, after_step, held, current)
            where, args = _metrics_where(conn, job_id, names, after_step, held)
            cursor = conn.execute(
                f"SELECT name, step, time, value FROM metrics{where} ORDER BY name, step", args
            )
        except BaseException:
            conn.close()
            raise
        return MetricRows(conn, [cursor], current)

    @staticmethod
    def _by_step(
        conn: sqlite3.Connection,
        job_id: str,
        names: Sequence[str],
        after_step: int | None,
        held: int | None,
        revision: int,
    ) -> MetricRows:
        """`stream_metrics(by_step=True)`'s rows, on `conn` in its read transaction."""
        cursors: list[sqlite3.Cursor] = []
        parts: list[Iterable[Row]] = []
        series: list[str] = []
        for name in sorted(set(names) if names else rollups.series_names(conn, job_id)):
            where, args = _metrics_where(conn, job_id, [name], after_step, held)
            cursor = conn.execute(
                f"SELECT name, step, time, value FROM metrics{where} ORDER BY step", args
            )
            cursors.append(cursor)
            first = cursor.fetchone()
            if first is not None:  # a series with no point in the read is no column of it
                series.append(name)
                parts.append(itertools.chain([first], cursor))
        rows = heapq.merge(*parts, key=lambda row: row[1])  # ties in `parts`' order: by name
        return MetricRows(conn, cursors, revision, rows, series)

    # --- writes ------------------------------------------------------------------------

    def create(self, spec: dict[str, Any]) -> JobRecord:
        """Store a new queued job; committed before this returns."""
        now = time.time()
        with self._transaction() as conn:
            for _ in range(5):  # an id collision is vanishingly rare; retry a few times
                job_id = new_job_id()
                try:
                    conn.execute(
                        "INSERT INTO jobs (id, name, state, priority, spec, created_at, updated_at)"
                        " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
                        (job_id, spec["name"], spec["priority"], _dumps(spec), now, now),
                    )
                    rollups.start(conn, job_id)
                    break
                except sqlite3.IntegrityError:
                    continue
            else:
                raise RuntimeError("Could not find a free job id after 5 tries.")
        record = self.get(job_id)
        assert record is not None
        return record

    def _update(
        self,
        job_id: str,
        where_state: JobState | Sequence[JobState] | None,
        *,
        extra_where: str | None = None,
        increment: str | None = None,
        extra_set: str | None = None,
        extra_args: Sequence[Any] = (),
        **fields: Any,
    ) -> bool:
        """Set `fields` on the job if it is in `where_state` (one state or any of several)
        and meets `extra_where`; `increment`: a column to add 1 to as well; `extra_set`: one
        more assignment (or several, comma-separated), as SQL (a change to a JSON column
        computed from its value), its `?` bound to `extra_args`."""
        fields["updated_at"] = time.time()
        for column in _JSON_COLUMNS:
            if column in fields:
                fields[column] = _dumps(fields[column])
        if "state" in fields:
            fields["state"] = JobState(fields["state"]).value
        assignments = [f"{column} = ?" for column in fields]
        assignments.append("version = version + 1")
        if increment is not None:
            assignments.append(f"{increment} = {increment} + 1")
        if extra_set is not None:
            assignments.append(extra_set)
        sql = f"UPDATE jobs SET {', '.join(assignments)} WHERE id = ?"
        params = [*fields.values(), *extra_args, job_id]
        if where_state is not None:
            states = [where_state] if isinstance(where_state, JobState) else list(where_state)
            sql += f" AND state IN ({', '.join('?' * len(states))})"
            params.extend(state.value for state in states)
        if extra_where is not None:
            sql += f" AND {extra_where}"
        with self._transaction() as conn:
            return conn.execute(sql, params).rowcount == 1

    def mark_running(self, job_id: str, *, devices: list[str]) -> bool:
        """Queued -> running, holding `devices`; the worker is recorded once it exists.

        The phase is `preparing` until the worker's `start` line: it imports TensorFlow,
        loads the data, builds the model and restores a checkpoint first, seconds to
        minutes, its lines meanwhile saying which (`stage`, and how far where it knows). It
        was blank, or the phase of the attempt a crash ended ("training") while the next
        one had not started. The last attempt's stage goes with its phase."""
        return self._update(
            job_id,
            JobState.QUEUED,
            extra_set="progress = json_set(json_remove(COALESCE(progress, '{}'), "
            f"{_ATTEMPT_PATHS}), '$.phase', '{PREPARING}')",
            state=JobState.RUNNING,
            devices=devices,
            ran_on=devices,
            pid=None,
            pid_started=None,
            cancel_requested_at=None,
            started_at=time.time(),
            finished_at=None,
            result=None,
            error=None,
            resumed_from=None,  # its attempt has started: a cancel now stops it
        )

    def set_worker(self, job_id: str, *, pid: int, pid_started: int | None) -> bool:
        """Record the worker process of a running job, so a restarted service can adopt it."""
        return self._update(job_id, JobState.RUNNING, pid=pid, pid_started=pid_started)

    def cancel_queued(self, job_id: str) -> bool:
        """Queued -> cancelled, at once; or, for a job resumed whose attempt has not
        started, back to how it was when it was resumed (its state, spec and result: a
        succeeded job's "train longer" taken back is succeeded again, its export served).
        False when the job is no longer queued."""
        with self._transaction() as conn:
            put_back = conn.execute(
                f"UPDATE jobs SET {_PUT_BACK}, updated_at = ?, version = version + 1"
                " WHERE id = ? AND state = 'queued' AND resumed_from IS NOT NULL",
                (time.time(), job_id),
            ).rowcount
        return put_back == 1 or self._update(
            job_id, JobState.QUEUED, state=JobState.CANCELLED, finished_at=time.time()
        )

    def request_cancel(self, job_id: str) -> bool:
        """Mark a running job for cancellation; the supervisor signals its worker."""
        return self._update(job_id, JobState.RUNNING, cancel_requested_at=time.time())

    def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
        exiting: dict[str, Any] | None = None,
    ) -> bool:
        """Running -> a terminal state; the job holds no devices. `exiting`: its worker has
        not exited yet (its pid, pid_started and devices), until `exited` is called.

        A job that ends other than succeeded has no ETA: its worker's `end` line says so
        (`fold_progress`), but a worker killed (the OOM killer, a cancel past its grace)
        writes none, and its last estimate would go on promising an end."""
        # A job started before `ran_on` was kept (its worker adopted across the upgrade)
        # has its devices kept there as they are freed.
        extra = ["ran_on = COALESCE(ran_on, devices)"]
        if JobState(state) is not JobState.SUCCEEDED:
            extra.append("progress = json_set(progress, '$.eta_seconds', NULL)")
        return self._update(
            job_id,
            JobState.RUNNING,
            extra_set=", ".join(extra),
            state=state,
            result=result,
            error=error,
            devices=[],
            pid=None,
            pid_started=None,
            finished_at=time.time(),
            exiting=exiting,
        )

    def exited(self, job_id: str) -> None:
        """An ended job's worker has exited (see `finish`'s `exiting`). The job's JSON does
        not change, so neither does its version."""
        with self._transaction() as conn:
            conn.execute("UPDATE jobs SET exiting = NULL WHERE id = ?", (job_id,))

    def delete(self, job_id: str) -> bool:
        """Remove an ended job whose worker has exited. False when the job is not (or no
        longer) such a job. Its points and rollups are left for `purge_points`, recorded as
        due in the same transaction: removing the millions of a long job in one took 1.7 s,
        every other write (submits, progress) waiting behind it."""
        with self._transaction() as conn:
            deleted = conn.execute(
                "DELETE FROM jobs WHERE id = ? AND state IN ('succeeded', 'failed', 'cancelled')"
                " AND exiting IS NULL",
                (job_id,),
            ).rowcount
            if deleted:
                conn.execute("INSERT OR IGNORE INTO purges VALUES (?)", (job_id,))
            return deleted == 1

    def purge_points(self, chunk: int = 5_000) -> int:
        """Remove the points and rollups of deleted jobs (`delete`), `chunk` rows at a
        time, each chunk its own transaction (20-50 ms), so other writes go on between; a
        purge cut short by a stop is finished by the next call (at start). Returns the
        points removed."""
        removed = 0
        due = [row[0] for row in self._reader().execute("SELECT job_id FROM purges")]
        for job_id in due:
            for table, key in (("metrics", "name, step"), *rollups.PURGED):
                while True:
                    with self._transaction() as conn:
                        count = conn.execute(
                            f"DELETE FROM {table} WHERE job_id = ? AND ({key}) IN"
                            f" (SELECT {key} FROM {table} WHERE job_id = ? LIMIT ?)",
                            (job_id, job_id, chunk),
                        ).rowcount
                    if table == "metrics":
                        removed += count
                    if count == 0:
                        break
            with self._transaction() as conn:
                rollups.delete(conn, job_id)  # what is left: its mark
                conn.execute("DELETE FROM purges WHERE job_id = ?", (job_id,))
        return removed

    def fail_queued(self, job_id: str, *, error: dict[str, Any]) -> bool:
        """Queued -> failed, for a job that can never start here."""
        return self._update(
            job_id, JobState.QUEUED, state=JobState.FAILED, error=error, finished_at=time.time()
        )

    def requeue(self, job_id: str, *, crashed: bool = False) -> bool:
        """Running -> queued for another attempt (its worker is gone); attempts += 1, and
        crashes += 1 when its worker was killed. Its progress keeps the step it reached
        and drops the dead attempt's phase, ETA and speed, and its `started_at` goes until
        the next attempt starts. False when the job is no longer
        running, or a cancel has been asked for: a cancel that came after the caller read
        the job was lost here (the next attempt's start clears the request), and the job
        trained on after a 202 that said it would end."""
        with self._transaction() as conn:
            return (
                conn.execute(
                    "UPDATE jobs SET state = 'queued', devices = '[]', pid = NULL,"
                    " ran_on = COALESCE(ran_on, devices),"  # as `finish` keeps them
                    " pid_started = NULL, started_at = NULL, attempts = attempts + 1, crashes = crashes + ?,"
                    f" progress = json_remove(progress, {_ATTEMPT_PATHS}),"
                    " updated_at = ?, version = version + 1"
                    " WHERE id = ? AND state = 'running' AND cancel_requested_at IS NULL",
                    (int(crashed), time.time(), job_id),
                ).rowcount
                == 1
            )

    def resume(
        self,
        job_id: str,
        *,
        spec: dict[str, Any] | None = None,
        progress: dict[str, Any] | None = None,
    ) -> bool:
        """Ended (cancelled or failed, or succeeded with a new `spec` that trains longer),
        its worker gone -> queued for another attempt, at the back of its priority's
        queue; attempts += 1 and its crash count starts again. `spec`, `progress`: the
        job's from now on, when given (its priority, the column, is `spec`'s). False when
        the job is not (or no longer) such a job."""
        ended = [JobState.FAILED, JobState.CANCELLED]
        if spec is not None:
            ended.append(JobState.SUCCEEDED)
        changes: dict[str, Any] = {}
        if spec is not None:
            changes["spec"] = spec
            changes["priority"] = spec["priority"]  # a resume may give a new one
        if progress is not None:
            changes["progress"] = progress
        # An ended job's reads have given every step it has: a later attempt's points
        # there are a rewind (`_rewound_after`). It has no worker to add any meanwhile.
        changes["shown_through"] = _newest_step(self._reader(), job_id)
        return self._update(
            job_id,
            ended,
            extra_where="exiting IS NULL",
            extra_set=_RESUMED_FROM,
            increment="attempts",
            state=JobState.QUEUED,
            devices=[],
            pid=None,
            pid_started=None,
            cancel_requested_at=None,
            started_at=None,  # the next attempt's, once it starts
            finished_at=None,
            result=None,
            error=None,
            crashes=0,
            queued_at=time.time(),
            **changes,
        )

    def set_priority(self, job_id: str, priority: int) -> bool:
        """A queued or running job's priority, in its column (the queue's order) and in its
        stored spec (shown, and written to the spec.json of its next attempt), in one
        commit. Nothing else changes: a queued job keeps the time it joined the queue, so
        it stands where it would had it been submitted (or resumed) at this priority; a
        running one's is read when it is requeued or resumed. False when the job is not
        (or no longer) queued or running."""
        return self._update(
            job_id,
            (JobState.QUEUED, JobState.RUNNING),
            extra_set="spec = json_set(spec, '$.priority', ?)",
            priority=priority,
            extra_args=(priority,),
        )

    def record_progress(
        self,
        job_id: str,
        *,
        offset: int,
        progress: dict[str, Any] | None,
        eval: dict[str, Any] | None,
        points: list[MetricPoint],
        forget_after: int | None = None,
    ) -> None:
        """Fold a batch of progress lines in: the latest snapshot, the offset read up to,
        and the scalar points (a step seen again after a resume is overwritten). With
        `forget_after`, the points stored past that step go first: a run resumed from it.
        Where that changes points a read may have given, the job's series is a revision
        newer, recorded with the step after which they changed (`_rewound_after`)."""
        # A step a batch holds twice stores its last value (as INSERT OR REPLACE would).
        rows = list({(p.name, p.step): (p.name, p.step, p.time, p.value) for p in points}.values())
        buckets = rollups.fold(rows)  # outside the lock: it is the Python part
        with self._transaction() as conn:
            # Of the job as reads saw it: before its progress (its total) changes.
            rewound = _rewound_after(conn, job_id, rows, forget_after)
            if rewound is not None:
                conn.execute(_REWIND, (rewound, rewound, rewound, job_id))
            conn.execute(
                "UPDATE jobs SET progress = ?, eval = ?, progress_offset = ?, updated_at = ?,"
                " version = version + 1 WHERE id = ?",
                (_dumps(progress), _dumps(eval), offset, time.time(), job_id),
            )
            rolled = rollups.kept(conn, job_id)
            if forget_after is not None:
                conn.execute(rollups.FORGET_POINTS, {"job": job_id, "step": forget_after})
                if rolled:
                    rollups.forget_after(conn, job_id, forget_after)
            # Buckets whose points change other than by being added are read again after.
            again = rollups.replaced(conn, job_id, rows) if rolled else set()
            if forget_after is not None:
                again.add(forget_after)
            conn.executemany(
                "INSERT OR REPLACE INTO metrics (job_id, name, step, time, value)"
                " VALUES (?, ?, ?, ?, ?)",
                [(job_id, *row) for row in rows],
            )
            if rolled:
                rollups.add(conn, job_id, buckets)
                rollups.rebuild(conn, job_id, again)
