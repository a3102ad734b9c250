"""Requests a person gets wrong, against a real service: a body that is not sent as JSON, a
missing body, HEAD on the routes monitors probe, and query parameters no route knows."""

from __future__ import annotations

import json

import pytest

from tests.service.harness import Service, job_spec


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain"],
    ids=["none", "form (curl -d)", "text"],
)
def test_create_job_body_not_sent_as_json_is_415(
    service: Service, content_type: str | None
) -> None:
    # `curl -d @spec.json` without `-H content-type:...` sends a form; `requests.post(url,
    # data=json.dumps(spec))` sends no type at all. Either way the body is good JSON: say
    # what header is missing, not "Input should be a valid dictionary ... Received: b'{...'".
    headers = {"content-type": content_type} if content_type else {}
    before = service.client.get("/api/v1/jobs").json()["count"]
    response = service.client.post(
        "/api/v1/jobs", content=b'{"data": {"format": "synthetic"}}', headers=headers
    )
    assert response.status_code == 415, response.text
    shown = repr(content_type) if content_type else "none"
    assert response.json() == {
        "detail": "Expected the body as JSON, with the header 'Content-Type: application/json'. "
        f"Received: Content-Type {shown}.",
        "errors": [],
    }
    assert service.client.get("/api/v1/jobs").json()["count"] == before


def test_optional_body_not_sent_as_json_is_415(service: Service) -> None:
    # TensorBoard's selection may be left out, but one sent as text is not ignored (that
    # would start TensorBoard over every job instead of the ones asked for).
    response = service.client.post(
        "/api/v1/tensorboard", content=b'{"job_ids": ["x"]}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415, response.text
    assert response.json()["detail"].startswith("Expected the body as JSON")


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [
        ("/api/v1/jobs", {**job_spec(), "batchsize": 8}, "batchsize",
         "Unknown key. Did you mean `batch_size`?"),
        ("/api/v1/jobs", {**job_spec(), "keep": 2}, "keep",
         "Unknown key here: `keep` is a key of `checkpoint`."),
        ("/api/v1/tensorboard", {"job_id": ["x"]}, "job_id", "Unknown key. Did you mean `job_ids`?"),
        ("/api/v1/tensorboard", {"jobs": ["x"]}, "jobs",
         "Unknown key. Remove it or check its spelling. Expected one of: job_ids, merge."),
    ],
    ids=["spec", "spec, another level", "tensorboard", "tensorboard, nothing close"],
)  # fmt: skip
def test_an_unknown_key_in_a_body_gets_the_key_it_is_closest_to(
    service: Service, path: str, body: dict[str, object], field: str, message: str
) -> None:
    response = service.client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [{"field": field, "message": message}]


def test_create_job_json_with_charset_is_accepted(service: Service) -> None:
    spec = job_spec(name="charset", steps=1, data={"format": "npz", "path": "nothing-here.npz"})
    response = service.client.post(
        "/api/v1/jobs",
        content=json.dumps(spec).encode(),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    # Read as JSON: the spec's own error (its data path), not a content type.
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["data.path"]


def test_create_job_without_body(service: Service) -> None:
    response = service.client.post("/api/v1/jobs", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "(spec)", "message": "Expected a JSON body: the job spec. Received: no body"}
    ]


@pytest.mark.parametrize("path", ["/healthz", "/"])
def test_head_on_health_and_dashboard(service: Service, path: str) -> None:
    # Uptime monitors and load balancers often probe with HEAD; it was a 405.
    got = service.client.get(path)
    head = service.client.head(path)
    assert head.status_code == 200, head.text
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))


@pytest.mark.parametrize(
    ("path", "query", "known"),
    [
        ("/api/v1/jobs", "status=running", "state, name, limit, cursor"),
        ("/api/v1/jobs/{id}/logs", "lines=5", "tail, offset, limit"),
        ("/api/v1/jobs/{id}/metrics", "names=loss", "name, after_step, points"),
        ("/api/v1/jobs/{id}/metrics", "name=loss&since=3", "name, after_step, points"),
        ("/api/v1/jobs/{id}", "verbose=1", None),
        ("/api/v1/jobs/{id}/checkpoints", "limit=1", None),
        ("/api/v1/devices", "kind=gpu", None),
        ("/api/v1/tensorboard", "x=1", None),
    ],
)
def test_unknown_query_parameter_is_422(
    service: Service, path: str, query: str, known: str | None
) -> None:
    # A misspelt filter (`status=` for `state=`) was ignored: the whole unfiltered list came
    # back as if it were the answer.
    # The parameters are checked before the job is looked up: no job is needed.
    url = path.format(id="nosuchjob") + "?" + query
    response = service.client.get(url)
    unknown = [part.partition("=")[0] for part in query.split("&")][-1]
    takes = f"this route takes {known}" if known else "this route takes none"
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [
        {
            "field": f"query.{unknown}",
            "message": f"Unknown query parameter; {takes}. Remove it or check its spelling.",
        }
    ]


def test_known_query_parameters_still_work(service: Service) -> None:
    response = service.client.get("/api/v1/jobs", params={"state": "failed", "limit": 1})
    assert response.status_code == 200
    assert service.client.get("/api/v1/jobs/nosuchjob?").status_code == 404  # empty query
    # The TensorBoard proxy passes TensorBoard's own parameters through untouched.
    proxied = service.client.get("/tensorboard/data/runs", params={"experiment": "x"})
    assert proxied.status_code == 503  # not running; not a 422


def test_unknown_job_id_is_not_echoed_whole(service: Service) -> None:
    # A 10 KB "id" came back whole in the 404's message (and in every log that keeps it).
    long_id = "x" * 10_000
    for path in (f"/api/v1/jobs/{long_id}", f"/api/v1/jobs/{long_id}/logs"):
        response = service.client.get(path)
        assert response.status_code == 404
        assert response.json()["detail"] == f"Job '{'x' * 200}...' not found."
    assert service.client.get("/api/v1/jobs/nosuchjob").json()["detail"] == (
        "Job 'nosuchjob' not found."
    )
