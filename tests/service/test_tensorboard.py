"""/api/v1/tensorboard and the /tensorboard proxy, with a real TensorBoard subprocess."""

from __future__ import annotations

import asyncio
import errno
import gzip
import json
import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from service.settings import Settings
from service.store import JobStore
from service.tensorboard import (
    LOG_ROTATE_BYTES,
    StartOutcome,
    TensorBoardInstance,
    TensorBoardLauncher,
    job_of,
    mirror_logdir,
    view_name,
)
from service.upstream import Upstream
from tests.service.harness import Service, fake_worker_env, job_spec

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _parent(proc: Path) -> int | None:
    """The parent pid of /proc/<pid>, or None if it has gone."""
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _folder(job: dict[str, Any]) -> str:
    """The job's folder in TensorBoard's view, and so its runs' names before `/train`: its
    name, then its id (for the plain names these tests give)."""
    return f"{job['name']} · {job['id']}"


@pytest.fixture(scope="module")
def traced_job(service: Service) -> dict[str, Any]:
    """The tiny job with a device trace of step 5, run to success."""
    job = service.submit(job_spec(name="traced", summaries={"trace_steps": [5]}))
    return service.wait_state(job["id"], "succeeded", "failed")


def test_start_tensorboard_and_read_loss_through_proxy(
    service: Service, traced_job: dict[str, Any]
) -> None:
    assert traced_job["state"] == "succeeded", traced_job
    job_id = traced_job["id"]
    response = service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]})
    assert response.status_code == 201
    started = response.json()
    assert started["state"] in ("starting", "running")
    assert started["url"] == f"{service.base_url}/tensorboard/"
    assert started["job_ids"] == [job_id]

    def loss() -> Any:
        reply = service.client.get(
            "/tensorboard/data/plugin/scalars/scalars",
            params={"run": f"{_folder(traced_job)}/train", "tag": "loss"},
        )
        return reply.json() if reply.status_code == 200 and reply.json() else None

    points = _wait(loss, 120, "the loss scalars through the proxy")
    steps = [step for _, step, _ in points]
    assert steps[-1] == 40
    # The same numbers the worker reported in its progress lines.
    series = service.client.get(f"/api/v1/jobs/{job_id}/metrics").json()["series"]["loss"]
    api_loss = {p["step"]: p["value"] for p in series}
    assert points[-1][2] == pytest.approx(api_loss[40], rel=1e-5)
    assert service.client.get("/api/v1/tensorboard").json()["state"] == "running"


def test_tensorboard_answers_nobody_who_goes_round_the_proxy(
    service: Service, traced_job: dict[str, Any]
) -> None:
    """Every user of the host can reach TensorBoard's loopback port. Asked there directly,
    it refuses: with no secret, with a wrong one, and for the profile plugin's capture from
    an address, which the proxy refuses and the port once served to anyone."""
    started = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    pid = started.json()["pid"]
    _wait(
        lambda: service.client.get("/api/v1/tensorboard").json()["state"] == "running",
        120,
        "TensorBoard to run",
    )
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    port = int(argv[argv.index("--port") + 1])
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    (secret,) = [v.split("=", 1)[1] for v in environ if v.startswith("TOWERBOARD_TB_SECRET=")]
    assert secret not in " ".join(argv)  # argv is every user's to read; environ is not
    # Nor does a data server run beside it: its gRPC port would serve the runs to anyone.
    children = [
        proc.name
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and _parent(proc) == pid
    ]
    assert children == [], "TensorBoard started a process (its Rust data server?)"
    board = f"http://127.0.0.1:{port}/tensorboard"
    capture = {"service_addr": "10.1.2.3:6009", "duration": "1000"}
    for path, params, headers in [
        ("/data/environment", None, {}),
        ("/data/environment", None, {"X-Towerboard-Secret": "guess"}),
        ("/data/plugin/profile/capture_profile", capture, {}),
    ]:
        refused = httpx.get(board + path, params=params, headers=headers, timeout=10)
        assert refused.status_code == 403, (path, refused.status_code, refused.text)
        assert refused.text == (
            "Forbidden: this TensorBoard answers through the Towerboard service only.\n"
        )
    # With the secret it answers: the header is what it checks.
    answered = httpx.get(
        board + "/data/environment", headers={"X-Towerboard-Secret": secret}, timeout=10
    )
    assert answered.status_code == 200, answered.text
    # A client's own header goes no further than the proxy, which sends the real one.
    proxied = service.client.get(
        "/tensorboard/data/environment", headers={"X-Towerboard-Secret": "guess"}
    )
    assert proxied.status_code == 200, proxied.text


def test_tensorboard_shows_every_kind_of_summary_a_job_writes(
    service: Service, traced_job: dict[str, Any]
) -> None:
    # The trainer writes its event files itself (trainer/summaries.py), not through
    # tf.summary: TensorBoard's own plugins must find and draw each kind.
    job_id = traced_job["id"]
    service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]})
    run = f"traced · {job_id}/train"  # the job's name, then its id

    def tags(plugin: str) -> Any:
        reply = service.client.get(f"/tensorboard/data/plugin/{plugin}/tags")
        return reply.status_code == 200 and reply.json().get(run)

    listing = _wait(
        lambda: (
            (r := service.client.get("/tensorboard/data/plugins_listing")).status_code == 200
            and r.json()
        ),
        60,
        "the plugins listing",
    )
    for plugin in ("scalars", "histograms", "images", "graphs"):
        assert listing[plugin]["enabled"] is True, (plugin, listing[plugin])

    histogram_tags = _wait(lambda: tags("histograms"), 60, "the histogram tags")
    assert any(tag.startswith("weights/") for tag in histogram_tags), histogram_tags
    tag = next(tag for tag in histogram_tags if tag.startswith("gradients/"))
    assert "gradient" in histogram_tags[tag]["description"].lower()
    points = service.client.get(
        "/tensorboard/data/plugin/histograms/histograms", params={"run": run, "tag": tag}
    ).json()
    assert [step for _, step, _ in points] == [1, 40]  # written at the job's first and last steps
    assert len(points[0][2]) == 30  # the buckets: [left, right, count] each

    image_tags = _wait(lambda: tags("images"), 60, "the image tags")
    assert list(image_tags) == ["tower_0/inputs"], image_tags
    images = service.client.get(
        "/tensorboard/data/plugin/images/images", params={"run": run, "tag": "tower_0/inputs"}
    ).json()
    assert [each["step"] for each in images] == [1, 40]
    image = images[-1]
    png = service.client.get(f"/tensorboard/data/plugin/images/individualImage?{image['query']}")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")

    graph = service.client.get("/tensorboard/data/plugin/graphs/graph", params={"run": run})
    assert graph.status_code == 200 and "tower_0" in graph.text

    # The HParams dashboard (its requests are POSTs): a row per job, its spec's values
    # beside the last value of each metric, its train and eval runs'.
    def session_groups() -> Any:
        reply = service.client.post(
            "/tensorboard/data/plugin/hparams/session_groups",
            json={"experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN"],
                  "colParams": [], "startIndex": 0, "sliceSize": 10},
            headers={"X-XSRF-Protected": "1"},  # TensorBoard's own check on a POST
        )  # fmt: skip
        return reply.status_code == 200 and reply.json()["sessionGroups"]

    [group] = _wait(session_groups, 60, "the hparams session groups")
    assert group["name"] == job_id  # the trial: the id the trainer wrote
    # Its session: the job's folder in the view, its name then its id.
    assert [session["name"] for session in group["sessions"]] == [f"traced · {job_id}"]
    hparams = group["hparams"]
    assert (hparams["name"], hparams["model.name"], hparams["model.params.hidden"]) == (
        "traced", "mlp", "[16]",
    )  # fmt: skip
    assert hparams["optimizer.learning_rate"] == 0.001 and hparams["batch_size"] == 32
    assert "steps" not in hparams and "summaries.trace_steps" not in hparams
    last = {(m["name"]["group"], m["name"]["tag"]): m for m in group["metricValues"]}
    assert last[("eval", "accuracy")]["trainingStep"] == 40
    assert 0.0 <= last[("eval", "accuracy")]["value"] <= 1.0
    assert last[("train", "loss")]["trainingStep"] == 40


