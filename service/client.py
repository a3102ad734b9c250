"""The `towerboard` client verbs: drive a running service over its HTTP API.

    towerboard submit SPEC.json [--watch]          submit a job (SPEC "-" reads stdin)
    towerboard status [ID] [--state S] [--json]    the jobs table, or one job in detail
    towerboard logs ID [--tail N] [--follow]       the worker's log
    towerboard cancel ID [--wait]                  cancel a queued or running job
    towerboard checkpoints ID [--download STEP]    list checkpoints, or fetch one (.tar.gz)
    towerboard export ID [-o PATH]                 fetch the exported SavedModel (.tar.gz)
    towerboard tensorboard [--jobs ID ...] [--merge] [--open] [--stop]

Every verb takes `--url` (default `$TOWERBOARD_URL`, else http://127.0.0.1:8000) and sends
`$TOWERBOARD_TOKEN`, when set, as its bearer token. Results go to stdout (`submit` prints
just the job id, so `id=$(towerboard submit spec.json)` works); progress and errors go to
stderr, each error as one line. Exit codes: 0 done; 1 the service refused or failed the
request, or a watched job did not succeed; 2 bad usage or a rejected spec; 3 the service
could not be reached, or a download was cut off (run it again: it resumes); 130
interrupted; 141 (as a shell reports SIGPIPE) the reader of stdout went away, as `| head`
does, which ends the command quietly.

Downloads (`checkpoints --download`, `export`) write `TARGET.part`, renamed to TARGET once
complete; a part left by a download that was cut off or interrupted is resumed by the next
run to the same target, when the service still serves the same archive (its ETag).

Only httpx and the standard library: the client never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
import webbrowser
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx

from service.partfile import PartFile, PartInUse, part_paths, resumable_bytes

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")
STATES = ("queued", "running", *TERMINAL)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

_TENSORBOARD_READY_SECONDS = 180.0  # it imports TensorFlow: slow on a busy host
_LOG_POLL_SECONDS = 1.0
# How long a verb that follows a job (submit --watch, logs --follow, cancel --wait) keeps
# trying a service it cannot reach: a restart takes seconds, and the job runs on meanwhile.
RECONNECT_SECONDS = 120.0
# A download waits up to this long between bytes: resuming near the end of a large
# archive, the service reads all before the first (for the gzip trailer's CRC).
_DOWNLOAD_TIMEOUT = httpx.Timeout(300.0, connect=5.0)
_T = TypeVar("_T")
LOG_OFFSET_HEADER = "X-Log-Offset"  # the logs route's "read on from here" (HTTP contract)


class ClientError(Exception):
    """A failure to report as one line, with the exit code it ends the command with."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# --- HTTP ----------------------------------------------------------------------------


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = response.text.strip().splitlines()
        return f"HTTP {response.status_code}" + (f": {text[0][:200]}" if text else "")
    detail = str(body.get("detail") or f"HTTP {response.status_code}")
    errors = body.get("errors") or []
    if errors:
        fields = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors)
        return f"{detail.removesuffix(' see `errors`.').rstrip(';')}: {fields}"
    return detail


