"""`GET /api/v1/jobs/{id}/metrics.csv`: a job's series as the CSV file `towerboard metrics
ID` prints, byte for byte (one writer, `service.metricscsv`), saved as `<job name>-<id>-
metrics.csv`, read as a stream in step order (`stream_metrics(by_step=True)`), and refused
as /metrics refuses. The real job's CSV is checked in test_client (its tiny job)."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.downloads import attachment, job_attachment, job_file_name
from service.metricscsv import csv_rows, header, stream_rows
from service.progress import SERIES
from service.series import Row
from service.store import JobState, JobStore, MetricPoint
from tests.service.harness import ROOT, Service, job_spec, stand_in_service
from tests.service.test_client import towerboard
from tests.service.test_metrics_read_on import EVALUATING_WORKER, running
from tests.service.test_volume import _peak_rss_mb, stalled_read_lets_go, stored_long_job
from trainer.spec import JobSpec

# Name lists a person would give: none (every series with points), two in another order
# than the service's, one given twice, one with no points at all, and every series.
NAME_LISTS: list[tuple[str, ...]] = [
    (),
    ("loss", "eval_accuracy"),
    ("eval_loss", "loss", "eval_loss"),
    ("accuracy", "loss"),  # the stand-in reports no accuracy: an empty column
    SERIES,
]


def cli_csv(service: Service, job_id: str, names: tuple[str, ...]) -> str:
    """`towerboard metrics ID --name ...`: its standard output."""
    options = [word for name in names for word in ("--name", name)]
    result = towerboard("metrics", job_id, *options, url=service.base_url)
    assert result.returncode == 0, result.stderr
    return result.stdout


def service_csv(service: Service, job_id: str, names: tuple[str, ...]) -> bytes:
    response = service.client.get(
        f"/api/v1/jobs/{job_id}/metrics.csv", params={"name": list(names)}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    return response.content


def test_the_csv_is_the_clis_byte_for_byte_before_and_after_the_eval(tmp_path: Path) -> None:
    """The stand-in evaluates at 20 and 40: between a step's line and its eval the step is
    held back from an exact read (of eval series), in the CSV as in the CLI's read."""
    with stand_in_service(tmp_path, ("evaluating_worker", EVALUATING_WORKER)) as service:
        job_id = service.submit(job_spec(name="csv-evals"))["id"]
        service.wait_for(job_id, lambda job: (job["progress"] or {}).get("step") == 20,
                         timeout=60, what="step 20")  # fmt: skip
        # 20 waits for its eval: left out wherever an eval series is read.
        assert service_csv(service, job_id, ("loss", "eval_accuracy")) == (
            b"step,loss,eval_accuracy\n10,0.1,\n"
        )
        assert service_csv(service, job_id, ("loss",)) == b"step,loss\n10,0.1\n20,0.05\n"
        for names in NAME_LISTS:
            assert service_csv(service, job_id, names).decode() == cli_csv(service, job_id, names)

        service.release(job_id)
        service.wait_for(job_id, lambda job: (job["eval"] or {}).get("step") == 20,
                         timeout=60, what="the eval of 20")  # fmt: skip
        service.release(job_id)
        service.wait_state(job_id, "succeeded", timeout=60)
        whole = service_csv(service, job_id, ("loss", "eval_accuracy"))
        assert (
            whole
            == (
                f"step,loss,eval_accuracy\n10,0.1,\n20,0.05,0.1\n30,{1 / 30!r},\n40,0.025,0.2\n"
            ).encode()
        )
        for names in NAME_LISTS:
            assert service_csv(service, job_id, names).decode() == cli_csv(service, job_id, names)
        # Without a name: the series with points, by name, as the CLI's columns are.
        every = service_csv(service, job_id, ()).decode()
        assert every.splitlines()[0] == "step,eval_accuracy,eval_loss,loss"

        # Refused as the JSON route refuses, with its answers.
        url = f"/api/v1/jobs/{job_id}"
        for query in ({"name": ["loss", "los"]}, {"name": "eval_los"}):
            csv_answer = service.client.get(f"{url}/metrics.csv", params=query)
            json_answer = service.client.get(f"{url}/metrics", params=query)
            assert csv_answer.status_code == json_answer.status_code == 422
            assert csv_answer.json() == json_answer.json()
            assert "Expected one of loss, " in csv_answer.text
        gone = service.client.get("/api/v1/jobs/nosuchjob0/metrics.csv")
        assert gone.status_code == 404
        assert gone.json() == service.client.get("/api/v1/jobs/nosuchjob0/metrics").json()
        # Points thin a chart: a file does not take them.
        thinned = service.client.get(f"{url}/metrics.csv", params={"points": 100})
        assert thinned.status_code == 422 and thinned.json()["errors"][0]["field"] == (
            "query.points"
        ), thinned.text