def test_tensorboard_shows_every_image_step_of_a_job(service: Service) -> None:
    """TensorBoard keeps 10 steps of an image tag a run by default (a seeded random pick,
    and the newest): a job's Images tab showed 10 of its 100 image steps, never step 1.
    The service's keeps them all, up to its count (`service.tensorboard`)."""
    job = service.submit(job_spec(name="pictured", summaries={"images_every": 2}))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    written = [1, *range(2, 41, 2)]  # every 2 steps, and the first: 21 steps
    service.client.post("/api/v1/tensorboard", json={"job_ids": [job["id"]], "merge": True})

    def steps() -> Any:
        reply = service.client.get(
            "/tensorboard/data/plugin/images/images",
            params={"run": f"{_folder(job)}/train", "tag": "tower_0/inputs"},
        )
        shown = reply.json() if reply.status_code == 200 else []
        # The newest step is always kept: once it shows, the run is loaded.
        return shown and shown[-1]["step"] == 40 and [each["step"] for each in shown]

    assert _wait(steps, 120, "the job's images through the proxy") == written


def test_start_tensorboard_same_selection_reused(
    service: Service, traced_job: dict[str, Any]
) -> None:
    first = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    second = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    assert second.status_code == 200
    assert second.json()["pid"] == first.json()["pid"]


def test_proxy_tensorboard_profile_plugin(service: Service, traced_job: dict[str, Any]) -> None:
    job_id = traced_job["id"]
    service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]})
    listing = service.client.get("/tensorboard/data/plugins_listing")
    assert listing.status_code == 200
    assert listing.json()["profile"]["enabled"] is True
    runs = service.client.get("/tensorboard/data/plugin/profile/runs").json()
    assert len(runs) == 1 and runs[0].startswith(f"traced · {job_id}/"), runs
    tools = service.client.get(
        "/tensorboard/data/plugin/profile/run_tools", params={"run": runs[0]}
    )
    assert "trace_viewer@" in tools.json()
    hosts = service.client.get(
        "/tensorboard/data/plugin/profile/hosts", params={"run": runs[0], "tag": "overview_page"}
    ).json()
    overview = service.client.get(
        "/tensorboard/data/plugin/profile/data",
        params={"run": runs[0], "tag": "overview_page", "host": hosts[0]["hostname"]},
    )
    assert overview.status_code == 200 and overview.json()
    page = service.client.get("/tensorboard/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    redirect = service.client.get("/tensorboard", follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"] == "/tensorboard/"


def test_proxy_opens_the_profile_trace_viewer(service: Service, traced_job: dict[str, Any]) -> None:
    """The trace viewer's page is asked for with the URL of its trace in `trace_data_url`
    (as the profile plugin's page asks for it): the proxy refused that as a path outside
    the logdir, and the browser showed a 400's JSON instead of the trace."""
    job_id = traced_job["id"]
    service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]})
    [run] = _wait(
        lambda: service.client.get("/tensorboard/data/plugin/profile/runs").json(),
        120,
        "the profile plugin to list the trace",
    )
    [host] = service.client.get(
        "/tensorboard/data/plugin/profile/hosts", params={"run": run, "tag": "trace_viewer@"}
    ).json()
    trace_url = "/tensorboard/data/plugin/profile/data?" + urlencode(
        {"run": run, "tag": "trace_viewer@", "host": host["hostname"]}
    )
    page = service.client.get(
        "/tensorboard/data/plugin/profile/trace_viewer_index.html",
        params={"is_streaming": "true", "is_oss": "true", "trace_data_url": trace_url},
    )
    assert page.status_code == 200, page.text
    assert "<html" in page.text.lower()
    trace = service.client.get(trace_url)
    assert trace.status_code == 200
    names = {frame["name"] for frame in trace.json()["stackFrames"].values()}
    assert any(name.startswith("tower_0/") for name in names)
    # Only a URL of this TensorBoard passes, and it is checked as any request is.
    for bad in ("/etc/passwd", "/tensorboard/../../etc/passwd", "/tensorboard/data?run=a/../../b"):
        refused = service.client.get(
            "/tensorboard/data/plugin/profile/trace_viewer_index.html",
            params={"trace_data_url": bad},
        )
        assert refused.status_code == 400, bad
        assert "trace_data_url" in refused.json()["detail"]


def test_proxy_decodes_gzip_for_a_client_that_did_not_ask_for_it(
    service: Service, traced_job: dict[str, Any]
) -> None:
    """The profile plugin gzips its answers whatever the request accepts: `curl` without
    `--compressed` printed gzip bytes where JSON was due."""
    service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    url = "/tensorboard/data/plugin/profile/runs"
    _wait(lambda: service.client.get(url).json(), 120, "the profile plugin to list the trace")
    for accept in ("identity", "gzip;q=0", None):
        headers = {"Accept-Encoding": accept} if accept else {}
        request = service.client.build_request("GET", url, headers=headers)
        if accept is None:
            del request.headers["Accept-Encoding"]  # as curl sends it: no header at all
        answer = service.client.send(request, stream=True)
        raw = b"".join(answer.iter_raw())
        answer.close()
        assert answer.status_code == 200
        assert "content-encoding" not in answer.headers, accept
        assert json.loads(raw)[0].startswith(f"{_folder(traced_job)}/"), accept
        assert int(answer.headers.get("content-length", len(raw))) == len(raw)
    # A client that takes gzip gets TensorBoard's bytes as they came.
    answer = service.client.send(
        service.client.build_request("GET", url, headers={"Accept-Encoding": "gzip"}), stream=True
    )
    raw = b"".join(answer.iter_raw())
    answer.close()
    assert answer.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(raw))[0].startswith(f"{_folder(traced_job)}/")


@pytest.mark.parametrize(
    "path",
    ["/data/plugin/profile/capture_profile", "//data/plugin/profile/capture_profile/",
     "/data/plugin/profile/%63apture_profile"],
)  # fmt: skip
def test_proxy_refuses_the_profile_plugins_capture_from_an_address(
    service: Service, path: str
) -> None:
    """A GET that had TensorBoard connect to any address given (`service_addr`); no worker
    runs a profiler server to capture from. Refused before TensorBoard is even asked."""
    response = service.client.get(
        f"/tensorboard{path}", params={"service_addr": "10.1.2.3:6009", "duration": "1000"}
    )
    assert response.status_code == 403
    assert response.json()["detail"].startswith(
        "Capturing a profile from a profiler server is not available here: jobs trace "
    )


