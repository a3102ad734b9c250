"""The jobs table's name search, in headless Chromium against a real service whose workers
are the harness's stand-in (it runs until cancelled; no model is trained here): what is
typed reads the list again and goes in the address, the stream's new jobs are kept to
the search, the state chips and a job page's way back keep it, and an empty result says
what was searched and offers to clear it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


def shown_names(page: Page) -> list[str]:
    return page.locator("#jobs-table tbody .job-name").all_text_contents()


def test_search_by_name_follows_the_list_live(session: Session, service: Service) -> None:
    """Typing reads the jobs whose names hold the text (any case; `_` taken literally, as
    the API takes it), shows it in the address and the summary, and a job submitted
    meanwhile joins the table only if its name matches."""
    ids = {name: service.submit(job_spec(name=name))["id"] for name in
           ("alpha-x", "ALPHA_x", "beta-x")}  # fmt: skip
    page = session.page
    page.goto("/#/")
    expect(page.locator(f'tr[data-job="{ids["beta-x"]}"]')).to_be_visible()

    page.locator("#jobs-search").fill("alpha")
    expect(page).to_have_url(re.compile(r"#/\?name=alpha$"))
    expect(page.locator("#jobs-summary")).to_have_text("2 of 2 jobs matching “alpha”")
    assert sorted(shown_names(page)) == ["ALPHA_x", "alpha-x"]

    # From the stream: one that does not match, then one that does (events come in order,
    # so once the second is shown the first has been passed over).
    gamma = service.submit(job_spec(name="gamma-live"))["id"]
    live = service.submit(job_spec(name="Alpha-live"))["id"]
    expect(page.locator(f'tr[data-job="{live}"]')).to_be_visible()
    expect(page.locator(f'tr[data-job="{gamma}"]')).to_have_count(0)
    expect(page.locator("#jobs-summary")).to_have_text("3 of 3 jobs matching “alpha”")

    # `_` is a wildcard to SQL's LIKE: "a_x" would also match "alpha-x" if it were one.
    page.locator("#jobs-search").fill("a_x")
    expect(page.locator("#jobs-summary")).to_have_text("1 of 1 job matching “a_x”")
    assert shown_names(page) == ["ALPHA_x"]
    expect(page).to_have_url(re.compile(r"#/\?name=a_x$"))

    # Escape clears the search, and every job is listed again.
    page.locator("#jobs-search").press("Escape")
    expect(page).to_have_url(re.compile(r"#/$"))
    expect(page.locator("#jobs-summary")).to_have_text("5 of 5 jobs")
    assert session.errors == []


def test_search_is_kept_by_the_chips_and_the_way_back(session: Session, service: Service) -> None:
    """A state chip keeps the search; a job page's "← Jobs" goes back to the list as it was
    shown; an empty result names what was searched, and Clear search lists the state's
    jobs again."""
    job = service.submit(job_spec(name="delta-cancel"))
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()
    service.wait_state(job["id"], "cancelled")
    page = session.page
    page.goto(f"/#/?name={quote('DELTA')}")
    expect(page.locator("#jobs-search")).to_have_value("DELTA")
    row = page.locator(f'tr[data-job="{job["id"]}"]')
    expect(row).to_be_visible()

    page.locator('.chip[data-state="cancelled"]').click()
    expect(page).to_have_url(re.compile(r"#/\?state=cancelled&name=DELTA$"))
    expect(page.locator("#jobs-search")).to_have_value("DELTA")
    expect(page.locator("#jobs-summary")).to_have_text("1 of 1 job cancelled matching “DELTA”")

    row.locator(".job-name").click()
    expect(page.locator(".job-heading .state")).to_have_text("cancelled")
    page.locator(".crumbs a").click()
    expect(page).to_have_url(re.compile(r"#/\?state=cancelled&name=DELTA$"))
    expect(page.locator("#jobs-search")).to_have_value("DELTA")
    expect(row).to_be_visible()

    page.locator('.chip[data-state="succeeded"]').click()
    expect(page.locator(".empty p")).to_have_text("No succeeded jobs match “DELTA”.")
    expect(page.locator("#jobs-table")).to_be_hidden()
    page.locator(".empty .clear-search").click()
    expect(page).to_have_url(re.compile(r"#/\?state=succeeded$"))
    expect(page.locator("#jobs-search")).to_be_focused()
    expect(page.locator("#jobs-search")).to_have_value("")
    expect(page.locator(".empty .clear-search")).to_be_hidden()
    expect(page.locator(".empty p")).to_have_text("No succeeded jobs.")  # not "here yet"

    # A chip pressed within the typing pause keeps what was typed.
    page.locator("#jobs-search").fill("delta")
    page.locator('.chip[data-state="cancelled"]').click()
    expect(page).to_have_url(re.compile(r"#/\?state=cancelled&name=delta$"))
    expect(row).to_be_visible()
    assert session.errors == []


def test_name_matching_in_the_page_is_the_apis(session: Session, service: Service) -> None:
    """The page's test for a streamed job agrees with `?name=` on case (ASCII letters only,
    as SQLite's LIKE), on `%` and `_`, and on text that is not ASCII."""
    names = ["Straße-1", "STRASSE-2", "100%-done", "100-percent", "a_b", "axb", "Émile", "émile"]
    for name in names:
        service.submit(job_spec(name=name))
    page = session.page
    page.goto("/#/")
    searches = ["strasse", "straße", "STRAßE", "100%", "a_b", "émile", "Émile", "e-"]
    for text in searches:
        listed = service.client.get("/api/v1/jobs", params={"name": text, "limit": 200})
        api = {job["name"] for job in listed.json()["data"]} & set(names)
        in_page = page.evaluate(
            """async ([names, text]) => {
              const { nameHolds } = await import("/static/js/jobs.js");
              return names.filter((name) => nameHolds(name, text));
            }""",
            [names, text],
        )
        assert set(in_page) == api, (text, in_page, api)
