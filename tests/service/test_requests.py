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
        ("/api/v1/jobs/{id}/metrics", "names=loss", "name, after_step, points, revision"),
        ("/api/v1/jobs/{id}/metrics", "name=loss&since=3", "name, after_step, points, revision"),
        ("/api/v1/jobs/{id}/metrics.csv", "points=5", "name, after_step, revision"),
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


# A key given twice: Python's json keeps the last value and drops the other silently; the
# service refuses it (service/jsonbody.py), naming the key where it is, on every body.
TWICE = "Give each key once: only one of its values would be kept."


def test_every_body_refuses_a_key_given_twice(service: Service) -> None:
    # Every operation with a body, read from the API's own description: a route added
    # later is checked too. Its path's job need not exist: the body is read first.
    paths = service.client.get("/openapi.json").json()["paths"]
    with_body = sorted(
        (method.upper(), path.replace("{job_id}", "nosuchjob"))
        for path, operations in paths.items()
        for method, operation in operations.items()
        if "requestBody" in operation
    )
    assert {path for _, path in with_body} >= {
        "/api/v1/jobs",
        "/api/v1/jobs/nosuchjob/resume",
        "/api/v1/jobs/nosuchjob/profile",
        "/api/v1/tensorboard",
    }
    before = service.client.get("/api/v1/jobs").json()["count"]
    for method, path in with_body:
        response = service.client.request(
            method,
            path,
            content=b'{"steps": 5,\n "steps": 7}',
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422, (path, response.text)
        assert response.json() == {
            "detail": "Invalid request: 1 error; see `errors`.",
            "errors": [
                {
                    "field": "steps",
                    "message": "Duplicate key here: given at line 1 column 2 and again at "
                    f"line 2 column 2. {TWICE}",
                }
            ],
        }, path
    assert service.client.get("/api/v1/jobs").json()["count"] == before


@pytest.mark.parametrize(
    ("text", "field", "places"),
    [
        ('{"data": {"format": "synthetic"}, "steps": 5, "steps": 7}', "steps",
         "line 1 column 35 and again at line 1 column 47"),
        ('{\n  "name": "x",\n  "data": {"format": "synthetic"},\n'
         '  "model": {"name": "mlp", "params": {\n    "hidden": [8],\n    "hidden": [16]}}\n}',
         "model.params.hidden", "line 5 column 5 and again at line 6 column 5"),
        ('{"data": {"format": "synthetic"}, "model": {"name": "m:f", "params": '
         '{"layers": [{"units": 2}, {"units": 4, "\\u0075nits": 8}]}}}',
         "model.params.layers.1.units", "line 1 column 97 and again at line 1 column 109"),
    ],
    ids=["top level", "nested", "in a list, escaped"],
)  # fmt: skip
def test_a_spec_giving_a_key_twice_is_422_naming_it_and_where(
    service: Service, text: str, field: str, places: str
) -> None:
    response = service.client.post(
        "/api/v1/jobs", content=text.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [
        {"field": field, "message": f"Duplicate key here: given at {places}. {TWICE}"}
    ]


def test_one_key_in_two_objects_is_no_duplicate(service: Service) -> None:
    # `name` at the top and in `model`, `every_steps` in `eval` and `checkpoint`.
    text = (
        '{"name": "twice-ok", "model": {"name": "mlp", "params": {"hidden": [4]}}, '
        '"data": {"format": "synthetic", "params": {"shape": [4, 4], "classes": 2, '
        '"size": 64}}, "steps": 1, "eval": {"every_steps": 0}, '
        '"checkpoint": {"every_steps": 0}}'
    )
    response = service.client.post(
        "/api/v1/jobs", content=text.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 201, response.text
    spec = response.json()["spec"]
    assert (spec["name"], spec["model"]["name"]) == ("twice-ok", "mlp")
    assert (spec["eval"]["every_steps"], spec["checkpoint"]["every_steps"]) == (0, 0)
    service.client.post(f"/api/v1/jobs/{response.json()['id']}/cancel")
