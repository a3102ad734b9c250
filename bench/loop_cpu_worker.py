"""A whole worker (`python -m trainer run --job-dir DIR`) that also writes how much CPU its
training loop's thread spent a step, for `towers_bench.py`'s whole-worker runs.

    .venv/bin/python bench/loop_cpu_worker.py --job-dir DIR

Writes `DIR/loop_cpu.json`: {"steps": n, "seconds": s}, the loop thread's CPU time (user and
system, `time.thread_time`) from the start of this process's second step to the end of its
last (the first traces the step function; the end's checkpoint and export are left out).
A host whose loop launches a short GPU step is bound by that thread: what the monitoring
adds to its CPU time a step is what it costs such a host, with no core's other work in it
(on this 2-core CPU it spreads between runs as much as their examples/sec do). Run by
hand through the bench, not by the service: the trainer itself is unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT = "loop_cpu.json"


def main(argv: list[str]) -> int:
    from trainer import controller
    from trainer.__main__ import main as trainer_main

    marks: dict[str, float] = {}
    step, finish = controller.Controller._step, controller.Controller._finish

    def timed_step(self, loop, at, *args, **kwargs):  # noqa: ANN001, ANN202 - wraps _step
        if at == loop.first_step + 1:
            marks["first"], marks["cpu"] = at, time.thread_time()
        return step(self, loop, at, *args, **kwargs)

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
        result = {"steps": int(marks["steps"]), "seconds": marks["cpu"]}
        (job_dir / RESULT).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
