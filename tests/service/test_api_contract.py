"""The API's contract: every JSON body a real service sends matches the schema its
/openapi.json declares for that route and status, as clients generated from it read them.

Some routes build their JSON outside FastAPI's `response_model` (a job's JSON is rendered
once and reused: `service.jobjson`; a list of jobs is joined from those), so nothing but
a test like this keeps the documented schema and the bytes sent the same. One service,
stand-in workers that report every field a job's JSON has, jobs in every state; each
body is validated (JSON Schema 2020-12, which OpenAPI 3.1's schemas are) against the
route's schema with every object closed to undeclared keys, and a job's JSON must also
send every key the schema declares, each of them set in at least one of the jobs."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker

from service.jobjson import render_job
from service.store import JobStore
from tests.service.harness import (
    Service,
    job_spec,
    stand_in_checkpoint,
    stand_in_head,
    worker_env,
)
from trainer.spec import JobSpec

# A stand-in worker whose spec's name says what it does. `full` writes every field a
# job's progress and eval can show, stopping twice (`release`) where a later line clears
# some (a preparation's stage; an eval phase's batches), then succeeds with an export;
# `fail` ends with a trace that gave no times and a failure; `killed` is SIGKILLed (the
# error's signal); any other name trains until SIGTERM, as the trainer stops.
CONTRACT_WORKER = stand_in_head(total=10, imports="import os") + (
    """

def wait_release():
    while not stopped and not (job_dir / "release").exists():
        time.sleep(0.05)
    (job_dir / "release").unlink(missing_ok=True)


def result(outcome, code, **more):
    line = {"outcome": outcome, "message": name, "exit_code": code, **more}
    (job_dir / "result.json").write_text(json.dumps({**line, "finished_at": time.time()}))
    sys.exit(code)


if name == "full":
    progress(event="phase", phase="preparing", stage="loading data", stage_done=5,
             stage_total=20)
    wait_release()
data = {"train_examples": 200, "eval_examples": 56, "classes": 4, "image_shape": [8, 8, 1]}
progress(event="start", step=0, phase="starting", towers=1, steps_per_epoch=7, data=data)
print("worker started", flush=True)  # worker.log: a failed job's log_tail
if name == "full":
    progress(event="progress", step=1, phase="training", loss=0.5, accuracy=0.75,
             examples_per_sec=100.0, eta_seconds=9.0, learning_rate=0.001,
             memory_mb=[12.5], tower_ms=[3.0])
    progress(event="trace", step=1, tower_ms=[3.0])
    progress(event="checkpoint", step=1, checkpoint="checkpoints/ckpt-1")
    progress(event="eval", step=1, eval_loss=0.6, eval_accuracy=0.7, eval_examples=56)
    progress(event="phase", step=1, phase="eval", phase_done=1, phase_total=2)
    wait_release()
    progress(event="end", step=10, outcome="succeeded", phase="done")
    result("succeeded", 0, step=10, export="export")
if name == "fail":
    progress(event="trace", step=0, tower_ms_error="no kernels recorded")
    progress(event="end", step=0, outcome="failed", phase="failed")
    result("failed", 1)
if name == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
step = 0
while not stopped:
    time.sleep(0.05)
    step += 1
    progress(event="progress", step=step, phase="training", loss=1 / step)