def test_a_job_without_points_gives_the_header_alone(make_service: Callable[..., Service]) -> None:
    """Where the CLI prints nothing (and says on stderr there are no metrics yet), the
    file is a CSV of no rows: its header."""
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="empty")).model_dump(mode="json"))
    store.cancel_queued(job.id)
    store.close()
    service.start()
    assert service_csv(service, job.id, ()) == b"step\n"
    assert service_csv(service, job.id, ("loss", "eval_loss")) == b"step,loss,eval_loss\n"
    result = towerboard("metrics", job.id, url=service.base_url)
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"job {job.id} has no metrics yet\n"


def test_the_csv_reads_on_after_a_step_as_the_json_route_does(
    make_service: Callable[..., Service],
) -> None:
    """`after_step` (and `revision`) on the CSV: the rows after the step under the header,
    the CLI's `--after-step` rows byte for byte, and refused as /metrics refuses, with its
    answers: a bad step, a revision alone or to come, and a read on past a step a resume
    changed (a 409 saying where to read again from). The revision comes in a header."""
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job_id, worker = running(
        store, JobSpec.model_validate(job_spec(name="on")).model_dump(mode="json")
    )
    for step in (10, 20, 30):
        worker.report(step)
        if step == 20:
            worker.evaluate(20)
    assert store.requeue(job_id, crashed=True)  # died at 30; its checkpoint is of 20
    worker.restart(20)
    worker.write("progress", 30, loss=0.125, accuracy=0.5)
    worker.report(40)
    worker.evaluate(40)
    assert store.finish(job_id, JobState.SUCCEEDED, result={}, error=None)
    store.close()
    service.start()
    url = f"/api/v1/jobs/{job_id}"
    names = {"name": ["loss", "eval_loss"]}

    def both(params: dict[str, Any]) -> tuple[Any, Any]:
        return (
            service.client.get(f"{url}/metrics.csv", params={**names, **params}),
            service.client.get(f"{url}/metrics", params={**names, **params}),
        )

    csv_answer, json_answer = both({"after_step": 20, "revision": 1})
    assert csv_answer.status_code == 200, csv_answer.text
    assert csv_answer.content == b"step,loss,eval_loss\n30,0.125,\n40,0.025,0.05\n"
    assert csv_answer.headers["x-metrics-revision"] == "1" == str(json_answer.json()["revision"])
    cli = towerboard(
        "metrics", job_id, "--name", "loss", "--name", "eval_loss", "--after-step", "20",
        "--revision", "1", url=service.base_url,
    )  # fmt: skip
    assert (cli.returncode, cli.stdout) == (0, csv_answer.text), cli.stderr
    # Nothing after the last step: the header alone.
    assert both({"after_step": 40, "revision": 1})[0].content == b"step,loss,eval_loss\n"
    # Without names: the series with points after the step, as the CLI's columns are.
    every = service.client.get(f"{url}/metrics.csv", params={"after_step": 30, "revision": 1})
    assert every.text.splitlines()[0] == "step,accuracy,eval_accuracy,eval_loss,loss"
    assert service.client.get(f"{url}/metrics.csv").headers["x-metrics-revision"] == "1"

    # Read on past 20 from revision 0 (or none given): 30 changed since.
    for read_on in ({"after_step": 30}, {"after_step": 30, "revision": 0}):
        csv_answer, json_answer = both(read_on)
        assert csv_answer.status_code == json_answer.status_code == 409, csv_answer.text
        assert csv_answer.json() == json_answer.json()
        assert (csv_answer.json()["read_again_after"], csv_answer.json()["revision"]) == (20, 1)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"after_step": -1}, "query.after_step"),
        ({"after_step": "ten"}, "query.after_step"),
        ({"after_step": 2**63}, "query.after_step"),
        ({"revision": 1}, "query.revision"),  # without after_step
        ({"after_step": 20, "revision": 2}, "query.revision"),  # past the job's
        ({"after_step": 20, "revision": -1}, "query.revision"),
    ]
    for params, field in bad:
        csv_answer, json_answer = both(params)
        assert csv_answer.status_code == json_answer.status_code == 422, (params, csv_answer.text)
        assert csv_answer.json() == json_answer.json()
        assert csv_answer.json()["errors"][0]["field"] == field, csv_answer.text
    assert "Expected after_step beside it" in both({"revision": 0})[0].text
    assert (
        "Expected at most 1, the latest revision" in both({"after_step": 0, "revision": 5})[0].text
    )


