"""What each client verb does, given the service's API and the verb's arguments."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shlex
import shutil
import sys
import time
import webbrowser
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from service import metricscsv
from service.client import display as show
from service.client.api import Client
from service.client.commands import parse_url
from service.client.common import (
    DEFAULT_LIMIT,
    DEFAULT_URL,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    LOG_OFFSET_HEADER,
    QUEUE_MOST,
    TERMINAL,
    ClientError,
    Interrupted,
    OutputLost,
)
from service.client.display import watch
from service.client.downloads import RUN_AGAIN, download, download_to_stdout
from service.client.metricsfile import MetricsFile, revision_path
from trainer import duplicate_keys
from trainer.duplicate_keys import DuplicateKeyError

_TENSORBOARD_READY_SECONDS = 180.0  # it imports TensorFlow: slow on a busy host
_LOG_POLL_SECONDS = 1.0


def _out(text: str) -> None:
    """`text` onto standard output, where results go (progress and errors go to stderr),
    at once; a write that fails there is raised as OutputLost, for `run` to end the verb
    on (quietly when its reader went away, as `| head` does)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as error:
        raise OutputLost(error) from error


def _table(rows: list[list[str]], *, last_within: int | None = None) -> None:
    text = io.StringIO()
    show.table(rows, text, last_within=last_within)
    _out(text.getvalue())


# Where `_result` keeps a failure of standard output under a verb that changes things; `run`
# ends with it once the verb is done.
_lost_output: list[OutputLost] = []


def _result(text: str, *, echo: bool = True) -> None:
    """The result of a change made (a job's id, "ID deleted") onto standard output. Where
    that fails, the verb goes on: its change was made, and the rest of a batch is still to
    be made; the result goes to stderr instead (`echo`; not when stderr says it anyway),
    and `run` ends with the failure (exit 141 for a reader gone, else 1 saying why)."""
    if not _lost_output:
        try:
            _out(text)
            return
        except OutputLost as lost:
            _lost_output.append(lost)
            _drop_stdout()
    if echo:
        sys.stderr.write(text)
        sys.stderr.flush()


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that what is left in its buffer, and Python's
    flush of it at exit, fail no more."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _read_spec(path: str) -> tuple[str, dict[str, Any]]:
    """The spec's JSON text, and the object it holds (checked to be one). The text is what
    is sent, as it is, so the service judges each value (a number past float's range, an
    escape that is half a character) and names its field, where re-encoding what Python
    parsed failed with a traceback."""
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

    def not_json(constant: str) -> Any:
        # Python reads NaN and Infinity; JSON has neither, and the request could not send them.
        raise ClientError(f"{name} is not valid JSON: {constant} is not a JSON number", EXIT_USAGE)

    try:
        spec = duplicate_keys.loads(text, parse_constant=not_json)
    except DuplicateKeyError as error:
        # Sent as it is, the service would refuse it too; said here with the file's places.
        raise ClientError(f"cannot read the spec {name}: {error}", EXIT_USAGE) from error
    except json.JSONDecodeError as error:
        raise ClientError(
            f"{name} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            EXIT_USAGE,
        ) from error
    # Not only JSONDecodeError (as trainer/run.load_spec): an integer of thousands of
    # digits is a ValueError, and brackets nested thousands deep a RecursionError.
    except ValueError as error:
        raise ClientError(
            f"cannot read the spec {name}: {str(error).partition(';')[0]}", EXIT_USAGE
        ) from error
    except RecursionError as error:
        raise ClientError(
            f"cannot read the spec {name}: its brackets nest too deep (a job spec nests a "
            "few levels)",
            EXIT_USAGE,
        ) from error
    if not isinstance(spec, dict):
        raise ClientError(f"{name} must hold a JSON object (the job spec).", EXIT_USAGE)
    return text, spec


def _command(args: argparse.Namespace, *words: str) -> str:
    """`towerboard WORDS` for the person to run next, quoted for a shell, with this
    command's `--url URL` when it was given one. Not when the URL came from TOWERBOARD_URL
    or is the default: the hint is run in the shell that ran this command, where the
    variable (or its absence) picks the same service again, and naming it would only
    lengthen every hint; a URL given by --url is the one that shell would not send again
    by itself (without it, the command checks another service)."""
    url = ["--url", args.url] if args.url else []
    return shlex.join(["towerboard", *words, *url])


def submit(client: Client, args: argparse.Namespace) -> int:
    spec, fields = _read_spec(args.spec)
    name = fields.get("name")
    by_name = ["--name", name] if isinstance(name, str) else []
    try:
        job = client.request_json(
            "POST",
            "/api/v1/jobs",
            content=spec.encode("utf-8"),
            headers={"Content-Type": "application/json"},
            # A job made of a submit whose answer never came is found by its name (the
            # newest jobs come first); submitted again, it would run twice.
            check_with=_command(args, "status", *by_name),
        )[1]
    except ClientError as error:
        if error.code == EXIT_USAGE:
            source = "the spec from stdin" if args.spec == "-" else args.spec
            # A refusal not in the service's shape (no status: a proxy's 413) is no
            # judgement of the spec's by the service.
            said = "the service rejected" if error.status is not None else "cannot submit"
            error.message = f"{said} {source}: {error.message}"
        raise
    _result(f"{job['id']}\n", echo=False)  # the next line says it
    sys.stderr.write(f"submitted {job['name']!r} as job {job['id']} ({job['state']})\n")
    return _watch_if_asked(client, job, args)


def _watch_if_asked(client: Client, job: dict[str, Any], args: argparse.Namespace) -> int:
    """`--watch`: follow the job to its end; exit 0 only if it succeeded."""
    if not args.watch:
        return EXIT_OK
    try:
        job = watch(client, job["id"], sys.stderr)
    except KeyboardInterrupt:
        cancel = _command(args, "cancel", job["id"])
        sys.stderr.write(f"\nstopped watching; job {job['id']} goes on ({cancel})\n")
        return EXIT_INTERRUPTED
    sys.stderr.write(show.summary(job) + "\n")
    return EXIT_OK if job["state"] == "succeeded" else EXIT_FAILED


_PAGE_MOST = 200  # the API's largest page


def _jobs(client: Client, limit: int, states: list[str], name: str | None) -> dict[str, Any]:
    """The first `limit` jobs as one page of the API's shape, read a page at a time: the
    newest, or of the queued jobs alone the first to start."""
    data: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: list[tuple[str, str | int]] = [("limit", min(_PAGE_MOST, limit - len(data)))]
        params += [("state", state) for state in states]
        params += [("name", name)] if name else []
        params += [("cursor", cursor)] if cursor else []
        page: dict[str, Any] = client.get("/api/v1/jobs", params=params)
        data += page["data"]
        cursor = page.get("next_cursor")
        if not cursor or len(data) >= limit:
            return {**page, "data": data}