@pytest.mark.parametrize(
    "query, name, value",
    [
        ("run_path=gs%3A%2F%2Fsome-bucket%2Fprofiles", "run_path", "gs://some-bucket/profiles"),
        ("run=x&session_path=data%2Fruns%2Fx", "session_path", "data/runs/x"),
    ],
)
def test_proxy_refuses_the_profile_plugins_own_folder_parameters(
    service: Service, query: str, name: str, value: str
) -> None:
    """Neither a `..` nor an absolute path, yet a folder outside the logdir: a path from
    TensorBoard's working directory, or a bucket read with the host's credentials."""
    response = service.client.get(f"/tensorboard/data/plugin/profile/runs?{query}")
    assert response.status_code == 400
    assert response.json() == {
        "detail": f"Query parameter {name!r} is not accepted: it would make TensorBoard read "
        f"profiles from a folder other than its logdir. Received: {value!r}",
        "errors": [],
    }


@pytest.mark.parametrize(
    "query, name, value",
    [
        ("run=../../../../etc&tag=x", "run", "../../../../etc"),
        ("run=/etc/passwd&tag=x", "run", "/etc/passwd"),
        ("run=a/../../b", "run", "a/../../b"),
    ],
)
def test_proxy_tensorboard_path_traversal_400(
    service: Service, query: str, name: str, value: str
) -> None:
    response = service.client.get(f"/tensorboard/data/plugin/profile/data?{query}")
    assert response.status_code == 400
    assert response.json() == {
        "detail": f"Query parameter {name!r} must not be a path outside TensorBoard's logdir. "
        f"Received: {value!r}",
        "errors": [],
    }


def test_proxy_tensorboard_redirect_keeps_query(service: Service) -> None:
    response = service.client.get("/tensorboard?darkMode=true&x=a%2Fb")
    assert response.status_code == 307
    assert response.headers["location"] == "/tensorboard/?darkMode=true&x=a%2Fb"


def test_tensorboard_fonts_at_the_root_go_to_the_proxy(service: Service) -> None:
    """TensorBoard's page asks for its fonts at /font-roboto/..., outside /tensorboard/:
    they 404ed. They are sent on to the proxy, and nothing else of the root is reached."""
    name = "oMMgfZMQthOryQo9n22dcuvvDin1pK8aKteLpeZ5c0A.woff2"
    for method in ("GET", "HEAD"):
        response = service.client.request(method, f"/font-roboto/{name}")
        assert response.status_code == 308, response.text
        assert response.headers["location"] == f"/tensorboard/font-roboto/{name}"
    for other in ("a/b", "..%2F..%2Fapi%2Fv1%2Fjobs"):
        assert service.client.get(f"/font-roboto/{other}").status_code == 404


def test_start_tensorboard_unknown_job_422(service: Service) -> None:
    response = service.client.post("/api/v1/tensorboard", json={"job_ids": ["nope", "nada"]})
    assert response.status_code == 422
    assert response.json() == {
        "detail": "Invalid request: 2 errors; see `errors`.",
        "errors": [
            {"field": "job_ids.0", "message": "Unknown job. Received: 'nope'"},
            {"field": "job_ids.1", "message": "Unknown job. Received: 'nada'"},
        ],
    }


def test_start_tensorboard_no_jobs_422(service: Service) -> None:
    before = service.client.get("/api/v1/tensorboard").json()
    response = service.client.post("/api/v1/tensorboard", json={"job_ids": []})
    assert response.status_code == 422
    assert response.json() == {
        "detail": "Invalid request: 1 error; see `errors`.",
        "errors": [
            {
                "field": "job_ids",
                "message": "Expected at least one job id, or no `job_ids` for every job. "
                "Received: []",
            }
        ],
    }
    assert service.client.get("/api/v1/tensorboard").json() == before  # nothing started


def test_start_tensorboard_body_not_object_422(service: Service) -> None:
    response = service.client.post("/api/v1/tensorboard", json=["abc"])
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {
            "field": "(body)",  # not "(spec)": a selection of jobs is no job spec
            "message": "Input should be a valid dictionary or object to extract fields from. "
            "Received: ['abc']",
        }
    ]


@pytest.fixture(scope="module")
def other_job(service: Service) -> dict[str, Any]:
    """A second tiny job, run to success: TensorBoard has its runs to show too."""
    job = service.submit(job_spec(name="other"))
    return service.wait_state(job["id"], "succeeded", "failed")


def _running(service: Service) -> dict[str, Any]:
    status: dict[str, Any] = _wait(
        lambda: (s := service.client.get("/api/v1/tensorboard").json())["state"] == "running" and s,
        120,
        "TensorBoard to run",
    )
    return status


def _runs(service: Service) -> list[str]:
    runs: list[str] = service.client.get("/tensorboard/data/runs").json()
    return runs


def _running_over(service: Service, job_id: str) -> dict[str, Any]:
    """TensorBoard running over `job_id` alone, replacing none: the one an earlier test left
    running when it is that (a start costs seconds: it imports TensorFlow), else one
    started afresh."""
    status = service.client.get("/api/v1/tensorboard").json()
    if status["state"] != "running" or status["job_ids"] != [job_id] or status["replaced"]:
        service.client.delete("/api/v1/tensorboard")
        started = service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]})
        assert started.status_code == 201, started.text
    return _running(service)


def test_start_tensorboard_over_more_jobs_adds_them_in_place(
    service: Service, traced_job: dict[str, Any], other_job: dict[str, Any]
) -> None:
    """A start whose jobs include every job shown adds them to the running TensorBoard:
    no restart, so a tab another user has open on it carries on."""
    old = _running_over(service, traced_job["id"])
    assert f"{_folder(other_job)}/train" not in _runs(service)
    response = service.client.post("/api/v1/tensorboard")  # every job
    assert response.status_code == 200
    new = response.json()
    assert new["job_ids"] is None and new["pid"] == old["pid"]
    assert new["state"] == "running" and new["replaced"] is None
    assert _alive(new["pid"])
    runs = _wait(
        lambda: (r := _runs(service)) and f"{_folder(other_job)}/train" in r and r,
        60,
        "the other job's runs, added",
    )
    assert f"{_folder(traced_job)}/train" in runs


def test_tensorboard_killed_after_ready_reported_stopped(service: Service) -> None:
    # Placed after the test above: the start reuses the TensorBoard over every job that it
    # leaves running (a fresh one takes seconds to import TensorFlow), and this kills it.
    pid = service.client.post("/api/v1/tensorboard").json()["pid"]
    _wait(
        lambda: service.client.get("/api/v1/tensorboard").json()["state"] == "running",
        120,
        "TensorBoard to run",
    )
    os.kill(pid, signal.SIGKILL)
    # With no request at all, the watch loop notices within seconds and reaps it (a zombie
    # keeps its /proc entry until then).
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 30, "the dead TensorBoard reaped")
    error = (
        f"TensorBoard (pid {pid}) was killed by SIGKILL after it was ready; see "
        f"{service.data_dir / 'tensorboard.log'}."
    )
    status = service.client.get("/api/v1/tensorboard").json()
    assert status["state"] == "stopped" and status["pid"] is None
    assert status["last_error"] == error
    proxied = service.client.get("/tensorboard/data/runs")
    assert proxied.status_code == 503
    assert proxied.json()["detail"] == (
        f"TensorBoard is not running. Start it with POST /api/v1/tensorboard. Last error: {error}"
    )
    assert "\ntowerboard_tensorboard_up 0\n" in service.client.get("/metrics").text


