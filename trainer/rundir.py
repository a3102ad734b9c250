"""The run directory: the file contract between the service and a worker.

    runs/<job_id>/
      spec.json        validated spec, written by the service before the worker starts
      progress.jsonl   one JSON object a line, appended and flushed by the worker
      result.json      final outcome and metrics, written atomically by the worker
      worker.log       stdout+stderr of the worker
      tb/              TensorBoard logdir (train/, eval/, plugins/profile/<run>/, and an
                       event file of the job's hyperparameters in tb/ itself)
      checkpoints/     tf.train.CheckpointManager directory; damaged/ holds checkpoints a
                       resume found unreadable and set aside (trainer/checkpoints.py)
      export/          SavedModel written at the end of a successful job (as .export.tmp/,
                       then renamed)
      profile_request.json   {"steps": N}: the service asks a running worker for a device
                       trace of its next N steps; the worker takes it
                       (`RunDir.take_profile_request`): renames it to
      profile_request.taken, then reads and deletes that
      workers/<type>-<index>/   a multi-worker cluster's tasks other than the chief
                       (trainer/cluster.py), one directory each: its own spec.json,
                       progress.jsonl, result.json and checkpoints/ (no tb/ or export/:
                       the chief writes those), so that tasks given one job dir on a
                       shared disk never write the same file

No TensorFlow here: the service reads these files with this module too.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A profile request's steps: how many the service asks for by default, and at most (a
# trace's size grows with its steps, and a whole trace is parsed for the towers' times).
PROFILE_STEPS_DEFAULT = 3
PROFILE_STEPS_MAX = 100


# A checkpoint's files, as tf.train.CheckpointManager names them (`checkpoints/`): its
# index, and each of its data shards, which say how many there are.
_CHECKPOINT_FILE = re.compile(r"ckpt-([0-9]+)\.(?:index|data-[0-9]+-of-([0-9]+))")
# The last 8 bytes of a whole index: it is a table in LevelDB's format, whose footer ends
# with this magic number (TensorFlow's `kTableMagicNumber`, little-endian). TensorFlow
# renames a save's data shards into place whole, but writes its index in place, under its
# final name: a save cut short leaves an index of 0 bytes, or a part of one.
INDEX_END = (0xDB4775248B80FB57).to_bytes(8, "little")


class ExitCode(enum.IntEnum):
    """How a worker process ends; the service maps these to job states."""

    SUCCEEDED = 0
    FAILED = 1
    INVALID_SPEC = 2
    CANCELLED = 3  # stopped by SIGTERM after writing a checkpoint


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INVALID_SPEC = "invalid_spec"
    CANCELLED = "cancelled"


# The phase a run's `end` line leaves the job in: what its worker did last. A run stopped
# by SIGTERM (a cancel) did not train all its steps, and one that failed did not either:
# "done" said so of both. Workers before these wrote "done" for every end.
END_PHASES = {
    Outcome.SUCCEEDED: "done",
    Outcome.FAILED: "failed",
    Outcome.INVALID_SPEC: "failed",
    Outcome.CANCELLED: "stopped",
}
ENDED_PHASES = frozenset(END_PHASES.values())

OUTCOME_EXIT_CODES = {
    Outcome.SUCCEEDED: ExitCode.SUCCEEDED,
    Outcome.FAILED: ExitCode.FAILED,
    Outcome.INVALID_SPEC: ExitCode.INVALID_SPEC,
    Outcome.CANCELLED: ExitCode.CANCELLED,
}


@dataclass(frozen=True)
class RunDir:
    """Paths of one job's run directory."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def progress(self) -> Path:
        return self.root / "progress.jsonl"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def log(self) -> Path:
        return self.root / "worker.log"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def latest_checkpoint_step(self) -> int | None:
        """The step of the newest checkpoint in `checkpoints/` that looks whole (its index
        ends as a whole one does, `INDEX_END`, and every data shard is there), without
        TensorFlow; None when there is none. A save cut short is no resume's: the
        Checkpointer sets it aside, and the run resumes from the one before."""
        try:
            names = os.listdir(self.checkpoints)
        except OSError:  # none yet (or no folder there)
            return None
        indexes: set[int] = set()
        shards: dict[int, list[int]] = {}
        for name in names:
            if (match := _CHECKPOINT_FILE.fullmatch(name)) is None:
                continue
            if match[2] is None:
                indexes.add(int(match[1]))
            else:
                shards.setdefault(int(match[1]), []).append(int(match[2]))
        for step in sorted(indexes, reverse=True):
            counts = shards.get(step, [])
            if (
                counts
                and len(counts) == counts[0]
                and _whole_index(self.checkpoints / f"ckpt-{step}.index")
            ):
                return step
        return None

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def profile_request(self) -> Path:
        return self.root / "profile_request.json"

    def take_profile_request(self) -> str | None:
        """The text of the service's profile request, taken (None: none waits). Claimed by
        a rename before it is read: a request the service writes meanwhile is a new file,
        left for the next take, where a read then delete would delete it unseen."""
        taken = self.root / "profile_request.taken"
        try:
            os.replace(self.profile_request, taken)
        except FileNotFoundError:
            return None
        try:
            return taken.read_text()
        finally:
            taken.unlink(missing_ok=True)

    def read_result(self) -> dict[str, Any] | None:
        """result.json's object, or None when there is none or it holds no JSON object
        (not UTF-8, not JSON, or a list or a number: the worker runs a custom model's code
        in this directory, which may write anything here)."""
        try:
            return json_object(self.result.read_bytes())
        except FileNotFoundError:
            return None


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinite float in it, at any depth, made None (null).

    Python writes them as `NaN` and `Infinity`, which are not JSON: browsers' JSON.parse,
    jq and most other readers refuse the whole file (or event). An eval loss can be NaN
    while training runs on (a model that gives inf only in inference), so they do reach
    these files; the service also passes a worker's lines through this before its event
    streams send them (a worker other than this trainer may write NaN).
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def significant(value: float) -> float:
    """A loss as the progress lines carry it: to 6 significant digits. A loss trains down
    to 1e-7 and below, where 6 decimal places would report 0 in the progress lines, the
    API's series and its charts."""
    return float(f"{value:.6g}")


