"""What every part of the client shares: exit codes, job states and its one-line error."""

from __future__ import annotations

from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")
STATES = ("queued", "running", *TERMINAL)
DEFAULT_LIMIT = 50  # the jobs `status` lists without --limit
QUEUE_DEFAULT = 100  # the jobs `queue` lists without --limit: the API's default
QUEUE_MOST = 1000  # the API's largest page of the queue
# A job's priority, as the spec bounds it (trainer.spec's; the client imports no pydantic).
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3  # nothing was sent: the service could not be reached
EXIT_NO_ANSWER = 4  # sent, and no answer came: whether the service acted on it is unknown
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

# How long a verb that follows a job (submit --watch, logs --follow, cancel --wait) keeps
# trying a service it cannot reach: a restart takes seconds, and the job runs on meanwhile.
RECONNECT_SECONDS = 120.0
LOG_OFFSET_HEADER = "X-Log-Offset"  # the logs route's "read on from here" (HTTP contract)


class ClientError(Exception):
    """A failure to report as one line, with the exit code it ends the command with; for
    an error the service answered, its HTTP `status` and field `errors` too."""

    def __init__(
        self,
        message: str,
        code: int = EXIT_FAILED,
        *,
        status: int | None = None,
        errors: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.errors = errors or []
        self.body = body or {}  # the service's error as it answered it, fields beyond those

    @property
    def unanswered(self) -> bool:
        """No answer came (EXIT_UNREACHABLE, EXIT_NO_ANSWER): the service is gone or quiet,
        where a refusal is its answer. A follower waits for it; a batch stops there."""
        return self.code in (EXIT_UNREACHABLE, EXIT_NO_ANSWER)


class OutputLost(Exception):
    """A write to standard output failed: its reader went away (`error` is a
    BrokenPipeError), or what it goes to took no more (a full disk: another OSError).
    `message`: what to say of it, where more is to say than that it failed."""

    def __init__(self, error: OSError, message: str | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.message = message


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what to say of it (an interrupted download: what it kept, and how to
    resume it), for `run` to say once it has ended the terminal's line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