def test_start_tensorboard_merge_adds_to_what_it_shows(
    service: Service, traced_job: dict[str, Any], other_job: dict[str, Any]
) -> None:
    """`merge` keeps another user's jobs and adds these, in place; the answer comes once
    TensorBoard lists the added job's runs, so a tab opened on it shows them."""
    service.client.delete("/api/v1/tensorboard")
    first = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    _running(service)
    assert f"{_folder(other_job)}/train" not in _runs(service)
    response = service.client.post(
        "/api/v1/tensorboard", json={"job_ids": [other_job["id"]], "merge": True}
    )
    assert response.status_code == 200
    merged = response.json()
    assert merged["pid"] == first.json()["pid"] and merged["replaced"] is None
    assert merged["job_ids"] == sorted([traced_job["id"], other_job["id"]])
    runs = _runs(service)
    assert {f"{_folder(traced_job)}/train", f"{_folder(other_job)}/train"} <= set(runs), runs
    # Asked again, it is simply reused.
    again = service.client.post(
        "/api/v1/tensorboard", json={"job_ids": [traced_job["id"]], "merge": True}
    )
    assert again.status_code == 200 and again.json()["job_ids"] == merged["job_ids"]


def test_start_tensorboard_over_other_jobs_says_what_it_replaced(
    service: Service, traced_job: dict[str, Any], other_job: dict[str, Any]
) -> None:
    """Without `merge`, a start that leaves out jobs the running one shows restarts it,
    and its answer and the status say what was replaced (another user's TensorBoard)."""
    service.client.delete("/api/v1/tensorboard")
    old = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]}).json()
    response = service.client.post("/api/v1/tensorboard", json={"job_ids": [other_job["id"]]})
    assert response.status_code == 201
    new = response.json()
    assert new["job_ids"] == [other_job["id"]] and new["pid"] != old["pid"]
    assert not _alive(old["pid"])
    replaced = new["replaced"]
    assert replaced["job_ids"] == [traced_job["id"]] and replaced["pid"] == old["pid"]
    assert replaced["started_at"] == old["started_at"]
    assert replaced["last_used_at"] == old["last_used_at"]  # nobody used it since
    status = service.client.get("/api/v1/tensorboard").json()
    assert status["pid"] == new["pid"] and status["replaced"] == replaced
    runs = _wait(lambda: _runs(service), 120, "the new TensorBoard's runs")
    assert f"{_folder(traced_job)}/train" not in runs
    # Every job, narrowed to one: replaced says it showed every job (null).
    service.client.post("/api/v1/tensorboard")
    narrowed = service.client.post("/api/v1/tensorboard", json={"job_ids": [other_job["id"]]})
    assert narrowed.status_code == 201
    assert narrowed.json()["replaced"]["job_ids"] is None


def test_start_tensorboard_merge_with_none_running_starts_one(
    service: Service, traced_job: dict[str, Any]
) -> None:
    service.client.delete("/api/v1/tensorboard")
    response = service.client.post(
        "/api/v1/tensorboard", json={"job_ids": [traced_job["id"]], "merge": True}
    )
    assert response.status_code == 201
    assert response.json()["job_ids"] == [traced_job["id"]]
    assert response.json()["replaced"] is None


def test_start_tensorboard_merge_not_bool_422(service: Service) -> None:
    response = service.client.post("/api/v1/tensorboard", json={"merge": "perhaps"})
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "merge", "message": "Input should be a valid boolean. Received: 'perhaps'"}
    ]


def test_stop_tensorboard(service: Service) -> None:
    pid = service.client.post("/api/v1/tensorboard").json()["pid"]
    response = service.client.delete("/api/v1/tensorboard")
    assert response.status_code == 200
    assert response.json() == {
        "state": "stopped", "url": None, "job_ids": None, "pid": None,
        "started_at": None, "last_used_at": None, "idle_stop_at": None, "last_error": None,
        "replaced": None,
    }  # fmt: skip
    assert not _alive(pid)
    proxied = service.client.get("/tensorboard/data/runs")
    assert proxied.status_code == 503
    assert proxied.json() == {
        "detail": "TensorBoard is not running. Start it with POST /api/v1/tensorboard.",
        "errors": [],
    }


def test_tensorboard_killed_while_starting_says_so(service: Service) -> None:
    service.client.delete("/api/v1/tensorboard")
    started = service.client.post("/api/v1/tensorboard").json()
    assert started["state"] == "starting"  # it imports TensorFlow first: seconds
    os.kill(started["pid"], signal.SIGKILL)
    status = _wait(
        lambda: (s := service.client.get("/api/v1/tensorboard").json())["state"] == "stopped" and s,
        30,
        "the dead TensorBoard reported",
    )
    # Whoever notices first (the readiness probe or a look), the reason is the same.
    assert status["last_error"] == (
        f"TensorBoard (pid {started['pid']}) was killed by SIGKILL while starting; see "
        f"{service.data_dir / 'tensorboard.log'}."
    )


def test_stop_tensorboard_after_idle_timeout(make_service: Callable[..., Service]) -> None:
    """The idle clock starts when TensorBoard is ready: one whose start takes longer than
    the idle timeout (held here with SIGSTOP, as a busy host can) is not stopped while
    starting, and is stopped once it has then gone unused for the timeout."""
    # 3 s, looked at every 0.75 s (a quarter of it): the idle wait and the hold past it
    # are most of this test's time.
    service = make_service(env={"TOWERBOARD_TB_IDLE_MINUTES": "0.05"})
    service.start()
    started = service.client.post("/api/v1/tensorboard").json()
    os.kill(started["pid"], signal.SIGSTOP)
    try:
        time.sleep(5)  # the idle timeout and two watch ticks past it
        assert service.client.get("/api/v1/tensorboard").json()["state"] == "starting"
    finally:
        os.kill(started["pid"], signal.SIGCONT)
    # Not a look for "running" between: on a busy host the 3 s can pass between two looks.
    _wait(
        lambda: service.client.get("/api/v1/tensorboard").json()["state"] == "stopped",
        180,
        "the idle stop",
    )
    assert not _alive(started["pid"])
    log = service.log.read_text()
    ready = f"TensorBoard pid {started['pid']} is ready"
    assert ready in log, log  # it ran: the start held past the timeout did not stop it
    assert "TensorBoard unused for 0.05 minutes; stopping it" in log.split(ready, 1)[1], log
    # Stopped a whole idle timeout after it was ready, not at the first look once ready
    # (the clock counted from the start would have run out by then).
    ready_at, stopped_at = (
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for said in (ready, "TensorBoard unused for")
        for line in log.splitlines()
        if said in line
    )
    assert (stopped_at - ready_at).total_seconds() >= 3.0, log


def test_a_deleted_job_leaves_the_tensorboard_selection(
    service: Service, other_job: dict[str, Any]
) -> None:
    """A job deleted while TensorBoard shows it leaves its selection: the status listed it
    on, and a start over the jobs left restarted TensorBoard, saying it replaced one over
    a job that no longer exists."""
    doomed = service.submit(job_spec(name="doomed"))
    service.wait_state(doomed["id"], "succeeded", "failed")
    service.client.delete("/api/v1/tensorboard")
    both = sorted([other_job["id"], doomed["id"]])
    started = service.client.post("/api/v1/tensorboard", json={"job_ids": both})
    assert started.status_code == 201, started.text
    pid = _running(service)["pid"]

    service.wait_exited(doomed["id"])  # deletable only then
    assert service.client.delete(f"/api/v1/jobs/{doomed['id']}").status_code == 204

    assert service.client.get("/api/v1/tensorboard").json()["job_ids"] == [other_job["id"]]
    again = service.client.post("/api/v1/tensorboard", json={"job_ids": [other_job["id"]]})
    assert again.status_code == 200, again.text  # reused: nothing shown was left out
    assert again.json()["pid"] == pid and again.json()["replaced"] is None