class Client:
    """The service's API over httpx, raising ClientError with a one-line message."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.url,
            headers={**headers, "User-Agent": "towerboard-cli"},
            timeout=httpx.Timeout(timeout, connect=5.0),
        )
        self.has_token = bool(token)

    def close(self) -> None:
        self.http.close()

    def _unreachable(self, error: httpx.TransportError) -> ClientError:
        return ClientError(
            f"cannot reach the service at {self.url} ({error.__class__.__name__}: {error}). "
            "Is `towerboard serve` running? Set --url or TOWERBOARD_URL.",
            EXIT_UNREACHABLE,
        )

    def check(self, response: httpx.Response) -> httpx.Response:
        if response.is_success:
            return response
        if response.status_code == 401:
            hint = (
                "the token in TOWERBOARD_TOKEN was refused"
                if self.has_token
                else "the service needs a token: set TOWERBOARD_TOKEN"
            )
            raise ClientError(f"{hint} ({_error_message(response)})")
        code = EXIT_USAGE if response.status_code == 422 else EXIT_FAILED
        raise ClientError(_error_message(response), code)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error
        return self.check(response)

    def request_json(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, Any]:
        """`request`, and its body as JSON: anything else is not the service answering (a
        wrong port, or a proxy's sign-in page)."""
        response = self.request(method, path, **kwargs)
        try:
            return response, response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type").partition(";")[0]
            raise ClientError(
                f"{self.url} answered {path} with {kind or 'no content type'}, not the "
                "service's JSON: is --url (or TOWERBOARD_URL) a Towerboard service?"
            ) from None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request_json("GET", path, **kwargs)[1]

    def patiently(self, call: Callable[[], _T], note: Callable[[str], None]) -> _T:
        """`call()`, tried again each second while the service cannot be reached, for up
        to RECONNECT_SECONDS: a follower outlives a service restart, as the job does.
        `note` is told when the service is first found gone, and when it is back."""
        deadline = None
        while True:
            try:
                answer = call()
            except ClientError as error:
                if error.code != EXIT_UNREACHABLE:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + RECONNECT_SECONDS
                    note(
                        f"lost the service at {self.url}; trying again for up to "
                        f"{RECONNECT_SECONDS:g} s (the job goes on meanwhile)"
                    )
                elif time.monotonic() >= deadline:
                    raise
            else:
                if deadline is not None:
                    note(f"the service at {self.url} is back")
                return answer
            time.sleep(1.0)

    def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.get(f"/api/v1/jobs/{job_id}")
        return job

    def events(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """A job's Server-Sent Events as (event, data) until the service ends the stream."""
        timeout = httpx.Timeout(60.0, connect=5.0)  # the service pings every 15 s
        try:
            with self.http.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=timeout) as r:
                if not r.is_success:
                    r.read()
                    self.check(r)
                name, data = "message", list[str]()
                for line in r.iter_lines():
                    if line.startswith(":"):
                        continue  # a ping
                    if line == "":
                        if data:
                            yield name, json.loads("\n".join(data))
                        name, data = "message", []
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        name = value
                    elif field == "data":
                        data.append(value)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error


# --- formatting ----------------------------------------------------------------------


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}g}"


