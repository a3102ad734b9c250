"""The `towerboard` command. Verbs are subcommands; `serve` runs the service.

    towerboard serve [--host H] [--port P] [--data-dir D] [--log-level L] [--no-access-log]

Everything else comes from `TOWERBOARD_*` environment variables (see service/settings.py).
`serve` exits 2 on an invalid setting and 1 when it cannot start (its port is taken,
another service holds the data dir, or its job store cannot be opened), saying why in one
line.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.client.commands import add_client_commands, parse_url
from service.settings import Settings, missing_data_roots, unknown_variables

EXIT_CANNOT_START = 1
EXIT_BAD_SETTING = 2


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (as uvicorn binds one; it listens once the app is up)."""
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY on the connections it accepts
    # only from a socket that says it is TCP, and without it every answer on a keep-alive
    # connection waited some 40 ms for the client's delayed ACK.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _store_refusal(db_path: Path, error: sqlite3.DatabaseError) -> str:
    """The one line `serve` ends with when its job store cannot be opened."""
    said = f"Cannot open the job store {db_path} ({error})."
    if "locked" in str(error):
        return (
            f"{said} Another process holds a transaction on it (a backup, a sqlite3 shell): "
            "start again once it has let go."
        )
    return (
        f"{said} Expected Towerboard's SQLite job store, or no file there: restore it from a "
        "backup, or move it aside to start with an empty store (its jobs' folders stay "
        "under runs/), then start again."
    )


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.browsers import listens_on_loopback
    from service.headtimeout import head_timeout_protocol
    from service.main import DataDirInUse, create_app, lock_data_dir
    from service.store import JobStore
    from service.workers import check_worker_command

    log = logging.getLogger("towerboard")

    overrides = {
        key: value
        for key, value in (("host", args.host), ("port", args.port), ("data_dir", args.data_dir))
        if value is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        for item in error.errors(include_url=False):
            field, *place = (str(part) for part in item["loc"])
            # Name what the person gave: the option when it was one, else the variable (a
            # list's item by its place, as "TOWERBOARD_GPUS.0" is no variable's name).
            name = (
                f"--{field.replace('_', '-')}"
                if field in overrides
                else f"setting TOWERBOARD_{field.upper()}"
            )
            if place and place[0].isdigit():
                name += f" (item {int(place[0]) + 1} of the list)"
            message = item["msg"].removeprefix("Value error, ")
            # Never a secret into a log; nor a second "Received" after a validator's own.
            shown = "input" in item and field != "token" and "Received:" not in message
            received = f". Received: {item['input']!r}" if shown else ""
            log.error("Invalid %s: %s%s", name, message, received)
        return EXIT_BAD_SETTING
    worker_command = check_worker_command(settings.python, settings.worker_module)
    if worker_command.problems:
        for name, problem in worker_command.problems:
            log.error("Invalid setting %s: %s", name, problem)
        return EXIT_BAD_SETTING
    # The port and the data dir's lock are checked before the app starts: its start-up
    # adopts running workers and starts queued jobs, and a service that then could not
    # listen would stop at once, leaving the workers it started behind it.
    try:
        sock = _listen(settings.host, settings.port)
    except socket.gaierror as error:
        log.error(
            "Cannot listen on %s:%d (%s). Expected an IP address or a name of this host: "
            "give another with --host or TOWERBOARD_HOST.",
            settings.host,
            settings.port,
            error.strerror or error,
        )
        return EXIT_CANNOT_START
    except OSError as error:
        log.error(
            "Cannot listen on %s:%d (%s). Expected a free port: stop what holds it, or "
            "pick another with --port or TOWERBOARD_PORT.",
            settings.host,
            settings.port,
            error.strerror or error,
        )
        return EXIT_CANNOT_START
    try:
        # Taken and let go: the app's lifespan takes it again and holds it (and still
        # refuses, should another service take it in between).
        os.close(lock_data_dir(settings.resolved().data_dir))
    except DataDirInUse as error:
        sock.close()
        log.error("%s", error)
        return EXIT_CANNOT_START
    except OSError as error:
        sock.close()
        log.error(
            "Cannot use the data dir %s (%s). Expected a folder this service can create and "
            "write: give another with --data-dir or TOWERBOARD_DATA_DIR.",
            settings.resolved().data_dir,
            error.strerror or error,
        )
        return EXIT_CANNOT_START
    try:
        # Opened once before the app starts, as the lock is taken above: a towerboard.db
        # that is no SQLite database (a damaged disk, a copy cut short, a data dir of other
        # files) failed the app's start-up with a traceback and uvicorn's exit 3, after
        # "Listening on".
        JobStore(settings.resolved().db_path).close()
    except sqlite3.DatabaseError as error:
        sock.close()
        log.error("%s", _store_refusal(settings.resolved().db_path, error))
        return EXIT_CANNOT_START
    host, port = sock.getsockname()[:2]
    log.info("Listening on http://%s:%d (Ctrl-C stops)", f"[{host}]" if ":" in host else host, port)
    if settings.token is None and not listens_on_loopback(settings.host):
        # Said, not refused (a trusted network may want it): without a token, anyone who
        # can reach the port reads every job, cancels and deletes them, and runs code on
        # this host through a job's custom model.
        log.warning(
            "No TOWERBOARD_TOKEN is set and %s is reachable beyond this host: anyone who can "
            "reach the port can use the service. Set TOWERBOARD_TOKEN, or listen on 127.0.0.1.",
            settings.host,
        )
    for line in unknown_variables(os.environ):
        log.warning("%s", line)
    for line in missing_data_roots(settings):
        log.warning("%s", line)
    app = create_app(settings, worker_python=worker_command.python)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # At the stop signal, not after the connections have drained (up to 5 s): no
            # worker may be started while the service is on its way out.
            runtime = getattr(app.state, "runtime", None)
            if runtime is not None:
                runtime.supervisor.stop_starting()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=5,
        http=head_timeout_protocol(settings.head_timeout_seconds),
        # No route takes a WebSocket, and the token guard checks HTTP requests only: an
        # upgrade is answered as the plain request it is, even if a WebSocket library
        # comes to be installed beside uvicorn.
        ws="none",
    )
    Server(config).run(sockets=[sock])
    return 0


