"""The CLI's transport against a server that closes a kept-alive connection as a request
arrives on it (the race every keep-alive client meets with an idle timeout), and against
servers that take a request and never answer it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from service.client.api import Client, ReusedConnectionRetry
from service.client.common import EXIT_NO_ANSWER, EXIT_UNREACHABLE, ClientError
from tests.service.harness import ROOT, job_spec

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


@contextlib.contextmanager
def stand_in(handle: Callable[[socket.socket, bytes], None]) -> Iterator[str]:
    """A server on a free loopback port that reads each connection's first request head
    and hands the connection and that head to `handle` (a connection closed with no
    request is passed over). Yields its URL; stops its thread on the way out."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                head = _read_head(conn)
                if head:
                    handle(conn, head)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept(): close() alone does not
        server.close()
        thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture(params=["read", "unread"])
def closes_on_second_request(request) -> Iterator[tuple[str, list[str]]]:
    """A server on a free loopback port: on each connection it answers the first request
    (kept alive) and closes without a word when the second one's head is in: having read
    it (the client sees a disconnect), or with it unread (a reset). Yields its URL and the
    request lines it saw, in order."""
    seen: list[str] = []

    def handle(conn: socket.socket, head: bytes) -> None:
        seen.append(head.split(b"\r\n")[0].decode())
        conn.sendall(ANSWER + b'{"n": 1}')
        # "unread": wait for it to arrive, and leave it in the socket.
        second = _read_head(conn) if request.param == "read" else conn.recv(4096, socket.MSG_PEEK)
        # Nothing: the client closed the connection (its last one, as it closed)
        # without sending a second request, which is no request to record.
        if second:
            seen.append(second.split(b"\r\n")[0].decode())

    with stand_in(handle) as url:
        yield url, seen


def test_a_get_sent_as_the_connection_closes_is_sent_again(closes_on_second_request) -> None:
    url, seen = closes_on_second_request
    with httpx.Client(base_url=url, transport=ReusedConnectionRetry()) as client:
        assert client.get("/a").json() == {"n": 1}
        assert client.get("/b").json() == {"n": 1}  # the second try, on a new connection
    assert seen == ["GET /a HTTP/1.1", "GET /b HTTP/1.1", "GET /b HTTP/1.1"]


def test_without_it_the_same_get_fails(closes_on_second_request) -> None:
    # What the test above guards against: httpx alone gives up.
    url, _ = closes_on_second_request
    with httpx.Client(base_url=url) as client:
        client.get("/a")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            client.get("/b")


def test_a_post_is_not_sent_twice(closes_on_second_request) -> None:
    # It may have been acted on: the error stands, for the caller to judge.
    url, seen = closes_on_second_request
    with httpx.Client(base_url=url, transport=ReusedConnectionRetry()) as client:
        client.get("/a")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            client.post("/jobs", json={})
    assert seen == ["GET /a HTTP/1.1", "POST /jobs HTTP/1.1"]


# --- a request sent that no answer came to --------------------------------------------


