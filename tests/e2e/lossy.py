"""A lossy network for one kind of request, in the dashboard tests: the request reaches the
service, which acts on it, and its answer is lost on the way back to the page."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from playwright.sync_api import Page, Route


@contextmanager
def answers_lost(page: Page, url: str | re.Pattern[str]) -> Iterator[list[int]]:
    """While inside, each POST to `url` from `page` is sent on to the service and its answer
    dropped (the page sees a failed request); yields the statuses the service answered, in
    order, whole once the block is left. Other methods pass untouched.

    Playwright's sync API runs a route's handler only while the test is inside one of its
    calls, so the page can show what the service did (its stream is quicker) before the
    handler has its answer: the statuses are read after the block, which waits for every
    handler under way. Left with one still fetching, it finished on a later test's page
    ("Route is already handled") and its status was missing here."""
    sent: list[int] = []
    pending = 0  # handlers under way: each has sent its request to the service

    def lose_answer(route: Route) -> None:
        nonlocal pending
        if route.request.method != "POST":
            route.continue_()
            return
        pending += 1
        try:
            sent.append(route.fetch().status)  # the service has it
            route.abort()
        finally:
            pending -= 1

    page.route(url, lose_answer)
    try:
        yield sent
    finally:
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        page.unroute(url)


def pump_until(
    page: Page, ready: Callable[[], bool], *, tries: int = 100, every_ms: int = 100
) -> None:
    """Wait, at most `tries` times `every_ms`, until `ready()`: the test's own check of what
    its route or response handlers have seen. It waits in the page, as Playwright's sync API
    runs those handlers only inside one of its calls; the caller asserts what it waited for."""
    for _ in range(tries):
        if ready():
            return
        page.wait_for_timeout(every_ms)