@pytest.mark.parametrize(
    ("name", "saved", "disposition"),
    [
        (
            "mnist-cnn",
            "mnist-cnn-ID-metrics.csv",
            'attachment; filename="mnist-cnn-ID-metrics.csv"',
        ),
        (
            "two words",
            "two words-ID-metrics.csv",
            'attachment; filename="two words-ID-metrics.csv"',
        ),
        (  # each run of what was replaced as one `_`, none at the ends
            'a/b\\c "q" <x>:y|z?*',
            "a_b_c _q_ _x_y_z-ID-metrics.csv",
            'attachment; filename="a_b_c _q_ _x_y_z-ID-metrics.csv"',
        ),
        ("my__run_", "my_run-ID-metrics.csv", 'attachment; filename="my_run-ID-metrics.csv"'),
        ("-run-.", "run-ID-metrics.csv", 'attachment; filename="run-ID-metrics.csv"'),
        ("..hidden", "hidden-ID-metrics.csv", 'attachment; filename="hidden-ID-metrics.csv"'),
        ("..", "ID-metrics.csv", 'attachment; filename="ID-metrics.csv"'),  # nothing left
        (None, "ID-metrics.csv", 'attachment; filename="ID-metrics.csv"'),
        # Nothing safe left: the id alone, not `___-ID-metrics.csv`.
        ("???", "ID-metrics.csv", 'attachment; filename="ID-metrics.csv"'),
        ('<"|"> _ . -', "ID-metrics.csv", 'attachment; filename="ID-metrics.csv"'),
        (
            "日本",  # saved whole by a browser (filename*); the id alone in the ASCII name
            "日本-ID-metrics.csv",
            'attachment; filename="ID-metrics.csv"; '
            "filename*=UTF-8''%E6%97%A5%E6%9C%AC-ID-metrics.csv",
        ),
        (
            "naïve 100% 日本",
            "naïve 100% 日本-ID-metrics.csv",
            'attachment; filename="na_ve 100-ID-metrics.csv"; '
            "filename*=UTF-8''na%C3%AFve%20100%25%20%E6%97%A5%E6%9C%AC-ID-metrics.csv",
        ),
        (  # cut as a TensorBoard run's name; the ellipsis not in the ASCII name
            "x" * 200,
            "x" * 59 + "…-ID-metrics.csv",
            f'attachment; filename="{"x" * 59}-ID-metrics.csv"; '
            f"filename*=UTF-8''{'x' * 59}%E2%80%A6-ID-metrics.csv",
        ),
        ("a\u202eb\u2066c", "abc-ID-metrics.csv", 'attachment; filename="abc-ID-metrics.csv"'),
    ],
)
def test_the_file_name_is_the_jobs_name_made_safe_then_its_id(
    name: str | None, saved: str, disposition: str
) -> None:
    assert job_file_name(name, "ID", "metrics.csv") == saved
    header_value = job_attachment(name, "ID", "metrics.csv")
    header_value.encode("latin-1")  # a header Starlette can send
    assert header_value == disposition
    # A file name of no job (an archive's) is sent as it is, or made ASCII where it is not.
    assert attachment("ID-export.tar.gz") == 'attachment; filename="ID-export.tar.gz"'
    assert attachment("日本.csv") == (
        "attachment; filename=\"__.csv\"; filename*=UTF-8''%E6%97%A5%E6%9C%AC.csv"
    )