def _refuse(given: list[str], why: str) -> None:
    """Options given to a command that would not use them, refused (exit 2) before any
    request, rather than left to look as if they had done something: `why` says what
    they go with, after the options named."""
    if given:
        raise ClientError(
            f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with {why}", EXIT_USAGE
        )


def status(client: Client, args: argparse.Namespace) -> int:
    """One job's details with an ID, else the table of jobs."""
    if args.id:
        unused = (("--state", args.state), ("--limit", args.limit), ("--name", args.name))
        _refuse(
            [option for option, value in unused if value is not None],
            f"the list of jobs (status without an ID); status {args.id} shows that one job",
        )
        return _status_of_job(client, args)
    return _status_table(client, args)


def _tower_ms(p: dict[str, Any]) -> str:
    """The towers' times of a step, or why the latest trace gave none (it is still in
    TensorBoard's profile tab), or "-"."""
    if p.get("tower_ms"):
        return ", ".join(f"{ms:.2f}" for ms in p["tower_ms"])
    if p.get("tower_ms_error"):
        at = (
            f" that ended at step {p['trace_step']}" if isinstance(p.get("trace_step"), int) else ""
        )
        return f"none from the trace{at}: {show.printable(p['tower_ms_error'])}"
    return "-"


def _memory(p: dict[str, Any]) -> list[list[str]]:
    """The "memory" row: each tower's GPU's peak memory since its worker started; no row
    where the worker said none (towers on CPUs, or counters it could not read)."""
    memory = p.get("memory_mb")
    if not memory:
        return []
    return [["memory", ", ".join(f"{mb:.1f}" for mb in memory) + " MiB (peak)"]]


def _status_of_job(client: Client, args: argparse.Namespace) -> int:
    """A job's details, a row each (with an error's log tail where it failed)."""
    job = client.job(args.id)
    if args.json:
        _out(json.dumps(job, indent=2) + "\n")
        return EXIT_OK
    p, evaluation = job.get("progress") or {}, job.get("eval") or {}
    # Beside its attempts, as its page's meta line says it: finished at its checkpoint,
    # that attempt trained no step, which its "20/20" alone did not say.
    no_step = show.no_step(job)
    rows = [
        ["id", job["id"]],
        ["name", show.printable(job["name"])],
        ["state", job["state"] + (" (cancel requested)" if job.get("cancel_requested") and job["state"] not in TERMINAL else "")],
        *([["queue", _place_in_queue(client, job["id"])]] if job["state"] == "queued" else []),
        ["progress", f"{show.steps(job)}" + (f" ({p['percent']}%)" if p.get("percent") is not None else "")],
        # An ended job's last phase ("preparing", where it failed before its first
        # line) read as one it was in; over, it is in none, as the dashboard says.
        ["phase", "-" if job["state"] in TERMINAL else show.phase(p) or "-"],
        # The last training batch's, named so beside the eval's (the model's score).
        ["train loss", show.number(p.get("loss"))],
        ["train accuracy", show.percent(p.get("accuracy"))],
        ["eval loss", show.number(evaluation.get("loss"))],
        ["eval accuracy", show.percent(evaluation.get("accuracy"))],
        ["examples/s", show.rate(p.get("examples_per_sec"))],
        ["eta", show.eta(job, why=True)],
        ["tower ms", _tower_ms(p)],
        *_memory(p),
        ["devices", show.devices_and_towers(job, _host_gpus(client) if job["state"] == "queued" else None)],
        ["data", show.data(p)],
        ["priority", str(job["priority"])],
        ["attempts", str(job["attempts"]) + (f" ({no_step})" if no_step else "")],
        ["created", f"{job['created_at']} ({show.age(job['created_at'])} ago)"],
        ["started", job.get("started_at") or "-"],
        ["finished", job.get("finished_at") or "-"],
        ["checkpoint", str(p.get("checkpoint") or "-")],
    ]  # fmt: skip
    # A succeeded job's export, by the command that downloads it; export_url is null
    # where there is none to download (before the job succeeds, or while it trains on).
    if job.get("export_url"):
        rows.append(
            ["export", f"`{_command(args, 'export', job['id'])}` downloads the exported model"]
        )
    if stopped := show.stopped(job):  # a cancelled job's end, as its page says it
        rows.append(["stopped", stopped])
        rows.append(["resume", _resumes_from(client, args, job["id"])])
    # A cancel's error (its worker killed after the grace) is said in `stopped`, as the
    # page says it: a cancel, not a failure. Its log tail is printed all the same.
    if job.get("error") and job["state"] != "cancelled":
        error = job["error"]
        rows.append(["error", str(error.get("reason"))])
        if error.get("exit_code") is not None:
            rows.append(["exit code", str(error["exit_code"])])
    width = max(len(key) for key, _ in rows)
    lines = [f"{key.ljust(width)}  {value}\n" for key, value in rows]
    if job.get("error") and job["error"].get("log_tail"):
        lines.append("log tail:\n")
        lines += [f"  {log_line}\n" for log_line in job["error"]["log_tail"]]
    _out("".join(lines))
    return EXIT_OK


def _resumes_from(client: Client, args: argparse.Namespace, job_id: str) -> str:
    """Where a resume of a cancelled job trains on from, as its page says it: the latest
    checkpoint it keeps (one more read, made for cancelled jobs alone)."""
    listing = client.get(f"/api/v1/jobs/{job_id}/checkpoints")["data"]
    command = _command(args, "resume", job_id)
    if not listing:
        return f"`{command}` trains again from step 0, as no checkpoint was saved"
    latest = max(int(c["step"]) for c in listing)
    return f"`{command}` trains on from step {latest}'s checkpoint"


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 21st, ..."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _host_gpus(client: Client) -> bool:
    """Whether the service gives its jobs GPUs (one a tower) rather than CPU job slots (one
    a job): what a queued job waits for is said in those units."""
    return any(device["kind"] == "gpu" for device in client.get("/api/v1/devices")["data"])


def _place_in_queue(client: Client, job_id: str) -> str:
    """Where a queued job stands: "2nd of 5 (1 job ahead)", from the queue's largest page."""
    answer = client.get("/api/v1/queue", params={"limit": QUEUE_MOST})
    count = answer["count"]
    for job in answer["data"]:
        if job["id"] == job_id:
            place = job["position"]
            ahead = (
                f"next to start; it waits for {show.printable(answer['waiting_for'])}"
                if place == 1
                else f"{place - 1} job{'s' if place > 2 else ''} ahead"
            )
            return f"{_ordinal(place)} of {count} ({ahead})"
    if len(answer["data"]) < count:
        return f"after the first {len(answer['data'])} of {count}"
    # Queued when the job was read, and gone from the queue since: started or cancelled.
    return "no longer queued (started or cancelled since: run status again)"


