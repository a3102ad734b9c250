"""A CSV file of a job's metrics kept in sync with the job (`metrics --into FILE`): its
header names the columns, each row is a step; beside it, `FILE.revision` keeps the job's
id and the revision of its series the rows are of, to read on with.

Every change leaves FILE a whole CSV and its revision true of it, whatever stops the
command (Ctrl-C, a full disk, SIGTERM): rows are appended in one piece, and cut back to
where they began should a write fail; FILE is made, or cut back to a step, as a temporary
file renamed over it; and Ctrl-C, SIGTERM and SIGHUP are held off while FILE and its
revision change, and delivered once both have. The revision is written after FILE's rows
and cleared before FILE is replaced whole: where the two disagree it is older than the
rows, and an older revision is never wrong, only slower (the service may refuse a read on
from it, and the rows after the step it names are then read again). While a command keeps
FILE it holds a lock on FILE.revision, so two cannot interleave their rows. Only SIGKILL
(or a power cut) cannot be held off: one during an append can leave FILE's last row cut
short, and the next command cuts that row off, says so, and reads on after the row before.

Standard library only: the client never imports more than httpx. Its CSV, header and
rows, is `service.metricscsv`'s, which the service's `metrics.csv` writes too.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import secrets
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from service.client.common import EXIT_USAGE, ClientError
from service.metricscsv import header
from service.progress import SERIES

if sys.platform != "win32":
    import fcntl

_REVISION = ".revision"  # the sidecar's suffix
_TAIL_BYTES = 64 * 1024  # a row is a few hundred bytes at most: its last line is in this


def revision_path(path: Path) -> Path:
    """Where the revision of the CSV at `path` is kept (`MetricsFile` refuses a `path`
    that names no file, `.` or `/`, which has no name to add to)."""
    return path.with_name(path.name + _REVISION) if path.name else path / f"FILE{_REVISION}"


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP held off for the block, then delivered as they
    would have been (Ctrl-C as KeyboardInterrupt): FILE and its revision change together.
    Only the main thread can set handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    kinds = [signal.SIGINT, signal.SIGTERM]
    if sys.platform != "win32":
        kinds.append(signal.SIGHUP)
    before = {}
    for kind in kinds:
        before[kind] = signal.signal(kind, lambda number, _: caught.append(number))
    try:
        yield
    finally:
        for kind, handler in before.items():
            signal.signal(kind, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)


def _last_part(given: str) -> str:
    """What `given` has after its last path separator: "" where it ends with one."""
    separators = os.sep + (os.altsep or "")
    return given[max(given.rfind(separator) for separator in separators) + 1 :]


def _is_row(fields: list[str], width: int) -> bool:
    """Whether `fields` are a row of a CSV of `width` fields: a step, then a number or
    nothing in each column, as `metrics` writes them."""
    if len(fields) != width or not (fields[0].isascii() and fields[0].isdigit()):
        return False
    for field in fields[1:]:
        if field:
            try:
                float(field)
            except ValueError:
                return False
    return True


def _is_row_start(line: bytes, width: int) -> bool:
    """Whether `line`, with no line end, is the start of a row of a CSV of `width`
    fields as `metrics` writes them: a step's digits, then at most the rest of the fields,
    each of what a float's repr is made of. Anything else is not a cut-short row of ours,
    and is not cut off."""
    fields = line.split(b",")
    return (
        len(fields) <= width
        and fields[0].isdigit()
        and all(not field.strip(b"0123456789.e+-") for field in fields[1:])
    )


class MetricsFile:
    """FILE (`given`, as the person named it: said in every message) for job `job_id`, of
    the columns `names` (None: FILE's own, or for a new FILE every series)."""

    def __init__(self, given: str, job_id: str, names: list[str] | None) -> None:
        if given == "-" or not given:
            raise ClientError(
                "--into takes a file to keep in sync; without it the CSV goes to standard output",
                EXIT_USAGE,
            )
        self.given, self.job_id = given, job_id
        self.names = list(dict.fromkeys(names)) if names else None
        path = Path(given)
        # ".", "/", "..", "new/", "new/.": a folder's name, whether or not it is there.
        # Path drops a trailing separator or `.`, and took "new/" as a file named "new".
        if _last_part(given) in ("", ".", ".."):
            raise self._folder()
        # A link is followed: the file it names is the one kept, and its revision beside it.
        self.path = Path(os.path.realpath(path)) if path.is_symlink() else path
        self.revision_path = revision_path(self.path)
        self.columns: list[str] = list(self.names or SERIES)
        self.last_step: int | None = None  # of FILE's last row, as last checked or written
        self.revision = 0  # of the rows in FILE, as FILE.revision says (none: 0)
        self._lock: int | None = None  # FILE.revision, open and locked
        self._made_revision = False
        # Where FILE's last line is a row cut short (an append killed part way): the size
        # of FILE without it, and the line; cut off once FILE.revision is locked.
        self._cut_short: tuple[int, bytes] | None = None

    # --- reading FILE ------------------------------------------------------------------

    def check(self) -> bool:
        """Check FILE against the columns, setting `columns` and `last_step`: False where
        it is absent or empty, to be made whole; True where it is a CSV of these columns,
        to be read on after its last row. A FILE that is not (a folder, another CSV, a last
        line that is no row of it) is a ClientError, nothing changed. A last line that is
        the start of a row, cut short (a SIGKILL in an append, which nothing can hold off),
        is left out, and cut off where FILE.revision is locked (`open` checks again)."""
        self._cut_short = None
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            folder = self.path.parent
            if not folder.is_dir():
                what = "is not a folder" if folder.exists() else "does not exist"
                raise ClientError(f"cannot write {self.given}: {folder} {what}") from None
            self.last_step = None
            return False
        except OSError as error:
            raise ClientError(f"cannot read {self.given}: {error.strerror or error}") from error
        if stat.S_ISDIR(info.st_mode):
            raise self._folder()
        if not stat.S_ISREG(info.st_mode):
            raise ClientError(f"{self.given} is not a plain file; give --into a CSV file's path")
        if info.st_size == 0:
            self.last_step = None
            return False
        try:
            with open(self.path, "rb") as file:
                first = file.readline(4096)
                file.seek(max(0, info.st_size - _TAIL_BYTES))
                tail = file.read()
        except OSError as error:
            raise ClientError(f"cannot read {self.given}: {error.strerror or error}") from error
        fields = self._header(first)
        if self.names is None:
            self.columns = fields[1:]
        elif fields != ["step", *self.columns]:
            raise ClientError(
                f"{self.given} has the columns {','.join(fields)!r}, not "
                f"{header(self.columns).strip()!r} as the --name options give: name the "
                f"series it was made with, or give --into another file"
            )
        self.last_step = self._last_step(tail, info.st_size, first)
        if self._cut_short is not None and self._lock is not None:
            self._cut_off_row_cut_short()
        return True

    def _folder(self) -> ClientError:
        what = "is a folder" if os.path.isdir(self.given) else "names a folder"
        return ClientError(
            f"{self.given} {what}; give --into a CSV file's path (in it, say "
            f"{os.path.join(self.given, self.job_id + '.csv')})"
        )

    def _header(self, first: bytes) -> list[str]:
        """FILE's first line as its header's fields: `step`, then known series."""
        try:
            text = first.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        fields = next(csv.reader([text.rstrip("\n")]), []) if text.endswith("\n") else []
        known = fields[:1] == ["step"] and len(fields) > 1
        if (
            not known
            or any(name not in SERIES for name in fields[1:])
            or (len(set(fields)) != len(fields))
        ):
            shown = first[:80].decode("utf-8", "replace").rstrip("\n")
            raise ClientError(
                f"{self.given} is not a CSV of a job's metrics: its first line is {shown!r}, "
                f"not a header like 'step,loss,eval_accuracy' (give --into another file, or "
                f"remove it to write it whole)"
            )
        return fields

    def _last_step(self, tail: bytes, size: int, first: bytes) -> int | None:
        """The step of FILE's last row (None: it has only its header), from its `tail`,
        less a last line that is a row cut short (`_cut_short`)."""
        if not tail.endswith(b"\n"):
            start = tail.rfind(b"\n") + 1
            if start == 0 or not _is_row_start(tail[start:], len(self.columns) + 1):
                raise self._not_a_row("its last line is cut short (no line end after it)")
            self._cut_short = (size - (len(tail) - start), tail[start:])
            size, tail = self._cut_short[0], tail[:start]
        lines = tail[:-1].split(b"\n")
        if len(lines) == 1 and size > len(tail):
            raise self._not_a_row(f"its last line is over {_TAIL_BYTES} bytes long")
        last = lines[-1]
        if size == len(first):  # the header alone
            return None
        try:
            fields = next(csv.reader([last.decode("utf-8")]), [])
        except (UnicodeDecodeError, csv.Error):
            fields = []
        if not _is_row(fields, len(self.columns) + 1):
            shown = last[:80].decode("utf-8", "replace")
            raise self._not_a_row(f"its last line, {shown!r}, is not a row of it")
        return int(fields[0])

    def _not_a_row(self, why: str) -> ClientError:
        return ClientError(
            f"{self.given} does not end with a whole row of its CSV: {why}. Remove that line "
            "(or the file, to write it whole) and run the command again"
        )

    # --- its revision ------------------------------------------------------------------

    def open(self, existing: bool) -> None:
        """Lock FILE.revision (made if missing) and read it: the revision FILE's rows are
        of, and the job they are of. `existing`: FILE has rows to read on after (`check`),
        which another job's are refused."""
        self._check_writable(existing)
        side = self.revision_path
        self._made_revision = not (side.exists() or side.is_symlink())
        try:
            fd = os.open(side, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise ClientError(f"cannot write {side}: {error.strerror or error}") from error
        self._lock = fd
        if sys.platform != "win32":
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._made_revision = False  # another command's: not this one's to remove
                raise ClientError(
                    f"{self.given} is being kept by another towerboard command (it holds "
                    f"{side.name}); stop that one first"
                ) from None
        job, revision = self._read_revision(fd)
        if existing and job is not None and job != self.job_id:
            raise ClientError(
                f"{self.given} holds the metrics of job {job} ({side.name} says so), not of "
                f"job {self.job_id}: give --into another file"
            )
        self.revision = revision
        if existing and self._cut_short is not None:
            self.check()  # again, now that no other command can be appending: it cuts

    def _cut_off_row_cut_short(self) -> None:
        """FILE cut back to its last line end, where its last line is a row cut short: an
        append killed part way (SIGKILL, a power cut) left it, and the rows after FILE's
        last whole one are read again. Only with FILE.revision locked (`check`): no other
        command is appending to it."""
        assert self._cut_short is not None
        size, line = self._cut_short
        try:
            os.truncate(self.path, size)
        except OSError as error:
            raise self._cannot_write(error) from error
        self._cut_short = None
        after = "its header" if self.last_step is None else f"step {self.last_step}"
        sys.stderr.write(
            f"{self.given} ended in a row cut short, {line[:80].decode('utf-8', 'replace')!r}"
            f" (an earlier append stopped part way): cut it off, to read on after {after}\n"
        )

    def _check_writable(self, existing: bool) -> None:
        """Refuse, before any request, a FILE that could not be appended to, or a folder
        that a FILE made anew, or cut back after a resume, could not be renamed into."""
        folder = self.path.parent
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ClientError(
                f"cannot write {self.given}: its folder {folder} is not writable (FILE is "
                "made, or cut back after a resume, as a new file renamed over it)"
            )
        if existing:
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND))
            except OSError as error:
                raise ClientError(
                    f"cannot write {self.given}: {error.strerror or error}"
                ) from error

    def _read_revision(self, fd: int) -> tuple[str | None, int]:
        """The job and revision FILE.revision names; (None, 0) when it is empty."""
        try:
            text = os.read(fd, 4096).decode("utf-8")
            held: Any = json.loads(text) if text.strip() else {}
        except (OSError, UnicodeDecodeError, ValueError):
            held = None
        if isinstance(held, dict):
            job, revision = held.get("job_id"), held.get("revision", 0)
            if (job is None or isinstance(job, str)) and type(revision) is int and revision >= 0:
                return job, revision
        raise ClientError(
            f"{self.revision_path} is not a revision towerboard wrote (expected "
            '{"job_id": ID, "revision": N}); remove it to read on from revision 0, which '
            "reads again any rows a resume replaced"
        )

    def close(self) -> None:
        """Let go of FILE.revision; an empty one is removed where this command made it, or
        where FILE is gone (it tells nothing)."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            empty = os.fstat(self._lock).st_size == 0
            if empty and (self._made_revision or not self.path.exists()):
                self.revision_path.unlink()
        os.close(self._lock)
        self._lock = None

    def _write_revision(self, revision: int | None) -> None:
        """FILE.revision: `revision` with the job's id, or emptied (None), which reads as
        revision 0. Emptied first, so a write cut short leaves it empty, never half."""
        assert self._lock is not None
        text = (
            ""
            if revision is None
            else json.dumps({"job_id": self.job_id, "revision": revision}) + "\n"
        )
        try:
            os.ftruncate(self._lock, 0)
            os.lseek(self._lock, 0, os.SEEK_SET)
            _write_all(self._lock, text.encode("utf-8"))
        except OSError as error:
            raise ClientError(
                f"cannot write {self.revision_path}: {error.strerror or error}; "
                f"{self.given} is whole, and read on from revision 0"
            ) from error
        self._made_revision = False
        self.revision = revision or 0

    # --- changing FILE ---------------------------------------------------------------

    def write_whole(self, rows: str, last_step: int | None, revision: int) -> None:
        """FILE made anew: its header and `rows`, of `revision`."""
        temporary = self._temporary()
        try:
            self._fill(temporary, (header(self.columns) + rows).encode("utf-8"))
            with _signals_held():
                self._write_revision(None)
                self._replace(temporary)
                self._write_revision(revision)
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()
        self.last_step = last_step

    def append(self, rows: str, last_step: int | None, revision: int) -> None:
        """`rows` (whole lines) added to FILE, all or none, and its revision now `revision`."""
        data = rows.encode("utf-8")
        with _signals_held():
            if data:
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                except OSError as error:
                    raise self._cannot_write(error) from error
                try:
                    start = os.fstat(fd).st_size
                    try:
                        _write_all(fd, data)
                    except OSError as error:
                        with contextlib.suppress(OSError):
                            os.ftruncate(fd, start)  # no half row left behind
                        raise self._cannot_write(error) from error
                finally:
                    os.close(fd)
            if revision != self.revision or data:
                self._write_revision(revision)
        if last_step is not None:
            self.last_step = last_step

    def drop_after(self, step: int, revision: int) -> int:
        """FILE cut back to its rows up to `step` (FILE's rows are in step order), of
        `revision`; how many rows were dropped."""
        temporary = self._temporary()
        kept: int | None = None
        dropped = 0
        try:
            try:
                with open(self.path, "rb") as source, open(temporary, "wb") as target:
                    target.write(source.readline())  # the header, checked already
                    for line in source:
                        at = line.partition(b",")[0]
                        if dropped or not at.isdigit() or int(at) > step:
                            dropped += 1
                            continue
                        target.write(line)
                        kept = int(at)
                    _sync_file(target)
            except OSError as error:
                raise self._cannot_write(error, temporary) from error
            with _signals_held():
                self._replace(temporary)
                self._write_revision(revision)
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()
        self.last_step = kept
        return dropped

    def _temporary(self) -> Path:
        """A new, empty file beside FILE, to be renamed over it (`_replace`); FILE's mode,
        or for a new FILE what the umask gives."""
        for _ in range(10):
            path = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            except OSError as error:
                raise self._cannot_write(error, path) from error
            os.close(fd)
            with contextlib.suppress(OSError):
                os.chmod(path, stat.S_IMODE(os.stat(self.path).st_mode))
            return path
        raise ClientError(f"cannot make a temporary file beside {self.given}")

    def _fill(self, path: Path, data: bytes) -> None:
        try:
            with open(path, "wb") as file:
                file.write(data)
                _sync_file(file)
        except OSError as error:
            raise self._cannot_write(error, path) from error

    def _replace(self, temporary: Path) -> None:
        try:
            os.replace(temporary, self.path)
        except OSError as error:
            raise ClientError(
                f"cannot rename {temporary} to {self.given}: {error.strerror or error}; "
                f"{self.given} is as it was"
            ) from error

    def _cannot_write(self, error: OSError, where: Path | None = None) -> ClientError:
        place = where if where is not None else self.given
        return ClientError(
            f"cannot write {place}: {error.strerror or error}; {self.given} is as it was"
        )

    def holds(self) -> str:
        """What FILE holds now, for a message: "run.csv holds job X's rows to step 400"."""
        if not self.path.exists():
            return f"nothing was written to {self.given}"
        if self.last_step is None:
            return f"{self.given} holds no row of job {self.job_id} yet"
        return f"{self.given} holds job {self.job_id}'s rows to step {self.last_step}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_file(file: Any) -> None:
    """Its bytes on the disk before it is renamed over FILE: a crash then never leaves
    FILE empty (a rename can reach the disk before the data)."""
    file.flush()
    os.fsync(file.fileno())
