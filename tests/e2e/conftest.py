"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a
real `towerboard serve` with real workers and a real TensorBoard.

Playwright cannot download its own browser builds here, so it launches /usr/bin/chromium
(`scripts/e2e-deps.sh` installs it). Without it each test module here skips, saying so.
Screenshots go to build/screenshots/, or to $TOWERBOARD_SCREENSHOTS (for example
`TOWERBOARD_SCREENSHOTS=docs/screenshots` to refresh the README's pictures).
`TOWERBOARD_SLOW_BROWSER=net,cpu` slows the browser, to bring out races (tests/e2e/slow.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Playwright, expect

from tests.e2e.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.service.harness import ROOT

# An `expect` waits 5 s unless told (the context's default timeout is for actions, not
# these): short for what a stand-in worker, started niced on a busy 2-core host, has to
# do first. A passing `expect` returns as soon as it holds, so this costs only failures.
expect.set_options(timeout=20_000)


@pytest.fixture(scope="session")
def screenshots() -> Path:
    folder = Path(os.environ.get("TOWERBOARD_SCREENSHOTS") or ROOT / "build" / "screenshots")
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # launch() runs Chromium on a fresh temporary profile (its --user-data-dir), removed
    # on close: no state from other runs, nothing written to $HOME.
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture
def session(browser: Browser, service: Any) -> Iterator[Any]:
    """A laptop-wide page (`tests.e2e.test_dashboard.Session`) on the test module's own
    `service` fixture, closed after the test (test_dashboard keeps one per module)."""
    from tests.e2e.test_dashboard import LAPTOP, open_session

    session = open_session(browser, service, LAPTOP)
    yield session
    session.context.close()
