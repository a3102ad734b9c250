"""How the client shows jobs: numbers, tables, one-line summaries and live progress."""

from __future__ import annotations

import re
import shutil
import time
import unicodedata
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO, TypeGuard

from service.client.common import TERMINAL, ClientError
from service.progress import fold_memory, fold_phase, fold_trace_line, percent_done, step_after
from service.store import PREPARING

if TYPE_CHECKING:
    from service.client.api import Client


def number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}g}"


def percent(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "-"


def rate(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age(value: Any) -> str:
    at = timestamp(value)
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


def data_size(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def printable(text: Any) -> str:
    """`text` with its control characters escaped (\\x1b, \\n): a job's name is what
    another user typed, and printed raw an escape sequence in it acts on the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def steps(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if not isinstance(p.get("step"), int):
        return "-"
    return f"{p['step']}/{p['total']}" if isinstance(p.get("total"), int) else str(p["step"])


def step_or_phase(job: dict[str, Any]) -> str:
    """`steps`, or for a running job with no step yet its phase (`preparing`, between its
    worker's start and first line), as the dashboard's jobs table shows it."""
    p = job.get("progress") or {}
    if isinstance(p.get("step"), int) or job.get("state") != "running":
        return steps(job)
    return phase(p) or "-"


def phase(progress: dict[str, Any]) -> str:
    """`eval 3/20` while a phase reports how far it is, else the phase's name ('' if none);
    while `preparing`, the stage its worker says it is in, `loading data 42%` where it says
    how far (a whole percent, never 100 before it is through), as the dashboard says it."""
    phase, done, of = progress.get("phase"), progress.get("phase_done"), progress.get("phase_total")
    if not phase:
        return ""
    stage = progress.get("stage")
    if phase == PREPARING and isinstance(stage, str) and stage:
        # Floored from the amounts, not `stage_percent`: rounded to a tenth, that is 100.0
        # from 99.95% on, while the stage is not through.
        part, whole = progress.get("stage_done"), progress.get("stage_total")
        if _count(part) and _count(whole) and 0 <= part <= whole and whole > 0:
            return f"{stage} {part * 100 // whole}%"
        return stage
    return f"{phase} {done}/{of}" if isinstance(done, int) and isinstance(of, int) else str(phase)


def _count(value: Any) -> TypeGuard[int]:
    """Whether `value` is an integer amount (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


# Seconds without a progress report after which a running job's time left is unknown. A
# worker reports at least every 2 s while it trains, so this is a stall (or a long save):
# counted on, the ETA would reach 0 and say the job is nearly done. As the dashboard.
QUIET_SECONDS = 60.0


def eta(job: dict[str, Any], *, why: bool = False) -> str:
    """The worker's ETA counted down since it was reported; "?" after QUIET_SECONDS
    without a report (`why`: and for how long)."""
    p = job.get("progress") or {}
    if job.get("state") != "running" or not isinstance(p.get("eta_seconds"), int | float):
        return "-"
    at = timestamp(p.get("updated_at"))
    quiet = max(0.0, time.time() - at) if at else 0.0
    if quiet > QUIET_SECONDS:
        return f"? (no report for {duration(quiet)})" if why else "?"
    return duration(max(0.0, p["eta_seconds"] - quiet))


def devices(job: dict[str, Any]) -> str:
    """The devices a job holds: only a running job holds any (the service clears them
    when it ends)."""
    return ",".join(job.get("devices") or []) or "-"


def devices_and_towers(job: dict[str, Any], gpus: bool | None = None) -> str:
    """`devices`, and the towers the job asked for; for a queued job, what it waits for in
    the units its place in the queue is said in: a GPU a tower on a GPU host (`gpus`), one
    job slot on a CPU-only one whatever its towers ("waiting for 1 job slot (2 towers)", as
    the dashboard says it); "none yet" where the host's kind is not given; for an ended
    job, the devices its last attempt ran on ("ran on gpu:0,gpu:1")."""
    held = devices(job)
    towers = (job.get("spec") or {}).get("towers")
    if held == "-" and job.get("state") in TERMINAL and job.get("ran_on"):
        # Released at its end: which devices it ran on is still worth knowing (a slow or
        # failing GPU), and `ran_on` keeps them.
        held = f"ran on {','.join(job['ran_on'])}"
    elif held == "-" and job.get("state") == "queued":
        held = "none yet"
        if gpus is not None and isinstance(towers, int):
            needed = towers if gpus else 1
            noun = "GPU" if gpus else "job slot"
            held = f"waiting for {needed} {noun}{'' if needed == 1 else 's'}"
    return f"{held} ({towers} tower{'' if towers == 1 else 's'})" if towers else held


def data(progress: dict[str, Any]) -> str:
    """What a job trains on, as its worker loaded it: "8,000 train, 2,000 eval examples, 10
    classes, 28x28x1"; "-" until its worker has said (a job that has not started)."""
    said = progress.get("data")
    if not isinstance(said, dict):
        return "-"
    shape = "x".join(str(size) for size in said.get("image_shape") or [])
    return (
        f"{said.get('train_examples', 0):,} train, {said.get('eval_examples', 0):,} eval "
        f"examples, {said.get('classes')} classes, {shape}"
    )


def width(text: str) -> int:
    """The columns `text` takes on a terminal: a wide character (CJK, most emoji) two, a
    combining mark none. Padded by its length, a name in Chinese pushed the columns after
    it out of line."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def table(rows: list[list[str]], out: TextIO, *, last_within: int | None = None) -> None:
    """The rows in columns two spaces apart. With `last_within` (a terminal's width), the
    last column's cells are cut to what is left of it (with "…", never below 20 columns),
    so a long one does not wrap under the row."""
    widths = [max(width(row[i]) for row in rows) for i in range(len(rows[0]))]
    if last_within is not None:
        room = max(20, last_within - sum(w + 2 for w in widths[:-1]))
        rows = [[*row[:-1], shortened(row[-1], room)] for row in rows]
    for row in rows:
        cells = (cell + " " * (w - width(cell)) for cell, w in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


def shortened(text: str, columns: int) -> str:
    """`text` within `columns` terminal columns, ending in "…" where it was cut."""
    if width(text) <= columns:
        return text
    kept, used = [], 0
    for c in text:
        used += width(c)
        if used > columns - 1:
            break
        kept.append(c)
    return "".join(kept) + "…"


def end_reason(job: dict[str, Any]) -> str:
    """Why a job ended badly, its first line, without a leading "Failed:" or "Cancelled:"
    (the state beside it says that), as the dashboard's jobs table says it; "" for none."""
    reason = str((job.get("error") or {}).get("reason") or "").strip()
    first = reason.splitlines()[0] if reason else ""
    return printable(re.sub(r"^(cancelled|failed):\s*", "", first, flags=re.I))


def capitalised(text: str) -> str:
    """`text` with its first character upper-cased where it is a lower-case ASCII letter,
    as the dashboard's jobs table does (`capitalised`): a killed cancel's reason, its
    "Cancelled: " taken off, began in lower case among capitalised ones. Only ASCII: a name
    or path that starts a reason keeps its own first character."""
    return text[0].upper() + text[1:] if text[:1].isascii() and text[:1].islower() else text


# The trainer's message of an attempt resumed at its latest checkpoint's step ("finish
# here"): "Finished at step N, its checkpoint: no step trained." (trainer/run.py). Its
# result carries no other sign that the attempt trained nothing.
_NO_STEP_TRAINED = re.compile(r": no step trained\.?$")


def no_step(job: dict[str, Any]) -> str:
    """A succeeded job whose last attempt trained no step (finished at its latest
    checkpoint, evaluated and exported), as its page says it beside the attempt
    (`noStepText`): "trained no step: finished at step 20's checkpoint"; "" for any other
    job. Its "20/20" alone read as steps that attempt trained."""
    result = job.get("result") or {}
    message = result.get("message")
    if job.get("state") != "succeeded" or not isinstance(message, str):
        return ""
    if not _NO_STEP_TRAINED.search(message.strip()):
        return ""
    step = result.get("step")
    if not _whole(step):
        step = (job.get("progress") or {}).get("step")
    at = f"step {step}'s" if _whole(step) else "its"
    return f"trained no step: finished at {at} checkpoint"


def stopped(job: dict[str, Any]) -> str:
    """How a cancelled job stopped, in plain words, from its result, as the dashboard says
    it (`stoppedText`): "Stopped at step 8000 of 10000, after a checkpoint." (the trainer's
    "Stopped by SIGTERM at step 8000, after a checkpoint."), the worker's message where it
    gives no step, or "Cancelled while queued: it never started."; for one whose cancel
    ended otherwise (its error says how: a worker killed after the grace), `_cut_short`.
    "" for any other job."""
    if job.get("state") != "cancelled":
        return ""
    if job.get("error"):
        return _cut_short(job)
    result = job.get("result") or {}
    step, total = result.get("step"), result.get("total")
    if result.get("outcome") == "cancelled" and _whole(step):
        of = f" of {total}" if _whole(total) else ""
        saved = (
            ", after a checkpoint"
            if isinstance(result.get("checkpoint"), str) and result["checkpoint"]
            else ""
        )
        return f"Stopped at step {step}{of}{saved}."
    message = result.get("message")
    if isinstance(message, str) and message.strip():
        return printable(message.strip().splitlines()[0]).rstrip(".") + "."
    return (
        ""
        if job.get("result") or job.get("started_at")
        else "Cancelled while queued: it never started."
    )


def _cut_short(job: dict[str, Any]) -> str:
    """A cancel that did not end in its worker's own checkpoint and exit (killed, as it had
    not exited within the grace after SIGTERM, or stopped by a signal first), as the
    dashboard says it (`cutShortText`): the service's reason, and the step the worker last
    reported, which is no checkpoint's. "The worker did not exit within 10 s of SIGTERM and
    was killed with SIGKILL. Its last report was at step 12 of 100." """
    reason = end_reason(job).strip().rstrip(".")
    p = job.get("progress") or {}
    step, total = p.get("step"), p.get("total")
    of = f" of {total}" if _whole(total) else ""
    said = [
        reason[:1].upper() + reason[1:] + "." if reason else "",
        f"Its last report was at step {step}{of}." if _whole(step) else "",
    ]
    return " ".join(part for part in said if part)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fold_event(job: dict[str, Any], name: str, data: dict[str, Any]) -> dict[str, Any]:
    """The job with one SSE event applied (as the service folds progress lines)."""
    if name == "state":
        return data
    job = dict(job)
    p = dict(job.get("progress") or {})
    for key in ("total", "tower_ms", "checkpoint"):
        if key in data:
            p[key] = data[key]
    # With how far into it, and a preparation's stage, as the service folds it: a phase
    # copied alone kept the eval's "3/20" on the training after it.
    fold_phase(p, data)
    # A trace's step is the trace's, a lower bound of where the job is (as the service
    # folds it); the trace's line says which trace the times are from, or why it gave none.
    if "step" in data:
        p["step"] = step_after(p.get("step"), name, data["step"])
    if name == "trace":
        fold_trace_line(p, data)
    if name == "progress":
        for key in ("loss", "accuracy", "examples_per_sec", "eta_seconds", "learning_rate"):
            p[key] = data.get(key)
        fold_memory(p, data)
        p["updated_at"] = (
            datetime.fromtimestamp(data.get("time", time.time())).astimezone().isoformat()
        )
    if name == "end":  # as the service folds it (service/progress.py)
        p["eta_seconds"] = 0.0 if data.get("outcome") == "succeeded" else None
        for key in ("loss", "accuracy"):  # a cancelled run's, of the step it stopped at
            if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool):
                p[key] = data[key]
    if name == "eval":
        job["eval"] = {"step": data.get("step"), "loss": data.get("eval_loss"),
                       "accuracy": data.get("eval_accuracy")}  # fmt: skip
    if isinstance(p.get("step"), int) and p.get("total"):
        p["percent"] = percent_done(p["step"], p["total"])
    job["progress"] = p
    return job


class ProgressLine:
    """A one-line progress bar on a terminal; on anything else a line now and then."""

    WIDTH = 24  # the bar's, where the terminal has room
    NARROWEST = 10  # a narrower bar is dropped: the percent beside it says more
    # The parts of a line in the order a narrow terminal drops them, the first first: the
    # figures that tell how far the job is and how long it has to go stay longest.
    _DROPPED_FIRST = ("ex/s", "acc", "eval acc", "bar", "loss", "phase", "step", "eta", "state")

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.shown = ""
        self.last_line_at = 0.0
        self.last_state: Any = None
        self.phases_seen: set[Any] = set()

    @staticmethod
    def _done(job: dict[str, Any]) -> Any:
        return (
            100.0 if job.get("state") == "succeeded" else (job.get("progress") or {}).get("percent")
        )

    def _bar(self, job: dict[str, Any], width: int) -> str:
        filled = round(width * (self._done(job) or 0) / 100)
        return "[" + "#" * filled + "-" * (width - filled) + "]"

    def parts(self, job: dict[str, Any]) -> list[tuple[str, str]]:
        """The line's parts but the bar, as (kind, text), in the order shown."""
        p, done = job.get("progress") or {}, self._done(job)
        parts = [("percent", f"{done:5.1f}%" if isinstance(done, int | float) else "  -  ")]
        doing, state = phase(p), job.get("state", "?")
        parts.append(("state", state))
        if doing and state == "running":
            parts.append(("phase", f"({doing})"))
        parts.append(("step", f"step {steps(job)}"))
        if p.get("loss") is not None:
            parts.append(("loss", f"loss {number(p.get('loss'))}"))
        if p.get("accuracy") is not None:
            parts.append(("acc", f"acc {percent(p.get('accuracy'))}"))
        evaluation = job.get("eval") or {}
        if evaluation.get("accuracy") is not None:
            parts.append(("eval acc", f"eval acc {percent(evaluation['accuracy'])}"))
        if p.get("examples_per_sec"):
            parts.append(("ex/s", f"{rate(p['examples_per_sec'])} ex/s"))
        if state == "running" and p.get("eta_seconds") is not None:
            parts.append(("eta", f"ETA {eta(job)}"))
        return parts

    def text(self, job: dict[str, Any], columns: int | None = None) -> str:
        """The bar and the parts; within `columns`, the bar narrower (down to NARROWEST)
        and whole parts dropped (`_DROPPED_FIRST`) until it fits. Cut at the edge, it
        ended mid-word, and the loss and ETA at the end never showed."""
        parts = self.parts(job)
        if columns is None:
            return " ".join([self._bar(job, self.WIDTH), *(text for _, text in parts)])
        dropped: set[str | None] = set()
        for kind in (None, *self._DROPPED_FIRST):
            dropped.add(kind)
            rest = " ".join(text for name, text in parts if name not in dropped)
            if "bar" not in dropped:
                room = columns - width(rest) - 3  # the brackets, and a space
                if room >= self.NARROWEST:
                    return f"{self._bar(job, min(room, self.WIDTH))} {rest}"
            elif width(rest.lstrip()) <= columns:
                return rest.lstrip()
        return rest.lstrip()[:columns]  # the percent alone is too wide: a few columns

    def update(self, job: dict[str, Any]) -> None:
        if self.tty:
            # Never wider than the terminal: a wrapped line cannot be redrawn with \r.
            text = self.text(job, shutil.get_terminal_size().columns - 1)
            self.out.write("\r" + text + " " * max(0, len(self.shown) - len(text)))
            self.out.flush()
            self.shown = text
            return
        text = self.text(job)
        # A log file gets a line per state change and per phase first seen, else one per
        # 10 s: a job that checkpoints often goes from training to checkpoint and back
        # a few times a second, and a line for each would bury the rest.
        # A preparation's stages count as phases of their own (`loading data` and on).
        p = job.get("progress") or {}
        state, phase = job.get("state"), (p.get("phase"), p.get("stage"))
        now = time.monotonic()
        new = state != self.last_state or (phase[0] is not None and phase not in self.phases_seen)
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
                if not error.unanswered:
                    raise
                # The service restarted, or went quiet, or a proxy cut the stream: follow on.
                time.sleep(1.0)
            if job["state"] not in TERMINAL:
                # Prefixed as `logs --follow`'s notes are: the client's word, not the job's.
                job = client.patiently(
                    lambda: client.job(job_id), lambda text: line.note(f"towerboard: {text}")
                )
                line.update(job)
    except BaseException:
        if line.tty:
            out.write("\n")  # leave the bar's line before the error
        raise
    line.finish(job)
    return job


def summary(job: dict[str, Any]) -> str:
    parts = [f"{job['id']} {job['state']}"]
    started, finished = timestamp(job.get("started_at")), timestamp(job.get("finished_at"))
    if started and finished:
        parts[0] += f" in {duration(finished - started)}"
    p, evaluation = job.get("progress") or {}, job.get("eval") or {}
    # A job that ended before its first step has none to say ("step -" read as a glitch).
    facts = [f"step {steps(job)}"] if steps(job) != "-" else []
    # The progress's loss and accuracy are the last training batch's, marked train: a bare
    # "accuracy" beside "eval accuracy" read as the model's (and ran higher).
    if p.get("loss") is not None:
        facts.append(f"train loss {number(p['loss'])}")
    if p.get("accuracy") is not None:
        facts.append(f"train accuracy {percent(p['accuracy'])}")
    if evaluation.get("accuracy") is not None:
        facts.append(f"eval accuracy {percent(evaluation['accuracy'])}")
    if job.get("error"):
        facts.append(f"error: {job['error'].get('reason')}")
    return f"{parts[0]}: {', '.join(facts)}" if facts else parts[0]


# --- verbs ---------------------------------------------------------------------------
