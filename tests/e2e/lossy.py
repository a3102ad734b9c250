"""A lossy network for one kind of request, in the dashboard tests: the request reaches the
service, which acts on it, and its answer is lost on the way back to the page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Page, Route


@contextmanager
def answers_lost(page: Page, url: str | re.Pattern[str]) -> Iterator[list[int]]:
    """While inside, each POST to `url` from `page` is sent on to the service and its answer
    dropped (the page sees a failed request); yields the statuses the service answered, in
    order. Other methods pass untouched."""
    sent: list[int] = []

    def lose_answer(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        sent.append(route.fetch().status)  # the service has it
        route.abort()

    page.route(url, lose_answer)
    try:
        yield sent
    finally:
        page.unroute(url)
