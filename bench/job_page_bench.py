"""Benchmark: a job page left open while its job reports, in headless Chromium against a
real service: the page's JavaScript heap and the time of one chart update as the job
passes each mark.

    .venv/bin/python bench/job_page_bench.py [--marks 50000,300000] [--js-from REV]

A stand-in worker reports steps 1, 2, ... (loss, accuracy, examples/s each report, an
eval every 1,000 steps), 500 lines every 0.1 s, which the service's event stream sends to
the page as they come. Past each mark it reports 5 steps alone, 0.5 s apart: each is one
chart update of its own (job.js draws in an animation frame, the reports of a frame
together), timed from that frame's callback to the end of uPlot's redraw (per update on
stderr). With the page at the mark's last step, its heap is read after a full collection
(Chromium's `--enable-precise-memory-info`, `--js-flags=--expose-gc`). A stream the page
reads too slowly is ended by the service, and the page reconnects and reads the series
again ("streams lagged"). `--js-from REV` serves the dashboard's scripts (static/js/) as
they were at git revision REV, to measure before a change on the same service. Needs
Debian's Chromium (scripts/e2e-deps.sh). Results go to stdout as Markdown.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Route, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.e2e.chromium import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.service.harness import job_spec, stand_in_service  # noqa: E402

PROBES = 5

# `python -m reporting_worker run --job-dir DIR`: once a `go` file is in its run directory,
# reports up to each mark its job's name says ("bench-50000-300000"), 500 lines every 0.1 s,
# then PROBES steps alone, 0.5 s apart; then succeeds.
WORKER = """\
import json, math, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
marks = [int(m) for m in json.loads((job_dir / "spec.json").read_text())["name"].split("-")[1:]]
total = marks[-1] + PROBES_
step = 0


def report(f, step):
    f.write(json.dumps(dict(event="progress", step=step, total=total, time=time.time(),
                            loss=1.0 + 0.5 * math.sin(step / 50), phase="training",
                            accuracy=0.5 + 0.4 * math.sin(step / 70),
                            examples_per_sec=1000.0 + step % 7)) + "\\n")
    if step % 1000 == 0:
        f.write(json.dumps(dict(event="eval", step=step, total=total, time=time.time(),
                                eval_loss=1.0, eval_accuracy=0.8)) + "\\n")


with open(job_dir / "progress.jsonl", "a") as f:
    f.write(json.dumps(dict(event="start", step=0, total=total, time=time.time())) + "\\n")
while not (job_dir / "go").exists():
    time.sleep(0.05)
for mark in marks:
    while step < mark:
        with open(job_dir / "progress.jsonl", "a") as f:
            for _ in range(min(500, mark - step)):
                step += 1
                report(f, step)
        time.sleep(0.1)
    for _ in range(PROBES_):
        time.sleep(0.5)
        step += 1
        with open(job_dir / "progress.jsonl", "a") as f:
            report(f, step)
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "ok"}))
""".replace("PROBES_", str(PROBES))

# Each animation frame's callbacks timed, with uPlot's redraw (a microtask they queue), and
# the step the page showed as it ran them.
TIME_FRAMES = """
window.frames_ = [];
const raf = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (callback) => raf((t) => {
  const start = performance.now();
  callback(t);
  const text = document.querySelector("#job-progress-text")?.textContent || "";
  queueMicrotask(() => window.frames_.push({ ms: performance.now() - start,
                                             step: parseInt(text, 10) }));
});
"""
PAGE_STEP = "parseInt(document.querySelector('#job-progress-text')?.textContent || '', 10)"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--marks", default="50000,300000", help="steps to measure at")
    parser.add_argument("--js-from", default="", help="git revision of static/js/ to serve")
    return parser.parse_args()


def main() -> None:
    args = parse()
    marks = [int(m) for m in args.marks.split(",")]
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[*CHROMIUM_ARGS, "--enable-precise-memory-info", "--js-flags=--expose-gc"],
        )
        worker = ("reporting_worker", WORKER)
        with stand_in_service(Path(tmp), worker) as service:
            job = service.submit(job_spec(name="bench-" + "-".join(map(str, marks))))
            service.wait_reported(job["id"])
            page = browser.new_context(base_url=service.base_url).new_page()
            if args.js_from:

                def old_script(route: Route) -> None:
                    name = route.request.url.split("/static/js/")[1].split("?")[0]
                    body = subprocess.run(
                        ["git", "show", f"{args.js_from}:static/js/{name}"],
                        cwd=ROOT, check=True, capture_output=True, text=True,
                    ).stdout  # fmt: skip
                    route.fulfill(body=body, content_type="text/javascript")

                page.route("**/static/js/*.js", old_script)
            page.add_init_script(TIME_FRAMES)
            page.goto(f"/#/jobs/{job['id']}")
            page.locator(".job-heading .state", has_text="running").wait_for()
            time.sleep(1.0)  # its event stream open
            (service.data_dir / "runs" / job["id"] / "go").touch()
            started = time.monotonic()
            rows = []
            for mark in marks:
                # Polled by a timer: polled in animation frames (Playwright's default) it
                # would add frames of its own to those timed.
                page.wait_for_function(
                    f"{PAGE_STEP} >= {mark + PROBES}", polling=100, timeout=900_000
                )
                reached = time.monotonic() - started
                heap = page.evaluate("() => { gc(); return performance.memory.usedJSHeapSize; }")
                held = page.evaluate(
                    "Number(document.querySelector('figure[data-chart=\"loss\"]')"
                    ".dataset.pointsLoss)"
                )
                frames = page.evaluate("window.frames_")
                probes = [f["ms"] for f in frames if mark < f["step"] <= mark + PROBES]
                print(mark, [round(p, 1) for p in probes], file=sys.stderr)
                lagged = next(
                    line.split()[1]
                    for line in service.client.get("/metrics").text.splitlines()
                    if line.startswith("towerboard_event_streams_lagged_total ")
                )
                rows.append((mark, held, heap, probes, reached, lagged))
            browser.close()
    print(f"{platform.node()} · Chromium · static/js from {args.js_from or 'the checkout'}\n")
    print(
        "| step | loss points held | JS heap (after gc) | one update (median, max) "
        "| page there after | streams lagged |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for mark, held, heap, probes, reached, lagged in rows:
        update = f"{statistics.median(probes):.1f} ms, {max(probes):.1f} ms" if probes else "—"
        print(
            f"| {mark:,} | {held:,} | {heap / 2**20:.1f} MiB | {update} | {reached:.0f} s "
            f"| {lagged} |"
        )


if __name__ == "__main__":
    main()