def _percent(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "-"


def _rate(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _age(value: Any) -> str:
    at = _timestamp(value)
    if at is None:
        return "-"
    s = max(0, int(time.time() - at))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 172_800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _bytes(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _printable(text: Any) -> str:
    """`text` with its control characters escaped (\\x1b, \\n): a job's name is what
    another user typed, and printed raw an escape sequence in it acts on the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _steps(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if not isinstance(p.get("step"), int):
        return "-"
    return f"{p['step']}/{p['total']}" if isinstance(p.get("total"), int) else str(p["step"])


def _phase(progress: dict[str, Any]) -> str:
    """`eval 3/20` while a phase reports how far it is, else the phase's name ('' if none)."""
    phase, done, of = progress.get("phase"), progress.get("phase_done"), progress.get("phase_total")
    if not phase:
        return ""
    return f"{phase} {done}/{of}" if isinstance(done, int) and isinstance(of, int) else str(phase)


def _eta(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if job.get("state") != "running" or not isinstance(p.get("eta_seconds"), int | float):
        return "-"
    at = _timestamp(p.get("updated_at"))
    left = p["eta_seconds"] - (max(0.0, time.time() - at) if at else 0.0)
    return _duration(max(0.0, left))


def _devices(job: dict[str, Any]) -> str:
    """The devices a job holds: only a running job holds any (the service clears them
    when it ends)."""
    return ",".join(job.get("devices") or []) or "-"


def _devices_and_towers(job: dict[str, Any]) -> str:
    """`_devices`, or "none yet" for a queued job, and the towers the job asked for."""
    held = _devices(job)
    if held == "-" and job.get("state") == "queued":
        held = "none yet"
    towers = (job.get("spec") or {}).get("towers")
    return f"{held} ({towers} tower{'' if towers == 1 else 's'})" if towers else held


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            + "\n"
        )


def fold_event(job: dict[str, Any], name: str, data: dict[str, Any]) -> dict[str, Any]:
    """The job with one SSE event applied (as the service folds progress lines)."""
    if name == "state":
        return data
    job = dict(job)
    p = dict(job.get("progress") or {})
    for key in ("step", "total", "phase", "tower_ms", "checkpoint"):
        if key in data:
            p[key] = data[key]
    if name == "progress":
        for key in ("loss", "accuracy", "examples_per_sec", "eta_seconds", "learning_rate"):
            p[key] = data.get(key)
        p["updated_at"] = (
            datetime.fromtimestamp(data.get("time", time.time())).astimezone().isoformat()
        )
    if name == "eval":
        job["eval"] = {"step": data.get("step"), "loss": data.get("eval_loss"),
                       "accuracy": data.get("eval_accuracy")}  # fmt: skip
    if isinstance(p.get("step"), int) and p.get("total"):
        p["percent"] = round(100.0 * p["step"] / p["total"], 1)
    job["progress"] = p
    return job


class ProgressLine:
    """A one-line progress bar on a terminal; on anything else a line now and then."""

    WIDTH = 24

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.shown = ""
        self.last_line_at = 0.0
        self.last_state: Any = None
        self.phases_seen: set[Any] = set()

    def text(self, job: dict[str, Any]) -> str:
        p = job.get("progress") or {}
        percent = 100.0 if job.get("state") == "succeeded" else p.get("percent")
        filled = round(self.WIDTH * (percent or 0) / 100)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        parts = [f"[{bar}]", f"{percent:5.1f}%" if isinstance(percent, int | float) else "  -  "]
        # State first: a narrow terminal cuts the end of the line.
        phase, state = _phase(p), job.get("state", "?")
        parts.append(f"{state}" + (f" ({phase})" if phase and state == "running" else ""))
        parts.append(f"step {_steps(job)}")
        if p.get("loss") is not None:
            parts.append(f"loss {_number(p.get('loss'))}")
        if p.get("accuracy") is not None:
            parts.append(f"acc {_percent(p.get('accuracy'))}")
        evaluation = job.get("eval") or {}
        if evaluation.get("accuracy") is not None:
            parts.append(f"eval acc {_percent(evaluation['accuracy'])}")
        if p.get("examples_per_sec"):
            parts.append(f"{_rate(p['examples_per_sec'])} ex/s")
        if state == "running" and p.get("eta_seconds") is not None:
            parts.append(f"ETA {_eta(job)}")
        return " ".join(parts)

    def update(self, job: dict[str, Any]) -> None:
        text = self.text(job)
        if self.tty:
            # Never wider than the terminal: a wrapped line cannot be redrawn with \r.
            text = text[: shutil.get_terminal_size().columns - 1]
            self.out.write("\r" + text + " " * max(0, len(self.shown) - len(text)))
            self.out.flush()
            self.shown = text
            return
        # A log file gets a line per state change and per phase first seen, else one per
        # 10 s: a job that checkpoints often goes from training to checkpoint and back
        # a few times a second, and a line for each would bury the rest.
        state, phase = job.get("state"), (job.get("progress") or {}).get("phase")
        now = time.monotonic()
        new = state != self.last_state or (phase is not None and phase not in self.phases_seen)
        if new or now - self.last_line_at >= 10.0:
            self.out.write(text + "\n")
            self.out.flush()
            self.last_state, self.last_line_at, self.shown = state, now, text
            self.phases_seen.add(phase)

    def note(self, text: str) -> None:
        """A line of its own between progress lines (the bar is drawn again below it)."""
        if self.tty:
            self.out.write("\r" + " " * len(self.shown) + "\r")
        self.out.write(text + "\n")
        self.out.flush()
        self.shown, self.last_state = "", None  # the next update writes a line

    def finish(self, job: dict[str, Any]) -> None:
        if self.tty:
            self.update(job)
            self.out.write("\n")
        elif self.text(job) != self.shown:
            self.out.write(self.text(job) + "\n")
        self.out.flush()


def watch(client: Client, job_id: str, out: TextIO) -> dict[str, Any]:
    """Follow the job's events with a progress line on `out` until it ends."""
    line = ProgressLine(out)
    job = client.job(job_id)
    line.update(job)
    try:
        while job["state"] not in TERMINAL:
            try:
                for name, data in client.events(job_id):
                    job = fold_event(job, name, data)
                    line.update(job)
                    if job["state"] in TERMINAL:
                        break
            except ClientError as error:
                if error.code != EXIT_UNREACHABLE:
                    raise
                time.sleep(1.0)  # the service restarted or a proxy cut the stream: follow on
            if job["state"] not in TERMINAL:
                job = client.patiently(lambda: client.job(job_id), line.note)
                line.update(job)
    except BaseException:
        if line.tty:
            out.write("\n")  # leave the bar's line before the error
        raise
    line.finish(job)
    return job


def _summary(job: dict[str, Any]) -> str:
    parts = [f"{job['id']} {job['state']}"]
    started, finished = _timestamp(job.get("started_at")), _timestamp(job.get("finished_at"))
    if started and finished:
        parts[0] += f" in {_duration(finished - started)}"
    p, evaluation = job.get("progress") or {}, job.get("eval") or {}
    facts = [f"step {_steps(job)}"]
    if p.get("loss") is not None:
        facts.append(f"loss {_number(p['loss'])}")
    if p.get("accuracy") is not None:
        facts.append(f"accuracy {_percent(p['accuracy'])}")
    if evaluation.get("accuracy") is not None:
        facts.append(f"eval accuracy {_percent(evaluation['accuracy'])}")
    if job.get("error"):
        facts.append(f"error: {job['error'].get('reason')}")
    return f"{parts[0]}: {', '.join(facts)}"


# --- verbs ---------------------------------------------------------------------------


def _read_spec(path: str) -> dict[str, Any]:
    name = "stdin" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise ClientError(
            f"cannot read the spec {name}: {error.strerror or error}", EXIT_USAGE
        ) from error
    try:
        # JSON is UTF-8 whatever the locale says; a BOM, as some editors write, is skipped.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ClientError(
            f"cannot read the spec {name}: it is not UTF-8 text ({error.reason} at byte "
            f"{error.start}); save it as UTF-8 JSON",
            EXIT_USAGE,
        ) from error
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as error:
        raise ClientError(
            f"{name} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            EXIT_USAGE,
        ) from error
    if not isinstance(spec, dict):
        raise ClientError(f"{name} must hold a JSON object (the job spec).", EXIT_USAGE)
    return spec


def submit(client: Client, args: argparse.Namespace) -> int:
    spec = _read_spec(args.spec)
    try:
        job = client.request_json("POST", "/api/v1/jobs", json=spec)[1]
    except ClientError as error:
        if error.code == EXIT_USAGE:
            source = "the spec from stdin" if args.spec == "-" else args.spec
            error.message = f"the service rejected {source}: {error.message}"
        raise
    sys.stdout.write(f"{job['id']}\n")
    sys.stdout.flush()
    sys.stderr.write(f"submitted {job['name']!r} as job {job['id']} ({job['state']})\n")
    if not args.watch:
        return EXIT_OK
    try:
        job = watch(client, job["id"], sys.stderr)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"\nstopped watching; job {job['id']} goes on (towerboard cancel {job['id']})\n"
        )
        return EXIT_INTERRUPTED
    sys.stderr.write(_summary(job) + "\n")
    return EXIT_OK if job["state"] == "succeeded" else EXIT_FAILED


_PAGE_MOST = 200  # the API's largest page


def _jobs(client: Client, limit: int, states: list[str]) -> dict[str, Any]:
    """The newest `limit` jobs as one page of the API's shape, read a page at a time."""
    data: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: list[tuple[str, str | int]] = [("limit", min(_PAGE_MOST, limit - len(data)))]
        params += [("state", state) for state in states]
        params += [("cursor", cursor)] if cursor else []
        page: dict[str, Any] = client.get("/api/v1/jobs", params=params)
        data += page["data"]
        cursor = page.get("next_cursor")
        if not cursor or len(data) >= limit:
            return {**page, "data": data}


def status(client: Client, args: argparse.Namespace) -> int:
    if args.id:
        job = client.job(args.id)
        if args.json:
            sys.stdout.write(json.dumps(job, indent=2) + "\n")
            return EXIT_OK
        p, evaluation = job.get("progress") or {}, job.get("eval") or {}
        rows = [
            ["id", job["id"]],
            ["name", _printable(job["name"])],
            ["state", job["state"] + (" (cancel requested)" if job.get("cancel_requested") and job["state"] not in TERMINAL else "")],
            ["progress", f"{_steps(job)}" + (f" ({p['percent']}%)" if p.get("percent") is not None else "")],
            ["phase", _phase(p) or "-"],
            ["loss", _number(p.get("loss"))],
            ["accuracy", _percent(p.get("accuracy"))],
            ["eval loss", _number(evaluation.get("loss"))],
            ["eval accuracy", _percent(evaluation.get("accuracy"))],
            ["examples/sec", _rate(p.get("examples_per_sec"))],
            ["eta", _eta(job)],
            ["tower ms", ", ".join(f"{ms:.2f}" for ms in p["tower_ms"]) if p.get("tower_ms") else "-"],
            ["devices", _devices_and_towers(job)],
            ["priority", str(job["priority"])],
            ["attempts", str(job["attempts"])],
            ["created", f"{job['created_at']} ({_age(job['created_at'])} ago)"],
            ["started", job.get("started_at") or "-"],
            ["finished", job.get("finished_at") or "-"],
            ["checkpoint", str(p.get("checkpoint") or "-")],
        ]  # fmt: skip
        if job.get("error"):
            error = job["error"]
            rows.append(["error", str(error.get("reason"))])
            if error.get("exit_code") is not None:
                rows.append(["exit code", str(error["exit_code"])])
        width = max(len(key) for key, _ in rows)
        for key, value in rows:
            sys.stdout.write(f"{key.ljust(width)}  {value}\n")
        if job.get("error") and job["error"].get("log_tail"):
            sys.stdout.write("log tail:\n")
            for log_line in job["error"]["log_tail"]:
                sys.stdout.write(f"  {log_line}\n")
        return EXIT_OK
    page = _jobs(client, args.limit, args.state or [])
    if args.json:
        sys.stdout.write(json.dumps(page, indent=2) + "\n")
        return EXIT_OK
    if not page["data"]:
        sys.stdout.write("no jobs" + (f" {'/'.join(args.state)}" if args.state else "") + "\n")
        return EXIT_OK
    rows = [
        ["ID", "NAME", "STATE", "PROGRESS", "STEP", "LOSS", "ACC", "EX/S", "ETA", "DEVICES", "AGE"]
    ]
    for job in page["data"]:
        p = job.get("progress") or {}
        percent = 100.0 if job["state"] == "succeeded" else p.get("percent")
        rows.append([
            job["id"], _printable(job["name"])[:32], job["state"],
            f"{percent:.0f}%" if isinstance(percent, int | float) else "-",
            _steps(job), _number(p.get("loss")), _percent(p.get("accuracy")),
            _rate(p.get("examples_per_sec")), _eta(job), _devices(job), _age(job["created_at"]),
        ])  # fmt: skip
    _table(rows, sys.stdout)
    if page.get("next_cursor"):
        sys.stdout.write(f"... {page['count'] - len(page['data'])} more (use --limit)\n")
    return EXIT_OK


def _note(text: str) -> None:
    sys.stderr.write(f"towerboard: {text}\n")
    sys.stderr.flush()


def logs(client: Client, args: argparse.Namespace) -> int:
    path = f"/api/v1/jobs/{args.id}/logs"
    response = client.request("GET", path, params={"tail": args.tail})
    sys.stdout.write(response.text)
    sys.stdout.flush()
    if not args.follow:
        return EXIT_OK
    # Read on from where the last read ended (the service says where), so every line
    # shows once however fast the log grows.
    offset = int(response.headers.get(LOG_OFFSET_HEADER, "0"))
    try:
        while True:
            job = client.patiently(lambda: client.job(args.id), _note)
            ended = job["state"] in TERMINAL
            while True:  # drain: a fast log can hold more than one read's worth
                response = client.patiently(
                    partial(client.request, "GET", path, params={"offset": offset}), _note
                )
                sys.stdout.write(response.text)
                sys.stdout.flush()
                next_offset = int(response.headers[LOG_OFFSET_HEADER])
                if next_offset == offset:
                    break
                offset = next_offset
            if ended:  # read once more after the end, so the last lines are in
                return EXIT_OK
            time.sleep(_LOG_POLL_SECONDS)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def cancel(client: Client, args: argparse.Namespace) -> int:
    response, job = client.request_json("POST", f"/api/v1/jobs/{args.id}/cancel")
    if response.status_code == 202:
        sys.stderr.write(f"cancel requested: job {job['id']} checkpoints and stops\n")
    if args.wait and job["state"] not in TERMINAL:
        while job["state"] not in TERMINAL:
            time.sleep(0.5)
            job = client.patiently(lambda: client.job(args.id), _note)
    sys.stdout.write(f"{job['id']} {job['state']}\n")
    return EXIT_OK


_SEPARATORS = tuple(sep for sep in ("/", os.sep, os.altsep) if sep)


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
        return Path(output) / name
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
        raise client._unreachable(error) from error
    return response if response.is_success else None


def _download(client: Client, path: str, fallback_name: str, output: str | None) -> Path:
    """GET `path` into a file: `output`, or into the folder `output` names (made if need
    be), or ./ under the name the service gives. The bytes go to `TARGET.part`, renamed to
    TARGET once all have come; a part left by a download that stopped is resumed (a
    `Range` for the rest, with `If-Range` its ETag, kept in `TARGET.part.etag`). Progress
    on stderr when it is a terminal."""
    head = _head(client, path)
    name = _attachment_name(head, fallback_name) if head is not None else fallback_name
    target = _target(output, name)
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
                client.check(response)
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
            if part is None or part.target != target:
                if part is not None:
                    part.close()
                part = PartFile(target)
            if resumed:
                total: int | None = size
                if part.held() != held:
                    raise ClientError(f"{part.path} changed as the download began; try again")
                sys.stderr.write(f"resuming {name} at {_bytes(held)} of {_bytes(total)}\n")
            else:
                total, held = _length(response), 0
                if stale := part.held():
                    sys.stderr.write(
                        f"the {_bytes(stale)} in {part.path} are of another version of "
                        f"{name}: downloading it whole\n"
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
                f"the download of {name} ended at {_bytes(part.held())} of {_bytes(total)}"
                f"{_kept(part)}"
            )
        return part.finish()
    except PartInUse as error:
        raise ClientError(str(error)) from error
    except httpx.TransportError as error:
        if part is None or part.finished:  # no answer came
            raise client._unreachable(error) from error
        raise ClientError(
            f"the download of {name} was cut off at {_bytes(part.held())} of {_bytes(total)} "
            f"({error.__class__.__name__}: {error}){_kept(part)}",
            EXIT_UNREACHABLE,
        ) from error
    except KeyboardInterrupt:
        if note := _kept(part):
            sys.stderr.write(f"\ninterrupted{note}\n")
        raise
    except OSError as error:
        raise ClientError(f"cannot write {target}: {error.strerror or error}") from error
    finally:
        if part is not None:
            part.close()


def _kept(part: PartFile | None) -> str:
    """What a stopped download leaves to resume from, as the end of a sentence."""
    if part is None or part.finished or not part.tag_path.exists():
        return ""
    try:
        held = part.held()
    except OSError:
        return ""
    if not held:
        return ""
    return f"; {_bytes(held)} kept in {part.path}: run the same command again to resume"


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
            how_far = f"{100 * self.done_bytes // self.total}% of {_bytes(self.total)}"
        else:
            how_far = _bytes(self.done_bytes)
        sys.stderr.write(f"\rdownloading {self.name}: {how_far}\x1b[K")
        sys.stderr.flush()


def checkpoints(client: Client, args: argparse.Namespace) -> int:
    if args.download is not None:
        which = args.download
        if which != "latest" and not (which.isascii() and which.isdigit()):
            raise ClientError(
                f"--download takes a step number or 'latest'. Received: {which!r}", EXIT_USAGE
            )
        # `latest` is the service's to resolve: it retries when the job's checkpoint
        # rotation deletes the newest one between listing and reading.
        path = _download(
            client,
            f"/api/v1/jobs/{args.id}/checkpoints/{which}",
            f"{args.id}-ckpt-{which}.tar.gz",
            args.output,
        )
        sys.stderr.write(f"saved checkpoint to {path} ({_bytes(path.stat().st_size)})\n")
        sys.stdout.write(f"{path}\n")
        return EXIT_OK
    listing = client.get(f"/api/v1/jobs/{args.id}/checkpoints")["data"]
    if args.json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return EXIT_OK
    if not listing:
        sys.stdout.write(f"job {args.id} has no checkpoint yet\n")
        return EXIT_OK
    rows = [["STEP", "SAVED", "SIZE", "URL"]]
    for c in sorted(listing, key=lambda c: c["step"]):
        rows.append([str(c["step"]), c["time"], _bytes(c["size_bytes"]), c["url"]])
    _table(rows, sys.stdout)
    return EXIT_OK


def export(client: Client, args: argparse.Namespace) -> int:
    path = _download(
        client, f"/api/v1/jobs/{args.id}/export", f"{args.id}-export.tar.gz", args.output
    )
    sys.stderr.write(
        f"saved the exported model to {path} ({_bytes(path.stat().st_size)}); "
        "extract it and tf.saved_model.load the folder\n"
    )
    sys.stdout.write(f"{path}\n")
    return EXIT_OK


def tensorboard(client: Client, args: argparse.Namespace) -> int:
    if args.stop:
        client.request("DELETE", "/api/v1/tensorboard")
        sys.stdout.write("tensorboard stopped\n")
        return EXIT_OK
    body: dict[str, Any] = {"job_ids": args.jobs} if args.jobs else {}
    if args.merge:
        body["merge"] = True
    started, board = client.request_json("POST", "/api/v1/tensorboard", json=body)
    # `replaced` stays in the status for the instance's life; this start did it only when
    # it started a new one (201).
    replaced = board.get("replaced") if started.status_code == 201 else None
    deadline = time.monotonic() + _TENSORBOARD_READY_SECONDS
    if board["state"] == "starting":
        sys.stderr.write("starting TensorBoard ...\n")
    while board["state"] == "starting" and time.monotonic() < deadline:
        time.sleep(1.0)
        board = client.get("/api/v1/tensorboard")
    if board["state"] != "running":
        raise ClientError(
            f"TensorBoard did not come up (state {board['state']}); see the service log"
        )
    shown = "all jobs" if board.get("job_ids") is None else ", ".join(board["job_ids"])
    sys.stderr.write(f"TensorBoard is running over {shown}\n")
    if replaced:
        # One TensorBoard serves every user: say whose view this start took away.
        gone = "all jobs" if replaced.get("job_ids") is None else ", ".join(replaced["job_ids"])
        sys.stderr.write(
            f"this replaced the shared TensorBoard over {gone}, which others may have had "
            "open (--merge adds jobs to what it shows instead)\n"
        )
    sys.stdout.write(f"{board['url']}\n")
    if client.has_token:
        sys.stderr.write(
            "a browser needs the token too: enter it once on the dashboard, which keeps it "
            "in the towerboard_token cookie\n"
        )
    # Without a display (ssh, a container) Python finds no browser and opens nothing;
    # say so, or `--open` would look like it worked.
    if args.open and not webbrowser.open(board["url"]):
        sys.stderr.write(
            "could not open a web browser here (no display?); open the URL above in one\n"
        )
    return EXIT_OK


# --- wiring --------------------------------------------------------------------------


def _url_from_env() -> str:
    """TOWERBOARD_URL, or the default; a usage error naming the variable if it is no URL."""
    value = os.environ.get("TOWERBOARD_URL") or DEFAULT_URL
    try:
        return _url(value)
    except argparse.ArgumentTypeError as error:
        raise ClientError(f"TOWERBOARD_URL: {error}", EXIT_USAGE) from None


def _token_from_env() -> str | None:
    """TOWERBOARD_TOKEN without the whitespace around it (as the service reads it: a header
    value cannot keep it), or None; a usage error if a header cannot carry it."""
    token = os.environ.get("TOWERBOARD_TOKEN", "").strip()
    if not all(" " <= c <= "~" for c in token):
        raise ClientError(
            "TOWERBOARD_TOKEN holds characters an HTTP header cannot carry (expected "
            "printable ASCII only)",
            EXIT_USAGE,
        )
    return token or None


def _run(verb: Callable[[Client, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
        try:
            token = _token_from_env()
            url = args.url or _url_from_env()
        except ClientError as error:
            sys.stderr.write(f"towerboard: error: {error.message}\n")
            return error.code
        client = Client(url, token)
        try:
            code = verb(client, args)
            sys.stdout.flush()  # here, where a closed pipe can still be handled
            return code
        except ClientError as error:
            sys.stderr.write(f"towerboard: error: {error.message}\n")
            return error.code
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # The reader of stdout has gone (`towerboard status | head`): stop quietly, like
            # any filter, and keep Python's flush at exit from failing on it again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        finally:
            client.close()

    return handler


def _count(most: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if not 1 <= number <= most:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from 1 to {most}. Received: {value!r}"
            )
        return number

    return parse


def _url(value: str) -> str:
    """An http(s) URL with a host: `localhost:8000` would otherwise be read as a URL of
    scheme `localhost` and reported as a service that cannot be reached."""
    try:
        url = httpx.URL(value) if "://" in value else None
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"expected the service's URL, like {DEFAULT_URL}. Received: {value!r}"
        )
    return value


def _job_id(value: str) -> str:
    if not value or "/" in value or value.startswith("."):
        raise argparse.ArgumentTypeError(f"expected a job id. Received: {value!r}")
    return value


def add_client_commands(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register submit, status, logs, cancel, checkpoints, export and tensorboard on `verbs`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        type=_url,  # TOWERBOARD_URL is read (and judged, by its own name) in `_run`
        help=f"the service (default $TOWERBOARD_URL, else {DEFAULT_URL}); "
        "the token comes from $TOWERBOARD_TOKEN",
    )

    def verb(
        name: str, function: Callable[[Client, argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        parser = verbs.add_parser(
            name, parents=[common], help=help, description=help[0].upper() + help[1:] + "."
        )
        parser.set_defaults(handler=_run(function))
        return parser

    p = verb("submit", submit, "submit a job spec (a JSON file, or - for stdin)")
    p.add_argument("spec", metavar="SPEC.json")
    p.add_argument(
        "--watch",
        action="store_true",
        help="show a live progress bar until the job ends; exit 0 only if it succeeded",
    )

    p = verb("status", status, "list jobs, or show one job")
    p.add_argument("id", nargs="?", type=_job_id, metavar="ID")
    p.add_argument(
        "--state", action="append", choices=STATES, help="only jobs in this state (repeatable)"
    )
    p.add_argument(
        "--limit",
        type=_count(100_000),
        default=50,
        metavar="N",
        help="most jobs to list, newest first (default 50)",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    p = verb("logs", logs, "print the end of a job's worker log")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "--tail",
        type=_count(100_000),
        default=200,
        metavar="N",
        help="how many last lines (default 200)",
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )

    p = verb("cancel", cancel, "cancel a queued or running job")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument("--wait", action="store_true", help="wait until the job has stopped")

    p = verb("checkpoints", checkpoints, "list a job's checkpoints, or download one")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "--download",
        metavar="STEP",
        help="download the checkpoint at STEP (or 'latest') as a .tar.gz",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",  # a str: Path("ckpts/") would drop the slash that makes it a folder
        help="file, or folder (an existing one, or ending in /) to save it to "
        "(default: ./ID-ckpt-STEP.tar.gz)",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    p = verb("export", export, "download the model a succeeded job exported (a SavedModel)")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file, or folder (an existing one, or ending in /) to save the .tar.gz to "
        "(default: ./ID-export.tar.gz)",
    )

    p = verb("tensorboard", tensorboard, "start (or reuse) TensorBoard and print its URL")
    p.add_argument(
        "--jobs",
        nargs="+",
        type=_job_id,
        metavar="ID",
        help="show only these jobs (default: all jobs)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="add these jobs to what the shared TensorBoard shows, never taking any away",
    )
    p.add_argument("--open", action="store_true", help="open it in a web browser")
    p.add_argument("--stop", action="store_true", help="stop it instead")
