"""An opt-in slow browser, to bring out races between a test and the dashboard's
asynchronous rendering before CI's loaded machine does: `TOWERBOARD_SLOW_BROWSER`, a comma-
separated list of

- `net`: every answer of the dashboard's `fetch` (its /api/v1 reads and actions) reaches
  the page 300-1500 ms late, each its own random delay, so answers can arrive out of order;
  each event of an EventSource (the job and all-jobs streams) is handed on as late, in
  the order it came;
- `cpu` (or `cpu=N`): Chromium's CPU throttled N times (4 unless told), through CDP.

Unset (the default), nothing changes and it costs nothing. For example:
`TOWERBOARD_SLOW_BROWSER=net,cpu pytest -n 0 tests/e2e/test_job_page.py`. The delays are
made in the page with the timer it had before any `page.clock.install()` (its init script
runs after this one): a test that moves the page's clock on does not skip them, nor does
a paused clock hold them. The answers are held in the page, after the network: a test
that waits for a response (`page.expect_response`) and then only a moment before it
looks at the page can see it before it had the answer.

Under `net`, tests/e2e passes. The delays reorder events, and the page then shows another
true outcome: a test asserts what holds whatever the order (either true outcome, or the
state that must come last), or waits until the page has had what must come first (a page
init script can tell when its listeners have: tests/e2e/test_lossy_network.py's
HANDED_EVENTS).

Under `cpu` (4x) too, tests/e2e passes (two whole runs, a file batch at a time, on a busy
2-core host): none of its tests has a fixed time budget that a 4x slower page misses.
Under `cpu=8`, two tests polled in vain for a line the page showed only for a moment, as
a stand-in job ended at once: test_keyboard_stays.py's cancel now holds its job until it
has looked, test_resume_job.py's Train longer records each text the line is given. A
whole run under `cpu=8` then passed.
"""

from __future__ import annotations

import os

from playwright.sync_api import BrowserContext, Page

SLOW = {
    part.split("=")[0].strip(): part.partition("=")[2].strip()
    for part in os.environ.get("TOWERBOARD_SLOW_BROWSER", "").split(",")
    if part.strip()
}
if SLOW.keys() - {"net", "cpu"}:
    raise ValueError(f"TOWERBOARD_SLOW_BROWSER: expected net, cpu or cpu=N; got {SLOW}")

SLOW_NETWORK = """(() => {
  // The real timer: a page clock (page.clock.install) replaces it after this has run.
  const later = window.setTimeout.bind(window);
  const sleep = (ms) => new Promise((resolve) => later(resolve, ms));
  const delay = () => 300 + Math.random() * 1200;
  const realFetch = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const response = await realFetch(input, init);
    await sleep(delay());
    if (init && init.signal && init.signal.aborted) {
      throw new DOMException("The operation was aborted.", "AbortError");
    }
    return response;
  };
  const RealEventSource = window.EventSource;
  window.EventSource = class extends RealEventSource {
    constructor(...args) {
      super(...args);
      this._handed = Promise.resolve();
    }
    addEventListener(type, listener, options) {
      if (type === "open" || type === "error" || typeof listener !== "function") {
        return super.addEventListener(type, listener, options);
      }
      return super.addEventListener(type, (event) => {
        // Each as late, but in order: no earlier than the one before it.
        const late = sleep(delay());
        this._handed = Promise.all([this._handed, late]).then(() => listener.call(this, event));
      }, options);
    }
  };
})();"""


def slow_down(context: BrowserContext) -> None:
    """Slow the context's pages as TOWERBOARD_SLOW_BROWSER says (see the module's docstring);
    call it before the context opens a page."""
    if "net" in SLOW:
        context.add_init_script(SLOW_NETWORK)
    if "cpu" in SLOW:
        rate = float(SLOW["cpu"] or 4)

        def throttle(page: Page) -> None:
            context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": rate})

        context.on("page", throttle)