def _status_table(client: Client, args: argparse.Namespace) -> int:
    """The jobs, newest first, a row each (`--limit`, `--state`, `--name`). The queued jobs
    alone (`--state queued`) come in the order they start, as the API lists them, each
    with its place in the queue (POS, as `queue` says it) unless `--name` leaves some out."""
    page = _jobs(client, args.limit or DEFAULT_LIMIT, args.state or [], args.name)
    if args.json:
        _out(json.dumps(page, indent=2) + "\n")
        return EXIT_OK
    if not page["data"]:
        named = f" named like {args.name!r}" if args.name else ""
        _out("no jobs" + (f" {'/'.join(args.state)}" if args.state else "") + named + "\n")
        return EXIT_OK
    # EVAL: the latest eval's accuracy, on held-out examples ("-" before the first). The
    # last training batch's, shown here as ACC, read as the model's (98.4% for a job whose
    # eval said 94.9%); `status ID` gives both, as both here made a typical row wider
    # than 100 columns.
    rows = [
        ["ID", "NAME", "STATE", "PROGRESS", "STEP", "LOSS", "EVAL", "EX/S", "ETA", "DEVICES", "AGE"]
    ]
    for job in page["data"]:
        p, evaluation = job.get("progress") or {}, job.get("eval") or {}
        percent = 100.0 if job["state"] == "succeeded" else p.get("percent")
        rows.append([
            job["id"], show.printable(job["name"])[:32], job["state"],
            f"{percent:.0f}%" if isinstance(percent, int | float) else "-",
            show.step_or_phase(job), show.number(p.get("loss")), show.percent(evaluation.get("accuracy")),
            show.rate(p.get("examples_per_sec")), show.eta(job), show.devices(job), show.age(job["created_at"]),
        ])  # fmt: skip
    # The whole queue from its head, in its order: each row's place is its line's.
    if set(args.state or []) == {"queued"} and not args.name:
        rows = [["POS", *rows[0]]] + [[str(n), *row] for n, row in enumerate(rows[1:], 1)]
    # Why a job failed or was cancelled (where a cancelled one stopped), so the table
    # answers that as the dashboard's does (`status ID` gives the whole reason and the
    # log's end): a last column where a job on this page has one, cut to the terminal's
    # width on one (whole down a pipe).
    # Its first letter a capital, as the dashboard's (a killed cancel's began in lower case).
    reasons = [show.capitalised(show.end_reason(job) or show.stopped(job)) for job in page["data"]]
    if any(reasons):
        rows[0].append("WHY")
        for row, reason in zip(rows[1:], reasons, strict=True):
            row.append(reason or "-")
    on_terminal = any(reasons) and sys.stdout.isatty()
    _table(rows, last_within=shutil.get_terminal_size().columns - 1 if on_terminal else None)
    if page.get("next_cursor"):
        _out(f"... {page['count'] - len(page['data'])} more (use --limit)\n")
    return EXIT_OK


def _note(text: str) -> None:
    sys.stderr.write(f"towerboard: {text}\n")
    sys.stderr.flush()


def logs(client: Client, args: argparse.Namespace) -> int:
    try:
        return _logs(client, args)
    except KeyboardInterrupt as interrupt:
        if not args.follow:
            raise
        # From its first read on, which may still be printing as the ^C comes: said after
        # the terminal's ^C, on a line of its own, as `--watch` says it stopped.
        raise Interrupted(f"stopped following the log of job {args.id}") from interrupt


def _logs(client: Client, args: argparse.Namespace) -> int:
    path = f"/api/v1/jobs/{args.id}/logs"
    response = client.request("GET", path, params={"tail": args.tail})
    _out(response.text)
    # Followed, through a service restart as the reads below are (one may come now).
    read_job = partial(client.job, args.id)
    job = client.patiently(read_job, _note) if args.follow else read_job()
    if job["state"] == "queued":
        following = "; following it from when it starts" if args.follow else ""
        if not response.text:
            # Nothing printed, and nothing said: it read as a worker that had logged nothing.
            said = "it has not started, so it has no log yet"
        else:
            # A resumed or requeued job: its log ended with the last attempt's end ("...
            # Trained 20000 steps."), and --follow then waited without a word.
            said = (
                f"it waits to start attempt {job['attempts']}, so the log above is of its "
                "earlier attempts"
            )
        sys.stderr.write(f"job {args.id} is queued: {said}{following}\n")
    if not args.follow:
        return EXIT_OK
    # Read on from where the last read ended (the service says where), so every line
    # shows once however fast the log grows.
    offset = int(response.headers.get(LOG_OFFSET_HEADER, "0"))
    while True:
        job = client.patiently(lambda: client.job(args.id), _note)
        ended = job["state"] in TERMINAL
        while True:  # drain: a fast log can hold more than one read's worth
            response = client.patiently(
                partial(client.request, "GET", path, params={"offset": offset}), _note
            )
            _out(response.text)
            next_offset = int(response.headers[LOG_OFFSET_HEADER])
            if next_offset == offset:
                break
            offset = next_offset
        if ended:  # read once more after the end, so the last lines are in
            return EXIT_OK
        time.sleep(_LOG_POLL_SECONDS)


def cancel(client: Client, args: argparse.Namespace) -> int:
    """Each job asked to cancel in turn (each once, in the order given); one that cannot be
    is said and skipped, and the command ends with the first refusal's exit code (1: a job
    unknown, or ended without `--wait`), as `delete` does. With `--wait`, every job is
    asked first, then all are waited on together, each `ID STATE` said as it stops."""
    ids = list(dict.fromkeys(args.ids))
    refused: list[int] = []  # the exit code of each refusal, in order
    stopping: list[str] = []  # asked (`--wait`), and not ended yet
    for index, job_id in enumerate(ids):
        rest = ids[index + 1 :]
        try:
            job, said = _cancel_one(client, args, job_id)
            if args.wait and job["state"] not in TERMINAL:
                stopping.append(job_id)
            else:
                _result(f"{job['id']} {job['state']}\n", echo=not said)
        except KeyboardInterrupt as interrupt:
            raise _not_tried(interrupt, rest) from interrupt
        except ClientError as error:
            if error.unanswered:
                # The rest would meet the same service: they are left, and said to be.
                if rest:
                    error.message += f" (not tried: {' '.join(rest)})"
                raise
            sys.stderr.write(f"towerboard: error: {error.message}\n")
            refused.append(error.code)
    refused += _wait_stopped(client, stopping, several=len(ids) > 1)
    return refused[0] if refused else EXIT_OK


