"""The `towerboard` client verbs as a person runs them, against a real service with real
workers: submit --watch to the end, status, logs, cancel, checkpoints and download,
tensorboard, the token, and one-line errors with their exit codes."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client import display
from service.store import JobStore
from tests.service.harness import (
    ROOT,
    Service,
    fake_worker_env,
    free_port,
    job_spec,
    kill_processes_under,
    long_job,
    processes_under,
    stand_in_checkpoint,
    stepping_worker_env,
)
from trainer.spec import JobSpec

pytestmark = pytest.mark.slow


def cli_env(url: str | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with TOWERBOARD_URL=url and no token unless `env` gives one."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    if url is not None:
        clean["TOWERBOARD_URL"] = url
    return {**clean, **(env or {})}


def towerboard(
    *args: str, url: str | None, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `towerboard ARGS` with TOWERBOARD_URL=url and no token unless `env` gives one."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT, env=cli_env(url, env), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def towerboard_in_background(*args: str, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT, env=cli_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("towerboard: error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def watched(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny job submitted with `submit --watch` and followed to its end."""
    spec = tmp_path_factory.mktemp("specs") / "tiny.json"
    spec.write_text(json.dumps(job_spec(name="cli-tiny")))
    result = towerboard("submit", str(spec), "--watch", url=service.base_url)
    job_id = result.stdout.strip()
    return {"result": result, "id": job_id, "job": service.job(job_id)}


def test_submit_watch_until_succeeded(watched: dict[str, Any]) -> None:
    result = watched["result"]
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"[a-z2-9]{10}", watched["id"]), result.stdout
    assert watched["job"]["state"] == "succeeded"
    assert f"submitted 'cli-tiny' as job {watched['id']} (queued)" in result.stderr
    # The bar (one line per phase when stderr is not a terminal) reaches the end.
    assert "[########################] 100.0% succeeded step 40/40 loss " in result.stderr
    assert re.search(r"\[#*-+\]\s+\d+\.\d% running \(\w+\) step \d+/40", result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        # The duration reads 42s, or 1m02s on a loaded machine.
        rf"{watched['id']} succeeded in (\d+m)?\d+s: step 40/40, train loss [\d.e-]+, "
        r"train accuracy [\d.]+%, eval accuracy [\d.]+%",
        last,
    ), last


def test_status_lists_and_shows_job(service: Service, watched: dict[str, Any]) -> None:
    job_id = watched["id"]
    listing = towerboard("status", url=service.base_url)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == [
        "ID", "NAME", "STATE", "PROGRESS", "STEP", "LOSS", "EVAL", "EX/S", "ETA", "DEVICES", "AGE",
    ]  # fmt: skip
    row = next(line for line in rows if line.startswith(job_id))
    assert row.split()[1:5] == ["cli-tiny", "succeeded", "100%", "40/40"]
    # EVAL is its held-out accuracy, not its last training batch's.
    job = watched["job"]
    assert row.split()[6] == f"{100 * job['eval']['accuracy']:.1f}%", (row, job["eval"])

    only_failed = towerboard("status", "--state", "failed", url=service.base_url)
    assert only_failed.stdout == "no jobs failed\n"

    one = towerboard("status", job_id, url=service.base_url)
    assert one.returncode == 0, one.stderr
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in one.stdout.splitlines())
    assert fields["state"] == "succeeded"
    assert fields["progress"] == "40/40 (100.0%)"
    # The last training batch's, named so beside the eval's.
    assert fields["train accuracy"].endswith("%") and "accuracy" not in fields
    assert fields["eval accuracy"] == f"{watched['job']['eval']['accuracy'] * 100:.1f}%"
    assert fields["checkpoint"] == "checkpoints/ckpt-40"
    # An ended job holds none; what it ran on is still said.
    assert fields["devices"] == "ran on cpu:0 (1 tower)"
    assert fields["phase"] == "-"  # nor is it in one (its progress says "done")
    # 256 synthetic examples of 8x8, a fifth held out: it was in worker.log alone.
    assert fields["data"] == "205 train, 51 eval examples, 4 classes, 8x8x1"
    # Its export named, by the command that downloads it (its export_url is set).
    assert job["export_url"] == f"/api/v1/jobs/{job_id}/export"
    assert fields["export"] == f"`towerboard export {job_id}` downloads the exported model"
    # A --url given is kept in the command, as in every hint: without it, it asks another.
    given = towerboard("status", job_id, "--url", service.base_url, url=None)
    assert given.returncode == 0, given.stderr
    assert f"`towerboard export {job_id} --url {service.base_url}` downloads" in given.stdout

    as_json = towerboard("status", job_id, "--json", url=service.base_url)
    assert json.loads(as_json.stdout)["id"] == job_id


def test_logs_tail_and_follow_an_ended_job(service: Service, watched: dict[str, Any]) -> None:
    tail = towerboard("logs", watched["id"], "--tail", "3", url=service.base_url)
    assert tail.returncode == 0, tail.stderr
    assert 1 <= len(tail.stdout.splitlines()) <= 3
    whole = service.client.get(f"/api/v1/jobs/{watched['id']}/logs", params={"tail": 3}).text
    assert tail.stdout == whole
    # Following a job that has ended prints what there is, each line once, and returns.
    follow = towerboard(
        "logs", watched["id"], "--follow", "--tail", "100000", url=service.base_url, timeout=30
    )
    assert follow.returncode == 0, follow.stderr
    assert "starting" in follow.stdout
    assert (
        follow.stdout
        == service.client.get(f"/api/v1/jobs/{watched['id']}/logs", params={"tail": 100_000}).text
    )


def test_checkpoints_list_and_download(
    service: Service, watched: dict[str, Any], tmp_path: Path
) -> None:
    job_id = watched["id"]
    listing = towerboard("checkpoints", job_id, url=service.base_url)
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == ["STEP", "20", "40"]

    # --json is the API's JSON, as for `status --json` (it was the bare list of `data`).
    as_json = towerboard("checkpoints", job_id, "--json", url=service.base_url)
    assert as_json.returncode == 0, as_json.stderr
    api = service.client.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
    assert json.loads(as_json.stdout) == api

    got = towerboard(
        "checkpoints", job_id, "--download", "20", "-o", str(tmp_path), url=service.base_url
    )
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    assert path == tmp_path / f"{job_id}-ckpt-20.tar.gz"
    with tarfile.open(path) as tar:
        assert {"ckpt-20.index", "checkpoint", "spec.json"} <= set(tar.getnames())
    assert oct(path.stat().st_mode & 0o777) != "0o600"  # an ordinary file, not a temp file's
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    # It says how to extract it, into a folder of its own (two downloads to one folder
    # would mix): the command, as given, works.
    said = re.search(r"extract it into a folder of its own \((.*?)\), where", got.stderr)
    assert said, got.stderr
    assert "its spec.json and data.json say the model to build" in got.stderr
    subprocess.run(said.group(1), shell=True, check=True)
    extracted = tmp_path / f"{job_id}-ckpt-20"
    assert {"ckpt-20.index", "checkpoint", "spec.json", "data.json"} <= {
        p.name for p in extracted.iterdir()
    }
    shutil.rmtree(extracted)

    latest = towerboard(
        "checkpoints", job_id, "--download", "latest", "-o", str(tmp_path / "latest.tar.gz"),
        url=service.base_url,
    )  # fmt: skip
    assert latest.returncode == 0, latest.stderr
    with tarfile.open(tmp_path / "latest.tar.gz") as tar:
        assert "ckpt-40.index" in tar.getnames()

    # The README's `-o ckpts/`: a folder that does not exist yet, made, not a file named ckpts.
    folder = tmp_path / "new" / "ckpts"
    into = towerboard(
        "checkpoints", job_id, "--download", "latest", "-o", f"{folder}/", url=service.base_url
    )
    assert into.returncode == 0, into.stderr
    assert Path(into.stdout.strip()) == folder / f"{job_id}-ckpt-40.tar.gz"
    assert [p.name for p in folder.iterdir()] == [f"{job_id}-ckpt-40.tar.gz"]

    missing = towerboard(
        "checkpoints", job_id, "--download", "7", "-o", str(tmp_path), url=service.base_url
    )
    assert missing.returncode == 1
    assert one_error_line(missing) == (
        f"towerboard: error: Job {job_id!r} has no checkpoint at step 7. Retained steps: 20, 40."
    )
    # Options of a download, given to a listing: said, not silently ignored.
    astray = towerboard("checkpoints", job_id, "-o", str(tmp_path), "--force",
                        url=service.base_url)  # fmt: skip
    assert astray.returncode == 2 and astray.stdout == ""
    assert one_error_line(astray) == (
        "towerboard: error: -o and --force go with --download STEP, which downloads a "
        "checkpoint; without it the command lists them"
    )