# What `towerboard --help` ends with: what every client verb reads from the environment,
# and the exit codes a script branches on (README's list, in short).
_EPILOG = """\
The client verbs talk to --url, else $TOWERBOARD_URL, else http://127.0.0.1:8000, and send
$TOWERBOARD_TOKEN, when set, as their bearer token. `towerboard VERB --help` lists a verb's
options.

exit codes of the client verbs:
  0    done
  1    refused or failed, or the watched job did not succeed
  2    usage error, or a spec the service (or a proxy in front of it) rejected
  3    the service could not be reached (nothing was sent), or a download was cut off
       (the error says how to resume it)
  4    a request was sent and no answer came (a timeout, a dropped connection, a
       proxy's 502-504): what it asked may or may not have been done; the error says
       how to check before trying again, or what running it again does
  130  interrupted (Ctrl-C)
  141  the reader of standard output went away (`| head`); a verb that changes things
       still makes all its changes, and says them on stderr
"""


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked for (the
    metadata lookup would otherwise slow every start, `serve`'s included)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("towerboard")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown (not installed)"
        sys.stdout.write(f"towerboard {number}\n")  # as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="towerboard",
        description="A monitoring-first TensorFlow training service.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Also before the verb (`towerboard --url URL status`, as the README's "--url" reads):
    # argparse otherwise took the URL for the verb and said it was no verb. Its own dest,
    # since a verb's `--url` default (None) would overwrite one set here.
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "--url",
        dest="top_url",
        metavar="URL",
        type=parse_url,
        help="the service, for every verb but serve (as each verb's --url)",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    serve = verbs.add_parser(
        "serve",
        help="run the API, the job queue and its workers",
        description="Serve the API on HOST:PORT with the job store and runs under DATA_DIR.",
        # The settings a new user looks for here, and found nothing of: the README's table
        # lists each (devices, tokens, data roots, limits).
        epilog="Every setting is also read from a TOWERBOARD_* variable (the README's "
        "Settings table): TOWERBOARD_HOST, TOWERBOARD_PORT and TOWERBOARD_DATA_DIR for the "
        "three options above, which win over them, and TOWERBOARD_TOKEN, TOWERBOARD_GPUS, "
        "TOWERBOARD_DATA_ROOTS and the rest for what has no option.",
    )
    serve.add_argument(
        "--host", help="interface to listen on (default TOWERBOARD_HOST, else 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=int, help="port to listen on (default TOWERBOARD_PORT, else 8000)"
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        help="job store and runs directory (default TOWERBOARD_DATA_DIR, else ./data)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="the least severe messages logged (default info)",
    )
    serve.add_argument(
        "--no-access-log", dest="access_log", action="store_false", help="do not log each request"
    )
    serve.set_defaults(handler=_serve)
    add_client_commands(verbs)  # submit, status, logs, cancel, delete, checkpoints, export, ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.top_url is not None:
        if args.verb == "serve":
            parser.error("--url is the service a client verb talks to; serve takes --host/--port")
        args.url = args.url or args.top_url  # the verb's own --url, if given, wins
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO)
        if hasattr(args, "log_level")
        else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = args.handler
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
