"""`towerboard metrics ID --into FILE [--follow]`: a CSV file kept in sync with a job, read
on after its last row at the revision kept beside it (FILE.revision), and cut back and
read again where a resume replaced rows it holds. Against a real service whose stand-in
workers resume over steps already read (test_metrics_read_on's), or step on until
cancelled."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.progress import SERIES
from service.store import JobState, JobStore
from tests.service.harness import (
    Service,
    free_port,
    job_spec,
    long_job,
    stand_in_service,
    stepping_worker_env,
)
from tests.service.test_client import towerboard, towerboard_in_background
from tests.service.test_metrics_read_on import EVALUATING_WORKER, RESUMING_WORKER, running

NAMES = ("--name", "loss", "--name", "eval_loss")


def fresh(service: Service, job_id: str, *names: str) -> str:
    """The job's CSV as a plain read gives it now, header and all."""
    result = towerboard("metrics", job_id, *names, url=service.base_url)
    assert result.returncode == 0, result.stderr
    return result.stdout


def into(service: Service, job_id: str, path: Path, *args: str, code: int = 0) -> str:
    """`metrics JOB --into PATH ARGS`: its stderr."""
    result = towerboard("metrics", job_id, *args, "--into", str(path), url=service.base_url)
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    return result.stderr


def revision(path: Path) -> dict[str, Any]:
    held: dict[str, Any] = json.loads(Path(f"{path}.revision").read_text())
    return held