def test_tensorboard_names_each_jobs_runs_by_its_name_and_id(service: Service) -> None:
    """Runs were named by the job id alone (`3fkkyci9jr/train`): nobody comparing jobs in
    the run selector, the profile plugin or HParams could tell which was which. Each is
    now the job's name, made a folder name, then its id: two jobs of one name stay apart,
    a name of `/`, spaces and unicode is safe (and the profile plugin reads it), the
    dashboard's run filter (`<id>(/|$)`) finds one job's runs alone even beside a job
    whose name holds that id, and a deleted job's runs go."""
    first = service.submit(job_spec(name="twin"))
    second = service.submit(job_spec(name="twin"))
    odd = service.submit(
        job_spec(
            name=f"  ..naïve  a/b\\c ✓ 日本語 of {first['id']}", summaries={"trace_steps": [5]}
        )
    )
    for job in (first, second, odd):
        assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    odd_folder = f"naïve a_b_c ✓ 日本語 of {first['id']} · {odd['id']}"
    service.client.post("/api/v1/tensorboard")  # every job: added in place, or started
    expected = {
        f"twin · {first['id']}/train", f"twin · {second['id']}/train", f"{odd_folder}/train",
    }  # fmt: skip
    _running(service)
    runs = _wait(lambda: (r := set(_runs(service))) >= expected and r, 60, "the named runs")
    assert not any(run.startswith((f"{first['id']}/", f"{odd['id']}/")) for run in runs), runs
    logdir = service.data_dir / "tensorboard" / "logdir"
    assert {p.name for p in logdir.iterdir()} >= {
        f"twin · {first['id']}", f"twin · {second['id']}", odd_folder,
    }  # fmt: skip
    assert (logdir / odd_folder / "train").resolve() == (
        service.data_dir / "runs" / odd["id"] / "tb" / "train"
    )  # the view's link; the job's own run directory is as it was
    # The run filter the dashboard's link sets, a regular expression TensorBoard's page
    # matches without regard to case: the first twin's runs, not the odd job's.
    link_filter = re.compile(f"{first['id']}(/|$)", re.IGNORECASE)
    assert {run for run in runs if link_filter.search(run)} == {
        run for run in runs if run.startswith(f"twin · {first['id']}")
    }
    # Read through the proxy by that name: the loss, and the odd job's trace.
    loss = service.client.get(
        "/tensorboard/data/plugin/scalars/scalars",
        params={"run": f"{odd_folder}/train", "tag": "loss"},
    )
    assert loss.status_code == 200 and [step for _, step, _ in loss.json()][-1] == 40
    profiled = _wait(
        lambda: [
            run
            for run in service.client.get("/tensorboard/data/plugin/profile/runs").json()
            if run.startswith(f"{odd_folder}/")
        ],
        60,
        "the profile plugin to list the odd job's trace",
    )
    tools = service.client.get(
        "/tensorboard/data/plugin/profile/run_tools", params={"run": profiled[0]}
    )
    assert tools.status_code == 200 and "trace_viewer@" in tools.json()

    service.wait_exited(first["id"])
    assert service.client.delete(f"/api/v1/jobs/{first['id']}").status_code == 204
    gone = _wait(
        lambda: (
            (r := set(_runs(service)))
            and not any(run.startswith("twin · " + first["id"]) for run in r)
            and r
        ),
        60,
        "the deleted job's runs to go",
    )
    assert f"twin · {second['id']}/train" in gone and f"{odd_folder}/train" in gone
    assert not any(p.name.endswith(first["id"]) for p in logdir.iterdir())


def test_a_view_an_older_version_left_is_replaced_without_duplicate_runs(
    service: Service, traced_job: dict[str, Any]
) -> None:
    """An older version named the view's folders by the job id alone, and left its view
    in place when it stopped: the next start's view holds each job's runs once, by name."""
    service.client.delete("/api/v1/tensorboard")
    logdir = service.data_dir / "tensorboard" / "logdir"
    shutil.rmtree(logdir, ignore_errors=True)
    old = logdir / traced_job["id"]
    old.mkdir(parents=True)
    for entry in (service.data_dir / "runs" / traced_job["id"] / "tb").iterdir():
        if entry.name != "plugins":
            (old / entry.name).symlink_to(entry)
    started = service.client.post("/api/v1/tensorboard", json={"job_ids": [traced_job["id"]]})
    assert started.status_code == 201, started.text
    _running(service)
    runs = _wait(lambda: _runs(service), 60, "the runs")
    folder = f"traced · {traced_job['id']}"
    assert f"{folder}/train" in runs and all(run.startswith(folder) for run in runs), runs
    assert [p.name for p in logdir.iterdir()] == [folder]