progress(event="end", step=step, outcome="cancelled", phase="stopped")
result("cancelled", 3, step=step)
"""
)

_API = "/api/v1"
# What a job's JSON sends back as it was submitted (its `spec`): validated against its
# schema like the rest, but its keys are its submitter's (one an optimizer ignores left
# out, `clip_norm` null unless asked for), so not each one sent and set.
AS_SUBMITTED = {"JobSpec"}


class Contract:
    """The service's /openapi.json, to validate what it sends against."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.paths: dict[str, dict[str, Any]] = openapi["paths"]
        # Every object schema closed to keys it does not declare (`additionalProperties`
        # false where a model left it open): a key sent but not declared is drift that a
        # schema left open would pass. Free-form objects (a job's result, a model's
        # params) declare `additionalProperties: true` and stay open.
        self.components = _closed(copy.deepcopy(openapi["components"]))
        self.schemas: dict[str, Any] = self.components["schemas"]
        self.job_bodies: list[dict[str, Any]] = []
        self.checked: set[tuple[str, str, int]] = set()

    def check(self, response: httpx.Response, method: str, path: str) -> Any:
        """Validate `response`'s body against the schema `path` (its template, as
        /openapi.json names it) declares for `method` and the response's status and media
        type; returns the body."""
        operation = self.paths.get(path, {}).get(method.lower())
        assert operation is not None, f"{method} {path} is not in /openapi.json"
        documented = operation["responses"].get(str(response.status_code))
        assert documented is not None, (
            f"{method} {path} answered {response.status_code}, which /openapi.json does not "
            f"declare (it declares {sorted(operation['responses'])}): {response.text[:300]}"
        )
        media = response.headers["content-type"].split(";")[0].strip()
        content = documented.get("content", {})
        assert media in content, (
            f"{method} {path} {response.status_code} sent {media}; /openapi.json declares "
            f"{sorted(content)}"
        )
        body = response.json()
        self.validate(body, content[media]["schema"], f"{method} {path} {response.status_code}")
        self.checked.add((method, path, response.status_code))
        self.job_bodies += self.jobs_in(body, content[media]["schema"])
        return body

    def jobs_in(self, body: Any, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The jobs' JSON in `body`: itself where `schema` is a JobPublic, the items of its
        `data` where that is a list of them (GET /jobs' JobsPublic)."""
        name = _ref_of(schema)
        if name == "JobPublic":
            return [body]
        items = self.schemas.get(name or "", {}).get("properties", {}).get("data", {})
        return list(body["data"]) if _ref_of(items.get("items", {})) == "JobPublic" else []

    def validate(self, body: Any, schema: dict[str, Any], what: str) -> None:
        validator = Draft202012Validator(
            {**schema, "components": self.components}, format_checker=_FORMATS
        )
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        assert not errors, f"{what}: the body does not match /openapi.json:\n" + "\n".join(
            f"  at {'/'.join(map(str, e.absolute_path)) or '(body)'}: {e.message[:300]}"
            for e in errors
        )

    def declared_keys_missing(self, body: Any, name: str, where: str = "") -> list[str]:
        """Where `body`, an instance of schema `name`, lacks a key that schema declares,
        in it or in an object nested in it."""
        schema = self.schemas[name]
        missing = [f"{where}{key}" for key in schema["properties"] if key not in body]
        for key, value in body.items():
            nested = _ref_of(schema["properties"].get(key, {}))
            if nested is not None and nested not in AS_SUBMITTED and isinstance(value, dict):
                missing += self.declared_keys_missing(value, nested, f"{where}{key}.")
        return missing

    def never_set(self, bodies: list[dict[str, Any]], name: str, where: str = "") -> list[str]:
        """The keys of schema `name` (and of objects nested in it) null in every one of
        `bodies`: declared, but never sent with a value."""
        schema = self.schemas[name]
        unset = []
        for key, property_schema in schema["properties"].items():
            values = [body[key] for body in bodies if body.get(key) is not None]
            nested = _ref_of(property_schema)
            if not values:
                unset.append(f"{where}{key}")
            elif nested in AS_SUBMITTED:
                continue
            elif nested is not None and all(isinstance(value, dict) for value in values):
                unset += self.never_set(values, nested, f"{where}{key}.")
        return unset


def _closed(schema: Any) -> Any:
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            _closed(value)
    elif isinstance(schema, list):
        for value in schema:
            _closed(value)
    return schema


def _ref_of(schema: dict[str, Any]) -> str | None:
    """The component a property refers to, alone or beside null (`X | None`)."""
    for option in [schema, *schema.get("anyOf", [])]:
        ref = option.get("$ref")
        if isinstance(ref, str):
            return ref.rsplit("/", 1)[1]
    return None


# jsonschema checks `date-time` only with an optional package installed; checked here
# with what Python reads as ISO 8601, so a time sent as a number or a bare text fails.
_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or datetime.fromisoformat(value).tzinfo is not None


def _first_event(service: Service, path: str) -> tuple[str, str]:
    """The event name and data of the first event on the stream at `path`."""
    event, data = "", ""
    with service.client.stream("GET", path) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data += line.removeprefix("data:").strip()
            elif not line and data:
                return event, data
    raise AssertionError(f"{path} ended before an event")


@pytest.fixture(scope="module")
def every_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Contract]]:
    """A service with a job in each state: succeeded (with eval, checkpoint and export),
    failed (twice: a failure and a kill), cancelled, running (a resumed one with
    checkpoints) and queued behind it; and the bodies its answers sent on the way."""
    folder = tmp_path_factory.mktemp("contract")
    service = Service(
        folder / "data",
        {
            "TOWERBOARD_CRASH_RETRIES": "0",  # a killed worker fails its job at once
            **worker_env(folder, "contract_worker", CONTRACT_WORKER),
        },
    )
    service.start()
    try:
        contract = Contract(service.client.get("/openapi.json").json())
        yield service, contract
    finally:
        service.close()