def wait_until(what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_file_kept_by_reading_on_is_the_whole_read(tmp_path: Path) -> None:
    # Between a step's line and its eval the step is held: read on, it comes whole later.
    with stand_in_service(tmp_path, ("evaluating_worker", EVALUATING_WORKER)) as service:
        job_id = service.submit(job_spec(name="into"))["id"]
        names = ("--name", "loss", "--name", "eval_accuracy")
        path = tmp_path / "run.csv"
        service.wait_for(job_id, lambda job: (job["progress"] or {}).get("step") == 20,
                         timeout=60, what="step 20")  # fmt: skip
        said = into(service, job_id, path, *names)
        assert (
            path.read_text()
            == "step,loss,eval_accuracy\n10,0.1,\n"
            == fresh(service, job_id, *names)
        )
        assert said == f"wrote 1 row to {path} (to step 10)\n"
        assert revision(path) == {"job_id": job_id, "revision": 0}
        # Nothing new (20 waits for its eval): the file is as it was.
        said = into(service, job_id, path, *names)
        assert said == f"{path} is up to date (to step 10)\n"
        assert path.read_text() == "step,loss,eval_accuracy\n10,0.1,\n"

        service.release(job_id)
        service.wait_for(job_id, lambda job: (job["eval"] or {}).get("step") == 20,
                         timeout=60, what="the eval of 20")  # fmt: skip
        service.wait_for(job_id, lambda job: (job["progress"] or {}).get("step") == 40,
                         timeout=60, what="step 40")  # fmt: skip
        said = into(service, job_id, path, *names)
        assert said == f"appended 2 rows to {path} (to step 30)\n"
        assert path.read_text().endswith(f"10,0.1,\n20,0.05,0.1\n30,{1 / 30!r},\n")

        service.release(job_id)
        service.wait_state(job_id, "succeeded", timeout=60)
        # Without --name, the columns are the file's.
        said = into(service, job_id, path)
        assert said == f"appended 1 row to {path} (to step 40)\n"
        assert path.read_text() == fresh(service, job_id, *names)
        assert path.read_text().endswith("\n40,0.025,0.2\n")
        # A new file without --name has every series, as the service names them.
        whole = tmp_path / "whole.csv"
        into(service, job_id, whole)
        assert whole.read_text().splitlines()[0] == "step," + ",".join(SERIES)
        every = [word for name in SERIES for word in ("--name", name)]
        assert whole.read_text() == fresh(service, job_id, *every)


def test_a_file_kept_through_a_resume_that_replaced_its_rows(tmp_path: Path) -> None:
    with stand_in_service(tmp_path, ("resuming_worker", RESUMING_WORKER)) as service:
        # Followed from the start: the worker dies at 30, its next attempt trains 21-30
        # again to other values; the follower cuts its file back to 20 and reads on.
        crashed = service.submit(job_spec(name="crash"))["id"]
        path = tmp_path / "crash.csv"
        follower = towerboard_in_background(
            "metrics", crashed, *NAMES, "--into", str(path), "--follow", url=service.base_url
        )
        try:
            wait_until("row 30", lambda: path.exists() and "\n30," in path.read_text())
            assert path.read_text() == fresh(service, crashed, *NAMES)  # as then
            service.release(crashed)
            out, err = follower.communicate(timeout=120)
        finally:
            follower.kill()
        assert follower.returncode == 0, err
        assert (
            f"job {crashed}: a resume replaced its rows after step 20; rewrote {path} from "
            "there (1 row dropped, to read again)\n"
        ) in err
        assert err.endswith(
            f"job {crashed} succeeded: {path} holds job {crashed}'s rows to step 40\n"
        )
        assert out == ""
        assert path.read_text() == fresh(service, crashed, *NAMES)
        assert "\n30,0.1,\n" in path.read_text()  # the second attempt's value
        assert revision(path) == {"job_id": crashed, "revision": 1}

        # Read now and then: cancelled during its eval of 20 (20 is read without it), then
        # resumed, which does that eval first.
        cancelled = service.submit(job_spec(name="cancel"))["id"]
        path = tmp_path / "cancel.csv"
        service.wait_for(cancelled, lambda job: (job["progress"] or {}).get("phase") == "eval",
                         timeout=60, what="the eval of 20")  # fmt: skip
        assert service.client.post(f"/api/v1/jobs/{cancelled}/cancel").status_code == 202
        service.wait_state(cancelled, "cancelled", timeout=60)
        into(service, cancelled, path, *NAMES)
        assert path.read_text() == "step,loss,eval_loss\n10,0.1,\n20,0.05,\n"
        service.wait_exited(cancelled)
        assert service.client.post(f"/api/v1/jobs/{cancelled}/resume").status_code == 200
        service.wait_state(cancelled, "succeeded", timeout=60)
        said = into(service, cancelled, path, *NAMES)
        assert said.splitlines() == [
            f"job {cancelled}: a resume replaced its rows after step 19; rewrote {path} "
            "from there (1 row dropped, to read again)",
            f"appended 3 rows to {path} (to step 40)",
        ]
        assert path.read_text() == fresh(service, cancelled, *NAMES)
        assert "\n20,0.05,0.1\n" in path.read_text()
        assert revision(path) == {"job_id": cancelled, "revision": 1}
        before = path.read_bytes()
        assert into(service, cancelled, path, *NAMES).startswith(f"{path} is up to date")
        assert path.read_bytes() == before

        # A file read by hand before the resume, without FILE.revision: it reads on from
        # revision 0, so is refused and cut back as well.
        by_hand = tmp_path / "by-hand.csv"
        by_hand.write_text("step,loss,eval_loss\n10,0.1,\n20,0.05,\n")
        said = into(service, cancelled, by_hand, *NAMES)
        assert "a resume replaced its rows after step 19" in said
        assert by_hand.read_text() == fresh(service, cancelled, *NAMES)
        # Another job's file is refused, and left as it is.
        said = into(service, crashed, by_hand, *NAMES, code=1)
        assert said == (
            f"towerboard: error: {by_hand} holds the metrics of job {cancelled} "
            f"(by-hand.csv.revision says so), not of job {crashed}: give --into another file\n"
        )
        assert by_hand.read_text() == fresh(service, cancelled, *NAMES)


def rows_of(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_following_outlives_a_restart_and_ctrl_c_leaves_the_file_whole(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    job_id = service.submit(long_job(name="followed"))["id"]
    service.wait_checkpoint(job_id)
    path = tmp_path / "run.csv"
    follower = towerboard_in_background(
        "metrics", job_id, "--name", "loss", "--into", str(path), "--follow",
        url=service.base_url,
    )  # fmt: skip
    try:
        wait_until("the first rows", lambda: path.exists() and path.stat().st_size > 20)
        service.kill()  # the worker lives on, to be adopted
        time.sleep(3.0)  # longer than a poll and a retry
        assert follower.poll() is None, follower.communicate()
        service.start()
        grown = path.stat().st_size
        wait_until("rows after the restart", lambda: path.stat().st_size > grown)
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 130, err
    lost = f"lost the service at {service.base_url}; trying again for up to 120 s"
    back = f"the service at {service.base_url} is back"
    lines = err.splitlines()
    assert any(line.startswith(f"towerboard: {lost}") for line in lines), err
    assert f"towerboard: {back}" in lines, err
    # Its rows are the job's to its last one, and its revision is theirs.
    held = rows_of(path.read_text())
    last = int(held[-1][0])
    assert lines[-1] == (
        f"stopped following the metrics of job {job_id}; {path} holds job {job_id}'s rows "
        f"to step {last}"
    )
    whole = rows_of(fresh(service, job_id, "--name", "loss"))
    assert held == [row for row in whole if row[0] == "step" or int(row[0]) <= last]
    assert revision(path) == {"job_id": job_id, "revision": 0}
    # Read on once the job has ended: the whole read.
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    service.wait_state(job_id, "cancelled")
    into(service, job_id, path, "--name", "loss")
    assert path.read_text() == fresh(service, job_id, "--name", "loss")


def test_a_full_disk_leaves_no_half_row(
    make_service: Callable[..., Service], tmp_path: Path, small_disk: Path
) -> None:
    service = make_service(env=stepping_worker_env(tmp_path))
    service.start()
    job_id = service.submit(long_job(name="filled"))["id"]
    service.wait_for(job_id, lambda job: ((job["progress"] or {}).get("step") or 0) >= 20)
    # 6 bytes short of a whole page: a write of more fills the page, then fails.
    path = small_disk / "run.csv"
    text = "step,loss\n" + "0,0.0\n" * 679 + "1,1.0\n"
    path.write_text(text)
    assert len(text) == 4090
    Path(f"{path}.revision").touch()  # made beforehand: a full disk takes no file more
    with open(small_disk / "filler", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            while True:
                filler.write(b"\0")
        except OSError:
            pass
    said = into(service, job_id, path, "--name", "loss", code=1)
    assert said == (
        f"towerboard: error: cannot write {path}: No space left on device; {path} is as it was\n"
    )
    assert path.read_text() == text
    (small_disk / "filler").unlink()
    into(service, job_id, path, "--name", "loss")
    held = rows_of(path.read_text())
    assert held[: len(text.splitlines())] == rows_of(text)
    whole = rows_of(fresh(service, job_id, "--name", "loss"))
    appended = held[len(text.splitlines()) :]
    assert appended and appended == [row for row in whole[2:] if int(row[0]) <= int(held[-1][0])]
    service.client.post(f"/api/v1/jobs/{job_id}/cancel")


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("step,loss,accuracy\n10,0.1,0.5\n", "{path} has the columns 'step,loss,accuracy', not "
         "'step,loss,eval_loss' as the --name options give: name the series it was made with, "
         "or give --into another file"),
        ("id,value\n1,2\n", "{path} is not a CSV of a job's metrics: its first line is "
         "'id,value', not a header like 'step,loss,eval_accuracy' (give --into another file, "
         "or remove it to write it whole)"),
        (b"\x89PNG\r\n\x1a\n\0\0", "{path} is not a CSV of a job's metrics: its first line is "
         "'\ufffdPNG\\r', not a header like 'step,loss,eval_accuracy' (give --into another "
         "file, or remove it to write it whole)"),
        # Cut short, but no row of a towerboard CSV (a row cut short is cut off: below).
        ("step,loss,eval_loss\n10,0.1,\ndone", "{path} does not end with a whole row of its "
         "CSV: its last line is cut short (no line end after it). Remove that line (or the "
         "file, to write it whole) and run the command again"),
        ("step,loss,eval_loss\n10,0.1,\n20,0.05,0.1,3", "{path} does not end with a whole row "
         "of its CSV: its last line is cut short (no line end after it). Remove that line (or "
         "the file, to write it whole) and run the command again"),
        ("step,loss,eval_loss\n10,0.1,\n20,0.05\n", "{path} does not end with a whole row of "
         "its CSV: its last line, '20,0.05', is not a row of it. Remove that line (or the "
         "file, to write it whole) and run the command again"),
        ("step,loss,eval_loss\n10,0.1,\nstep,loss,eval_loss\n", "{path} does not end with a "
         "whole row of its CSV: its last line, 'step,loss,eval_loss', is not a row of it. "
         "Remove that line (or the file, to write it whole) and run the command again"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_one_to_read_on_is_refused_unchanged(
    tmp_path: Path, content: str | bytes, error: str
) -> None:
    path = tmp_path / "run.csv"
    data = content if isinstance(content, bytes) else content.encode()
    path.write_bytes(data)
    # Refused before any request: no service is there to ask.
    unreachable = f"http://127.0.0.1:{free_port()}"
    result = towerboard("metrics", "abc", *NAMES, "--into", str(path), url=unreachable)
    assert result.returncode == 1
    assert result.stderr == f"towerboard: error: {error.format(path=path)}\n"
    assert path.read_bytes() == data
    assert not Path(f"{path}.revision").exists()


@pytest.mark.parametrize(
    ("held", "after"),
    [
        ("step,loss,eval_loss\n10,0.1,\n20,0.0", "step 10"),  # in a value
        ("step,loss,eval_loss\n10,0.1,\n20,0.05,", "step 10"),  # before the last field
        ("step,loss,eval_loss\n2", "its header"),  # in the first row
    ],
)
def test_a_row_an_append_killed_part_way_left_is_cut_off_and_read_again(
    make_service: Callable[..., Service], held: str, after: str
) -> None:
    """A SIGKILL during an append (nothing holds it off) can leave FILE's last row cut
    short: the next command cuts it off, says so, and reads on after the row before it."""
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job_id, worker = running(store)
    for step in (10, 20, 30, 40):
        worker.report(step)
        if step in (20, 40):
            worker.evaluate(step)
    assert store.finish(job_id, JobState.SUCCEEDED, result={}, error=None)
    store.close()
    service.start()
    path = service.data_dir.parent / "run.csv"
    path.write_text(held)
    # As the killed append left it: FILE.revision is written after the rows.
    Path(f"{path}.revision").write_text(json.dumps({"job_id": job_id, "revision": 0}) + "\n")
    # Not while another command keeps FILE: that row may be its append, under way.
    import fcntl

    with open(f"{path}.revision") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        refused = into(service, job_id, path, *NAMES, code=1)
    assert "is being kept by another towerboard command" in refused
    assert path.read_text() == held
    said = into(service, job_id, path, *NAMES)
    cut = held.rpartition("\n")[2]
    # A file of its header alone is written to, as it says of one never killed.
    done = "wrote 4" if after == "its header" else "appended 3"
    assert said == (
        f"{path} ended in a row cut short, {cut!r} (an earlier append stopped part way): cut "
        f"it off, to read on after {after}\n{done} rows to {path} (to step 40)\n"
    )
    assert path.read_text() == fresh(service, job_id, *NAMES)
    assert path.read_text().startswith(held.rpartition("\n")[0] + "\n")


def test_bad_places_and_options_for_into_are_refused(tmp_path: Path) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"

    def error(*args: str, code: int = 1) -> str:
        result = towerboard("metrics", "abc", *args, url=unreachable)
        assert (result.returncode, result.stdout) == (code, ""), result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        return lines[0].removeprefix("towerboard: error: ")

    assert error("--into", str(tmp_path)) == (
        f"{tmp_path} is a folder; give --into a CSV file's path (in it, say {tmp_path}/abc.csv)"
    )
    assert error("--into", "/dev/null") == (
        "/dev/null is not a plain file; give --into a CSV file's path"
    )
    assert error("--into", str(tmp_path / "no" / "run.csv")) == (
        f"cannot write {tmp_path / 'no' / 'run.csv'}: {tmp_path / 'no'} does not exist"
    )
    assert error("--into", "-", code=2) == (
        "--into takes a file to keep in sync; without it the CSV goes to standard output"
    )
    assert error("--into", "x.csv", "--after-step", "5", "--no-header", code=2) == (
        "--after-step, --no-header go with a read to standard output; --into FILE reads on "
        "after FILE's last row, at the revision kept in x.csv.revision"
    )
    assert error("--follow", code=2) == "--follow goes with --into FILE, which it keeps in sync"
    # A file whose revision is not one towerboard wrote.
    path = tmp_path / "run.csv"
    path.write_text("step,loss\n1,1.0\n")
    Path(f"{path}.revision").write_text("three\n")
    assert error("--into", str(path)) == (
        f'{path}.revision is not a revision towerboard wrote (expected {{"job_id": ID, '
        '"revision": N}); remove it to read on from revision 0, which reads again any rows '
        "a resume replaced"
    )
    # Nothing is left where the service could not be reached: no file, no revision.
    made = tmp_path / "new.csv"
    assert error("--into", str(made), code=3).startswith("cannot reach the service")
    assert not made.exists() and not Path(f"{made}.revision").exists()
    # Another command keeping the file: its revision is locked.
    import fcntl

    Path(f"{path}.revision").write_text('{"job_id": "abc", "revision": 0}\n')
    with open(f"{path}.revision") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert error("--into", str(path)) == (
            f"{path} is being kept by another towerboard command (it holds run.csv.revision); "
            "stop that one first"
        )
    assert Path(f"{path}.revision").exists()
    if os.geteuid() != 0:  # root writes anything
        path.chmod(0o444)
        assert error("--into", str(path)).startswith(f"cannot write {path}: Permission denied")


@pytest.mark.parametrize("given", [".", "..", "/"])
def test_into_a_folder_named_without_a_file_name_is_refused(given: str) -> None:
    # `.` has no name to add `.revision` to: a traceback (ValueError), not the folder's
    # refusal, with or without an option to refuse.
    for extra in ([], ["--after-step", "5"]):
        result = towerboard("metrics", "abc", "--into", given, *extra, url="http://127.0.0.1:9")
        assert result.returncode == (2 if extra else 1), result.stderr
        assert "Traceback" not in result.stderr
        said = result.stderr.removeprefix("towerboard: error: ")
        assert said.startswith("--after-step goes with" if extra else f"{given} is a folder;")


@pytest.mark.parametrize("made", [False, True])
@pytest.mark.parametrize("end", ["/", "/."])
def test_into_a_name_ending_in_a_separator_is_a_folder_not_a_file(
    tmp_path: Path, made: bool, end: str
) -> None:
    """`--into newdir/` names a folder, there or not; Path drops the trailing separator,
    and an absent newdir was made as a CSV file named `newdir`."""
    folder = tmp_path / "newdir"
    if made:
        folder.mkdir()
    given = f"{folder}{end}"
    result = towerboard("metrics", "abc", "--into", given, url="http://127.0.0.1:9")
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    what = "is a folder" if made else "names a folder"
    assert result.stderr == (
        f"towerboard: error: {given} {what}; give --into a CSV file's path (in it, say "
        f"{os.path.join(given, 'abc.csv')})\n"
    )
    assert folder.is_dir() if made else not folder.exists()
    assert sorted(tmp_path.iterdir()) == ([folder] if made else [])