def test_a_queued_job_stays_in_the_tensorboard_selection(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A job asked for while it waits in the queue (no run directory yet) is not taken for
    a deleted one: it stays in the selection, so TensorBoard shows it once it starts."""
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    running = service.submit(job_spec(name="waits"))  # holds the one slot until cancelled
    queued = service.submit(job_spec(name="points"))
    service.wait_state(running["id"], "running")
    assert service.job(queued["id"])["state"] == "queued"
    started = service.client.post("/api/v1/tensorboard", json={"job_ids": [running["id"]]})
    assert started.json()["job_ids"] == [running["id"]]
    merged = service.client.post(
        "/api/v1/tensorboard", json={"job_ids": [queued["id"]], "merge": True}
    )
    both = sorted([running["id"], queued["id"]])
    assert merged.json()["job_ids"] == both, merged.text
    assert service.client.get("/api/v1/tensorboard").json()["job_ids"] == both
    service.client.post(f"/api/v1/jobs/{running['id']}/cancel")
    service.wait_state(queued["id"], "succeeded")
    assert service.client.get("/api/v1/tensorboard").json()["job_ids"] == both


def test_restart_tensorboard_makes_its_view_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Removing the old view and mirroring the new took 0.3-0.7 s over 2,000 jobs, on the
    # event loop: every request of the service waited that long. Each call of that file
    # work must run on another thread, while the loop answers; and what it answers then is
    # the old TensorBoard, not "stopped" (a page told so stops following, never told of
    # the one that replaced it). The launcher and both TensorBoards are real.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    for job_id in ("first", "second"):
        (settings.runs_dir / job_id / "tb" / "train").mkdir(parents=True)
    calls: list[tuple[str, str]] = []  # (what, the state the loop said meanwhile)

    async def restart() -> tuple[TensorBoardInstance, TensorBoardInstance, StartOutcome]:
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()
        upstream = Upstream()
        launcher = TensorBoardLauncher(settings=settings, upstream=upstream)

        async def state() -> str:
            return launcher.state

        def watched(what: str, blocking: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                if threading.get_ident() == loop_thread:
                    calls.append((what, "on the event loop"))
                else:  # the loop is free to answer: ask it what a request would hear
                    said = asyncio.run_coroutine_threadsafe(state(), loop).result(timeout=30)
                    calls.append((what, said))
                return blocking(*args, **kwargs)

            return call

        monkeypatch.setattr("service.tensorboard.mirror_logdir", watched("mirror", mirror_logdir))
        monkeypatch.setattr("service.tensorboard.shutil.rmtree", watched("rmtree", shutil.rmtree))
        try:
            first, _ = await launcher.start(["first"])
            calls.clear()
            second, outcome = await launcher.start(["second"])
        finally:
            await launcher.stop()
            await upstream.aclose()
            monkeypatch.undo()
        return first, second, outcome

    # In a thread of its own: after the browser tests, Playwright keeps an event loop
    # running in this one, and asyncio.run() refuses to start another beside it.
    with ThreadPoolExecutor(1) as pool:
        first, second, outcome = pool.submit(asyncio.run, restart()).result()

    assert outcome is StartOutcome.STARTED and second.pid != first.pid
    assert {what for what, _ in calls} == {"mirror", "rmtree"}, calls
    assert all(said in ("starting", "running") for _, said in calls), calls
    logdir = settings.data_dir / "tensorboard" / "logdir"
    assert second.logdir == logdir
    assert [entry.name for entry in logdir.iterdir()] == ["second"]
    assert (logdir / "second" / "train").resolve() == settings.runs_dir / "second" / "tb" / "train"
    assert sorted(entry.name for entry in logdir.parent.iterdir()) == ["logdir"]


def _in_a_thread(coroutine: Any) -> Any:
    """Run `coroutine` to its end on an event loop of its own: after the browser tests,
    Playwright keeps one running in this thread, and asyncio.run() refuses another."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _stand_in_settings(tmp_path: Path) -> Settings:
    """Settings whose TensorBoard is a shell script that sleeps with TensorBoard's argv
    (the logdir in it, as a previous service's is found by): for tests of the launcher's
    own files, not of TensorBoard, which takes seconds to import TensorFlow."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nsleep 600\n")
    python.chmod(0o755)
    settings = Settings(data_dir=tmp_path / "data", python=str(python)).resolved()
    settings.runs_dir.mkdir(parents=True)
    return settings


def test_a_tensorboard_a_killed_service_left_is_stopped_at_the_next_start(
    tmp_path: Path,
) -> None:
    settings = _stand_in_settings(tmp_path)

    async def leave_one() -> TensorBoardInstance:
        upstream = Upstream()
        launcher = TensorBoardLauncher(settings=settings, upstream=upstream)
        instance, _ = await launcher.start(None)
        await upstream.aclose()
        return instance  # and the service is killed: nothing stops it

    left = _in_a_thread(leave_one())
    assert _alive(left.pid)
    record = settings.data_dir / "tensorboard" / "instance.json"
    assert json.loads(record.read_text())["pid"] == left.pid
    TensorBoardLauncher(settings=settings, upstream=Upstream()).stop_orphan()
    _wait(lambda: not _alive(left.pid), 10, "the TensorBoard left behind stopped")
    assert not record.exists()


@pytest.mark.parametrize(
    "record",
    [b"[1, 2]", b'"text"', b"null", b'{"pid": 1', b"\xff\xfe{}", None],
    ids=["a list", "a string", "null", "torn", "not UTF-8", "a folder"],
)
def test_a_tensorboard_record_that_names_no_process_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record: bytes | None
) -> None:
    """What a previous service recorded of its TensorBoard is read as the service starts:
    a record that is JSON but no object failed there (`record.get`), and so did one that
    is no UTF-8 text or cannot be read at all, so the service did not start."""
    settings = _stand_in_settings(tmp_path)
    path = settings.data_dir / "tensorboard" / "instance.json"
    if record is None:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True)
        path.write_bytes(record)
    TensorBoardLauncher(settings=settings, upstream=Upstream()).stop_orphan()
    assert f"Ignoring {path}, which " in caplog.text


def test_a_service_starts_over_a_tensorboard_record_of_another_shape(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(data_dir=tmp_path / "data")
    record = service.data_dir / "tensorboard" / "instance.json"
    record.parent.mkdir(parents=True)
    record.write_text("[12345]")
    service.start()  # it exited, naming AttributeError: 'list' object has no attribute 'get'
    assert service.client.get("/api/v1/tensorboard").json()["state"] == "stopped"
    assert f"Ignoring {record}, which holds no JSON object" in service.log.read_text()


# Run by the test below in a process of its own: RLIMIT_FSIZE is the process's, and this
# one's own files (pytest's captured output) would meet it too.
_START_UNDER_A_FILE_SIZE_LIMIT = """\
import asyncio, json, resource, signal, sys
from pathlib import Path
from service.settings import Settings
from service.tensorboard import TensorBoardLauncher
from service.upstream import Upstream

settings = Settings(data_dir=Path(sys.argv[1]), python=sys.argv[2])
home = settings.data_dir / "tensorboard"


async def main():
    upstream = Upstream()
    launcher = TensorBoardLauncher(settings=settings, upstream=upstream)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20, 20))
    try:
        await launcher.start(None)
    except OSError as error:
        left = sorted(entry.name for entry in home.iterdir())
        print(json.dumps({"errno": error.errno, "left": left}))
    finally:
        await launcher.stop()
        await upstream.aclose()


asyncio.run(main())
"""


def test_a_tensorboard_record_cut_short_is_none_rather_than_part_of_one(tmp_path: Path) -> None:
    """The record of the running TensorBoard, written in place, was left cut short by a
    write that failed part way (a full disk; here the file size limit): one the next
    start could not read and passed over, its TensorBoard never stopped. Written to a
    temporary name and renamed, there is a whole record or none, and nothing else."""
    settings = _stand_in_settings(tmp_path)
    ran = subprocess.run(
        [sys.executable, "-c", _START_UNDER_A_FILE_SIZE_LIMIT, str(settings.data_dir),
         settings.python],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"errno": errno.EFBIG, "left": ["logdir"]}


def test_tensorboards_watch_loop_outlives_a_pass_that_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An error in a pass of the watch loop (here the store's, asked whether a selected
    job without a run directory is still there) ended the loop for good, unseen: nobody
    awaits its task. TensorBoard was then never stopped for idleness. Now the error is
    logged once while it repeats, and the loop goes on: TensorBoard, real, and the store, a
    real SQLite file, with a fault injected in front of it, stops once idle."""
    caplog.set_level(logging.INFO, logger="service.tensorboard")
    settings = Settings(data_dir=tmp_path / "data", tb_idle_minutes=0.05).resolved()  # 3 s
    settings.runs_dir.mkdir(parents=True)
    store = JobStore(tmp_path / "jobs.db")
    queued = store.create({"name": "queued", "priority": 0}).id  # no run directory yet
    faults = [0]

    def job_exists(job_id: str) -> bool:
        if faults[0]:  # the injected fault: the store refuses a read, as a locked one does
            faults[0] -= 1
            raise sqlite3.OperationalError("database is locked")
        return store.version(job_id) is not None

    async def watched() -> tuple[str, bool]:
        upstream = Upstream()
        launcher = TensorBoardLauncher(settings=settings, upstream=upstream, job_exists=job_exists)
        await launcher.start([queued])
        faults[0] = 3  # the next three passes fail
        watch = asyncio.create_task(launcher.watch())
        try:
            assert await launcher.wait_ready() is not None, launcher.last_error
            deadline = time.monotonic() + 60
            while launcher.state != "stopped" and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
            return launcher.state, watch.done()
        finally:
            watch.cancel()
            await launcher.stop()
            await upstream.aclose()

    state, ended = _in_a_thread(watched())
    store.close()
    assert (state, ended) == ("stopped", False)
    assert faults == [0]
    failed = "Watching TensorBoard failed; retrying each tick, logged again if it changes"
    assert caplog.text.count(failed) == 1, caplog.text
    assert "OperationalError: database is locked" in caplog.text
    assert "Watching TensorBoard works again" in caplog.text
    assert "TensorBoard unused for 0.05 minutes; stopping it" in caplog.text


