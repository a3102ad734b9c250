"""A whole worker (`python -m trainer run --job-dir DIR`) that also writes how much CPU its
training loop's thread spent a step, and where the loop's wall-clock time went, for
`towers_bench.py`'s whole-worker runs.

    .venv/bin/python bench/loop_cpu_worker.py --job-dir DIR

Writes `DIR/loop_cpu.json`:
- `steps`, `seconds`: the loop thread's CPU time (user and system, `time.thread_time`)
  from the start of this process's second step to the end of its last (the first traces
  the step function; the end's checkpoint and export are left out). A host whose loop
  launches a short GPU step is bound by that thread: what the monitoring adds to its CPU
  time a step is what it costs such a host, with no core's other work in it (on this
  2-core CPU it spreads between runs as much as their examples/sec do).
- `parts`: each monitoring call's calls and wall-clock seconds on the loop (`PARTS`),
  from the first step on (a job's first step writes every kind), and each kind of step's
  over the same span as above: where one run's time went, which runs with
  one kind left out each (`--attribute`) can only infer from rates that spread by more
  than the kind costs. A step is a scalars step, a traced one, or other (a launch, and
  the read of the unread steps when its turn comes: `UNREAD_STEPS_MAX`).
Run by hand through the bench, not by the service: the trainer itself is unchanged.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT = "loop_cpu.json"

# What is timed on the loop, by the name it is reported under: (module, class, method).
PARTS = {
    "scalars written": ("trainer.controller", "Controller", "_write_scalars"),
    "histograms handed over": ("trainer.controller", "Controller", "_write_histograms"),
    "images handed over": ("trainer.controller", "Controller", "_write_images"),
    "graph written": ("trainer.summaries", "SummaryManager", "graph"),
    "profiler started": ("trainer.profiling", "TraceCapture", "start"),
    "trace ended": ("trainer.controller", "Controller", "_finish_trace"),
    "trace written": ("trainer.controller", "Controller", "_write_trace"),
    "progress reported": ("trainer.controller", "Controller", "_report"),
}


def main(argv: list[str]) -> int:
    import importlib

    from trainer import controller
    from trainer.__main__ import main as trainer_main

    marks: dict[str, float] = {}
    # Per part: [calls, wall-clock seconds]: steps within the span above, monitoring calls
    # from the first step on.
    parts: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])

    def count(name: str, began: float, *, spanned: bool = True) -> None:
        if ("cpu" in marks or not spanned) and "steps" not in marks:
            entry = parts[name]
            entry[0] += 1
            entry[1] += time.perf_counter() - began

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                count(name, began, spanned=False)

        return wrapper

    for name, (module, owner, attribute) in PARTS.items():
        cls = getattr(importlib.import_module(module), owner)
        setattr(cls, attribute, timed(name, getattr(cls, attribute)))

    step, finish = controller.Controller._step, controller.Controller._finish

    def timed_step(self, loop, at, scalars_due, *args, **kwargs):  # noqa: ANN001, ANN202 - wraps _step
        if at == loop.first_step + 1:
            marks["first"], marks["cpu"] = at, time.thread_time()
        kind = "traced" if self.trace.active else "scalars" if scalars_due else "other"
        began = time.perf_counter()
        try:
            return step(self, loop, at, scalars_due, *args, **kwargs)
        finally:
            count(f"steps, {kind}", began)

    def timed_finish(self, loop, at):  # noqa: ANN001, ANN202 - wraps _finish
        if "cpu" in marks:
            marks["steps"], marks["cpu"] = (
                at - marks["first"] + 1,
                time.thread_time() - marks["cpu"],
            )
        return finish(self, loop, at)

    controller.Controller._step = timed_step  # type: ignore[method-assign, assignment]
    controller.Controller._finish = timed_finish  # type: ignore[method-assign]
    code = trainer_main(["run", *argv])
    job_dir = Path(argv[argv.index("--job-dir") + 1])
    if "steps" in marks:
        result = {
            "steps": int(marks["steps"]),
            "seconds": marks["cpu"],
            "parts": {name: {"calls": int(c), "seconds": s} for name, (c, s) in parts.items()},
        }
        (job_dir / RESULT).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