@contextlib.contextmanager
def never_answers() -> Iterator[str]:
    """A port that takes connections and never answers on them, as a service stopped with
    SIGSTOP (or stuck) does: the kernel completes the connection from its listen backlog,
    the request goes out, and nothing comes back. Yields its URL."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@contextlib.contextmanager
def hangs_up() -> Iterator[tuple[str, list[str]]]:
    """A server that reads each request whole and closes the connection without a word, as
    a service killed while it handled one. Yields its URL and the request lines it read."""
    seen: list[str] = []

    def handle(conn: socket.socket, head: bytes) -> None:
        top, _, body = head.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in top.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            0,
        )  # fmt: skip
        while len(body) < length and (chunk := conn.recv(65536)):
            body += chunk
        seen.append(top.split(b"\r\n")[0].decode())

    with stand_in(handle) as url:
        yield url, seen


def test_a_change_sent_that_no_answer_came_to_is_not_said_unreachable() -> None:
    # It said "cannot reach the service ... Is `towerboard serve` running?" (exit 3), and a
    # script that retries on 3 submitted the job twice: the service had made it.
    with never_answers() as url:
        client = Client(url, None, timeout=0.5)
        try:
            with pytest.raises(ClientError) as sent:
                client.request(
                    "POST", "/api/v1/jobs/abc/cancel", check_with="towerboard status abc"
                )
            with pytest.raises(ClientError) as read:
                client.request("GET", "/api/v1/jobs")
        finally:
            client.close()
    assert sent.value.code == EXIT_NO_ANSWER
    assert sent.value.message == (
        f"sent POST /api/v1/jobs/abc/cancel to the service at {url}, but no answer came "
        "(ReadTimeout: timed out): it may or may not have been done; check with "
        "`towerboard status abc` before trying again"
    )
    # A read changes nothing; the service is there (it took the connection), but slow.
    assert read.value.code == EXIT_NO_ANSWER
    assert read.value.message == (
        f"the service at {url} did not answer GET /api/v1/jobs (ReadTimeout: timed out): it "
        "took the request, but is busy or stuck, or the connection broke; try again"
    )


def test_a_request_that_could_not_be_sent_is_unreachable() -> None:
    with socket.socket() as closed:  # bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        client = Client(url, None, timeout=0.5)
        try:
            with pytest.raises(ClientError) as refused:
                client.request("POST", "/api/v1/jobs", check_with="towerboard status")
        finally:
            client.close()
    assert refused.value.code == EXIT_UNREACHABLE
    assert refused.value.message.startswith(f"cannot reach the service at {url} (ConnectError: ")
    assert refused.value.message.endswith(
        "Is `towerboard serve` running? Set --url or TOWERBOARD_URL."
    )


def _towerboard(*args: str, url: str, from_env: bool = False) -> subprocess.CompletedProcess[str]:
    """`towerboard ARGS --url URL`, or with TOWERBOARD_URL=URL (`from_env`); no token."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    if from_env:
        env["TOWERBOARD_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, *([] if from_env else ["--url", url])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_says_how_to_check_a_change_that_no_answer_came_to(tmp_path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="my run")))
    with hangs_up() as (url, seen):
        submitted = _towerboard("submit", str(spec), url=url)
        deleted = _towerboard("delete", "aaa", "bbb", "ccc", url=url)
        cancelled = _towerboard("cancel", "aaa", "bbb", "ccc", "--wait", url=url)
        listed = _towerboard("status", url=url)
    assert submitted.returncode == EXIT_NO_ANSWER, submitted.stderr
    assert submitted.stdout == ""
    assert submitted.stderr == (
        f"towerboard: error: sent POST /api/v1/jobs to the service at {url}, but no answer "
        "came (RemoteProtocolError: Server disconnected without sending a response.): it may "
        "or may not have been done; check with `towerboard status --name 'my run' --url "
        f"{url}` before trying again\n"
    )
    # A batch stops at the first such answer, and says which were not tried.
    assert deleted.returncode == EXIT_NO_ANSWER, deleted.stderr
    assert deleted.stderr.startswith(
        f"towerboard: error: sent DELETE /api/v1/jobs/aaa to the service at {url}, but no "
    ), deleted.stderr
    assert deleted.stderr.endswith(
        f"check with `towerboard status aaa --url {url}` before trying again (not tried: bbb ccc)\n"
    ), deleted.stderr
    assert cancelled.returncode == EXIT_NO_ANSWER, cancelled.stderr
    assert cancelled.stderr == (
        f"towerboard: error: sent POST /api/v1/jobs/aaa/cancel to the service at {url}, but "
        "no answer came (RemoteProtocolError: Server disconnected without sending a "
        f"response.): it may or may not have been done; check with `towerboard status aaa "
        f"--url {url}` before trying again (not tried: bbb ccc)\n"
    )
    assert listed.returncode == EXIT_NO_ANSWER, listed.stderr
    assert "did not answer GET /api/v1/jobs" in listed.stderr
    assert "towerboard serve" not in listed.stderr
    # Each change once (never sent again), and the read twice (it is safe to).
    assert seen == [
        "POST /api/v1/jobs HTTP/1.1",
        "DELETE /api/v1/jobs/aaa HTTP/1.1",
        "POST /api/v1/jobs/aaa/cancel HTTP/1.1",
        "GET /api/v1/jobs?limit=50 HTTP/1.1",
        "GET /api/v1/jobs?limit=50 HTTP/1.1",
    ]


def test_a_batch_that_cannot_reach_the_service_says_which_were_not_tried() -> None:
    with socket.socket() as closed:  # bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        results = [_towerboard(verb, "aaa", "bbb", "ccc", url=url) for verb in ("cancel", "delete")]
    for result in results:
        assert result.returncode == EXIT_UNREACHABLE, result.stderr
        assert result.stdout == ""
        assert result.stderr.startswith(f"towerboard: error: cannot reach the service at {url}")
        assert result.stderr.endswith(
            "Is `towerboard serve` running? Set --url or TOWERBOARD_URL. (not tried: bbb ccc)\n"
        ), result.stderr


def test_the_command_to_check_with_names_the_url_only_when_given_by_url() -> None:
    # With --url, "check with `towerboard status abc`", run as given, asked the service at
    # TOWERBOARD_URL (or the default), not the one the request went to. A URL from the
    # variable needs no --url: the shell the hint is run in picks the same service again.
    with hangs_up() as (url, _):
        given = _towerboard("cancel", "abc", url=url)
        from_env = _towerboard("cancel", "abc", url=url, from_env=True)
    assert given.returncode == from_env.returncode == EXIT_NO_ANSWER
    assert given.stderr.endswith(
        f"check with `towerboard status abc --url {url}` before trying again\n"
    ), given.stderr
    assert from_env.stderr.endswith("check with `towerboard status abc` before trying again\n"), (
        from_env.stderr
    )
    # Quoted for the shell where it needs it (a URL's path is the service's base, as given).
    with hangs_up() as (url, _):
        spaced = _towerboard("cancel", "abc", "--url", f"{url}/x y", url=url, from_env=True)
    assert spaced.returncode == EXIT_NO_ANSWER, spaced.stderr
    assert f"check with `towerboard status abc --url '{url}/x y'` before" in spaced.stderr


def test_tensorboard_and_profile_say_what_running_them_again_does() -> None:
    # No command tells what TensorBoard shows, or whether a trace was asked for: the error
    # said "check before trying again", with nothing to check with.
    with hangs_up() as (url, _):
        board = _towerboard("tensorboard", "--jobs", "abc", url=url)
        profile = _towerboard("profile", "abc", url=url)
    assert board.returncode == EXIT_NO_ANSWER, board.stderr
    assert board.stderr.endswith(
        "it may or may not have been done; running it again is safe: a TensorBoard that "
        "already shows these jobs is reused, not restarted\n"
    ), board.stderr
    assert profile.returncode == EXIT_NO_ANSWER, profile.stderr
    assert profile.stderr.endswith(
        "it may or may not have been done; run it again at once to be sure: a request its "
        "worker has not taken yet (it takes one within a few seconds) is joined, not traced "
        "twice\n"
    ), profile.stderr


@pytest.mark.parametrize(
    ("verb", "said"),
    [
        (
            ["submit", "SPEC"],
            "POST /api/v1/jobs: it may or may not have been done; check with `towerboard "
            "status --name 'my run' --url URL` before trying again",
        ),
        (
            ["delete", "aaa", "bbb"],
            "DELETE /api/v1/jobs/aaa: it may or may not have been done; check with "
            "`towerboard status aaa --url URL` before trying again (not tried: bbb)",
        ),
        (
            ["cancel", "aaa", "bbb", "aaa", "ccc", "--wait"],
            "POST /api/v1/jobs/aaa/cancel: it may or may not have been done; check with "
            "`towerboard status aaa --url URL` before trying again (not tried: bbb ccc)",
        ),
    ],
    ids=["submit", "delete", "cancel"],
)
def test_ctrl_c_before_a_change_is_answered_says_it_may_have_been_done(
    tmp_path, verb: list[str], said: str
) -> None:
    # A service slow to answer (busy, or stuck) and a person who gives up on it with
    # Ctrl-C: it said nothing but the new line, and a job it may have made was submitted
    # again by whoever ran the command again.
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="my run")))
    arrived, done = threading.Event(), threading.Event()

    def handle(conn: socket.socket, head: bytes) -> None:
        arrived.set()
        done.wait(60)  # never answered while the command waits

    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    args = [str(spec) if arg == "SPEC" else arg for arg in verb]
    with stand_in(handle) as url:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", *args, "--url", url],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert arrived.wait(60)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            done.set()
    assert proc.returncode == 130, err
    assert out == ""
    assert err == f"\ninterrupted before the service answered {said.replace('URL', url)}\n"


def test_a_closed_stderr_changes_no_exit_code() -> None:
    # Started with stderr closed (`2>&-`), Python has no sys.stderr: a submit made its job,
    # printed its id, then failed on its note of it (exit 1, and a script that retried on
    # it made a second job); an error's exit code (3 here) became 1 the same way.
    body = json.dumps({"id": "abc", "name": "t", "state": "queued"}).encode()

    def answer(conn: socket.socket, head: bytes) -> None:
        top = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
        conn.sendall(top + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}

    def towerboard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", *args],
            cwd=ROOT, env=env, input=json.dumps(job_spec()), capture_output=True, text=True,
            timeout=120, preexec_fn=lambda: os.close(2),  # after the pipes are set: no stderr
        )  # fmt: skip

    with stand_in(answer) as url:
        submitted = towerboard("submit", "-", "--url", url)
    with socket.socket() as closed:  # bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        unreachable = towerboard("status", "--url", f"http://127.0.0.1:{closed.getsockname()[1]}")
    assert (submitted.returncode, submitted.stdout) == (0, "abc\n")
    assert unreachable.returncode == EXIT_UNREACHABLE