def test_tensorboards_environment_is_a_workers_less_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard finds its main on PYTHONPATH (this project first) and never imports
    from its working directory, the service's, wherever that was started
    (PYTHONSAFEPATH, which a worker had and it lacked): a module there named as one it
    imports would shadow it. No service token, no GPU, its secret. Read from the
    environment of a stand-in's process."""
    monkeypatch.setenv("TOWERBOARD_TOKEN", "the-service-token")
    settings = _stand_in_settings(tmp_path)

    async def environment() -> dict[str, str]:
        upstream = Upstream()
        launcher = TensorBoardLauncher(settings=settings, upstream=upstream)
        try:
            instance, _ = await launcher.start(None)
            environ = Path(f"/proc/{instance.pid}/environ").read_bytes().split(b"\0")
        finally:
            await launcher.stop()
            await upstream.aclose()
        return dict(item.decode().split("=", 1) for item in environ if item)

    env = _in_a_thread(environment())
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[2])
    assert "TOWERBOARD_TOKEN" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert len(env["TOWERBOARD_TB_SECRET"]) > 20


async def _start_and_stop(settings: Settings) -> None:
    """One TensorBoard started and stopped, as a service's start and end do."""
    upstream = Upstream()
    launcher = TensorBoardLauncher(settings=settings, upstream=upstream)
    try:
        await launcher.start(None)
    finally:
        await launcher.stop()
        await upstream.aclose()


def test_a_start_moves_a_full_tensorboard_log_aside(tmp_path: Path) -> None:
    """tensorboard.log is appended to at each start, and grew without end (each deleted
    job TensorBoard showed adds two lines): a start past LOG_ROTATE_BYTES moves it to
    tensorboard.log.1, replacing the one before, and one below that appends."""
    settings = _stand_in_settings(tmp_path)
    log_path = settings.data_dir / "tensorboard.log"
    aside = settings.data_dir / "tensorboard.log.1"
    aside.write_bytes(b"older\n")
    full = b"x" * (LOG_ROTATE_BYTES - 5) + b"full\n"  # at the size: moved

    log_path.write_bytes(full)
    _in_a_thread(_start_and_stop(settings))
    assert aside.read_bytes() == full
    assert log_path.stat().st_size < LOG_ROTATE_BYTES, "expected a new log, not the full one"
    log_path.write_bytes(b"short\n")
    _in_a_thread(_start_and_stop(settings))
    assert log_path.read_bytes().startswith(b"short\n") and aside.read_bytes() == full


def test_a_linked_or_immovable_full_tensorboard_log_is_appended_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tensorboard.log that is a link (pointed elsewhere by its owner) stays one: moved,
    the output went to a new file beside it, not where it pointed. One that cannot be
    moved is appended to, logged: its TensorBoard started, where the move's error
    failed the start."""
    settings = _stand_in_settings(tmp_path)
    log_path = settings.data_dir / "tensorboard.log"
    aside = settings.data_dir / "tensorboard.log.1"
    full = b"x" * LOG_ROTATE_BYTES

    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(full)
    log_path.symlink_to(elsewhere)
    _in_a_thread(_start_and_stop(settings))
    assert log_path.is_symlink() and not aside.exists()
    assert elsewhere.read_bytes() == full  # the stand-in writes nothing: appended, not cut
    log_path.unlink()

    log_path.write_bytes(full)
    (aside / "in the way").mkdir(parents=True)  # os.replace cannot put a file there
    with caplog.at_level(logging.WARNING, logger="service.tensorboard"):
        _in_a_thread(_start_and_stop(settings))
    assert log_path.read_bytes() == full
    assert any("not moved aside" in message for message in caplog.messages), caplog.messages


# File operations seen by `_file_work`'s audit hook while it records (an audit hook can
# never be removed: one, added once, records only when asked).
_FILE_WORK: list[str] | None = None


def _file_work(event: str, args: tuple[Any, ...]) -> None:
    if _FILE_WORK is not None and event in ("os.scandir", "os.mkdir", "os.symlink"):
        _FILE_WORK.append(event)
    elif _FILE_WORK is not None and event == "open" and str(args[0]).endswith("spec.json"):
        _FILE_WORK.append("spec.json")


def _hook_file_work() -> None:
    """Add `_file_work`'s hook, once (added twice, it records each operation twice)."""
    if _file_work not in _HOOKED:
        sys.addaudithook(_file_work)
        _HOOKED.append(_file_work)


_HOOKED: list[Callable[[str, tuple[Any, ...]], None]] = []


def test_a_refresh_links_only_jobs_whose_folders_changed(tmp_path: Path) -> None:
    """TensorBoard's view is refreshed every 3 s while it runs, and each refresh scanned
    every job's tb/ and tried each link again: 1.6-3 s a pass over 20,000 jobs, the
    launcher's lock held. A job whose folders have not changed since they were linked
    must cost no scan, folder or link; one that changed is linked again."""
    global _FILE_WORK
    runs, logdir = tmp_path / "runs", tmp_path / "view"
    settled = time.time_ns() - 60 * 10**9
    for n in range(20):
        tb = runs / f"job{n:07d}" / "tb"
        (tb / "train").mkdir(parents=True)
        (tb / "plugins" / "profile").mkdir(parents=True)
        for folder in (tb, tb / "plugins"):
            os.utime(folder, ns=(settled, settled))
    logdir.mkdir()
    mirror_logdir(logdir, runs, None)
    assert len(list(logdir.iterdir())) == 20
    _hook_file_work()
    _FILE_WORK = []
    try:
        mirror_logdir(logdir, runs, None)
        assert _FILE_WORK == ["os.scandir", "os.scandir"]  # runs/ and the view: no job's
        # A job that grows a folder, and one that grows a plugin, are linked again.
        (runs / "job0000003" / "tb" / "eval").mkdir()
        (runs / "job0000007" / "tb" / "plugins" / "custom").mkdir()
        _FILE_WORK = []
        mirror_logdir(logdir, runs, None)
        # runs/ and the view, then each of the two: its tb/ and its plugins/ (3 links each)
        assert _FILE_WORK.count("os.scandir") == 2 + 2 * 2, _FILE_WORK
        assert _FILE_WORK.count("os.symlink") == 2 * 3, _FILE_WORK
    finally:
        _FILE_WORK = None
    assert (logdir / "job0000003" / "eval").resolve() == runs / "job0000003" / "tb" / "eval"
    custom = logdir / "job0000007" / "plugins" / "custom"
    assert custom.resolve() == runs / "job0000007" / "tb" / "plugins" / "custom"
    # A view made again at the same path (made beside it, then moved there: another
    # folder) is linked whole, even where it has each job's folder but no link yet.
    remade = tmp_path / "view.next"
    for n in range(20):
        (remade / f"job{n:07d}").mkdir(parents=True)
    shutil.rmtree(logdir)
    remade.rename(logdir)
    mirror_logdir(logdir, runs, None)
    assert (logdir / "job0000011" / "train").resolve() == runs / "job0000011" / "tb" / "train"
    assert len(list(logdir.glob("*/train"))) == 20


