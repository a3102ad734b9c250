"""The client verbs' arguments, registered on the `towerboard` command.

Kept apart from the verbs: parsing `towerboard serve` builds every verb's parser, and
importing the client (httpx, about 0.1 s) there would slow the service's start. A verb's
handler imports the client when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from service.client.common import (
    DEFAULT_LIMIT,
    DEFAULT_URL,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_DEFAULT,
    QUEUE_MOST,
    STATES,
)


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from service.client import verbs

        return verbs.run(name, args)

    return handler


def _count(most: int, least: int = 1) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = least - 1
        if not least <= number <= most:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {least} to {most}. Received: {value!r}"
            )
        return number

    return parse


def parse_url(value: str) -> str:
    """An http(s) URL with a host: `localhost:8000` would otherwise be read as a URL of
    scheme `localhost` and reported as a service that cannot be reached."""
    import httpx  # here, not at the top: see the module's docstring

    try:
        url = httpx.URL(value) if "://" in value else None
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"expected the service's URL, like {DEFAULT_URL}. Received: {value!r}"
        )
    # The API's own prefix, as the README's curl lines show it: every verb then asked
    # /api/v1/api/v1/... and got "No such resource". A path before it (a reverse proxy's
    # prefix) is the service's.
    path = url.path.rstrip("/")
    if path == "/api/v1" or path.endswith("/api/v1"):
        root = str(url.copy_with(path=path.removesuffix("/api/v1") or "/", query=None))
        raise argparse.ArgumentTypeError(
            f"expected the service's URL, without the API's /api/v1 (the verbs add it), "
            f"like {root}. Received: {value!r}"
        )
    return value


# The characters a URL path segment carries as they are (RFC 3986's unreserved): a job id
# goes into the path unquoted, where a `?` or `#` would end it early (`delete 'ID#x'` would
# delete ID) and a `%` would be decoded.
_ID_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _job_id(value: str) -> str:
    if not value or value.startswith(".") or not set(value) <= _ID_CHARACTERS:
        raise argparse.ArgumentTypeError(f"expected a job id. Received: {value!r}")
    return value


def add_client_commands(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register submit, status, logs, cancel, resume, priority, delete, checkpoints, export,
    tensorboard, metrics, profile, devices and queue on `verbs`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        type=parse_url,  # TOWERBOARD_URL is read (and judged, by its own name) in `verbs.run`
        help=f"the service (default $TOWERBOARD_URL, else {DEFAULT_URL}); "
        "the token comes from $TOWERBOARD_TOKEN",
    )

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        parser = verbs.add_parser(
            name, parents=[common], help=help, description=help[0].upper() + help[1:] + "."
        )
        parser.set_defaults(handler=_handler(name))
        return parser

    def add_watch(parser: argparse.ArgumentParser) -> None:
        """--watch, as submit and resume take it: both follow the job the same way."""
        parser.add_argument(
            "--watch",
            action="store_true",
            help="show a live progress bar until the job ends; exit 0 only if it succeeded",
        )

    p = verb("submit", "submit a job spec (a JSON file, or - for stdin)")
    p.add_argument("spec", metavar="SPEC.json")
    add_watch(p)

    p = verb("status", "list jobs, or show one job")
    p.add_argument("id", nargs="?", type=_job_id, metavar="ID")
    p.add_argument(
        "--state", action="append", choices=STATES, help="only jobs in this state (repeatable)"
    )
    p.add_argument(
        "--limit",
        type=_count(100_000),  # None when not given: `status ID` refuses it, as it lists none
        metavar="N",
        help=f"most jobs to list, newest first; queued ones alone, first to start first "
        f"(default {DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--name", metavar="TEXT", help="only jobs whose name contains TEXT, in any case of A-Z"
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    p = verb("logs", "print the end of a job's worker log")
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

    p = verb(
        "cancel",
        "cancel queued or running jobs, each in turn; one that cannot be is said and "
        "skipped (exit 1)",
    )
    p.add_argument("ids", nargs="+", type=_job_id, metavar="ID")
    p.add_argument(
        "--wait",
        action="store_true",
        help="ask every job first, then wait until all have stopped, printing each as it "
        "does (one that had already ended is no error)",
    )

    p = verb(
        "resume",
        "put a cancelled or failed job back in the queue to train on from its latest "
        "checkpoint (a succeeded one with --steps or --epochs, to train longer), or to "
        "finish it at that checkpoint (--finish)",
    )
    p.add_argument("id", type=_job_id, metavar="ID")
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--steps",
        type=_count(100_000_000),
        metavar="N",
        help="the job's new total steps; a cancelled or failed job's latest checkpoint's "
        "step finishes it there",
    )
    length.add_argument(
        "--epochs", type=_count(1_000_000), metavar="N", help="the job's new total epochs"
    )
    p.add_argument(
        "--priority",
        type=_count(PRIORITY_MAX, least=PRIORITY_MIN),
        metavar="N",
        help="the job's new priority (default: its own)",
    )
    length.add_argument(
        "--finish",
        action="store_true",
        help="end a cancelled or failed job at its latest checkpoint, training no step: "
        "its final eval and export (--steps of that checkpoint's step)",
    )
    add_watch(p)

    p = verb(
        "priority",
        "change a queued or running job's priority: a queued one moves in the queue at once "
        "(where it would be had it been submitted at that priority), a running one's counts "
        "if it is requeued or resumed",
    )
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "priority",
        type=_count(PRIORITY_MAX, least=PRIORITY_MIN),
        metavar="N",
        help=f"the new priority, from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first)",
    )

    p = verb("delete", "delete ended jobs for good: record, log, checkpoints and export")
    p.add_argument("ids", nargs="+", type=_job_id, metavar="ID")

    p = verb("checkpoints", "list a job's checkpoints, or download one")
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
        help="file, or folder (an existing one, or ending in /) to save it to, or - for "
        "standard output (default: ./ID-ckpt-STEP.tar.gz)",
    )
    p.add_argument("--force", action="store_true", help="replace the file if it exists")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    p = verb("export", "download the model a succeeded job exported (a SavedModel)")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file, or folder (an existing one, or ending in /) to save the .tar.gz to, "
        "or - for standard output (default: ./ID-export.tar.gz)",
    )
    p.add_argument("--force", action="store_true", help="replace the file if it exists")

    p = verb("tensorboard", "start (or reuse) TensorBoard and print its URL")
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

    p = verb(
        "metrics",
        "print a job's scalar series as CSV: a row per reported step, a column per series",
    )
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "--name",
        action="append",
        metavar="SERIES",  # the service names the series there are, should one be wrong
        help="only this series, e.g. loss or eval_accuracy (repeatable; default: every one)",
    )
    p.add_argument(
        "--after-step",
        # From 0, a script's first read, to the API's own bound.
        type=_count(2**63 - 1, least=0),
        metavar="N",
        help="only steps after N (the last one already read, to read on)",
    )
    p.add_argument(
        "--revision",
        type=_count(2**63 - 1, least=0),
        metavar="R",
        help="with --after-step: the series' revision the rows up to N were read at (default "
        "0); a read on past rows a resume has replaced since then fails, saying what to run",
    )
    p.add_argument(
        "--no-header",
        action="store_true",
        help="no header row: to append a read on (--after-step, with --name for the columns)",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument(
        "--into",
        metavar="FILE",
        help="keep the CSV FILE in sync instead of printing: made whole if absent (the --name "
        "series, else every one), else read on after its last row (in its own columns unless "
        "--name) and appended to; rows a resume replaced are dropped and read again (its "
        "revision is kept in FILE.revision)",
    )
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="with --into: keep reading on every few seconds until the job ends",
    )

    p = verb("profile", "ask a running job for a device trace of its next steps")
    p.add_argument("id", type=_job_id, metavar="ID")
    p.add_argument(
        "--steps", type=_count(100), default=5, metavar="N", help="how many steps (default 5)"
    )

    p = verb("devices", "list the devices the service gives to jobs, and the job holding each")
    p.add_argument("--json", action="store_true", help="print the API's JSON")

    p = verb("queue", "list the queued jobs in the order they start, and what the first waits for")
    p.add_argument(
        "--limit",
        type=_count(QUEUE_MOST),
        default=QUEUE_DEFAULT,
        metavar="N",
        help=f"most jobs to list (default {QUEUE_DEFAULT}, at most {QUEUE_MOST})",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")