def test_the_service_names_the_file_by_the_job(make_service: Callable[..., Service]) -> None:
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    jobs = []
    for name in ('cifar "v2"/ü', "???"):
        spec = JobSpec.model_validate(job_spec(name=name)).model_dump(mode="json")
        jobs.append(store.create(spec))
        store.cancel_queued(jobs[-1].id)
    store.close()
    service.start()
    dispositions = []
    for job in jobs:
        response = service.client.get(f"/api/v1/jobs/{job.id}/metrics.csv")
        assert response.status_code == 200, response.text
        dispositions.append(response.headers["content-disposition"])
    assert dispositions == [
        f'attachment; filename="cifar _v2-{jobs[0].id}-metrics.csv"; '
        f"filename*=UTF-8''cifar%20_v2_%C3%BC-{jobs[0].id}-metrics.csv",
        f'attachment; filename="{jobs[1].id}-metrics.csv"',
    ]


def test_rows_in_step_order_are_the_csv_of_the_json_read(tmp_path: Path) -> None:
    """`stream_metrics(by_step=True)` gives the exact read's points in step order, and its
    CSV is the one the CLI makes of the JSON read (`csv_rows`): steps no series shares, a
    series with points at a few steps alone, a series named twice or with no points."""
    store = JobStore(tmp_path / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="pivot")).model_dump(mode="json"))
    points = [MetricPoint("loss", k, float(k), 1 / k) for k in range(1, 301, 3)]
    points += [MetricPoint("accuracy", k, float(k), k / 1000) for k in range(2, 301, 7)]
    points += [MetricPoint("eval_loss", k, float(k), 2 / k) for k in (100, 200, 300)]
    points += [MetricPoint("learning_rate", 5, 5.0, 0.1)]
    store.record_progress(job.id, offset=0, progress=None, eval=None, points=points)
    store.cancel_queued(job.id)  # ended: nothing held back
    for names in [(), ("eval_loss", "loss"), ("examples_per_sec",), ("loss", "loss")]:
        rows = store.stream_metrics(job.id, names=names, by_step=True)
        read: list[Row] = [(name, step, time, value) for name, step, time, value in rows]
        assert [row[1] for row in read] == sorted(row[1] for row in read)
        assert sorted(read) == sorted(
            (p.name, p.step, p.time, p.value) for p in store.metrics(job.id, names=names)
        )
        series: dict[str, list[dict[str, Any]]] = {}
        for point in store.metrics(job.id, names=names):
            series.setdefault(point.name, []).append({"step": point.step, "value": point.value})
        assert rows.series == sorted(series)
        columns = list(dict.fromkeys(names)) or sorted(series)
        assert "".join(stream_rows(read, columns)) == csv_rows(series, columns)[0]
    store.close()


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        ("service.metricscsv", {"httpx", "fastapi", "starlette", "tensorflow"}),
        ("service.client.metricsfile", {"fastapi", "starlette", "tensorflow"}),
    ],
)
def test_the_csvs_writer_loads_neither_side_of_the_other(module: str, not_loaded: set[str]) -> None:
    """The client imports the CSV's writer without FastAPI, the service without httpx."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    loaded = {name.split(".")[0] for name in json.loads(output)}
    assert module in json.loads(output) and not loaded & not_loaded, loaded & not_loaded


def test_a_long_jobs_csv_is_sent_without_holding_its_rows(
    make_service: Callable[..., Service],
) -> None:
    """Every point of 5 series of 100,000 steps, a row a step: sent as read, a step at a
    time, what the service holds does not grow with the job (the JSON route's bound)."""
    service = make_service()
    reports = 100_000
    names = ("loss", "accuracy", "examples_per_sec", "learning_rate", "eval_loss")
    job_id = stored_long_job(service, names, reports)
    service.start()
    assert service.process is not None
    url = f"/api/v1/jobs/{job_id}/metrics.csv"
    service.client.get(url, params={"name": "loss"})  # warm
    before = _peak_rss_mb(service.process.pid)
    response = service.client.get(url)
    grown = _peak_rss_mb(service.process.pid) - before
    assert response.status_code == 200
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["step", "accuracy", "eval_loss", "examples_per_sec", "learning_rate", "loss"]
    assert len(rows) == reports + 1 and rows[1][0] == "1" and rows[-1][0] == str(reports)
    assert rows[-1][1:] == [repr(1.0 / reports)] * 5
    assert grown < 60, f"the service grew by {grown:.0f} MB to send {5 * reports} points"
    assert response.text.startswith(header(rows[0][1:]))


def test_a_csv_its_client_leaves_stalled_lets_go_of_the_store(
    make_service: Callable[..., Service],
) -> None:
    """As /metrics' stream (test_volume): a download stopped mid-file and then dropped
    closes the CSV's read of the store, its cursor a series and their connection, so
    SQLite can checkpoint its WAL past it."""
    service = make_service()
    job_id = stored_long_job(service, ("loss", "eval_loss"), 150_000)
    service.start()
    path = f"/api/v1/jobs/{job_id}/metrics.csv"
    assert stalled_read_lets_go(service, job_id, path), (
        "the CSV's read stayed open after its client"
    )


def test_an_infinity_stored_by_an_older_service_is_no_point_in_either_csv(
    make_service: Callable[..., Service],
) -> None:
    """Before the service took a non-finite number in a progress line as no value it stored
    infinities. The store reads them back, the API's JSON gives them as null: the CSV said
    `inf` where the CLI said `None` (a row `metrics --into` then refused to read on after).
    Each leaves them out, as no point; a step of nothing else has no row. So does the
    JSON, read whole or thinned for a chart: it sent them as null, against its schema."""
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create(JobSpec.model_validate(job_spec(name="inf")).model_dump(mode="json"))
    loss = [(1, math.inf), (3, -math.inf), (5, 1e-300), (6, 0.5)]
    points = [MetricPoint("loss", step, float(step), value) for step, value in loss]
    points += [MetricPoint("accuracy", step, float(step), step / 10) for step in (2, 3, 7)]
    store.record_progress(job.id, offset=0, progress=None, eval=None, points=points)
    store.cancel_queued(job.id)
    store.close()
    service.start()
    for params in ({}, {"points": 2}, {"after_step": 0}):
        response = service.client.get(f"/api/v1/jobs/{job.id}/metrics", params=params)
        assert response.status_code == 200, response.text
        loss = [(p["step"], p["value"]) for p in response.json()["series"]["loss"]]
        assert loss == [(5, 1e-300), (6, 0.5)], params
    expected = "step,accuracy,loss\n2,0.2,\n3,0.3,\n5,,1e-300\n6,,0.5\n7,0.7,\n"
    assert service_csv(service, job.id, ()).decode() == expected
    assert cli_csv(service, job.id, ()) == expected
    for names in (("loss",), ("loss", "accuracy")):
        assert service_csv(service, job.id, names).decode() == cli_csv(service, job.id, names)
    into = service.data_dir.parent / "run.csv"
    for _ in range(2):  # made, then read on after its last row
        options = ("--name", "accuracy", "--name", "loss")
        result = towerboard("metrics", job.id, *options, "--into", str(into), url=service.base_url)
        assert result.returncode == 0, result.stderr
    assert into.read_text() == expected