@pytest.mark.parametrize(
    "name, folder",
    [
        ("mnist-cnn", "mnist-cnn · 3fkkyci9jr"),
        ("lr=0.1/bs=32 \\ try 2", "lr=0.1_bs=32 _ try 2 · 3fkkyci9jr"),  # no folder inside
        (
            "  ..hidden \u3000 naïve 日本語 ✓  ",
            "hidden naïve 日本語 ✓ · 3fkkyci9jr",
        ),  # no leading dot
        ("a\u202edcba\u2066x\ty\u2028z", "adcbaxyz · 3fkkyci9jr"),  # no bidi or control characters
        ("..", "3fkkyci9jr"),  # nothing left: the id alone
        ("/", "_ · 3fkkyci9jr"),
        ("x" * 200, "x" * 59 + "… · 3fkkyci9jr"),
        ("é" * 200, "é" * 59 + "… · 3fkkyci9jr"),
        ("\U0001f9d1" * 100, "\U0001f9d1" * 44 + "… · 3fkkyci9jr"),  # 180 bytes of name
        ("a · b", "a · b · 3fkkyci9jr"),
        (None, "3fkkyci9jr"),  # no name: a spec.json that cannot be read
    ],
)
def test_a_jobs_folder_in_the_view_is_its_name_made_safe_then_its_id(
    name: str | None, folder: str
) -> None:
    made = view_name("3fkkyci9jr", name)
    assert made == folder
    assert job_of(made) == "3fkkyci9jr"
    assert len(made.encode()) <= 255 and "/" not in made and not made.startswith(".")


def _spec(runs: Path, job_id: str, name: str, *, trace: bool = False) -> Path:
    """A job's run directory as a worker leaves it: its spec.json and a tb/ with a train
    run (and a trace's plugins/profile/)."""
    tb = runs / job_id / "tb"
    (tb / "train").mkdir(parents=True)
    if trace:
        (tb / "plugins" / "profile" / "trace1").mkdir(parents=True)
    (runs / job_id / "spec.json").write_text(json.dumps({"name": name, "steps": 40}))
    return tb


def test_the_view_names_each_job_by_its_spec_and_reads_that_once(tmp_path: Path) -> None:
    """The view's folder of a job is named by its spec.json's `name` then its id; two jobs
    of one name have two folders. The name never changes: spec.json (a MiB, with a
    custom model's params) is read once a job, not at each refresh of a job that writes,
    nor for one whose folders have not changed."""
    global _FILE_WORK
    runs, logdir = tmp_path / "runs", tmp_path / "view"
    _spec(runs, "twinjob001", "twin", trace=True)
    _spec(runs, "twinjob002", "twin")
    (runs / "nospecjob3" / "tb" / "train").mkdir(parents=True)  # no spec.json: the id alone
    logdir.mkdir()
    _hook_file_work()
    _FILE_WORK = []
    try:
        mirror_logdir(logdir, runs, None)
        assert _FILE_WORK.count("spec.json") == 3, _FILE_WORK
        # Each job's tb/ changed just now: linked again at each refresh, its spec not read.
        _FILE_WORK = []
        mirror_logdir(logdir, runs, None)
        mirror_logdir(logdir, runs, None)
        assert _FILE_WORK.count("spec.json") == 2, _FILE_WORK  # the one not there, twice
    finally:
        _FILE_WORK = None
    assert sorted(p.name for p in logdir.iterdir()) == [
        "nospecjob3", "twin · twinjob001", "twin · twinjob002",
    ]  # fmt: skip
    twin = logdir / "twin · twinjob001"
    assert (twin / "train").resolve() == runs / "twinjob001" / "tb" / "train"
    assert (twin / "plugins" / "profile").is_dir()  # a real folder: the profile plugin's
    trace = twin / "plugins" / "profile" / "trace1"
    assert trace.resolve() == runs / "twinjob001" / "tb" / "plugins" / "profile" / "trace1"
    # A spec.json written later (it never is, but a copied run directory may lack one):
    # the job's folder is renamed at its next change, never listed twice.
    (runs / "nospecjob3" / "spec.json").write_text(json.dumps({"name": "late"}))
    (runs / "nospecjob3" / "tb" / "eval").mkdir()
    mirror_logdir(logdir, runs, None)
    assert sorted(p.name for p in logdir.iterdir()) == [
        "late · nospecjob3", "twin · twinjob001", "twin · twinjob002",
    ]  # fmt: skip
    assert sorted(p.name for p in (logdir / "late · nospecjob3").iterdir()) == ["eval", "train"]


def test_a_view_an_older_version_made_is_renamed_in_place(tmp_path: Path) -> None:
    """A view whose folders are named by the job id alone (an older version's) is brought
    to the names: each job once, under its name and id, whether the refresh links it
    again or had already linked it (a folder of the id alone put beside it)."""
    runs, logdir = tmp_path / "runs", tmp_path / "view"
    settled = time.time_ns() - 60 * 10**9
    for job_id in ("oldjob0001", "oldjob0002"):
        tb = _spec(runs, job_id, "old one", trace=True)
        old = logdir / job_id
        (old / "plugins").mkdir(parents=True)
        (old / "train").symlink_to(tb / "train")
        (old / "plugins" / "profile").symlink_to(tb / "plugins" / "profile")
        for folder in (tb, tb / "plugins"):
            os.utime(folder, ns=(settled, settled))
    mirror_logdir(logdir, runs, None)
    assert sorted(p.name for p in logdir.iterdir()) == [
        "old one · oldjob0001", "old one · oldjob0002",
    ]  # fmt: skip
    assert sorted(p.name for p in (logdir / "old one · oldjob0001").iterdir()) == [
        "plugins", "train",
    ]  # fmt: skip
    # Linked, and settled: a folder of its id alone appearing beside it goes all the same.
    (logdir / "oldjob0002" / "train").mkdir(parents=True)
    mirror_logdir(logdir, runs, None)
    assert sorted(p.name for p in logdir.iterdir()) == [
        "old one · oldjob0001", "old one · oldjob0002",
    ]  # fmt: skip
    assert (runs / "oldjob0002" / "tb" / "train").is_dir()  # never what the links lead to


def test_a_refresh_survives_a_job_deleted_while_it_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delete moves the run directory away; one between the refresh's read of a job's tb/
    # and its read of tb/plugins/ failed the refresh (a 500 for a TensorBoard start). The
    # window is microseconds, so the delete is made to fall in it.
    runs, logdir = tmp_path / "runs", tmp_path / "view"
    tb = runs / "doomed" / "tb"
    (tb / "train").mkdir(parents=True)
    (tb / "plugins" / "profile").mkdir(parents=True)
    logdir.mkdir()
    real_scandir = os.scandir

    def scandir(path: Any) -> Any:
        found = real_scandir(path)  # open: it reads on from the folder as it was
        if Path(path) == tb:
            shutil.move(runs / "doomed", tmp_path / "deleting")
        return found

    monkeypatch.setattr(os, "scandir", scandir)
    mirror_logdir(logdir, runs, None)
    monkeypatch.undo()
    assert not (logdir / "doomed" / "plugins" / "profile").exists()
    mirror_logdir(logdir, runs, None)  # the next refresh takes its view away
    assert list(logdir.iterdir()) == []