def _submit(service: Service, contract: Contract, name: str, **changes: Any) -> str:
    response = service.client.post(f"{_API}/jobs", json=job_spec(name=name, **changes))
    assert response.status_code == 201, response.text
    return str(contract.check(response, "POST", f"{_API}/jobs")["id"])


def _read(service: Service, contract: Contract, job_id: str) -> dict[str, Any]:
    response = service.client.get(f"{_API}/jobs/{job_id}")
    job: dict[str, Any] = contract.check(response, "GET", f"{_API}/jobs/{{job_id}}")
    return job


@pytest.fixture(scope="module")
def jobs(every_state: tuple[Service, Contract]) -> dict[str, str]:
    """The ids of the jobs in each state, each job's JSON checked on the way there."""
    service, contract = every_state
    ids = {}
    full = ids["succeeded"] = _submit(service, contract, "full")
    service.wait_for(full, lambda job: (job["progress"] or {}).get("stage") is not None)
    _read(service, contract, full)  # preparing, its stage said
    service.release(full)
    service.wait_for(full, lambda job: (job["progress"] or {}).get("phase_done") is not None)
    _read(service, contract, full)  # an eval under way: its batches said
    service.release(full)
    service.wait_state(full, "succeeded")
    for name in ("fail", "killed"):
        ids[name] = _submit(service, contract, name)
        service.wait_state(ids[name], "failed")
    for state in ("cancelled", "running"):
        ids[state] = _submit(service, contract, "trains")
        service.wait_reported(ids[state])
        # Past step 6, so the resumed attempt, which trains from step 1 again, replaces
        # points a read on after step 6 had (test_metrics_rewound_matches_the_schema).
        service.wait_for(ids[state], lambda job: (job["progress"] or {}).get("step", 0) >= 8)
        cancel = service.client.post(f"{_API}/jobs/{ids[state]}/cancel")
        assert cancel.status_code == 202, cancel.text
        contract.check(cancel, "POST", f"{_API}/jobs/{{job_id}}/cancel")
        service.wait_state(ids[state], "cancelled")
        service.wait_exited(ids[state])
    # Resumed from a checkpoint: queued again, then running its second attempt.
    running = ids["running"]
    stand_in_checkpoint(service, running, 5)
    resume = service.client.post(f"{_API}/jobs/{running}/resume")
    assert resume.status_code == 200, resume.text
    assert contract.check(resume, "POST", f"{_API}/jobs/{{job_id}}/resume")["state"] == "queued"
    service.wait_for(running, lambda job: job["state"] == "running" and job["attempts"] == 2)
    ids["queued"] = _submit(service, contract, "waits")  # behind it: one job slot
    for job_id in ids.values():
        _read(service, contract, job_id)
    return ids


def test_read_jobs_match_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    path = f"{_API}/jobs"
    for query in ("", "?state=queued", "?state=running&state=failed", "?limit=1", "?name=FULL"):
        body = contract.check(service.client.get(path + query), "GET", path)
        assert body["count"] >= 1, query
    # The second page, read on from the first's cursor.
    first = contract.check(service.client.get(f"{path}?limit=2"), "GET", path)
    assert first["next_cursor"] is not None
    second = service.client.get(path, params={"limit": 2, "cursor": first["next_cursor"]})
    assert len(contract.check(second, "GET", path)["data"]) == 2