def _not_tried(interrupt: KeyboardInterrupt, rest: list[str]) -> KeyboardInterrupt:
    """Ctrl-C in a batch, with the jobs it left untried named: after what the interrupted
    request has to say (an Interrupted), or on its own (a read, or between requests)."""
    if not rest:
        return interrupt
    untried = f"not tried: {' '.join(rest)}"
    if isinstance(interrupt, Interrupted):
        interrupt.message += f" ({untried})"
        return interrupt
    return Interrupted(f"interrupted; {untried}")


def _cancel_one(
    client: Client, args: argparse.Namespace, job_id: str
) -> tuple[dict[str, Any], bool]:
    """Ask the service to cancel `job_id`, saying on stderr what came of it; the job as it
    then is, and whether stderr said its state already (one that had already ended)."""
    try:
        response, job = client.request_json(
            "POST",
            f"/api/v1/jobs/{job_id}/cancel",
            check_with=_command(args, "status", job_id),
        )
    except ClientError as refused:
        if not args.wait or refused.unanswered:
            raise
        # `--wait` asks for a stopped job: one that ended already (cancelled by someone
        # else, or finished meanwhile) is that, and a script waiting on it goes on.
        job = client.job(job_id)
        if job["state"] not in TERMINAL:
            raise refused from None
        sys.stderr.write(f"job {job['id']} had already ended ({job['state']})\n")
        return job, True
    if response.status_code == 202:
        sys.stderr.write(f"cancel requested: job {job['id']} checkpoints and stops\n")
    elif job["state"] != "cancelled":  # a resume taken back before its attempt started
        sys.stderr.write(
            f"job {job['id']} was resumed and had not started again: it is {job['state']} "
            "again, as it was\n"
        )
    return job, False


def _wait_stopped(client: Client, ids: list[str], *, several: bool) -> list[int]:
    """Wait for every job of `ids` (each asked to cancel) to end, all at once rather than
    one after another, saying each `ID STATE` as it does; the exit code of each that could
    not be followed (deleted meanwhile), said and left. `several`: the command was given
    more than one job, so a service lost for good, or Ctrl-C, names those not seen to end."""
    pending = list(ids)
    refused: list[int] = []
    try:
        while pending:
            time.sleep(0.5)
            for job_id in list(pending):
                try:
                    job = client.patiently(partial(client.job, job_id), _note)
                except ClientError as error:
                    if error.unanswered:
                        if several:
                            error.message += f" (not seen to stop: {' '.join(pending)})"
                        raise
                    sys.stderr.write(f"towerboard: error: {error.message}\n")
                    pending.remove(job_id)
                    refused.append(error.code)
                    continue
                if job["state"] in TERMINAL:
                    pending.remove(job_id)
                    _result(f"{job['id']} {job['state']}\n")
    except KeyboardInterrupt as interrupt:
        if not pending:
            raise
        which = (
            f"job {pending[0]} stops on its own (its cancel was asked)"
            if len(pending) == 1
            else f"jobs {' '.join(pending)} stop on their own (their cancel was asked)"
        )
        raise Interrupted(f"stopped waiting; {which}") from interrupt
    return refused


def resume(client: Client, args: argparse.Namespace) -> int:
    finish = _latest_checkpoint_step(client, args) if args.finish else None
    steps = args.steps if finish is None else finish
    body = {key: value for key, value in (("steps", steps), ("epochs", args.epochs)) if value}
    if args.priority is not None:
        body["priority"] = args.priority
    try:
        job = _once_exited(
            client,
            args.id,
            partial(
                client.request_json,
                "POST",
                f"/api/v1/jobs/{args.id}/resume",
                json=body,
                check_with=_command(args, "status", args.id),
                options={"steps": "--steps", "epochs": "--epochs", "priority": "--priority"},
            ),
        )[1]
    except ClientError as error:
        # The service's hints name the API's body ({"steps": N}); here they are options.
        for key in ("steps", "epochs"):
            error.message = error.message.replace(f'{{"{key}": N}}', f"--{key} N")
        patch = f'PATCH /api/v1/jobs/{args.id} with {{"priority": P}}'
        error.message = error.message.replace(
            patch, f"use `{_command(args, 'priority', args.id, 'P')}`"
        )
        error.message = _how_to_wait(error.message, args, args.id)
        raise
    _result(f"{job['id']}\n", echo=False)  # the lines below say it
    # Where it starts and, trained longer, where it stops, as the dashboard says it.
    checkpoint = (job.get("progress") or {}).get("checkpoint")
    where = (
        f"from its latest checkpoint ({show.printable(checkpoint)})"
        if checkpoint
        else "from step 0: it has no checkpoint"
    )
    to = f" to step {steps}" if steps else f" to {args.epochs} epochs" if args.epochs else ""
    # `--steps` of the latest checkpoint's step finishes the job too: the service shows it
    # at that step until its worker reports.
    at = (job.get("progress") or {}).get("step")
    finishes = finish is not None or (checkpoint is not None and steps is not None and at == steps)
    does = (
        f"it finishes at step {steps}, its latest checkpoint: no step trained, its final eval "
        "and export"
        if finishes
        else f"it trains on{to} {where}"
    )
    sys.stderr.write(
        f"resumed job {job['id']} as attempt {job['attempts']} ({job['state']}): {does}\n"
    )
    return _watch_if_asked(client, job, args)


def priority(client: Client, args: argparse.Namespace) -> int:
    """A queued or running job's new priority; stdout says `ID N`, stderr what it did (a
    queued job's place in the queue now)."""
    try:
        job = client.request_json(
            "PATCH",
            f"/api/v1/jobs/{args.id}",
            json={"priority": args.priority},
            check_with=_command(args, "status", args.id),
            options={"priority": "N"},
        )[1]
    except ClientError as error:
        # An ended job's refusal names the API's resume; here it is a verb.
        route = f"(POST /api/v1/jobs/{args.id}/resume)"
        for body, options in (
            ('{"priority": P}', ["--priority", "P"]),
            ('{"steps": N, "priority": P}', ["--steps", "N", "--priority", "P"]),
        ):
            resume = _command(args, "resume", args.id, *options)
            error.message = error.message.replace(f"{body} {route}", f"`{resume}`")
        raise
    _result(f"{job['id']} {job['priority']}\n", echo=False)  # the line below says it
    if job["state"] == "queued":
        place = _place_in_queue(client, job["id"])
        does = place if place.startswith("no longer") else f"its place in the queue: {place}"
    elif job["state"] == "running":
        does = "it runs on; the new priority counts if it is requeued or resumed"
    else:  # ended since the change: it had none to use
        does = f"it has ended since ({job['state']})"
    sys.stderr.write(
        f"job {job['id']} ({job['state']}) now has priority {job['priority']}: {does}\n"
    )
    return EXIT_OK


