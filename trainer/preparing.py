"""A worker's preparation as progress lines: which stage it is in, and how far a load is.

Between its start and its `start` line a worker imports TensorFlow, checks and loads the
data, builds the model and restores the latest checkpoint: seconds on MNIST, minutes for
gigabytes of data or a large model's checkpoint, all of which the service showed as
`preparing`. Each stage is a `phase` line of phase `preparing` that names it in `stage`
(`STAGES`); a stage that knows how far it is (the data's check and load: bytes of its
files, as on disk; a restore: bytes read of the checkpoint's data files) says so in
`stage_done` of `stage_total`, at its start, then at most once every `EVERY_SECONDS`,
and when it is through. A line that sets a phase without a `stage` ends the stage (the
`start` line does, with its phase `starting`).

Reporting must not cost the job anything: the lines are at most one a second, the calls
between them a clock read, and a line that cannot be written (a full disk) is logged
once and the rest given up, the job going on as it would without them (its `start` line
fails it where the disk is full, saying where). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from trainer.rundir import ProgressWriter, RunDir

log = logging.getLogger(__name__)

# The phase of every preparation line: the service's own word for a worker that has not
# yet started (`service.store.PREPARING`), so a reader that knows no stage shows it as before.
PREPARING: Final = "preparing"

# The stages, in their order. The data's and the checkpoint's say how far they are, in
# bytes: `checking data` (TFRecord files alone: every record header walked before any file
# is loaded) and `loading data` of the data files as on disk (`trainer.data`'s meter),
# `joining data` of the images of several files copied into one array (only where there
# are several), `restoring checkpoint` of its data files read (`Preparation.reads`).
IMPORTING: Final = "importing TensorFlow"
CHECKING: Final = "checking data"
LOADING: Final = "loading data"
JOINING: Final = "joining data"
BUILDING: Final = "building the model"
RESTORING: Final = "restoring checkpoint"
STAGES: Final = (IMPORTING, CHECKING, LOADING, JOINING, BUILDING, RESTORING)

# Where Linux counts the bytes a process has read (`read_bytes`).
PROC_IO: Final = Path("/proc/self/io")

# The most a stage's amounts are said, besides its first and last.
EVERY_SECONDS = 1.0


class Preparation:
    """Writes the preparation's lines to the run directory's progress.jsonl, which it opens
    on its first line (`progress`, which training then writes on)."""

    def __init__(
        self,
        rundir: RunDir,
        *,
        every: float = EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rundir = rundir
        self._every = every
        self._clock = clock
        self._progress: ProgressWriter | None = None
        self._failed = False  # a line could not be written: no more are tried
        self._stage: str | None = None
        self._said_at = -math.inf  # when the stage's amounts were last written
        self._said: tuple[int, int] | None = None  # and what they were

    @property
    def progress(self) -> ProgressWriter:
        """The run's progress.jsonl, opened by the first line of the preparation or here."""
        if self._progress is None:
            self._progress = ProgressWriter(self._rundir.progress)
        return self._progress

    def close(self) -> None:
        """Close progress.jsonl where a line opened it (a job that ends before training);
        a failure to is logged, not raised over the job's own end."""
        if self._progress is not None:
            try:
                self._progress.close()
            except OSError as e:
                log.warning("could not close progress.jsonl: %s", e)

    def stage(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """The worker is at stage `name` now (of `STAGES`); `done` of `total` where it knows
        how far that is."""
        self._stage = name
        self._said = None
        self._write(done, total)

    def amount(self, done: int, total: int) -> None:
        """How far the stage is: written at once when it is through (`done` of `total`),
        else only when `EVERY_SECONDS` have passed since the stage's last line; a clock
        read otherwise."""
        if self._stage is None or (done, total) == self._said:
            return
        # The stage's first amounts are said at once: its total.
        if self._said is not None and done < total and self._clock() - self._said_at < self._every:
            return
        self._write(done, total)

    @contextlib.contextmanager
    def reads(self, name: str, total: int, *, io: Path = PROC_IO) -> Iterator[None]:
        """Stage `name` while the body runs, said in `total` bytes the body is to read, as
        far as this process's count of bytes read (`read_bytes`) has gone since it began:
        at its start, then from a thread every `EVERY_SECONDS` (`min(read, total - 1)`),
        and `total` once the body has returned (not where it raised). For a read done by
        code that says nothing of its way (TensorFlow's restore of a checkpoint): the count
        is every read of every thread of the process, whatever it reads, so it is the
        body's only where nothing else reads much meanwhile, and it runs ahead of the
        body's own by what else is read (a restore reads its checkpoint's index, a few
        times, besides the data files its total counts; the samples read /proc): held
        under `total` until the body has returned, the stage is never said through before
        it is. Where the count is unreadable (no Linux), or `total` is 0, the stage is said
        without amounts.

        The body must write no line of its own: the thread writes them meanwhile."""
        start = read_bytes(io)
        if start is None or total <= 0:
            if name != self._stage:
                self.stage(name)
            yield
            return
        self.stage(name, 0, total)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self._every):
                now = read_bytes(io)
                if now is None:
                    return
                # Every `EVERY_SECONDS` already: not held back by `amount`'s clock. Under
                # `total` while the body runs, as the count can reach it first.
                if (done := min(now - start, total - 1), total) != self._said:
                    self._write(done, total)

        sampler = threading.Thread(target=sample, name="preparation-reads", daemon=True)
        sampler.start()
        try:
            yield
        finally:
            stop.set()
            sampler.join()
        self.amount(total, total)

    def _write(self, done: int | None, total: int | None) -> None:
        if self._failed:
            return
        amounts = (
            {} if done is None or total is None else {"stage_done": done, "stage_total": total}
        )
        try:
            self.progress.write("phase", phase=PREPARING, stage=self._stage, **amounts)
        except OSError as e:
            # Not the job's failure: the load goes on without its lines (the `start` line
            # will say where the disk is full, if it still is).
            self._failed = True
            log.warning("could not write the preparation's progress lines: %s", e)
            return
        self._said_at = self._clock()
        self._said = None if done is None or total is None else (done, total)


def read_bytes(io: Path = PROC_IO) -> int | None:
    """The bytes this process has read so far, by Linux's count (`rchar` of `/proc/self/io`:
    every read call's bytes, of files, the page cache's copies of them included, pipes and
    sockets, by every thread), or None where it cannot be read."""
    try:
        with io.open("rb") as file:
            for line in file:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