def test_job_json_sends_every_declared_key(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    for job_id in jobs.values():
        _read(service, contract, job_id)
    assert len(contract.job_bodies) > len(jobs)
    for body in contract.job_bodies:
        missing = contract.declared_keys_missing(body, "JobPublic")
        assert not missing, f"job {body['id']} ({body['state']}) lacks declared {missing}"
    assert {body["state"] for body in contract.job_bodies} >= {
        "queued", "running", "succeeded", "failed", "cancelled"
    }  # fmt: skip
    # Declared but always null would be drift too: each key is set in some job.
    unset = contract.never_set(contract.job_bodies, "JobPublic")
    assert not unset, f"declared but null in every job: {unset}"


def test_job_event_stream_state_matches_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """A job's stream opens with its JSON (`state`): the same JobPublic as GET sends."""
    service, contract = every_state
    event, data = _first_event(service, f"{_API}/jobs/{jobs['succeeded']}/events")
    assert event == "state"
    job = json.loads(data)
    contract.validate(job, {"$ref": "#/components/schemas/JobPublic"}, "the state event")
    assert contract.declared_keys_missing(job, "JobPublic") == []
    assert job == _read(service, contract, jobs["succeeded"])


def test_job_reads_match_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    full, running = jobs["succeeded"], jobs["running"]
    job_path = f"{_API}/jobs/{{job_id}}"
    for query in ("", "?points=10", "?name=loss&after_step=0"):
        response = service.client.get(f"{_API}/jobs/{full}/metrics{query}")
        body = contract.check(response, "GET", f"{job_path}/metrics")
        assert body["series"]["loss"], query
    checkpoints = contract.check(
        service.client.get(f"{_API}/jobs/{running}/checkpoints"), "GET", f"{job_path}/checkpoints"
    )
    assert [checkpoint["step"] for checkpoint in checkpoints["data"]] == [5]
    none = service.client.get(f"{_API}/jobs/{jobs['cancelled']}/checkpoints")
    assert contract.check(none, "GET", f"{job_path}/checkpoints")["data"] == []
    profile = service.client.post(f"{_API}/jobs/{running}/profile", json={"steps": 2})
    assert contract.check(profile, "POST", f"{job_path}/profile")["steps"] == 2
    patch = service.client.patch(f"{_API}/jobs/{jobs['queued']}", json={"priority": 3})
    assert contract.check(patch, "PATCH", job_path)["priority"] == 3


def test_service_reads_match_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    devices = contract.check(service.client.get(f"{_API}/devices"), "GET", f"{_API}/devices")
    assert [device["job_id"] for device in devices["data"]] == [jobs["running"]]
    queue = contract.check(service.client.get(f"{_API}/queue"), "GET", f"{_API}/queue")
    assert [job["id"] for job in queue["data"]] == [jobs["queued"]]
    assert queue["waiting_for"] is not None
    tensorboard = service.client.get(f"{_API}/tensorboard")
    assert contract.check(tensorboard, "GET", f"{_API}/tensorboard")["state"] == "stopped"
    assert contract.check(service.client.get("/healthz"), "GET", "/healthz") == {"status": "ok"}
    stopped = service.client.delete(f"{_API}/tensorboard")
    assert contract.check(stopped, "DELETE", f"{_API}/tensorboard")["state"] == "stopped"


def test_other_bodies_are_sent_as_documented(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """The answers that are no JSON (a log, a CSV, event streams, Prometheus' text) come
    in the media type /openapi.json declares for them."""
    service, contract = every_state
    job_path = f"{_API}/jobs/{{job_id}}"
    full = jobs["succeeded"]
    reads = [
        (f"{_API}/jobs/{jobs['fail']}/logs", f"{job_path}/logs", "worker started"),
        (f"{_API}/jobs/{full}/metrics.csv", f"{job_path}/metrics.csv", "step,"),
        (f"{_API}/jobs/{full}/events", f"{job_path}/events", "event: state"),
        ("/metrics", "/metrics", "towerboard_jobs"),
    ]
    for url, path, text in reads:
        response = service.client.get(url)
        assert response.status_code == 200, (url, response.text)
        media = response.headers["content-type"].split(";")[0].strip()
        declared = contract.paths[path]["get"]["responses"]["200"]["content"]
        assert media in declared, f"GET {path} sent {media}; /openapi.json says {declared}"
        assert text in response.text, (url, response.text[:300])
        contract.checked.add(("GET", path, 200))


def test_error_bodies_match_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    client = service.client
    job_path = f"{_API}/jobs/{{job_id}}"
    refused = [
        (client.get(f"{_API}/jobs/nosuchjob"), "GET", job_path, 404),
        (client.get(f"{_API}/jobs/{jobs['running']}?bogus=1"), "GET", job_path, 422),
        (client.get(f"{_API}/jobs?state=bogus"), "GET", f"{_API}/jobs", 422),
        (client.post(f"{_API}/jobs", json={}), "POST", f"{_API}/jobs", 422),
        (client.delete(f"{_API}/jobs/{jobs['running']}"), "DELETE", job_path, 409),
        (client.post(f"{_API}/jobs/{jobs['queued']}/resume"), "POST", f"{job_path}/resume", 409),
        (client.post(f"{_API}/jobs/{jobs['fail']}/cancel"), "POST", f"{job_path}/cancel", 409),
        (client.get(f"{_API}/jobs/nosuchjob/metrics"), "GET", f"{job_path}/metrics", 404),
        (client.get(f"{_API}/jobs/{jobs['succeeded']}/metrics?name=bogus"), "GET",
         f"{job_path}/metrics", 422),
        (client.get(f"{_API}/jobs/nosuchjob/checkpoints"), "GET", f"{job_path}/checkpoints", 404),
        (client.get(f"{_API}/jobs/nosuchjob/logs"), "GET", f"{job_path}/logs", 404),
        (client.get(f"{_API}/jobs/{jobs['running']}/logs?offset=999999999"), "GET",
         f"{job_path}/logs", 416),
        (client.get(f"{_API}/jobs/{jobs['running']}/logs?tail=0"), "GET", f"{job_path}/logs", 422),
        (client.get(f"{_API}/jobs/{jobs['succeeded']}/checkpoints/nope"), "GET",
         f"{job_path}/checkpoints/{{step}}", 422),
        (client.get(f"{_API}/jobs/{jobs['cancelled']}/export"), "GET", f"{job_path}/export", 404),
        (client.post(f"{_API}/tensorboard", json={"job_ids": ["nosuchjob"]}), "POST",
         f"{_API}/tensorboard", 422),
        (client.get(f"{_API}/queue?limit=0"), "GET", f"{_API}/queue", 422),
        (client.get(f"{_API}/devices?bogus=1"), "GET", f"{_API}/devices", 422),
        (client.post(f"{_API}/jobs", content=b"{}", headers={"content-type": "text/plain"}),
         "POST", f"{_API}/jobs", 415),
        (client.post(f"{_API}/jobs", json={"name": "x" * (1024 * 1024)}), "POST",
         f"{_API}/jobs", 413),
    ]  # fmt: skip
    for response, method, path, status in refused:
        assert response.status_code == status, (method, path, response.text)
        body = contract.check(response, method, path)
        assert body["detail"], (method, path)


def test_a_spec_stored_by_an_earlier_version_matches_the_schema(
    every_state: tuple[Service, Contract], tmp_path: Path
) -> None:
    """A job's `spec` is declared as a JobSpec and sent as it is stored, not validated
    again: one stored before `summaries.activations` existed, keeping an option its
    optimizer ignores (as a store of then kept them), is sent without the field and
    without the option, and still matches the schema."""
    _, contract = every_state
    old = JobSpec.model_validate(job_spec(name="old")).model_dump(mode="json")
    del old["summaries"]["activations"]
    old["optimizer"] = {**old["optimizer"], "name": "adam", "momentum": 0.5}
    store = JobStore(tmp_path / "towerboard.db")
    try:
        job = json.loads(render_job(store.create(old)))
    finally:
        store.close()
    contract.validate(job, {"$ref": "#/components/schemas/JobPublic"}, "a job stored long ago")
    assert "activations" not in job["spec"]["summaries"]  # no default filled in
    assert "momentum" not in job["spec"]["optimizer"]
    assert job["spec"]["optimizer"]["name"] == "adam"


def test_refusals_before_any_route_match_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """What the middlewares answer before a route runs, declared by `service.apidoc` on
    the operations they reach: BrowserGuard's 403 (a browser's cross-origin write; without
    a token on loopback, a Host that is no address) and BodyLimit's 413, a POST's even
    where it reads no body. (A store's 503 and 507 are declared too but not met here: a
    locked store answers only past SQLite's busy timeout, 30 s and no setting; the
    handler's body is checked in test_storage_errors.py.)"""
    service, contract = every_state
    client = service.client
    job_path = f"{_API}/jobs/{{job_id}}"
    evil = {"origin": "http://evil.example"}
    cross_site = {"sec-fetch-site": "cross-site"}
    refused = [
        (client.post(f"{_API}/jobs/nosuchjob/cancel", headers=evil), "POST",
         f"{job_path}/cancel", 403, "Cross-origin POST refused"),
        (client.post(f"{_API}/jobs", json=job_spec(name="evil"), headers=cross_site), "POST",
         f"{_API}/jobs", 403, "Cross-origin POST refused"),
        (client.patch(f"{_API}/jobs/{jobs['queued']}", json={"priority": 9}, headers=evil),
         "PATCH", job_path, 403, "Cross-origin PATCH refused"),
        (client.get(f"{_API}/jobs", headers={"host": "evil.example"}), "GET", f"{_API}/jobs",
         403, "Host 'evil.example' refused"),
        (client.post(f"{_API}/jobs/nosuchjob/cancel", content=b"x" * (1024 * 1024 + 1)), "POST",
         f"{job_path}/cancel", 413, "Request body too large"),
    ]  # fmt: skip
    for response, method, path, status, words in refused:
        assert response.status_code == status, (method, path, response.text)
        assert words in contract.check(response, method, path)["detail"], (method, path)
    assert _read(service, contract, jobs["queued"])["priority"] != 9  # nothing was changed
    # Monitors probe /healthz by any name, and it declares no 403.
    health = client.get("/healthz", headers={"host": "evil.example"})
    assert contract.check(health, "GET", "/healthz") == {"status": "ok"}


def test_a_method_no_operation_declares_is_refused_naming_those_declared(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """A 405 answers a method that no operation of its path declares, so no operation can
    declare it; its body is ErrorPublic as every error's, and its `Allow` names the
    methods /openapi.json declares there (HEAD with GET: `service.headmethod`), so a
    client generated from it never sends one that gets a 405."""
    service, contract = every_state
    for path, operations in contract.paths.items():
        url = path.replace("{job_id}", jobs["succeeded"]).replace("{step}", "latest")
        response = service.client.put(url, json={})
        assert response.status_code == 405, (path, response.status_code, response.text)
        assert "put" not in operations, path
        contract.validate(response.json(), {"$ref": "#/components/schemas/ErrorPublic"}, path)
        declared = {method.upper() for method in operations} | (
            {"HEAD"} if "get" in operations else set()
        )
        allowed = set(response.headers["allow"].split(", "))
        assert allowed == declared, f"{path}: Allow {sorted(allowed)}, declared {sorted(declared)}"
        assert response.headers["allow"] in response.json()["detail"], path


def test_head_answers_are_declared_without_a_body(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """A HEAD answer is a GET's head, with no body: no HEAD operation declares one, and
    each status a HEAD gets is declared."""
    service, contract = every_state
    with_body = [
        f"HEAD {path} {status}"
        for path, operations in contract.paths.items()
        for status, answer in operations.get("head", {}).get("responses", {}).items()
        if answer.get("content")
    ]
    assert not with_body, f"HEAD answers declared with a body: {with_body}"
    job_path = f"{_API}/jobs/{{job_id}}"
    heads = [
        ("/healthz", "/healthz", 200),
        (f"{_API}/jobs/{jobs['running']}/checkpoints/5", f"{job_path}/checkpoints/{{step}}", 200),
        (f"{_API}/jobs/{jobs['cancelled']}/export", f"{job_path}/export", 404),
        (f"{_API}/jobs/nosuchjob/checkpoints/latest", f"{job_path}/checkpoints/{{step}}", 404),
    ]
    for url, path, status in heads:
        response = service.client.head(url)
        assert response.status_code == status, (url, response.status_code)
        assert response.content == b"", url
        responses = contract.paths[path]["head"]["responses"]
        assert str(status) in responses, f"HEAD {path} answered {status}; declared {responses}"


def test_metrics_rewound_matches_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """A read on from a revision the series has moved past: the 409 says where to read
    again from (RewoundPublic), not only why."""
    service, contract = every_state
    path = f"{_API}/jobs/{jobs['running']}/metrics"
    # The resumed attempt trained its steps after checkpoint 5 again: revision 0's points
    # past it are not the job's now.
    # Its first attempt reached step 8 (the fixture): the revision moves on at the resumed
    # attempt's first reported step, which may be a moment after it started.
    deadline = time.monotonic() + 30
    while (
        response := service.client.get(path, params={"after_step": 6, "revision": 0})
    ).status_code == 200:
        assert time.monotonic() < deadline, (
            f"no resumed step replaced a point: {response.text[:200]}"
        )
        time.sleep(0.1)
    assert response.status_code == 409, response.text
    body = contract.check(response, "GET", f"{_API}/jobs/{{job_id}}/metrics")
    assert body["read_again_after"] <= 6


def test_cancel_of_a_queued_job_matches_the_schema(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    service, contract = every_state
    queued = _submit(service, contract, "waits")
    cancel = service.client.post(f"{_API}/jobs/{queued}/cancel")
    assert cancel.status_code == 200, cancel.text
    assert contract.check(cancel, "POST", f"{_API}/jobs/{{job_id}}/cancel")["state"] == "cancelled"


def test_refusal_without_the_token_matches_the_schema(tmp_path: Path) -> None:
    """With TOWERBOARD_TOKEN set, a request without it gets the 401 every secured
    operation declares."""
    service = Service(tmp_path / "data", {"TOWERBOARD_TOKEN": "contract-token"})
    service.start()
    try:
        contract = Contract(service.client.get("/openapi.json").json())
        for method, path in [("GET", f"{_API}/jobs"), ("POST", f"{_API}/jobs/{{job_id}}/cancel")]:
            url = path.replace("{job_id}", "nosuchjob")
            response = httpx.request(method, service.base_url + url)
            assert response.status_code == 401, response.text
            assert "Missing bearer token" in contract.check(response, method, path)["detail"]
        # With a token any Host is answered: only a browser's cross-origin write gets a 403.
        assert "403" not in contract.paths[f"{_API}/jobs"]["get"]["responses"]
        assert "403" in contract.paths[f"{_API}/jobs"]["post"]["responses"]
    finally:
        service.close()


# The successful answers with a body not checked above, and why.
UNCHECKED = {
    # Starts a real TensorBoard (seconds, and a process per test run); its answer is
    # the TensorBoardPublic that GET and DELETE send, from the same function.
    ("POST", f"{_API}/tensorboard", 200): "starts TensorBoard",
    ("POST", f"{_API}/tensorboard", 201): "starts TensorBoard",
    ("GET", f"{_API}/events", 200): "an endless stream, of the events checked per job",
    ("GET", f"{_API}/jobs/{{job_id}}/checkpoints/{{step}}", 200): "a .tar.gz",
    ("GET", f"{_API}/jobs/{{job_id}}/checkpoints/{{step}}", 206): "a part of a .tar.gz",
    ("GET", f"{_API}/jobs/{{job_id}}/export", 200): "a .tar.gz",
    ("GET", f"{_API}/jobs/{{job_id}}/export", 206): "a part of a .tar.gz",
}


def test_every_answer_with_a_body_was_checked(
    every_state: tuple[Service, Contract], jobs: dict[str, str]
) -> None:
    """Each 2xx answer /openapi.json declares a body for was checked by a test above (they
    run in this file's order), or is named in UNCHECKED: a route added later gets checked."""
    _, contract = every_state
    declared = {
        (method.upper(), path, int(status))
        for path, operations in contract.paths.items()
        for method, operation in operations.items()
        for status, response in operation["responses"].items()
        if status.startswith("2") and response.get("content") and method != "head"
    }
    missed = declared - contract.checked - UNCHECKED.keys()
    assert not missed, f"answers not checked against /openapi.json: {sorted(missed)}"