def _latest_checkpoint_step(client: Client, args: argparse.Namespace) -> int:
    """The step of the job's latest checkpoint, for `resume --finish`: said as an error when
    the job is not cancelled or failed (a succeeded one has its export already) or has no
    checkpoint to end at: none, or only the `ckpt-0` of a job cancelled as it started,
    before its first step (a total of 0 steps is no job's)."""
    state = client.job(args.id)["state"]
    if state not in ("cancelled", "failed"):
        if state == "succeeded":
            export = _command(args, "export", args.id)
            now, then = "has succeeded", f"its model is exported already (`{export}`)"
        else:
            cancel = _command(args, "cancel", args.id, "--wait")
            now, then = f"is {state}", f"`{cancel}` stops it at a checkpoint first"
        raise ClientError(
            f"job {args.id} {now}: --finish ends a cancelled or failed job at its latest "
            f"checkpoint; {then}",
            EXIT_FAILED,
        )
    listing = client.get(f"/api/v1/jobs/{args.id}/checkpoints")["data"]
    latest = max((int(c["step"]) for c in listing), default=0)
    if not latest:
        # A job with only ckpt-0 was sent no steps: resumed as it is, it trained in full,
        # said as "it finishes at step None".
        what = "no checkpoint past step 0" if listing else "no checkpoint"
        raise ClientError(
            f"job {args.id} has {what} to finish at: `{_command(args, 'resume', args.id)}` "
            "trains it again from step 0",
            EXIT_FAILED,
        )
    return latest


def _how_to_wait(message: str, args: argparse.Namespace, job_id: str) -> str:
    """The service's refusal of a delete or resume of a job that has not ended, with the
    command that waits for its end: of one that is stopping (its cancel asked for, as a
    user who cancels and at once deletes or resumes has done), and in place of the route
    its hint names for one that is not ("Cancel it first (POST /api/v1/jobs/ID/cancel)")."""
    stopping = "try again once it has ended."
    wait = _command(args, "cancel", job_id, "--wait")
    message = message.replace(stopping, f"{stopping[:-1]} (`{wait}` returns then).")
    return message.replace(f"(POST /api/v1/jobs/{job_id}/cancel)", f"({wait})")


# How long a delete or resume refused because the job's worker is still exiting waits for
# it to go before asking again: the service waits 5 s itself, and TensorFlow's teardown
# took 8 s on a loaded 2-core host; a worker still there after this is stuck, said then.
EXIT_WAIT_SECONDS = 120.0


def _exiting(client: Client, job_id: str) -> bool:
    """Whether the job's worker has ended it and not yet exited (`/devices` marks what it
    held `exiting`)."""
    held = client.get("/api/v1/devices")["data"]
    return any(d["job_id"] == job_id and d.get("exiting") for d in held)


def _once_exited(client: Client, job_id: str, send: Callable[[], Any]) -> Any:
    """`send()`, asked again once if the service refused it (409) for an ended job: after
    its worker has exited, where it was still exiting (said on stderr, and waited for).
    `cancel --wait` returns at the job's end, so a delete or resume straight after it
    met the service's refusal in the second or so TensorFlow's teardown takes. A second
    refusal (one for another reason) is the caller's."""
    try:
        return send()
    except ClientError as error:
        if error.status != 409 or client.job(job_id)["state"] not in TERMINAL:
            raise
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    said = False
    while _exiting(client, job_id) and time.monotonic() < deadline:
        if not said:
            sys.stderr.write(f"job {job_id} has ended; waiting for its worker process to exit\n")
            said = True
        time.sleep(0.5)
    return send()


def delete(client: Client, args: argparse.Namespace) -> int:
    """Each job in turn; one that cannot be deleted is said and skipped (exit 1 at the end)."""
    refused = False
    ids = list(dict.fromkeys(args.ids))  # each once, in the order given
    for index, job_id in enumerate(ids):
        try:
            _once_exited(
                client,
                job_id,
                partial(
                    client.request,
                    "DELETE",
                    f"/api/v1/jobs/{job_id}",
                    check_with=_command(args, "status", job_id),
                ),
            )
        except Interrupted as interrupted:
            if rest := ids[index + 1 :]:
                interrupted.message += f" (not tried: {' '.join(rest)})"
            raise
        except ClientError as error:
            if error.unanswered:
                # The rest would meet the same service: they are left, and said to be.
                if rest := ids[index + 1 :]:
                    error.message += f" (not tried: {' '.join(rest)})"
                raise
            # The service's hint names the API's route; here it is a verb.
            message = _how_to_wait(error.message, args, job_id)
            sys.stderr.write(f"towerboard: error: {message}\n")
            refused = True
            continue
        _result(f"{job_id} deleted\n")
    return EXIT_FAILED if refused else EXIT_OK


def _resume_by_step(args: argparse.Namespace) -> Callable[[str], str]:
    """How a stopped `--download latest` of the archive NAME resumes: by its step. Run
    again, `latest` may be a newer checkpoint by then, which would come whole and leave
    the part behind."""

    def resume(name: str) -> str:
        step = re.fullmatch(r"\S+-ckpt-(\d+)\.tar\.gz", name)
        if step is None:
            return RUN_AGAIN
        output = ["-o", args.output] if args.output else []
        command = _command(args, "checkpoints", args.id, "--download", step[1], *output)
        return f"resume it with `{command}`"

    return resume


def _save_archive(
    client: Client,
    route: str,
    name: str,
    args: argparse.Namespace,
    what: str,
    *,
    saved: str | None = None,
    then: Callable[[Path], str] | None = None,
    resume: Callable[[str], str] | None = None,
) -> int:
    """Download the archive at `route`: with `-o -` to stdout, else to a file (`-o`'s path,
    or `name`) whose path goes to stdout. Stderr says where it went and its size: "wrote
    `what` to stdout (SIZE)", or "saved `saved` (default: `what`) to PATH (SIZE)" and
    `then` of PATH (what to do with it). `resume`: how a download that stopped resumes (see `download`)."""
    if args.output == "-" and sys.stdout.isatty():
        # Its bytes would fill the screen with gzip, and leave the terminal in a mess.
        raise ClientError(
            "-o - writes the archive's bytes to standard output, which is a terminal here: "
            "pipe it (| tar xz) or redirect it (> FILE), or give -o a path",
            EXIT_USAGE,
        )
    if args.output == "-":
        written = download_to_stdout(client, route, name)
        sys.stderr.write(f"wrote {what} to stdout ({show.data_size(written)})\n")
        return EXIT_OK
    path = download(client, route, name, args.output, force=args.force, resume=resume)
    size = show.data_size(path.stat().st_size)
    sys.stderr.write(f"saved {saved or what} to {path} ({size}){then(path) if then else ''}\n")
    _result(f"{path}\n", echo=False)  # the line above says it
    return EXIT_OK


