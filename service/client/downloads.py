"""Archive downloads (checkpoints, exports) into a `.part` that resumes where it stopped."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from service.client import display as show
from service.client.api import Client
from service.client.common import EXIT_UNREACHABLE, ClientError, Interrupted, OutputLost
from service.partfile import PartFile, PartInUse, part_paths, resumable_bytes, saved_etag

# A download waits up to this long between bytes: resuming near the end of a large
# archive, the service reads all before the first (for the gzip trailer's CRC).
_DOWNLOAD_TIMEOUT = httpx.Timeout(300.0, connect=5.0)


_SEPARATORS = tuple(sep for sep in ("/", os.sep, os.altsep) if sep)


# How a stopped download resumes, as the end of a sentence, unless told otherwise: the
# command that was run resumes it when it fetches the same archive again.
RUN_AGAIN = "run the same command again to resume"


def _attachment_name(response: httpx.Response, fallback: str) -> str:
    """The file name the service gave the download, if it is a plain one."""
    disposition = response.headers.get("content-disposition", "")
    name = disposition.partition('filename="')[2].partition('"')[0]
    plain = name and name not in (".", "..") and not any(sep in name for sep in _SEPARATORS)
    return name if plain else fallback


def _target(output: str | None, name: str) -> Path:
    """Where a download named `name` goes: `output`, or into the folder `output` names
    (made if need be), or ./NAME."""
    if output is None:
        return Path(name)
    if output.endswith(_SEPARATORS) or Path(output).is_dir():
        folder = Path(output)
        if folder.exists() and not folder.is_dir():
            raise ClientError(f"cannot save into {output}: {folder} is a file, not a folder")
        return folder / name
    return Path(output)


def _length(response: httpx.Response | None) -> int | None:
    value = response.headers.get("content-length", "") if response is not None else ""
    return int(value) if value.isascii() and value.isdigit() else None


def _head(client: Client, path: str) -> httpx.Response | None:
    """HEAD `path`: the download's name, length and ETag, to resume by. None when it
    fails: the GET then says why, with the body a HEAD has not got."""
    try:
        response = client.http.head(path)
    except httpx.TransportError as error:
        raise client.lost(error, "HEAD", path) from error
    return response if response.is_success else None


def _check_free(target: Path, force: bool) -> None:
    """Refuse a target that is already there (unless `force`): the finished download is
    renamed over it, and a file of the same name (an earlier checkpoint, or a file of the
    person's own) would be gone without a word. Never anything but a plain file: renamed
    over, `-o /dev/null` would replace the device itself."""
    if not (target.exists() or target.is_symlink()):
        return
    if not target.is_file():
        raise ClientError(
            f"cannot save to {target}: it is not a plain file; give -o a file or folder "
            "path (or - for standard output)"
        )
    if not force:
        raise ClientError(
            f"{target} already exists; remove it, give -o another path, or add --force to "
            "replace it"
        )


def download(
    client: Client,
    path: str,
    fallback_name: str,
    output: str | None,
    *,
    force: bool = False,
    resume: Callable[[str], str] | None = None,
) -> Path:
    """GET `path` into a file: `output`, or into the folder `output` names (made if need
    be), or ./ under the name the service gives. The bytes go to `TARGET.part`, renamed to
    TARGET once all have come; a part left by a download that stopped is resumed (a
    `Range` for the rest, with `If-Range` its ETag, kept in `TARGET.part.etag`). A TARGET
    already there is refused unless `force`. Progress on stderr when it is a terminal.

    A download that stops (cut off, interrupted, its disk full) says what it kept, and
    `resume(NAME)` how to resume it, NAME being the archive's as the service named it
    (without `resume`: RUN_AGAIN)."""

    def how(name: str) -> str:
        return resume(name) if resume is not None else RUN_AGAIN

    head = _head(client, path)
    name = _attachment_name(head, fallback_name) if head is not None else fallback_name
    target = _target(output, name)
    if head is not None:  # else the GET says why it fails, or the name it gives is checked
        _check_free(target, force)
    etag = head.headers.get("etag") if head is not None else None
    size = _length(head)
    held = resumable_bytes(target, etag, size)
    part: PartFile | None = None
    try:
        if held and held == size:  # complete before: only the rename was missed
            part = PartFile(target)
            if part.held() == size:
                return part.finish()
        ranged = f"bytes {held}-{size - 1}/{size}" if held and size else None
        headers = {"Range": f"bytes={held}-", "If-Range": etag or ""} if ranged else {}
        with client.http.stream(
            "GET", path, headers=headers, timeout=_DOWNLOAD_TIMEOUT
        ) as response:
            if not response.is_success:
                response.read()
                try:
                    client.check(response)
                except ClientError as error:
                    raise _with_stale_part(error, response, target) from None
            name = _attachment_name(response, fallback_name)
            resumed = response.status_code == 206
            if resumed and response.headers.get("content-range") != ranged:
                raise ClientError(
                    f"the service answered the resume of {name} with Content-Range "
                    f"{response.headers.get('content-range')!r}, not {ranged!r}; remove "
                    f"{part_paths(target)[0]} to download it whole"
                )
            if not resumed:  # a first download, or the archive changed: the whole comes
                target = _target(output, name)
                _check_free(target, force)
            if part is None or part.target != target:
                if part is not None:
                    part.close()
                part = PartFile(target)
            if resumed:
                total: int | None = size
                if part.held() != held:
                    raise ClientError(f"{part.path} changed as the download began; try again")
                sys.stderr.write(
                    f"resuming {name} at {show.data_size(held)} of {show.data_size(total)}\n"
                )
            else:
                total, held = _length(response), 0
                if stale := part.held():
                    of = (
                        f"are of another version of {name}"
                        if saved_etag(target) is not None
                        else f"have no {part.tag_path.name} beside them to say which version "
                        f"of {name} they are"
                    )
                    sys.stderr.write(
                        f"the {show.data_size(stale)} in {part.path} {of}: downloading it whole\n"
                    )
                part.restart(response.headers.get("etag"))
            progress = _DownloadProgress(name, total, held) if sys.stderr.isatty() else None
            for chunk in response.iter_bytes():
                part.write(chunk)
                if progress is not None:
                    progress.add(len(chunk))
            if progress is not None:
                progress.done()
        if total is not None and part.held() != total:
            raise ClientError(
                f"the download of {name} ended at {show.data_size(part.held())} of {show.data_size(total)}"
                f"{_kept(part, how(name))}"
            )
        return part.finish()
    except PartInUse as error:
        raise ClientError(str(error)) from error
    except httpx.TransportError as error:
        if part is None or part.finished:  # no answer came
            raise client.lost(error, "GET", path) from error
        raise ClientError(
            f"the download of {name} was cut off at {show.data_size(part.held())} of {show.data_size(total)} "
            f"({error.__class__.__name__}: {error}){_kept(part, how(name))}",
            EXIT_UNREACHABLE,
        ) from error
    except KeyboardInterrupt as interrupt:
        if note := _kept(part, how(name)):
            raise Interrupted(f"interrupted{note}") from interrupt
        raise
    except OSError as error:  # of the disk: full, read-only, not ours to write
        raise ClientError(f"{_cannot(error, part, target)}{_kept(part, how(name))}") from error
    finally:
        if part is not None:
            part.close()


def download_to_stdout(client: Client, path: str, name: str) -> int:
    """GET `path` onto standard output (`-o -`, for a pipe into `tar xz`); the bytes
    written. Nothing is kept to resume: a download cut off is said, and run again whole.
    Progress on stderr when it is a terminal."""
    out = sys.stdout.buffer
    written, total = 0, None
    try:
        with client.http.stream("GET", path, timeout=_DOWNLOAD_TIMEOUT) as response:
            if not response.is_success:
                response.read()
                client.check(response)
            name = _attachment_name(response, name)
            total = _length(response)
            progress = _DownloadProgress(name, total, 0) if sys.stderr.isatty() else None
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
                if progress is not None:
                    progress.add(len(chunk))
            out.flush()
            if progress is not None:
                progress.done()
    except OSError as error:  # of standard output: its reader gone, or its disk full
        raise OutputLost(
            error,
            f"cannot write the download of {name} to standard output "
            f"({error.strerror or error}); what was written is incomplete",
        ) from error
    except httpx.TransportError as error:
        if not written:
            raise client.lost(error, "GET", path) from error
        raise ClientError(
            f"the download of {name} was cut off at {show.data_size(written)} of "
            f"{show.data_size(total)} ({error.__class__.__name__}: {error}); what was "
            "written is incomplete",
            EXIT_UNREACHABLE,
        ) from error
    if total is not None and written != total:
        raise ClientError(
            f"the download of {name} ended at {show.data_size(written)} of "
            f"{show.data_size(total)}; what was written is incomplete"
        )
    return written


def _with_stale_part(error: ClientError, response: httpx.Response, target: Path) -> ClientError:
    """`error`, saying so when what it refuses leaves an earlier part of it for nothing:
    the checkpoint is gone (rotated out, or its job deleted). The part is the person's to
    remove; this only names it."""
    part = part_paths(target)[0]
    if response.status_code not in (404, 410) or not part.is_file():
        return error
    return ClientError(
        f"{error.message.rstrip('.')}. The {show.data_size(part.stat().st_size)} in {part} "
        f"were of it and can no longer be finished: remove it and {part_paths(target)[1].name}.",
        error.code,
    )


def _cannot(error: OSError, part: PartFile | None, target: Path) -> str:
    """What a download could not do on its disk, naming the file it could not write: the
    part (or its tag) as often as not, which the final name alone left unsaid."""
    why = error.strerror or str(error)
    if error.filename2 is not None:
        return f"cannot rename {error.filename} to {error.filename2}: {why}"
    where = error.filename if error.filename is not None else part.path if part else target
    if Path(where) in target.parents:
        return f"cannot make the folder {where}: {why}"
    return f"cannot write {where}: {why}"


def _kept(part: PartFile | None, how: str) -> str:
    """What a stopped download leaves to resume from, and `how` to, as the end of a
    sentence."""
    if part is None or part.finished or not part.tag_path.exists():
        return ""
    try:
        held = part.held()
    except OSError:  # the disk that failed a write fails the flush: what reached it
        held = part.on_disk()
    if not held:
        return ""
    return f"; {show.data_size(held)} kept in {part.path}: {how}"


class _DownloadProgress:
    """`downloading NAME: 45% of 75.0 MB` on one stderr line, redrawn a few times a second."""

    def __init__(self, name: str, total: int | None, done: int = 0) -> None:
        self.name, self.total, self.done_bytes, self.drawn = name, total, done, 0.0

    def add(self, count: int) -> None:
        self.done_bytes += count
        if time.monotonic() - self.drawn >= 0.2:
            self._draw()

    def done(self) -> None:
        self._draw()
        sys.stderr.write("\n")

    def _draw(self) -> None:
        self.drawn = time.monotonic()
        if self.total:
            how_far = f"{100 * self.done_bytes // self.total}% of {show.data_size(self.total)}"
        else:
            how_far = show.data_size(self.done_bytes)
        sys.stderr.write(f"\rdownloading {self.name}: {how_far}\x1b[K")
        sys.stderr.flush()
