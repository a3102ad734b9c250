"""Answering a download of an archive (`service.archives`): HEAD, byte ranges, ETag.

A dropped download resumes where it stopped: the client sends `Range: bytes=N-` and
`If-Range: <the ETag it started with>`, and gets a 206 of the rest, or, if the files have
changed since, a 200 of the whole new archive (RFC 9110, sections 13.1.5 and 14).

Only a single range is served. A request for several gets the whole archive as a 200, as
RFC 9110 allows a server to ignore Range: a multipart/byteranges answer is rarely used by
clients (a resume asks for one range), and each range after the first would cost the
reading and CRC of everything before it again. A 416 instead would fail a client that
could have used the whole. A Range that cannot be parsed, or in another unit, is ignored
likewise; one whose start lies past the end gets 416 with `Content-Range: bytes */SIZE`.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from service.archives import Archive, ArchiveHead
from service.safename import safe_name

MEDIA_TYPE = "application/gzip"
_SPEC = re.compile(r"([0-9]*)-([0-9]*)")
_HUGE = 10**30  # any position past every archive: the end of the list of digits is not read
# What a file name saved on Windows cannot hold (besides `/` and `\\`, which `safe_name`
# replaces), and in the ASCII `filename` a `%`, which some clients decode.
_NOT_IN_FILE_NAMES = re.compile(r'[<>:"|?*]')
_NOT_IN_ASCII_NAME = re.compile(r"[^\x20-\x7e]|%")
_UNDERSCORES = re.compile(r"_{2,}")
# Not at either end of the name's part: `-` and ` ` would run into the `-` before the id,
# `.` would hide the file, and `_` is what was left of characters replaced.
_NAME_ENDS = "_-. "


def _name_part(name: str | None, *, ascii_only: bool) -> str:
    """The job's name as the first part of a download's file name: made safe as its
    TensorBoard runs' folder is (`safe_name`: no `/`, controls or bidi controls, at most 60
    characters), without what a Windows file name cannot hold (and, `ascii_only`, without
    any other character than printable ASCII but `%`), each as `_`; runs of `_` as one, and
    no `_`, `-`, `.` or space at either end. Empty where nothing else is left: "???" gave
    `___-<id>-metrics.csv`, a name of another script in the ASCII `filename` likewise."""
    if not name:
        return ""
    safe = _NOT_IN_FILE_NAMES.sub("_", safe_name(name))
    if ascii_only:
        safe = _NOT_IN_ASCII_NAME.sub("_", safe)
    return _UNDERSCORES.sub("_", safe).strip(_NAME_ENDS)


def job_file_name(name: str | None, job_id: str, what: str, *, ascii_only: bool = False) -> str:
    """The name a download of a job's `what` is saved as: `<name>-<id>-<what>`, the job's
    name as `_name_part` makes it; the id alone before `what` where nothing of the name is
    left. `ascii_only`: of the name's printable ASCII alone, for the `filename` of a
    Content-Disposition (`job_attachment`)."""
    safe = _name_part(name, ascii_only=ascii_only)
    return f"{safe}-{job_id}-{what}" if safe else f"{job_id}-{what}"


def attachment(filename: str, plain: str | None = None) -> str:
    """A Content-Disposition saving the answer as `filename` (RFC 6266): its `filename` in
    printable ASCII (`plain`, or where not given `filename` with any other character and
    `"`, `\\` and `%` as `_`: a header is sent as Latin-1, and a name of another script
    cannot be), and where that is not `filename`, `filename*` too, the name whole in UTF-8
    %-encoded (RFC 5987), which browsers take instead."""
    if plain is None:
        plain = _NOT_IN_ASCII_NAME.sub("_", filename).replace('"', "_").replace("\\", "_")
    if plain == filename:
        return f'attachment; filename="{filename}"'
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename, safe='')}"


def job_attachment(name: str | None, job_id: str, what: str) -> str:
    """The Content-Disposition of a download of a job's `what`: saved as `job_file_name`
    says, and, by a client that takes no `filename*`, as it says of the name's ASCII alone
    (`日本` is `<id>-metrics.csv` there, not `__-<id>-metrics.csv`)."""
    return attachment(
        job_file_name(name, job_id, what), job_file_name(name, job_id, what, ascii_only=True)
    )


class Unsatisfiable(Exception):
    """A single range whose start lies past the end."""


def requested_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range `header` (a Range header's value) asks of `size` bytes, as
    [start, stop), or None to send the whole (no header, a malformed one, another unit,
    several ranges). Raises Unsatisfiable when the range starts past the end."""
    if header is None:
        return None
    unit, equals, ranges = header.strip().partition("=")
    if not equals or unit.lower() != "bytes":
        return None
    specs = [spec.strip(" \t") for spec in ranges.split(",")]
    specs = [spec for spec in specs if spec]  # a list may hold empty elements (RFC 9110 5.6.1)
    if len(specs) != 1:
        return None
    match = _SPEC.fullmatch(specs[0])
    if match is None or not (match.group(1) or match.group(2)):
        return None
    first, last = (_position(group) if group else None for group in match.groups())
    if first is None:  # "-N": the last N bytes
        assert last is not None
        if last == 0:
            raise Unsatisfiable
        return max(0, size - last), size
    if last is not None and last < first:
        return None  # invalid: ignored, as malformed
    if first >= size:
        raise Unsatisfiable
    return first, size if last is None else min(last + 1, size)


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 30 else _HUGE


def if_range_holds(header: str | None, etag: str) -> bool:
    """Whether a Range may be served under `If-Range: header`: it names this very ETag
    (compared strongly: a weak tag never matches). A date never holds: these archives send
    no Last-Modified to compare it with."""
    return header is None or header.strip() == etag


def archive_response(request: Request, archive: ArchiveHead, filename: str) -> Response:
    """The answer to a GET or HEAD of `archive` (an open `Archive` for a GET): 200 with
    the whole, or 206 with the one range asked for, or 416; the same headers either way,
    length and ETag included, so a HEAD tells what a GET would send."""
    tagged = {"ETag": archive.etag, "Accept-Ranges": "bytes"}
    headers = {**tagged, "Content-Disposition": attachment(filename)}
    whole = {**headers, "Content-Length": str(archive.size)}
    if not isinstance(archive, Archive):  # HEAD: Range is defined for GET only
        return Response(status_code=200, media_type=MEDIA_TYPE, headers=whole)
    wanted = request.headers.get("range")
    span = None
    try:
        if if_range_holds(request.headers.get("if-range"), archive.etag):
            span = requested_range(wanted, archive.size)
    except Unsatisfiable:
        archive.close()
        raise HTTPException(
            416,
            f"Range {(wanted or '')[:100]!r} starts at or past the end of the archive, which is "
            f"{archive.size} bytes: ask for a range that starts before it.",
            # Not an attachment: the body is the error, as JSON.
            headers={**tagged, "Content-Range": f"bytes */{archive.size}"},
        ) from None
    # Its files closed once the answer is over, however it ended: Starlette leaves a body
    # unclosed when its client goes away mid-stream, and the open files (a deleted job's
    # disk space among them) stayed open until a cycle collection.
    closing = BackgroundTask(archive.close)
    if span is None:
        return StreamingResponse(
            archive.stream(), media_type=MEDIA_TYPE, headers=whole, background=closing
        )
    start, stop = span
    return StreamingResponse(
        archive.stream(start, stop),
        status_code=206,
        media_type=MEDIA_TYPE,
        background=closing,
        headers={
            **headers,
            "Content-Length": str(stop - start),
            "Content-Range": f"bytes {start}-{stop - 1}/{archive.size}",
        },
    )