def checkpoints(client: Client, args: argparse.Namespace) -> int:
    if args.download is None and (args.output is not None or args.force):
        # A list has nowhere to go and nothing to replace: the options were meant for a
        # download, which without --download did not happen, and nothing said so.
        given = " and ".join(o for o, v in (("-o", args.output), ("--force", args.force)) if v)
        raise ClientError(
            f"{given} {'go' if ' and ' in given else 'goes'} with --download STEP, which "
            "downloads a checkpoint; without it the command lists them",
            EXIT_USAGE,
        )
    if args.download is not None:
        _refuse(
            ["--json"] if args.json else [],
            "the list of checkpoints (without --download); a download is the archive itself",
        )
        which = args.download
        if which != "latest" and not (which.isascii() and which.isdigit()):
            raise ClientError(
                f"--download takes a step number or 'latest'. Received: {which!r}", EXIT_USAGE
            )
        # `latest` is the service's to resolve: it retries when the job's checkpoint
        # rotation deletes the newest one between listing and reading.
        route, name = (
            f"/api/v1/jobs/{args.id}/checkpoints/{which}",
            f"{args.id}-ckpt-{which}.tar.gz",
        )
        return _save_archive(
            client,
            route,
            name,
            args,
            "the checkpoint",
            saved="checkpoint",
            then=lambda path: (
                f"; extract it into a folder of its own ({_extract_command(path, own=True)}), "
                "where tf.train.latest_checkpoint finds it; its spec.json and data.json say "
                "the model to build and restore it into"
            ),
            resume=_resume_by_step(args) if which == "latest" else None,
        )
    answer = client.get(f"/api/v1/jobs/{args.id}/checkpoints")
    if args.json:  # the API's JSON, as --help says and `status --json` gives: not its list
        _out(json.dumps(answer, indent=2) + "\n")
        return EXIT_OK
    listing = answer["data"]
    if not listing:
        _out(f"job {args.id} has no checkpoint yet\n")
        return EXIT_OK
    rows = [["STEP", "SAVED", "SIZE", "URL"]]
    for c in sorted(listing, key=lambda c: c["step"]):
        rows.append([str(c["step"]), c["time"], show.data_size(c["size_bytes"]), c["url"]])
    _table(rows)
    return EXIT_OK


def export(client: Client, args: argparse.Namespace) -> int:
    route, name = f"/api/v1/jobs/{args.id}/export", f"{args.id}-export.tar.gz"
    return _save_archive(
        client,
        route,
        name,
        args,
        "the exported model",
        then=lambda path: (
            f"; extract it ({_extract_command(path, own=False)}) and tf.saved_model.load "
            "that folder; its model.json says what the model takes and answers"
        ),
    )


def _extract_command(archive: Path, *, own: bool) -> str:
    """The shell command that extracts a downloaded archive: into the folder it was saved
    in (`model/ID-export.tar.gz` into `model/`, as the README does), or, `own`, into one
    named after it beside it: checkpoints of one job downloaded to one folder would
    otherwise mix, the last one's `checkpoint` file naming the one restored."""
    if not own:
        return f"tar xzf {shlex.quote(str(archive))} -C {shlex.quote(str(archive.parent))}"
    folder = shlex.quote(str(archive.with_name(archive.name.removesuffix(".tar.gz"))))
    return f"mkdir -p {folder} && tar xzf {shlex.quote(str(archive))} -C {folder}"


def tensorboard(client: Client, args: argparse.Namespace) -> int:
    if args.stop and (given := [f"--{o}" for o in ("jobs", "merge", "open") if getattr(args, o)]):
        # Said, not ignored: `--stop --jobs X` stopped the TensorBoard every job shares.
        raise ClientError(
            f"--stop stops the shared TensorBoard; it takes no {', '.join(given)}", EXIT_USAGE
        )
    if args.stop:
        was = client.get("/api/v1/tensorboard")["state"]
        # No command tells whether it stopped but this one, which stops it if it did not.
        client.request("DELETE", "/api/v1/tensorboard", again="running it again is safe")
        _result("tensorboard stopped\n" if was != "stopped" else "tensorboard was not running\n")
        return EXIT_OK
    body: dict[str, Any] = {"job_ids": args.jobs} if args.jobs else {}
    if args.merge:
        body["merge"] = True
    try:
        started, board = client.request_json(
            "POST",
            "/api/v1/tensorboard",
            json=body,
            options={"job_ids": "--jobs", "merge": "--merge"},
            # No command tells what TensorBoard shows; a start that did reach it made
            # this one's selection what it shows, so the same start again reuses it.
            again="running it again is safe: a TensorBoard that already shows these jobs "
            "is reused, not restarted",
        )
    except ClientError as error:
        raise _unknown_jobs(client, error, args.jobs or []) or error from None
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
        # The service keeps why it stopped; its log may be on another host.
        why = board.get("last_error") or "see the service log"
        raise ClientError(f"TensorBoard did not come up (state {board['state']}): {why}")
    shown = "all jobs" if board.get("job_ids") is None else ", ".join(board["job_ids"])
    sys.stderr.write(f"TensorBoard is running over {shown}\n")
    if replaced:
        # One TensorBoard serves every user: say whose view this start took away.
        gone = "all jobs" if replaced.get("job_ids") is None else ", ".join(replaced["job_ids"])
        sys.stderr.write(
            f"this replaced the shared TensorBoard over {gone}, which others may have had "
            "open (--merge adds jobs to what it shows instead)\n"
        )
    _result(f"{board['url']}\n")
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


def _unknown_jobs(client: Client, error: ClientError, ids: list[str]) -> ClientError | None:
    """The refusal of a selection naming jobs the service has not got, said as every other
    verb says of a job id it does not know (exit 1); None for any other error. The
    service's 422 names each id it refused by its place in the body (`job_ids.0`); each is
    then looked up, and only when none is found is the refusal said to be of unknown jobs:
    the message's words are the service's to change, the lookup's 404 is not."""
    if error.status != 422 or not error.errors:
        return None
    unknown = []
    for field in (str(e.get("field")) for e in error.errors):
        place = re.fullmatch(r"job_ids\.(\d+)", field)
        if place is None or int(place[1]) >= len(ids):
            return None
        unknown.append(ids[int(place[1])])
    for job_id in unknown:  # the error path only: a selection is a few jobs
        try:
            client.job(job_id)
        except ClientError as lookup:
            if lookup.status == 404:
                continue
        return None  # there, or not known to be gone: the refusal is said as it is
    named = ", ".join(repr(job_id) for job_id in unknown)
    return ClientError(f"Job{'s' if len(unknown) > 1 else ''} {named} not found.", EXIT_FAILED)