def accuracy_digits(value: float) -> float:
    """An accuracy as the progress lines carry it: to 6 decimal places."""
    return round(value, 6)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON atomically (`write_text_atomic`), every NaN or infinity as null."""
    text = json.dumps(finite_json(payload), indent=2, sort_keys=True, allow_nan=False)
    write_text_atomic(path, text + "\n")


def _ends_a_line(path: Path) -> bool:
    """Whether the file is empty or ends with a newline."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class ProgressWriter:
    """Appends one JSON object a line to progress.jsonl and flushes it at once.

    Every line carries `time` (unix seconds) and `event` (`start`, `progress`, `phase`,
    `eval`, `checkpoint`, `trace`, `end`); the rest are the fields the event has, among them
    step, total, loss, accuracy, examples_per_sec, eta_seconds, phase, checkpoint,
    learning_rate, tower_ms, eval_loss, eval_accuracy; phase_done of phase_total on
    the `phase` lines of a phase that reports how far it is (eval: batches, every 2 s);
    and before the `start` line, `phase` lines of phase `preparing` naming the `stage` the
    worker is in, with stage_done of stage_total where it says how far (bytes; see
    `trainer.preparing`).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - held for the run
        # A line the run before cut short (a disk that filled mid-line, a crashed host's
        # NULs) is ended first, so it stays a line of its own that readers skip: appended
        # to, it swallowed this run's `start` line, and the service never saw the restart
        # (the lost run's points past it were kept, the phase and total stayed the old).
        if not _ends_a_line(path):
            self._append("\n")

    def write(self, event: str, **fields: Any) -> None:
        line = finite_json({"time": round(time.time(), 3), "event": event, **fields})
        self._append(json.dumps(line, sort_keys=True, allow_nan=False) + "\n")

    def _append(self, text: str) -> None:
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as e:
            # A full disk's error names no file; the job's message should.
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def close(self) -> None:
        self._file.close()


def json_object(raw: bytes | str) -> dict[str, Any] | None:
    """The JSON object `raw` holds, or None where it holds none: a torn line of
    progress.jsonl (a killed worker's), JSON that is no object, or junk (a crashed host's
    at the end of a file, or a custom model's, which runs in the run directory). Every
    reader of progress.jsonl parses its lines here, and so do the readers of result.json,
    a profile request and TensorBoard's instance record.

    `json.loads` raises more than `JSONDecodeError` on such bytes: a run of NULs reads as
    UTF-16 or UTF-32 and fails to decode (`UnicodeDecodeError`), an integer of thousands
    of digits is refused (`ValueError`), and brackets nested thousands deep overflow the
    parser (`RecursionError`).
    """
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def reported_at(path: Path, step: int) -> dict[str, Any] | None:
    """The last line of progress.jsonl that says the training numbers of `step`: a
    `progress` line of it, or the `end` line of a run cancelled at it (which says the loss
    and accuracy of the step it stopped at, where its last report was of an earlier one;
    a succeeded run's says them too, but not its speed, which its last report does);
    None when no line does. Reads the whole file, a line at a time, as `evaluated_at` does:
    a run that failed at step 9000 may have reported step 8500, its checkpoint's, far
    back."""
    found = None
    try:
        with open(path, "rb") as f:
            for raw in f:
                if b'"progress"' not in raw and b'"end"' not in raw:
                    continue  # a phase, eval or checkpoint line: skipped unparsed
                line = json_object(raw)  # None: junk, or torn
                if line is None or line.get("step") != step:
                    continue
                event = line.get("event")
                if event == "progress" or (
                    event == "end"
                    and line.get("outcome") == "cancelled"
                    and line.get("loss") is not None
                ):
                    found = line
    except FileNotFoundError:
        pass
    return found


def evaluated_at(path: Path, step: int, through: int | None = None) -> bool:
    """Whether progress.jsonl has an eval of `step`, or of any step from `step` through
    `through` if given. Reads the whole file, a line at a time (tens of MB for a long job:
    a fraction of a second, once per resumed start)."""
    last = step if through is None else through
    try:
        with open(path, "rb") as f:
            for raw in f:
                if b'"eval"' not in raw:  # most lines are reports: skip them unparsed
                    continue
                line = json_object(raw)
                if (
                    line is not None
                    and line.get("event") == "eval"
                    and isinstance(at := line.get("step"), int | float)
                    and step <= at <= last
                ):
                    return True
    except FileNotFoundError:
        pass
    return False


def _whole_index(path: Path) -> bool:
    """Whether the checkpoint index at `path` was written whole (it ends with INDEX_END)."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            return os.pread(file.fileno(), len(INDEX_END), max(0, size - len(INDEX_END))) == (
                INDEX_END
            )
    except OSError:
        return False