def test_metrics_as_csv_and_json(service: Service, watched: dict[str, Any]) -> None:
    job_id = watched["id"]
    api = service.client.get(f"/api/v1/jobs/{job_id}/metrics").json()
    result = towerboard("metrics", job_id, "--name", "loss", "--name", "eval_accuracy",
                        url=service.base_url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["step", "loss", "eval_accuracy"]
    loss = {p["step"]: p["value"] for p in api["series"]["loss"]}
    evals = {p["step"]: p["value"] for p in api["series"]["eval_accuracy"]}
    assert [int(r[0]) for r in rows[1:]] == sorted(loss.keys() | evals.keys())
    for step, loss_text, eval_text in rows[1:]:
        assert (float(loss_text) if loss_text else None) == loss.get(int(step))
        assert (float(eval_text) if eval_text else None) == evals.get(int(step))
    later = towerboard("metrics", job_id, "--after-step", "20", "--json", url=service.base_url)
    steps = {p["step"] for points in json.loads(later.stdout)["series"].values() for p in points}
    assert steps and min(steps) > 20
    wrong = towerboard("metrics", job_id, "--name", "los", url=service.base_url)
    assert wrong.returncode == 2 and "loss" in one_error_line(wrong)  # the names there are
    # Said as the option the user gave, not as the API's `query.name`.
    assert one_error_line(wrong).startswith("towerboard: error: Invalid request: 1 error: --name: ")

    # Read on: the rows after step 20, no header, the same columns: appended to the rows
    # up to 20, one CSV, the same as the first read.
    head = [row for row in rows if row[0] == "step" or int(row[0]) <= 20]
    more = towerboard("metrics", job_id, "--name", "loss", "--name", "eval_accuracy",
                      "--after-step", "20", "--no-header", url=service.base_url)  # fmt: skip
    assert more.returncode == 0, more.stderr
    assert head + list(csv.reader(io.StringIO(more.stdout))) == rows
    last = max(loss)
    after_all = towerboard("metrics", job_id, "--after-step", str(last), url=service.base_url)
    assert after_all.returncode == 0 and after_all.stdout == ""
    assert after_all.stderr == f"job {job_id} has no metrics after step {last}\n"
    # A script's first read, before it has read any step: every row (it was refused).
    first = towerboard("metrics", job_id, "--name", "loss", "--name", "eval_accuracy",
                       "--after-step", "0", url=service.base_url)  # fmt: skip
    assert first.returncode == 0 and list(csv.reader(io.StringIO(first.stdout))) == rows


def test_metrics_csv_download_is_the_clis_csv(service: Service, watched: dict[str, Any]) -> None:
    """`GET /metrics.csv` of the real tiny job (train reports, evals at 20 and 40): the
    bytes `towerboard metrics` prints for the same names, saved under the job's name."""
    job_id = watched["id"]
    for names in [(), ("loss", "eval_accuracy"), ("eval_loss", "accuracy", "learning_rate")]:
        options = [word for name in names for word in ("--name", name)]
        printed = towerboard("metrics", job_id, *options, url=service.base_url)
        assert printed.returncode == 0, printed.stderr
        response = service.client.get(
            f"/api/v1/jobs/{job_id}/metrics.csv", params={"name": list(names)}
        )
        assert response.status_code == 200, response.text
        assert response.content == printed.stdout.encode()
        assert response.headers["content-disposition"] == (
            f'attachment; filename="cli-tiny-{job_id}-metrics.csv"'
        )
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["step", "eval_loss", "accuracy", "learning_rate"]
    assert [row[0] for row in rows[1:] if row[1]] == ["20", "40"]  # the evals' steps
    assert rows[-1][0] == "40" and all(rows[-1][1:])


def test_profile_and_devices(make_service: Callable[..., Service], tmp_path: Path) -> None:
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    job_id = service.submit(long_job(name="traced"))["id"]
    service.wait_for(job_id, lambda job: job["state"] == "running", what="its start")

    devices = towerboard("devices", url=service.base_url)
    assert devices.returncode == 0, devices.stderr
    # The job by its name too (its id alone said nothing to whoever looked for theirs).
    assert devices.stdout.split() == ["DEVICE", "JOB", "NAME", "cpu:0", job_id, "traced"]
    asked = towerboard("profile", job_id, "--steps", "7", url=service.base_url)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == f"{job_id} 7\n"
    assert "device trace of its next 7 steps" in asked.stderr
    run = service.data_dir / "runs" / job_id
    assert json.loads((run / "profile_request.json").read_text()) == {"steps": 7}

    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    service.wait_state(job_id, "cancelled")
    ended = towerboard("profile", job_id, url=service.base_url)
    assert ended.returncode == 1
    assert one_error_line(ended).endswith("only a running job can be traced.")


def test_devices_says_which_are_held_by_an_exiting_worker(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # An ended job holds its device until its worker has exited: the table says so, where
    # a bare job id read as a job still running.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job_id = service.submit(job_spec(name="linger"))["id"]  # exits once released
    service.wait_state(job_id, "succeeded")
    devices = towerboard("devices", url=service.base_url)
    assert devices.returncode == 0, devices.stderr
    assert devices.stdout.splitlines()[1].split(None, 2) == [
        "cpu:0",
        job_id,
        "linger (ended: its worker is exiting)",
    ]
    service.release(job_id)
    service.wait_exited(job_id)
    devices = towerboard("devices", url=service.base_url)
    assert devices.stdout.split() == ["DEVICE", "JOB", "NAME", "cpu:0", "free"]


def test_delete_and_resume_wait_for_a_worker_slower_to_exit_than_the_service_waits(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The service waits 5 s for an ended job's worker to exit, then refuses (409); on a
    # loaded host TensorFlow's teardown took 8 s, and `cancel --wait` then `resume` failed.
    # The CLI waits for the exit (the devices' `exiting`) and asks again, saying so. The
    # worker is let go once the CLI says it waits, not after a fixed time: a CLI slower to
    # start than the time left of the service's own wait was let through without a 409.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    for verb in ("resume", "delete"):
        job_id = service.submit(job_spec(name="linger"))["id"]  # exits once released
        service.wait_state(job_id, "succeeded")
        extra = ["--steps", "20"] if verb == "resume" else []
        cli = towerboard_in_background(verb, job_id, *extra, url=service.base_url)
        assert cli.stderr is not None
        # Only after the service's refusal (409), with the worker not yet let go.
        waiting = cli.stderr.readline()
        service.release(job_id)
        out, rest = cli.communicate(timeout=120)
        said = subprocess.CompletedProcess(cli.args, cli.returncode, out, waiting + rest)
        assert said.returncode == 0, said.stderr
        assert waiting == f"job {job_id} has ended; waiting for its worker process to exit\n"
        if verb == "resume":
            assert service.job(job_id)["attempts"] == 2
            service.wait_state(job_id, "succeeded")  # the stand-in's second attempt
            service.release(job_id)
            service.wait_exited(job_id)
        else:
            assert said.stdout == f"{job_id} deleted\n"
            assert service.client.get(f"/api/v1/jobs/{job_id}").status_code == 404


def test_status_table_shows_a_preparing_jobs_phase_as_its_step(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Between its worker's start and first line a running job has no step: its row says
    # `preparing` there, as the dashboard's does, where a "-" looked like a stall.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job_id = service.submit(job_spec(name="preparing"))["id"]  # never writes a line
    service.wait_state(job_id, "running")
    listed = towerboard("status", url=service.base_url)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert row.split()[:5] == [job_id, "preparing", "running", "-", "preparing"], listed.stdout
    assert row.split()[5:7] == ["-", "-"], listed.stdout  # no loss, and no eval yet
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    service.wait_state(job_id, "cancelled")
    listed = towerboard("status", url=service.base_url)
    assert listed.stdout.splitlines()[1].split()[3:5] == ["-", "-"]  # over: no phase
    assert service.job(job_id)["progress"]["phase"] == "preparing"  # where it ended
    one = towerboard("status", job_id, url=service.base_url)
    assert re.search(r"^phase\s{2,}-$", one.stdout, re.M), one.stdout  # none now


@pytest.mark.parametrize(
    ("job", "said"),
    [
        (  # the trainer's result of a cancel
            {
                "outcome": "cancelled",
                "step": 8000,
                "total": 10000,
                "checkpoint": "checkpoints/ckpt-8000",
            },
            "Stopped at step 8000 of 10000, after a checkpoint.",
        ),
        (
            {"outcome": "cancelled", "message": "Stopped before training"},
            "Stopped before training.",
        ),
        (None, "Cancelled while queued: it never started."),
    ],
)
def test_a_cancelled_jobs_stop_is_said_as_its_page_says_it(job: Any, said: str) -> None:
    assert display.stopped({"state": "cancelled", "result": job, "started_at": None}) == said
    assert display.stopped({"state": "failed", "result": job}) == ""


def test_a_cancel_that_ended_in_a_kill_is_said_as_its_page_says_it() -> None:
    # Its error says how it ended, and its progress the step the worker last reported: a
    # cancel still (the page says it as one), so `stopped` says both, as the page does.
    killed = {
        "state": "cancelled",
        "result": None,
        "progress": {"step": 12, "total": 100, "checkpoint": "checkpoints/ckpt-10"},
        "error": {
            "reason": "Cancelled: the worker did not exit within 10 s of SIGTERM and was "
            "killed with SIGKILL."
        },
    }
    assert display.stopped(killed) == (
        "The worker did not exit within 10 s of SIGTERM and was killed with SIGKILL. "
        "Its last report was at step 12 of 100."
    )
    assert display.stopped({**killed, "progress": None}) == (
        "The worker did not exit within 10 s of SIGTERM and was killed with SIGKILL."
    )
    assert display.stopped({**killed, "state": "failed"}) == ""  # a failure's error is its own


def test_status_says_a_cancel_that_ended_in_a_kill_as_a_cancel(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A worker that ignores SIGTERM is killed after the grace: `status ID` said it in an
    # `error` row, as a failure; its page says it as a cancel, where it stopped, and so
    # does `stopped` now, with the log's last lines under it still.
    service = make_service(
        env={"TOWERBOARD_CANCEL_GRACE_SECONDS": "0.05", **fake_worker_env(tmp_path)}
    )
    service.start()
    job = service.submit(job_spec(name="deaf"))  # ignores SIGTERM
    service.wait_reported(job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    ended = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert ended["state"] == "cancelled" and ended["error"]["signal"] == "SIGKILL", ended
    said = towerboard("status", job["id"], url=service.base_url)
    assert said.returncode == 0, said.stderr
    stopped = re.search(r"^stopped\s{2,}(.*)$", said.stdout, re.M)
    assert stopped, said.stdout
    assert stopped[1] == (
        "The worker did not exit within 0.05 s of SIGTERM and was killed with SIGKILL. "
        "Its last report was at step 0 of 10."
    )
    assert not re.search(r"^error\s", said.stdout, re.M), said.stdout
    assert re.search(r"^resume\s{2,}`towerboard resume .*` trains ", said.stdout, re.M)
    assert f"log tail:\n  --- towerboard: attempt 1 of job {job['id']} " in said.stdout
    # The table's WHY: the service's reason, "Cancelled: " taken off, from a capital.
    listed = towerboard("status", url=service.base_url)
    header, *rows = listed.stdout.splitlines()
    why = {row.split()[0]: row[header.index("WHY") :] for row in rows}[job["id"]]
    assert why == "The worker did not exit within 0.05 s of SIGTERM and was killed with SIGKILL."


def test_status_table_says_why_a_job_failed(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The dashboard's jobs table says why a job failed; the CLI's had only `failed`, and
    # `status ID` a job at a time. A last column says it where a job listed has a reason.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    quick = service.submit(job_spec(name="quick"))["id"]
    service.wait_state(quick, "succeeded")
    listed = towerboard("status", url=service.base_url)
    assert listed.stdout.splitlines()[0].split()[-1] == "AGE"  # no reason: no column
    failed = service.submit(job_spec(name="fail"))["id"]  # its result says "fail"
    service.wait_state(failed, "failed")
    assert service.job(failed)["error"]["reason"] == "fail"
    listed = towerboard("status", url=service.base_url)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[-2:] == ["AGE", "WHY"]
    by_id = {row.split()[0]: row for row in rows}
    # Its first letter a capital, as every reason there (the dashboard's too).
    assert by_id[failed][header.index("WHY") :] == "Fail", rows  # in its column
    assert by_id[quick].split()[-1] == "-"


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("the worker did not exit", "The worker did not exit"),  # a killed cancel's
        ("Expected labels", "Expected labels"),
        ("évalué", "évalué"),  # not an ASCII letter: left as it is
        ("`data.path`: missing", "`data.path`: missing"),
        ("x", "X"),
        ("", ""),
    ],
)
def test_a_reason_in_the_table_starts_with_a_capital(reason: str, said: str) -> None:
    assert display.capitalised(reason) == said


def test_status_says_an_attempt_that_finished_at_its_checkpoint_trained_no_step(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Finished at its latest checkpoint ("Finish at step N"), an attempt trains no step:
    # its result says so, `status ID` said "10/10" and nothing of it. Said beside its
    # attempts, as its page's meta line says it.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    finished = service.submit(job_spec(name="finish"))["id"]  # the trainer's message
    service.wait_state(finished, "succeeded")
    said = towerboard("status", finished, url=service.base_url)
    assert said.returncode == 0, said.stderr
    assert re.search(
        r"^attempts\s{2,}1 \(trained no step: finished at step 10's checkpoint\)$",
        said.stdout,
        re.M,
    ), said.stdout
    quick = service.submit(job_spec(name="quick"))["id"]  # trained: nothing more said
    service.wait_state(quick, "succeeded")
    said = towerboard("status", quick, url=service.base_url)
    assert re.search(r"^attempts\s{2,}1$", said.stdout, re.M), said.stdout


@pytest.mark.parametrize(
    ("job", "said"),
    [
        (
            {"state": "succeeded", "result": {"step": 20, "message": "Finished at step 20, "
             "its checkpoint: no step trained."}},
            "trained no step: finished at step 20's checkpoint",
        ),
        (  # no step in its result: the one it reported
            {"state": "succeeded", "progress": {"step": 7}, "result": {"message": "Finished at "
             "step 7, its checkpoint: no step trained."}},
            "trained no step: finished at step 7's checkpoint",
        ),
        ({"state": "succeeded", "result": {"step": 20, "message": "Trained 20 steps."}}, ""),
        ({"state": "failed", "result": {"message": "x: no step trained."}}, ""),
        ({"state": "succeeded", "result": None}, ""),
    ],
)  # fmt: skip
def test_an_attempt_that_trained_no_step_is_said_as_its_page_says_it(
    job: dict[str, Any], said: str
) -> None:
    assert display.no_step(job) == said


def test_export_downloads_the_saved_model(
    service: Service,
    watched: dict[str, Any],
    tmp_path: Path,
    make_service: Callable[..., Service],
) -> None:
    job_id = watched["id"]
    got = towerboard("export", job_id, "-o", f"{tmp_path}/model/", url=service.base_url)
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    assert path == tmp_path / "model" / f"{job_id}-export.tar.gz"
    assert got.stderr.startswith(f"saved the exported model to {path} (")
    with tarfile.open(path) as tar:
        assert {"saved_model.pb", "spec.json", "result.json"} <= set(tar.getnames())
    said = re.search(r"; extract it \((.*?)\) and tf.saved_model.load that folder", got.stderr)
    assert said, got.stderr
    assert "its model.json says what the model takes and answers" in got.stderr
    subprocess.run(said.group(1), shell=True, check=True)
    assert {"saved_model.pb", "model.json"} <= {p.name for p in path.parent.iterdir()}

    # A running job has none yet. It runs on a stand-in worker (until cancelled): a real
    # one spent seconds of TensorFlow's start-up on what only the job's state decides.
    (folder := tmp_path / "stand-in").mkdir()
    stand_in = make_service(env=fake_worker_env(folder))
    stand_in.start()
    running = stand_in.submit(job_spec(name="not-yet"))
    stand_in.wait_state(running["id"], "running")
    missing = towerboard("export", running["id"], url=stand_in.base_url)
    assert missing.returncode == 1
    assert one_error_line(missing) == (
        f"towerboard: error: Job {running['id']!r} has no exported model (a job exports its "
        "model as it succeeds; it is running)."
    )


def test_download_shows_progress_on_a_terminal(
    service: Service, watched: dict[str, Any], tmp_path: Path
) -> None:
    import pty

    controller, terminal = pty.openpty()  # stderr is a terminal: progress is drawn on it
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", "checkpoints", watched["id"], "--download",
             "latest", "-o", str(tmp_path)],
            cwd=ROOT, env=cli_env(service.base_url), stdout=subprocess.PIPE, stderr=terminal,
            timeout=180,
        )  # fmt: skip
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other end is closed and all is read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(controller)
    assert done.returncode == 0, drawn
    assert (tmp_path / f"{watched['id']}-ckpt-40.tar.gz").exists()
    name = re.escape(f"{watched['id']}-ckpt-40.tar.gz")
    assert re.search(rf"\rdownloading {name}: 100% of [0-9.]+ (B|KiB|MiB)".encode(), drawn), drawn


def test_status_escapes_characters_that_print_nothing_in_names(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A job's name is any text another user typed. Control characters are refused at
    # submit (an escape sequence would clear the terminal of whoever lists the jobs, a
    # newline break the table); format characters are not (an emoji needs its zero-width
    # joiner), and a right-to-left override printed raw reverses the rest of the line.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    refused = service.client.post("/api/v1/jobs", json=job_spec(name="evil\x1b[2J\nname"))
    assert refused.status_code == 422, refused.text
    job = service.submit(job_spec(name="evil\u202ename\u200b"))
    listing = towerboard("status", url=service.base_url)
    assert listing.returncode == 0, listing.stderr
    assert "\u202e" not in listing.stdout and "\u200b" not in listing.stdout
    header, row = listing.stdout.splitlines()
    assert row.split()[:2] == [job["id"], "evil\\u202ename\\u200b"]
    one = towerboard("status", job["id"], url=service.base_url)
    assert re.search(r"^name\s{2,}evil\\u202ename\\u200b$", one.stdout, re.M), one.stdout
    # --json is the API's JSON, escaped by JSON itself.
    as_json = towerboard("status", job["id"], "--json", url=service.base_url)
    assert json.loads(as_json.stdout)["name"] == "evil\u202ename\u200b"
    assert towerboard("cancel", job["id"], "--wait", url=service.base_url).returncode == 0


def test_cancel_queued_and_running_jobs(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The jobs run on the stepping stand-in: what is checked is the CLI's and the
    # service's, and a real worker spent seconds of TensorFlow's start-up first.
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    running = service.submit(long_job())
    queued = service.submit(job_spec(name="waits"))  # one job slot: this one waits
    waiting = towerboard("status", queued["id"], url=service.base_url)
    assert waiting.returncode == 0, waiting.stderr
    # What it waits for, in the units `queue` says it: one job slot, whatever its towers.
    waits = re.search(r"^devices\s{2,}(.*)$", waiting.stdout, re.M)
    assert waits and waits[1] == "waiting for 1 job slot (1 tower)", waiting.stdout
    # Its log is empty, and said to be for a reason (it printed nothing, and said nothing).
    no_log = towerboard("logs", queued["id"], url=service.base_url)
    assert no_log.returncode == 0, no_log.stderr
    assert no_log.stdout == ""
    assert no_log.stderr == (
        f"job {queued['id']} is queued: it has not started, so it has no log yet\n"
    )
    cancelled = towerboard("cancel", queued["id"], url=service.base_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"{queued['id']} cancelled\n"
    # Where a cancelled job stopped, as its page says it (it has no error to say).
    never = towerboard("status", queued["id"], url=service.base_url)
    assert re.search(
        r"^stopped\s{2,}Cancelled while queued: it never started\.$", never.stdout, re.M
    )
    # And where a resume trains on from, as the page says it, with the command that does it.
    assert re.search(
        rf"^resume\s{{2,}}`towerboard resume {queued['id']}( --url \S+)?` trains again from "
        r"step 0, as no checkpoint was saved$",
        never.stdout,
        re.M,
    ), never.stdout

    service.wait_checkpoint(running["id"])
    holding = towerboard("status", running["id"], url=service.base_url)
    assert re.search(r"^devices\s{2,}cpu:0 \(1 tower\)$", holding.stdout, re.M), holding.stdout
    stopped = towerboard("cancel", running["id"], "--wait", url=service.base_url)
    assert stopped.returncode == 0, stopped.stderr
    assert f"cancel requested: job {running['id']} checkpoints and stops" in stopped.stderr
    assert stopped.stdout == f"{running['id']} cancelled\n"
    assert service.job(running["id"])["state"] == "cancelled"
    step = service.job(running["id"])["result"]["step"]  # the stand-in's: no total, no path
    said = towerboard("status", running["id"], url=service.base_url)
    assert re.search(rf"^stopped\s{{2,}}Stopped at step {step}\.$", said.stdout, re.M), said.stdout
    # The stand-in reports checkpoints and writes none: the service lists none, and so
    # `resume` says a resume trains again; with two kept, from the later one.
    assert re.search(r"^resume\s{2,}.* trains again from step 0, as no", said.stdout, re.M)
    stand_in_checkpoint(service, running["id"], 5)
    stand_in_checkpoint(service, running["id"], 10)
    said = towerboard("status", running["id"], url=service.base_url)
    assert re.search(
        rf"^resume\s{{2,}}`towerboard resume {running['id']}( --url \S+)?` trains on from "
        r"step 10's checkpoint$",
        said.stdout,
        re.M,
    ), said.stdout
    listed = towerboard("status", url=service.base_url)
    header, *rows = listed.stdout.splitlines()
    assert header.split()[-1] == "WHY"
    by_id = {row.split()[0]: row[header.index("WHY") :] for row in rows}
    assert by_id[running["id"]] == f"Stopped at step {step}."
    assert by_id[queued["id"]] == "Cancelled while queued: it never started."

    again = towerboard("cancel", running["id"], url=service.base_url)
    assert again.returncode == 1
    assert one_error_line(again) == (
        f"towerboard: error: Job {running['id']!r} has ended (cancelled); "
        "only queued or running jobs can be cancelled."
    )
    # --wait asks for a stopped job, and this one is: a script waiting on it goes on.
    waited = towerboard("cancel", running["id"], "--wait", url=service.base_url)
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout == f"{running['id']} cancelled\n"
    assert waited.stderr == f"job {running['id']} had already ended (cancelled)\n"


def test_logs_of_a_job_queued_again_say_they_are_of_its_earlier_attempts(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A resumed job waiting for the one job slot: its log ends with its last attempt's
    # end, and `logs --follow` then waited without a word, as if on a job that had hung.
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    first = service.submit(long_job())
    service.wait_checkpoint(first["id"])
    assert towerboard("cancel", first["id"], "--wait", url=service.base_url).returncode == 0
    holder = service.submit(long_job(name="holds the slot"))
    service.wait_state(holder["id"], "running")
    resumed = towerboard("resume", first["id"], url=service.base_url)
    assert resumed.returncode == 0, resumed.stderr
    assert service.job(first["id"])["state"] == "queued"

    log = towerboard("logs", first["id"], url=service.base_url)
    assert log.returncode == 0, log.stderr
    assert f"--- towerboard: attempt 1 of job {first['id']} starting" in log.stdout
    assert log.stderr == (
        f"job {first['id']} is queued: it waits to start attempt 2, so the log above is of "
        "its earlier attempts\n"
    )
    # Followed, it says so and waits for the attempt; its first line comes once it starts.
    following = towerboard_in_background("logs", first["id"], "--follow", url=service.base_url)
    try:
        assert following.stderr is not None
        said = following.stderr.readline()  # said before the slot is freed, so still queued
        assert said == (
            f"job {first['id']} is queued: it waits to start attempt 2, so the log above is "
            "of its earlier attempts; following it from when it starts\n"
        )
        assert towerboard("cancel", holder["id"], "--wait", url=service.base_url).returncode == 0
        service.wait_state(first["id"], "running")
        assert towerboard("cancel", first["id"], url=service.base_url).returncode == 0
        out, err = following.communicate(timeout=60)
    finally:
        following.kill()
    assert following.returncode == 0, err
    assert err == ""
    assert f"--- towerboard: attempt 2 of job {first['id']} starting" in out


def test_cancel_several_jobs_each_in_turn(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A sweep cancelled in one command: it took one id. Two job slots, each held by a
    # running job of the stepping stand-in; a third job waits.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "2", **stepping_worker_env(tmp_path)})
    service.start()
    first, second = (service.submit(long_job()) for _ in range(2))
    for job in (first, second):
        service.wait_state(job["id"], "running")
    queued = service.submit(job_spec(name="waits"))
    a, b, q = first["id"], second["id"], queued["id"]

    # An empty id is refused with the rest, before any is sent.
    empty = towerboard("cancel", a, "", url=service.base_url)
    assert empty.returncode == 2, empty.stderr
    assert "argument ID: expected a job id. Received: ''" in empty.stderr
    assert service.job(a)["cancel_requested"] is False

    # Each in turn, each once; one unknown is said and skipped, and the command exits 1.
    several = towerboard("cancel", q, "nosuchjob", a, q, url=service.base_url)
    assert several.returncode == 1, several.stderr
    assert several.stdout == f"{q} cancelled\n{a} running\n"
    assert several.stderr == (
        "towerboard: error: Job 'nosuchjob' not found.\n"
        f"cancel requested: job {a} checkpoints and stops\n"
    )
    service.wait_state(a, "cancelled")
    assert service.job(q)["state"] == "cancelled"
    assert service.job(b)["state"] == "running"  # not named: left alone

    # --wait: the ended ones are said at once (no error), the running ones waited on,
    # two of them here (the slot `a` left is taken by a new job).
    third = service.submit(long_job())["id"]
    service.wait_state(third, "running")
    waited = towerboard("cancel", a, b, q, third, "--wait", url=service.base_url)
    assert waited.returncode == 0, waited.stderr
    lines = waited.stdout.splitlines()
    assert lines[:2] == [f"{a} cancelled", f"{q} cancelled"], waited.stdout
    assert sorted(lines[2:]) == sorted([f"{b} cancelled", f"{third} cancelled"])
    assert waited.stderr == (
        f"job {a} had already ended (cancelled)\n"
        f"cancel requested: job {b} checkpoints and stops\n"
        f"job {q} had already ended (cancelled)\n"
        f"cancel requested: job {third} checkpoints and stops\n"
    )
    assert {service.job(i)["state"] for i in (b, third)} == {"cancelled"}

    # Without --wait, ended jobs are refused, each said, and the exit is 1.
    refused = towerboard("cancel", a, b, url=service.base_url)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr == "".join(
        f"towerboard: error: Job {i!r} has ended (cancelled); only queued or running jobs "
        "can be cancelled.\n"
        for i in (a, b)
    )


def test_cancel_wait_waits_on_every_job_at_once(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # `cancel A B --wait` asks both, then says each as it stops: B, which stops on SIGTERM,
    # while A, whose worker ignores it (stopped only by the grace period's SIGKILL, a
    # minute here), is still running. Waited on one after the other, B was not even asked
    # until A had stopped. Ctrl-C then says which jobs it stopped waiting for.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "2", **fake_worker_env(tmp_path)})
    service.start()
    deaf = service.submit(job_spec(name="deaf"))["id"]
    prompt = service.submit(job_spec(name="prompt"))["id"]  # runs until SIGTERM
    for job_id in (deaf, prompt):
        service.wait_reported(job_id)
    waiter = towerboard_in_background("cancel", deaf, prompt, "--wait", url=service.base_url)
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline() == f"{prompt} cancelled\n"
        still = service.job(deaf)
        assert (still["state"], still["cancel_requested"]) == ("running", True)
        waiter.send_signal(signal.SIGINT)
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
    assert waiter.returncode == 130, err
    assert out == ""
    assert err == (
        f"cancel requested: job {deaf} checkpoints and stops\n"
        f"cancel requested: job {prompt} checkpoints and stops\n"
        f"\nstopped waiting; job {deaf} stops on its own (its cancel was asked)\n"
    )


def test_an_empty_job_id_is_a_usage_error(service: Service) -> None:
    # Refused like any malformed id: `status ""` must not list the jobs table as if no
    # id were given (its handler tests the id for truth).
    for args in (["status", ""], ["status", "  "], ["logs", ""], ["cancel", "\t"]):
        result = towerboard(*args, url=service.base_url)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stdout == ""
        assert f"argument ID: expected a job id. Received: {args[1]!r}" in result.stderr


def test_submit_watch_failed_job_exits_1(service: Service, tmp_path: Path) -> None:
    # A custom model the service cannot check (its module binds the name; whether that is
    # a function takes importing it) and the worker finds is none (a string).
    spec = tmp_path / "custom.json"
    spec.write_text(json.dumps(job_spec(name="custom", model={"name": "string:ascii_letters"})))
    result = towerboard("submit", str(spec), "--watch", url=service.base_url)
    assert result.returncode == 1, result.stderr
    job_id = result.stdout.strip()
    assert service.job(job_id)["state"] == "failed"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{job_id} failed in "), last
    assert "error: The worker rejected the spec: " in last
    # It exported nothing (its export_url is null): `status` names no export.
    one = towerboard("status", job_id, url=service.base_url)
    assert one.returncode == 0, one.stderr
    assert service.job(job_id)["export_url"] is None
    assert [line for line in one.stdout.splitlines() if line.startswith("export")] == []
    assert any(line.startswith("error ") for line in one.stdout.splitlines()), one.stdout


def test_followers_outlive_a_service_restart(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The job runs on the stepping stand-in (adopted by the restarted service like any
    # worker): a real one spent seconds of TensorFlow's start-up before its first step.
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(long_job(name="outlives")))
    watcher = towerboard_in_background("submit", str(spec), "--watch", url=service.base_url)
    try:
        assert watcher.stdout is not None
        job_id = watcher.stdout.readline().strip()
        service.wait_checkpoint(job_id)
        follower = towerboard_in_background("logs", job_id, "--follow", url=service.base_url)
        try:
            # Both following: the watcher has printed its id, and the follower the log so
            # far. Its first read is not retried (a wrong --url fails at once), and a
            # process started on a busy host took over a second to make it.
            assert follower.stdout is not None
            first = follower.stdout.readline()
            assert first.startswith(f"--- towerboard: attempt 1 of job {job_id} "), first
            service.kill()  # the worker lives on, to be adopted
            time.sleep(3.0)  # longer than one retry: the service is really gone a while
            assert watcher.poll() is None, watcher.communicate()
            assert follower.poll() is None, follower.communicate()
            service.start()
            service.wait_for(job_id, lambda job: job["progress"]["step"] > 0, what="adopted")
            assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
            out, err = watcher.communicate(timeout=120)
            logs_out, logs_err = follower.communicate(timeout=60)
        finally:
            follower.kill()
    finally:
        watcher.kill()
    assert watcher.returncode == 1, err  # followed to the end: cancelled, not succeeded
    lost = (
        f"lost the service at {service.base_url}; trying again for up to 120 s "
        "(the job goes on meanwhile)"
    )
    back = f"the service at {service.base_url} is back"
    # Each on a line of its own, prefixed as the log follower's are.
    lines = err.splitlines()
    assert f"towerboard: {lost}" in lines and f"towerboard: {back}" in lines, err
    assert err.index(lost) < err.index(back)
    assert err.strip().splitlines()[-1].startswith(f"{job_id} cancelled"), err
    assert follower.returncode == 0, logs_err
    assert logs_err == f"towerboard: {lost}\ntowerboard: {back}\n"
    assert f"--- towerboard: attempt 1 of job {job_id} starting" in first + logs_out


def test_ctrl_c_stops_following_a_log_saying_so(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # It ended with nothing said, the shell's prompt after the terminal's ^C on its line.
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    job = service.submit(long_job(name="followed"))
    service.wait_checkpoint(job["id"])
    follower = towerboard_in_background("logs", job["id"], "--follow", url=service.base_url)
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # following: the log so far is out
        assert first.startswith(f"--- towerboard: attempt 1 of job {job['id']} "), first
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert follower.returncode == 130, err
    assert err == f"\nstopped following the log of job {job['id']}\n"


def test_tensorboard_open_says_when_no_browser_opens(
    service: Service, watched: dict[str, Any]
) -> None:
    # No display, and a "browser" that fails: Python's webbrowser opens nothing.
    headless = {"DISPLAY": "", "WAYLAND_DISPLAY": "", "BROWSER": "false"}
    result = towerboard(
        "tensorboard", "--jobs", watched["id"], "--open", url=service.base_url, env=headless,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{service.base_url}/tensorboard/\n"
    assert result.stderr.strip().splitlines()[-1] == (
        "could not open a web browser here (no display?); open the URL above in one"
    )
    # One that opens (`true` takes the URL and succeeds) is not reported.
    opened = towerboard(
        "tensorboard", "--jobs", watched["id"], "--open", url=service.base_url,
        env={**headless, "BROWSER": "true"}, timeout=240,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    assert "could not open" not in opened.stderr


def test_tensorboard_starts_and_prints_proxied_url(
    service: Service, watched: dict[str, Any]
) -> None:
    result = towerboard("tensorboard", "--jobs", watched["id"], url=service.base_url, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{service.base_url}/tensorboard/\n"
    assert f"TensorBoard is running over {watched['id']}" in result.stderr
    page = httpx.get(result.stdout.strip(), timeout=60)
    assert page.status_code == 200 and "<title>TensorBoard</title>" in page.text
    runs = httpx.get(f"{service.base_url}/tensorboard/data/runs", timeout=60).json()
    assert f"cli-tiny · {watched['id']}/train" in runs  # the job's name, then its id

    # Over every job, then back to one: the second start takes the others away, and says so.
    every = towerboard("tensorboard", url=service.base_url, timeout=240)
    assert every.returncode == 0 and "replaced" not in every.stderr, every.stderr
    one = towerboard("tensorboard", "--jobs", watched["id"], url=service.base_url, timeout=240)
    assert one.returncode == 0, one.stderr
    assert "this replaced the shared TensorBoard over all jobs" in one.stderr
    # --merge never takes any away: the same jobs again reuse it, with nothing replaced.
    merged = towerboard(
        "tensorboard", "--jobs", watched["id"], "--merge", url=service.base_url, timeout=240
    )
    assert merged.returncode == 0 and "replaced" not in merged.stderr, merged.stderr

    stop = towerboard("tensorboard", "--stop", url=service.base_url)
    assert stop.returncode == 0 and stop.stdout == "tensorboard stopped\n"
    again = towerboard("tensorboard", "--stop", url=service.base_url)
    assert again.returncode == 0 and again.stdout == "tensorboard was not running\n"


def test_tensorboard_that_fails_to_start_says_why(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # An interpreter that runs workers but whose TensorBoard exits at once. The CLI said
    # only "see the service log", a file on the service's host; the service knows why.
    python = tmp_path / "python.sh"
    fail_board = 'case "$*" in *guarded_tensorboard*) exit 1;; esac'
    python.write_text(f'#!/bin/sh\n{fail_board}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    service = make_service(env={**fake_worker_env(tmp_path), "TOWERBOARD_PYTHON": str(python)})
    service.start()
    job = service.submit(job_spec(name="quick"))  # the stand-in succeeds at once
    service.wait_state(job["id"], "succeeded")
    result = towerboard("tensorboard", "--jobs", job["id"], url=service.base_url, timeout=240)
    assert result.returncode == 1, result.stderr
    assert re.fullmatch(
        r"towerboard: error: TensorBoard did not come up \(state stopped\): TensorBoard \(pid "
        rf"\d+\) exited with code 1 while starting; see {re.escape(str(service.data_dir))}/"
        r"tensorboard\.log\.",
        result.stderr.splitlines()[-1],
    ), result.stderr


def test_errors_are_one_line_with_exit_codes(service: Service, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": {"format": "synthetic"}, "towers": 0, "bogus": 1}))
    rejected = towerboard("submit", str(bad), url=service.base_url)
    assert rejected.returncode == 2
    assert one_error_line(rejected) == (
        f"towerboard: error: the service rejected {bad}: Invalid request: 2 errors: "
        "towers: Input should be greater than or equal to 1. Received: 0; "
        "bogus: Unknown key. Remove it or check its spelling. Expected one of: name, priority, "
        "model, data, towers, parameter_device, batch_size, steps, epochs, optimizer, "
        "weight_decay, clip_norm, ema_decay, eval, summaries, checkpoint, seed, deterministic"
    )

    not_json = tmp_path / "not.json"
    not_json.write_text("{\n  'towers': 2\n}")
    invalid = towerboard("submit", str(not_json), url=service.base_url)
    assert invalid.returncode == 2
    assert one_error_line(invalid) == (
        f"towerboard: error: {not_json} is not valid JSON: Expecting property name enclosed "
        "in double quotes at line 2 column 3"
    )

    unknown = towerboard("status", "nosuchjob2", url=service.base_url)
    assert unknown.returncode == 1
    assert one_error_line(unknown) == "towerboard: error: Job 'nosuchjob2' not found."

    # --url wins over TOWERBOARD_URL; nothing listens on port 1.
    down = towerboard("status", "--url", "http://127.0.0.1:1", url=service.base_url)
    assert down.returncode == 3
    assert one_error_line(down).startswith(
        "towerboard: error: cannot reach the service at http://127.0.0.1:1 (ConnectError:"
    )

    # A URL without its scheme is a usage error, not a service that cannot be reached.
    for bad_url in ("localhost:8000", "http://[::1"):
        no_scheme = towerboard("status", "--url", bad_url, url=service.base_url)
        assert no_scheme.returncode == 2, no_scheme.stderr
        assert no_scheme.stderr.strip().splitlines()[-1] == (
            "towerboard status: error: argument --url: expected the service's URL, like "
            f"http://127.0.0.1:8000. Received: {bad_url!r}"
        )

    usage = towerboard("logs", "abc", "--tail", "0", url=service.base_url)
    assert usage.returncode == 2
    assert (
        "argument --tail: expected a whole number from 1 to 100000. Received: '0'" in usage.stderr
    )


def test_submit_to_a_stopped_service_says_the_job_may_exist(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # `kill -STOP` the service, submit, `kill -CONT`: the service made the job from the
    # request waiting in its socket, while the client said "cannot reach the service ...
    # Is `towerboard serve` running?" (exit 3), so a script retrying on 3 ran it twice.
    import argparse

    from service.client import verbs
    from service.client.api import Client
    from service.client.common import EXIT_NO_ANSWER, ClientError

    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="stopped-service")))
    assert service.process is not None
    client = Client(service.base_url, None, timeout=1.0)  # the CLI's 30 s, shortened
    os.kill(service.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ClientError) as no_answer:
            verbs.submit(client, argparse.Namespace(spec=str(spec), watch=False, url=None))
    finally:
        os.kill(service.process.pid, signal.SIGCONT)
        client.close()
    assert no_answer.value.code == EXIT_NO_ANSWER
    assert no_answer.value.message == (
        f"sent POST /api/v1/jobs to the service at {service.base_url}, but no answer came "
        "(ReadTimeout: timed out): it may or may not have been done; check with "
        "`towerboard status --name stopped-service` before trying again"
    )
    # What it says to run finds the job the service made.
    deadline = time.monotonic() + 30
    while "stopped-service" not in (found := towerboard(
        "status", "--name", "stopped-service", url=service.base_url
    )).stdout:  # fmt: skip
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def test_errors_of_a_body_name_the_options_that_sent_it(
    service: Service, watched: dict[str, Any]
) -> None:
    # `tensorboard --jobs nosuchjob` said "Invalid request: 1 error: job_ids.0: Unknown
    # job. Received: 'nosuchjob'" (exit 2) where every other verb says the job is not
    # found (exit 1); `resume ID --steps 10` named `steps`, the API's field.
    unknown = towerboard("tensorboard", "--jobs", "nosuchjob", url=service.base_url)
    assert unknown.returncode == 1, unknown.stderr
    assert one_error_line(unknown) == "towerboard: error: Job 'nosuchjob' not found."
    some = towerboard("tensorboard", "--jobs", watched["id"], "nosuch1", "nosuch2",
                      url=service.base_url)  # fmt: skip
    assert some.returncode == 1, some.stderr
    assert one_error_line(some) == "towerboard: error: Jobs 'nosuch1', 'nosuch2' not found."
    # What of the service's refusal that reads: each unknown id's place in the body, not
    # its words (it checked that they began "Unknown job"). Each is then looked up, and a
    # refusal of a job that is there is said as the service said it.
    from service.client import verbs
    from service.client.api import Client
    from service.client.common import ClientError

    raw = httpx.post(
        f"{service.base_url}/api/v1/tensorboard", json={"job_ids": [watched["id"], "nosuch1"]}
    )
    assert raw.status_code == 422, raw.text
    assert [e["field"] for e in raw.json()["errors"]] == ["job_ids.1"]
    other = ClientError("x", 2, status=422, errors=[{"field": "job_ids.0", "message": "No."}])
    client = Client(service.base_url, None)
    try:
        assert verbs._unknown_jobs(client, other, [watched["id"]]) is None
        gone = verbs._unknown_jobs(client, other, ["nosuch1"])
    finally:
        client.close()
    assert gone is not None and gone.message == "Job 'nosuch1' not found."

    shorter = towerboard("resume", watched["id"], "--steps", "10", url=service.base_url)
    assert shorter.returncode == 2, shorter.stderr
    assert one_error_line(shorter) == (
        "towerboard: error: Invalid request: 1 error: --steps: Expected more than 40, the "
        "step of the job's latest checkpoint, where it resumes. Received: 10"
    )


def test_submit_spec_the_client_cannot_re_encode_is_judged_by_the_service(
    service: Service, tmp_path: Path
) -> None:
    # Valid JSON that Python reads as a value JSON cannot write back: a number past float's
    # range (inf) and an escape that is half a UTF-16 pair. Re-encoded by the client, each
    # was a ValueError traceback; sent as written, the service names the field.
    cases = (
        ('"optimizer": {"learning_rate": 1e400}', "optimizer.learning_rate: Input should be "
         "a finite number. Received: inf"),
        ('"steps": -1e400', "steps: Input should be a finite number. Received: -inf"),
        ('"name": "\\ud800"', "name: Input should be a valid string, unable to parse raw "
         "data as a unicode string. Received: '\\ud800'"),
    )  # fmt: skip
    for field, said in cases:
        spec = tmp_path / "spec.json"
        spec.write_text('{"data": {"format": "synthetic"}, ' + field + "}")
        rejected = towerboard("submit", str(spec), url=service.base_url)
        assert rejected.returncode == 2, rejected.stderr
        assert one_error_line(rejected) == (
            f"towerboard: error: the service rejected {spec}: Invalid request: 1 error: {said}"
        )


def test_submit_spec_too_large_is_a_rejected_spec_exit_2(service: Service, tmp_path: Path) -> None:
    # The service's 413 is a rejected spec like its 422: exit 2 (it was 1, as for a
    # service that failed), naming the file.
    spec = tmp_path / "huge.json"
    spec.write_text(json.dumps({**job_spec(), "name": "x" * 1_100_000}))
    rejected = towerboard("submit", str(spec), url=service.base_url)
    assert rejected.returncode == 2, rejected.stderr
    assert re.fullmatch(
        rf"towerboard: error: the service rejected {re.escape(str(spec))}: Request body too "
        r"large: 11\d{5} bytes, and at most 1048576 bytes are accepted\. A job spec is a few "
        r"kilobytes; data goes in files under the data roots, named by `data\.path`\.",
        one_error_line(rejected),
    )


def test_submit_spec_not_utf8_is_one_line_exit_2(tmp_path: Path) -> None:
    # A spec saved as UTF-16 (as some Windows editors do), or a binary file by mistake: read
    # before any request, so no service is needed. It was a UnicodeDecodeError traceback.
    utf16 = tmp_path / "utf16.json"
    utf16.write_text(json.dumps(job_spec()), encoding="utf-16")
    result = towerboard("submit", str(utf16), url="http://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert one_error_line(result) == (
        f"towerboard: error: cannot read the spec {utf16}: it is not UTF-8 text "
        "(invalid start byte at byte 0); save it as UTF-8 JSON"
    )
    piped = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", "-"],
        cwd=ROOT, env=cli_env("http://127.0.0.1:1"), input=b"\xff{}", capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert piped.returncode == 2, piped.stderr
    assert piped.stderr.decode().strip() == (
        "towerboard: error: cannot read the spec stdin: it is not UTF-8 text "
        "(invalid start byte at byte 0); save it as UTF-8 JSON"
    )


def test_url_of_something_else_than_the_service_is_one_line(tmp_path: Path) -> None:
    # --url at another web server (a wrong port, or a proxy's sign-in page) that answers
    # 200 with HTML: it was a JSONDecodeError traceback.
    import http.server

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's own name)
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>Sign in</html>")

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec()))
    try:
        for args in (("status", "abc"), ("status",), ("submit", str(spec)), ("cancel", "abc")):
            result = towerboard(*args, url=url)
            assert result.returncode == 1, (args, result.stderr)
            path = "/api/v1/jobs" + ("/abc" if "abc" in args else "")
            path += "/cancel" if args[0] == "cancel" else ""
            assert one_error_line(result) == (
                f"towerboard: error: {url} answered {path} with HTTP 200 OK (text/html), not "
                "the service's JSON: is --url (or TOWERBOARD_URL) a Towerboard service?"
            ), args
    finally:
        server.shutdown()


def test_error_from_a_url_that_is_no_service_says_so(tmp_path: Path) -> None:
    # `--url` at `python -m http.server`: "HTTP 404: <!DOCTYPE HTML>", with no word of
    # what was wrong (the hint came only for a success that was not JSON).
    import http.server
    from functools import partial

    class Files(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    (site := tmp_path / "site").mkdir()
    handler = partial(Files, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec()))
    try:
        listed = towerboard("status", url=url)
        one = towerboard("status", "abc", url=url)
        submitted = towerboard("submit", str(spec), url=url)
    finally:
        server.shutdown()
        server.server_close()
    for result, path in ((listed, "/api/v1/jobs"), (one, "/api/v1/jobs/abc")):
        assert result.returncode == 1, result.stderr
        assert one_error_line(result) == (
            f"towerboard: error: {url} answered {path} with HTTP 404 File not found "
            "(text/html), not the service's JSON: the service, or a proxy in front of it, "
            "refused the request; is --url (or TOWERBOARD_URL) a Towerboard service?"
        )
    assert submitted.returncode == 1, submitted.stderr  # not 2: no spec was judged
    assert one_error_line(submitted) == (
        f"towerboard: error: {url} answered /api/v1/jobs with HTTP 501 Unsupported method "
        "('POST') (text/html), not the service's JSON: is --url (or TOWERBOARD_URL) a "
        "Towerboard service?"
    )


def test_bad_url_from_the_environment_names_the_variable() -> None:
    # It said "argument --url: ..." to someone who never gave --url.
    result = towerboard("status", url="localhost:8000")
    assert result.returncode == 2, result.stderr
    assert one_error_line(result) == (
        "towerboard: error: TOWERBOARD_URL: expected the service's URL, like "
        "http://127.0.0.1:8000. Received: 'localhost:8000'"
    )
    # The API's prefix, as the README's curl lines show it: every verb asked
    # /api/v1/api/v1/... and got "No such resource".
    for given, root in (
        ("http://localhost:8000/api/v1", "http://localhost:8000/"),
        ("https://host/towerboard/api/v1/", "https://host/towerboard"),
    ):
        api = towerboard("status", url=given)
        assert api.returncode == 2, api.stderr
        assert one_error_line(api) == (
            "towerboard: error: TOWERBOARD_URL: expected the service's URL, without the "
            f"API's /api/v1 (the verbs add it), like {root}. Received: {given!r}"
        )
    # --url wins over it, bad or not.
    down = towerboard("status", "--url", "http://127.0.0.1:1", url="localhost:8000")
    assert down.returncode == 3, down.stderr


def test_output_cut_short_by_its_reader_ends_quietly(
    service: Service, watched: dict[str, Any]
) -> None:
    # `towerboard status ID | head -1`, where head has gone before the first write.
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "service.cli", "status", watched["id"]],
            cwd=ROOT, env=cli_env(service.base_url), stdout=write, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.stderr == ""  # no traceback
    assert result.returncode == 141


def towerboard_with_stdout(
    stdout: int | None, *args: str, url: str, close_stdout: bool = False
) -> subprocess.CompletedProcess[str]:
    """`towerboard ARGS` with its standard output on the file descriptor `stdout`, or
    closed (`>&-`)."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT, env=cli_env(url), stdout=stdout, stderr=subprocess.PIPE, text=True,
        timeout=120, preexec_fn=(lambda: os.close(1)) if close_stdout else None,
    )  # fmt: skip


def closed_pipe() -> int:
    """The writing end of a pipe whose reader has gone, as `| head` leaves it."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_stdout_that_takes_nothing_more_is_one_line(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # `towerboard status > /dev/full` and the like: an OSError traceback (only a broken
    # pipe was handled), against "errors are one line on stderr".
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="chatty"))  # 200 lines of log, then runs on
    service.wait_for(
        job["id"],
        lambda _: "line 199" in service.client.get(f"/api/v1/jobs/{job['id']}/logs").text,
        what="its log",
    )
    with open("/dev/full", "w") as full:
        for args in (("status",), ("status", job["id"]), ("logs", job["id"]), ("devices",)):
            result = towerboard_with_stdout(full.fileno(), *args, url=service.base_url)
            assert result.returncode == 1, (args, result.stderr)
            assert result.stderr == (
                "towerboard: error: cannot write to standard output: No space left on device\n"
            ), args


def test_a_change_made_is_said_whatever_becomes_of_stdout(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # `towerboard submit spec.json | true` ended with 141 and nothing said, the job made
    # and its id lost; `delete A B | true` deleted A alone; `submit spec.json >&-` made the
    # job, then failed with an AttributeError traceback.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="quick")))

    def jobs() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = service.client.get("/api/v1/jobs").json()["data"]
        return listed

    # No standard output at all: refused before anything is sent.
    closed = towerboard_with_stdout(None, "submit", str(spec), url=service.base_url,
                                    close_stdout=True)  # fmt: skip
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr == (
        "towerboard: error: standard output is closed, and the results go there; give the "
        "command one (> /dev/null to drop them)\n"
    )
    assert jobs() == []

    # Its reader gone: the job is made, and stderr says which; 141, as for any verb.
    pipe = closed_pipe()
    try:
        gone = towerboard_with_stdout(pipe, "submit", str(spec), url=service.base_url)
    finally:
        os.close(pipe)
    assert gone.returncode == 141, gone.stderr
    (made,) = jobs()
    assert gone.stderr == f"submitted 'quick' as job {made['id']} (queued)\n"

    # A full disk: the same, and the failure in one line.
    with open("/dev/full", "w") as full:
        failed = towerboard_with_stdout(full.fileno(), "submit", str(spec), url=service.base_url)
    assert failed.returncode == 1, failed.stderr
    second = jobs()[0]
    assert second["id"] != made["id"]
    assert failed.stderr == (
        f"submitted 'quick' as job {second['id']} (queued)\n"
        "towerboard: error: cannot write the results to standard output (No space left on "
        "device): what was done is said above\n"
    )

    # A batch goes on to its end, saying on stderr what stdout would have said.
    for job in (made, second):
        service.wait_state(job["id"], "succeeded")
        service.wait_exited(job["id"])
    pipe = closed_pipe()
    try:
        deleted = towerboard_with_stdout(
            pipe, "delete", made["id"], second["id"], url=service.base_url
        )
    finally:
        os.close(pipe)
    assert deleted.returncode == 141, deleted.stderr
    assert deleted.stderr == f"{made['id']} deleted\n{second['id']} deleted\n"
    assert jobs() == []


def test_token_from_environment(make_service: Callable[..., Service]) -> None:
    secured = make_service(env={"TOWERBOARD_TOKEN": "cli-token"})
    secured.start()
    without = towerboard("status", url=secured.base_url)
    assert without.returncode == 1
    assert one_error_line(without).startswith(
        "towerboard: error: the service needs a token: set TOWERBOARD_TOKEN (Missing bearer token."
    )
    wrong = towerboard("status", url=secured.base_url, env={"TOWERBOARD_TOKEN": "nope"})
    assert one_error_line(wrong).startswith(
        "towerboard: error: the token in TOWERBOARD_TOKEN was refused"
    )
    right = towerboard("status", url=secured.base_url, env={"TOWERBOARD_TOKEN": "cli-token"})
    assert right.returncode == 0, right.stderr
    assert right.stdout == "no jobs\n"


def test_token_with_whitespace_around_it(make_service: Callable[..., Service]) -> None:
    # `TOWERBOARD_TOKEN="cli-token "` on both sides: the service never matched a header (its
    # value loses the space), and the CLI failed with "cannot reach the service ...
    # LocalProtocolError: Illegal header value" (exit 3, as if the service were down).
    secured = make_service(env={"TOWERBOARD_TOKEN": "cli-token "})
    secured.start()
    right = towerboard("status", url=secured.base_url, env={"TOWERBOARD_TOKEN": "cli-token \n"})
    assert right.returncode == 0, right.stderr
    assert right.stdout == "no jobs\n"
    headers = {"Authorization": "Bearer cli-token"}
    assert httpx.get(f"{secured.base_url}/api/v1/jobs", headers=headers).status_code == 200
    bad = towerboard("status", url=secured.base_url, env={"TOWERBOARD_TOKEN": "cli\x01token"})
    assert bad.returncode == 2
    assert one_error_line(bad) == (
        "towerboard: error: TOWERBOARD_TOKEN holds characters an HTTP header cannot carry "
        "(expected printable ASCII only)"
    )


def test_status_lists_more_than_one_page(make_service: Callable[..., Service]) -> None:
    # The API gives at most 200 jobs a page; --limit stopped at 200 too, and past it the
    # listing said "... 50 more (use --limit)" with no --limit left to use.
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="old")).model_dump(mode="json")
    for _ in range(230):
        store.cancel_queued(store.create(spec).id)  # ended before the service starts
    store.close()
    service.start()
    listing = towerboard("status", "--limit", "500", url=service.base_url)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert len(rows) == 230 and len({row.split()[0] for row in rows}) == 230
    some = towerboard("status", "--limit", "210", url=service.base_url)
    assert some.stdout.splitlines()[-1] == "... 20 more (use --limit)"
    assert len(some.stdout.splitlines()) == 1 + 210 + 1
    as_json = towerboard("status", "--limit", "201", "--json", url=service.base_url)
    page = json.loads(as_json.stdout)
    assert len(page["data"]) == 201 and page["count"] == 230 and page["next_cursor"]


def test_phase_shows_how_far_a_phase_is() -> None:
    from service.client.display import phase
    from service.progress import fold_progress

    assert phase({"phase": "eval", "phase_done": 31, "phase_total": 50}) == "eval 31/50"
    assert phase({"phase": "training"}) == "training"
    assert phase({}) == ""

    # A preparing worker's stage, as far as it says in whole percents (never 100 early):
    # its amounts folded as the service folds them, whose `stage_percent` (a tenth, rounded)
    # is 100.0 at 9,996 of 10,000, which said "100%" before the load was through.
    def loading(done: int) -> dict[str, Any]:
        line = {"time": 1.0, "event": "phase", "phase": "preparing", "stage": "loading data"}
        folded, _, _ = fold_progress(
            None, None, [{**line, "stage_done": done, "stage_total": 10_000}]
        )
        assert folded is not None
        return folded

    assert loading(9_996)["stage_percent"] == 100.0
    assert phase(loading(9_996)) == "loading data 99%"
    assert phase(loading(4_299)) == "loading data 42%"
    assert phase(loading(10_000)) == "loading data 100%"
    assert phase({"phase": "preparing", "stage": "building the model"}) == "building the model"
    assert phase({"phase": "preparing"}) == "preparing"  # a worker that says no stage

    # Every stage a worker says, with its amounts (`checking data`, `restoring checkpoint`
    # came after the rest): shown by its name, as far as it says.
    from trainer.preparing import STAGES

    for stage in STAGES:
        line = {"time": 1.0, "event": "phase", "phase": "preparing", "stage": stage}
        folded, _, _ = fold_progress(None, None, [{**line, "stage_done": 3, "stage_total": 10}])
        assert folded is not None and phase(folded) == f"{stage} 30%"


def test_watch_folds_a_phase_with_how_far_it_is_and_a_stage() -> None:
    # The stream's events folded as the service folds them: the eval's "3/20" stayed on
    # the training after it, and a preparation's stage showed only as "preparing".
    from service.client.display import fold_event, phase

    job: dict[str, Any] = {"state": "running", "progress": {"phase": "preparing"}}
    job = fold_event(job, "phase", {"phase": "preparing", "stage": "loading data",
                                    "stage_done": 420, "stage_total": 1000})  # fmt: skip
    assert phase(job["progress"]) == "loading data 42%"
    job = fold_event(job, "start", {"step": 0, "total": 9, "phase": "starting"})
    assert phase(job["progress"]) == "starting"
    assert not any(key.startswith("stage") for key in job["progress"])
    job = fold_event(job, "phase", {"step": 5, "phase": "eval", "phase_done": 3, "phase_total": 20})
    assert phase(job["progress"]) == "eval 3/20"
    job = fold_event(job, "progress", {"step": 6, "phase": "training", "loss": 1.0})
    assert phase(job["progress"]) == "training"


def test_eta_counts_down_then_is_unknown_once_the_worker_goes_quiet() -> None:
    # A stalled worker's ETA counted down to 0 and stayed there: "nearly done".
    from datetime import UTC, datetime, timedelta

    from service.client.display import eta

    def job(reported_ago: float) -> dict[str, Any]:
        at = datetime.now(UTC) - timedelta(seconds=reported_ago)
        return {"state": "running", "progress": {"eta_seconds": 300, "updated_at": at.isoformat()}}

    assert eta(job(10)) == "4m50s"
    assert eta(job(59)) == "4m01s"
    assert eta(job(130)) == "?"
    assert eta(job(130), why=True) == "? (no report for 2m10s)"
    assert eta({**job(130), "state": "succeeded"}) == "-"


def test_watch_into_a_file_writes_a_line_per_new_phase_not_per_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `submit --watch 2> job.log`: a job checkpointing every 100 steps flips between the
    # training and checkpoint phases a few times a second, and each flip was a line (360
    # lines for a 7-minute job). A phase is written when first seen, a state change always,
    # and otherwise a line per 10 s.
    import io

    from service.client.display import ProgressLine

    now = [0.0]
    monkeypatch.setattr("service.client.display.time.monotonic", lambda: now[0])
    out = io.StringIO()
    line = ProgressLine(out)

    def job(state: str, phase: str | None, step: int) -> dict[str, Any]:
        progress = {"phase": phase, "step": step, "total": 1000, "percent": step / 10}
        return {"state": state, "progress": progress if phase else None}

    line.update(job("queued", None, 0))
    line.update(job("running", None, 0))
    line.update(job("running", "starting", 0))
    for step in range(100, 600, 100):
        now[0] += 0.3
        line.update(job("running", "training", step - 50))
        line.update(job("running", "checkpoint", step))
    line.update(job("running", "eval", 600))
    now[0] += 10.0
    line.update(job("running", "training", 700))
    line.finish(job("succeeded", "done", 1000))
    pattern = re.compile(r"\]\s+(?:[\d.]+%|-)\s+(.+?) step ")
    phases = [pattern.search(text)[1] for text in out.getvalue().splitlines()]  # type: ignore[index]
    assert phases == [
        "queued",
        "running",
        "running (starting)",
        "running (training)",
        "running (checkpoint)",
        "running (eval)",
        "running (training)",  # 10 s on
        "succeeded",
    ]


def test_serve_refuses_a_taken_port_before_touching_jobs(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A job left "running" by a service that was killed, whose worker died with it: the
    # next service to start on this data dir would requeue it and start a worker.
    first = make_service(env=fake_worker_env(tmp_path))
    first.start()
    job = first.submit(job_spec(name="sleepy"))
    first.wait_state(job["id"], "running")
    # Its worker past its exec: killed mid-spawn, the service left a child that became the
    # worker after every look for it had passed.
    first.wait_reported(job["id"])
    first.kill()
    kill_processes_under(first.data_dir)
    busy = make_service()
    busy.start()

    second = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(busy.port),
         "--data-dir", str(first.data_dir)],
        cwd=ROOT, env=first.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].endswith(
        f"ERROR towerboard: Cannot listen on 127.0.0.1:{busy.port} (Address already in use). "
        "Expected a free port: stop what holds it, or pick another with --port or "
        "TOWERBOARD_PORT."
    )
    # Nothing was recovered, requeued or started: the job is as the killed service left it.
    assert processes_under(first.data_dir) == []
    store = JobStore(first.data_dir / "towerboard.db")
    try:
        record = store.get(job["id"])
    finally:
        store.close()
    assert record is not None
    assert (record.state.value, record.attempts) == ("running", 1)


def test_serve_refuses_a_data_dir_in_use_in_one_line(
    make_service: Callable[..., Service],
) -> None:
    first = make_service()
    first.start()
    second = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(free_port()),
         "--data-dir", str(first.data_dir)],
        cwd=ROOT, env=first.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr  # no traceback from the app's start-up
    assert lines[0].endswith(
        f"ERROR towerboard: Another Towerboard service is using the data dir {first.data_dir} "
        f"(it holds {first.data_dir / 'towerboard.lock'}); refusing to start a second one on "
        "it. Stop that one, or give this one another --data-dir / TOWERBOARD_DATA_DIR."
    )
    assert first.process is not None and first.process.poll() is None