def metrics(client: Client, args: argparse.Namespace) -> int:
    """CSV on stdout, a row per step and a column per series (empty where a series has no
    point at that step: eval runs less often), or the API's JSON; or with `--into`, a CSV
    file kept in sync (`_metrics_into`)."""
    if args.into is not None:
        return _metrics_into(client, args)
    _refuse(["--follow"] if args.follow else [], "--into FILE, which it keeps in sync")
    _refuse(["--no-header"] if args.json and args.no_header else [], "the CSV; --json has none")
    _refuse(["--revision"] if args.revision is not None and args.after_step is None else [],
            "--after-step, to read on")  # fmt: skip
    params: dict[str, Any] = {"name": args.name or []}
    if args.after_step is not None:
        params["after_step"] = args.after_step
    if args.revision is not None:
        params["revision"] = args.revision
    try:
        answer = client.get(f"/api/v1/jobs/{args.id}/metrics", params=params)
    except ClientError as error:
        raise _rewound(args, error) from None
    revision = answer.get("revision", 0)
    if revision != (args.revision or 0) and not args.json:
        # Said while the command a script runs lacks it: a read on without it fails once
        # a resume replaces rows at or before its step (each revision is such a resume).
        sys.stderr.write(
            f"job {args.id}'s series is at revision {revision} (a resume trained steps "
            f"again): read on with --revision {revision}\n"
        )
    if args.json:
        _out(json.dumps(answer, indent=2) + "\n")
        return EXIT_OK
    # The columns: those asked for, in order, each kept with no points (so reads with
    # --after-step and --no-header append to one CSV); else the series that have points.
    present = [name for name, points in answer["series"].items() if points]
    columns = metricscsv.columns_of(args.name or [], present)
    rows, _ = metricscsv.csv_rows(answer["series"], columns)
    if not rows:
        after = " yet" if args.after_step is None else f" after step {args.after_step}"
        sys.stderr.write(f"job {args.id} has no metrics{after}\n")
        return EXIT_OK
    _out(("" if args.no_header else metricscsv.header(columns)) + rows)
    return EXIT_OK


_METRICS_POLL_SECONDS = 2.0  # `metrics --into --follow`: a worker reports every 2 s or so


def _metrics_into(client: Client, args: argparse.Namespace) -> int:
    """`--into FILE`: FILE made whole where it is absent, else read on after its last row
    and appended to, at the revision kept beside it; rows a resume replaced are dropped
    and read again. `--follow`: again every few seconds until the job has ended, through
    a service restart as `logs --follow` rides one out."""
    given = [("--after-step", args.after_step is not None), ("--revision", args.revision is not None),
             ("--no-header", args.no_header), ("--json", args.json)]  # fmt: skip
    _refuse(
        [option for option, set_ in given if set_],
        "a read to standard output; --into FILE reads on after FILE's last row, at the "
        f"revision kept in {revision_path(Path(args.into)).name}",
    )
    target = MetricsFile(args.into, args.id, args.name)
    try:
        target.open(existing=target.check())
        if not args.follow:
            before = target.last_step
            written = _sync_into(client, args, target, patient=False)
            sys.stderr.write(_synced(target, before, written) + "\n")
            return EXIT_OK
        return _follow_into(client, args, target)
    except KeyboardInterrupt as interrupt:
        following = f"stopped following the metrics of job {args.id}; " if args.follow else ""
        raise Interrupted(f"{following}{target.holds()}") from interrupt
    finally:
        target.close()


def _synced(target: MetricsFile, before: int | None, written: int | None) -> str:
    """What a read into FILE did: "appended 12 rows to run.csv (to step 400)"."""
    to = f"to step {target.last_step}" if target.last_step is not None else "no row yet"
    if written is None:
        return f"{target.given} is up to date ({to})"
    rows = f"{written} row{'s' if written != 1 else ''}"
    return f"{'wrote' if before is None else 'appended'} {rows} to {target.given} ({to})"


def _follow_into(client: Client, args: argparse.Namespace, target: MetricsFile) -> int:
    """`--into FILE --follow`: read on until the job has ended, then once more."""
    job = client.job(args.id)  # a wrong --url, or job id, fails at once
    patient = False
    while True:
        ended = job["state"] in TERMINAL
        _sync_into(client, args, target, patient=patient)
        if ended:  # read once more after the end, so its last rows are in
            sys.stderr.write(f"job {args.id} {job['state']}: {target.holds()}\n")
            return EXIT_OK
        time.sleep(_METRICS_POLL_SECONDS)
        patient = True
        job = client.patiently(lambda: client.job(args.id), _note)


def _sync_into(
    client: Client, args: argparse.Namespace, target: MetricsFile, *, patient: bool
) -> int | None:
    """One read into FILE: its rows since its last one, or all of them into a FILE made
    anew; how many were written (None: none were new). A read refused because a resume
    replaced rows FILE holds drops them, says so, and reads on from where they begin.
    `patient`: a service gone is waited for (`Client.patiently`), as followers wait."""
    route = f"/api/v1/jobs/{args.id}/metrics"

    def read(params: dict[str, Any]) -> dict[str, Any]:
        call = partial(client.get, route, params=params)
        answer: dict[str, Any] = client.patiently(call, _note) if patient else call()
        return answer

    while True:
        params: dict[str, Any] = {"name": target.columns}
        if not target.check():
            answer = read(params)
            rows, last = metricscsv.csv_rows(answer["series"], target.columns)
            target.write_whole(rows, last, answer.get("revision", 0))
            return rows.count("\n")
        if target.last_step is not None:
            params.update(after_step=target.last_step, revision=target.revision)
        try:
            answer = read(params)
        except ClientError as error:
            after, revision = error.body.get("read_again_after"), error.body.get("revision")
            if error.status == 422 and any(
                e.get("field") == "query.revision" for e in error.errors
            ):
                raise ClientError(
                    f"{target.revision_path} says revision {target.revision}, which job "
                    f"{args.id}'s series has not reached ({error.message}): it is not of this "
                    "job's rows; remove it to read on from revision 0"
                ) from None
            if error.status != 409 or not isinstance(after, int) or not isinstance(revision, int):
                raise
            dropped = target.drop_after(after, revision)
            done = (
                f"rewrote {target.given} from there ({dropped} row{'s' if dropped != 1 else ''} "
                "dropped, to read again)"
                if dropped
                else f"{target.given} has none after it"
            )
            sys.stderr.write(
                f"job {args.id}: a resume replaced its rows after step {after}; {done}\n"
            )
            continue
        rows, last = metricscsv.csv_rows(answer["series"], target.columns)
        target.append(rows, last, answer.get("revision", 0))
        return rows.count("\n") or None


def _rewound(args: argparse.Namespace, error: ClientError) -> ClientError:
    """A read on refused because rows it would follow were replaced since `--revision`
    (the service's 409 with `read_again_after`), said with the command that reads them
    again; any other error as it is. Nothing was written: stdout may be appended to a CSV,
    and the rows to drop are in it already."""
    after, revision = error.body.get("read_again_after"), error.body.get("revision")
    if error.status != 409 or not isinstance(after, int) or not isinstance(revision, int):
        return error
    names = [word for name in args.name or [] for word in ("--name", name)]
    header = ["--no-header"] if args.no_header else []
    json_flag = ["--json"] if args.json else []
    again = _command(
        args, "metrics", args.id, *names, "--after-step", str(after),
        "--revision", str(revision), *header, *json_flag,
    )  # fmt: skip
    return ClientError(
        f"job {args.id}'s rows after step {after} were replaced since revision "
        f"{args.revision or 0} (a resume trained those steps again, or added an eval of "
        f"one): those you read are not the job's now. Drop your rows after step {after}, "
        f"then read on with `{again}`",
        EXIT_FAILED,
        status=error.status,
    )


def profile(client: Client, args: argparse.Namespace) -> int:
    answer = client.request_json(
        "POST",
        f"/api/v1/jobs/{args.id}/profile",
        json={"steps": args.steps},
        options={"steps": "--steps"},
        # No command tells whether a trace was asked for; the service joins a request its
        # worker has not taken yet to the one waiting.
        again="run it again at once to be sure: a request its worker has not taken yet "
        "(it takes one within a few seconds) is joined, not traced twice",
    )[1]
    _result(f"{answer['job_id']} {answer['steps']}\n", echo=False)  # the line below says it
    sys.stderr.write(
        f"asked job {answer['job_id']} for a device trace of its next {answer['steps']} steps: "
        "its worker takes it within a few seconds, and it then shows in TensorBoard's profile "
        f"tab ({_command(args, 'tensorboard', '--jobs', answer['job_id'], '--merge')})\n"
    )
    return EXIT_OK


def devices(client: Client, args: argparse.Namespace) -> int:
    answer = client.get("/api/v1/devices")
    if args.json:
        _out(json.dumps(answer, indent=2) + "\n")
        return EXIT_OK
    rows = [["DEVICE", "JOB", "NAME"]]
    for device in answer["data"]:
        # The job's name beside its id, cut as `status` and `queue` cut it; a service from
        # before the name was given says none.
        name = device.get("job_name")
        held = show.printable(name)[:32] if device["job_id"] and name is not None else ""
        notes = []
        if device.get("exiting"):
            notes.append("(ended: its worker is exiting)")
        if not device.get("configured", True):
            notes.append("(not configured: not given out again)")
        rows.append([device["id"], device["job_id"] or "free", " ".join([held, *notes]).strip()])
    _table(rows)
    sys.stderr.write(f"up to {answer['max_towers']} towers a job\n")
    return EXIT_OK


def queue(client: Client, args: argparse.Namespace) -> int:
    """The queued jobs in the order they start, a row each, then what the first waits for."""
    answer = client.get("/api/v1/queue", params={"limit": args.limit})
    if args.json:
        _out(json.dumps(answer, indent=2) + "\n")
        return EXIT_OK
    if not answer["data"]:
        _out("no jobs queued\n")
        return EXIT_OK
    rows = [["POS", "ID", "NAME", "PRIORITY", "TOWERS", "WAITING"]]
    for job in answer["data"]:
        rows.append([
            str(job["position"]), job["id"], show.printable(job["name"])[:32],
            str(job["priority"]), str(job["towers"]), show.age(job["queued_at"]),
        ])  # fmt: skip
    _table(rows)
    count = answer["count"]
    if count > len(answer["data"]):
        _out(f"... {count - len(answer['data'])} more (use --limit)\n")
    waits = show.printable(answer["waiting_for"])
    _out(f"the first waits for {waits} ({count} queued in all)\n")
    return EXIT_OK


# --- wiring --------------------------------------------------------------------------


def _url_from_env() -> str:
    """TOWERBOARD_URL, or the default; a usage error naming the variable if it is no URL."""
    value = os.environ.get("TOWERBOARD_URL") or DEFAULT_URL
    try:
        return parse_url(value)
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


def run(name: str, args: argparse.Namespace) -> int:
    """Run the verb `name` (one of VERBS) on its parsed arguments; the exit code."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    if sys.stderr is None:  # started with it closed (`2>&-`): Python has none
        # Progress and errors are dropped, and the exit code still tells: a submit made its
        # job, then failed writing its note of it (exit 1), and a script that retried on
        # that made a second job.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the process's own, for its life
    try:
        token = _token_from_env()
        url = args.url or _url_from_env()
        if sys.stdout is None:  # started with it closed (`>&-`): Python has none
            # Refused before anything is done: a submit made the job, then lost its id.
            raise ClientError(
                "standard output is closed, and the results go there; give the command one "
                "(> /dev/null to drop them)",
                EXIT_USAGE,
            )
    except ClientError as error:
        sys.stderr.write(f"towerboard: error: {error.message}\n")
        return error.code
    _lost_output.clear()
    client = Client(url, token)
    try:
        code = VERBS[name](client, args)
        _out("")  # the flush, here, where a failure can still be handled
        return _output_lost(_lost_output[0], code, changed=True) if _lost_output else code
    except ClientError as error:
        sys.stderr.write(f"towerboard: error: {error.message}\n")
        return error.code
    except OutputLost as lost:
        return _output_lost(lost, EXIT_OK)
    except KeyboardInterrupt as interrupt:
        # A new line after the terminal's ^C, then what the verb has to say of it, if any.
        said = f"{interrupt.message}\n" if isinstance(interrupt, Interrupted) else ""
        sys.stderr.write(f"\n{said}")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Stderr's reader went away (`2>&1 | head`): nothing can be said.
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        client.close()


def _output_lost(lost: OutputLost, code: int, *, changed: bool = False) -> int:
    """The end of a verb whose standard output failed (`code`: what it would have exited
    with; `changed`: it made a change, and said so on stderr). Its reader gone (`towerboard
    status | head`): quietly, like any filter, with 141. Anything else (a full disk): said
    in one line, exit 1. A verb that failed keeps its own code."""
    _drop_stdout()
    if isinstance(lost.error, BrokenPipeError):
        return code or EXIT_BROKEN_PIPE
    why = lost.error.strerror or lost.error
    if lost.message:
        said = lost.message
    elif changed:
        said = f"cannot write the results to standard output ({why}): what was done is said above"
    else:
        said = f"cannot write to standard output: {why}"
    sys.stderr.write(f"towerboard: error: {said}\n")
    return code or EXIT_FAILED


VERBS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "submit": submit,
    "status": status,
    "logs": logs,
    "cancel": cancel,
    "resume": resume,
    "priority": priority,
    "delete": delete,
    "checkpoints": checkpoints,
    "export": export,
    "tensorboard": tensorboard,
    "metrics": metrics,
    "profile": profile,
    "devices": devices,
    "queue": queue,
}
