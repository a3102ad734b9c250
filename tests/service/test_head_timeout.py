"""A real `towerboard serve` closes a connection whose request head, or the body it
declares, does not come whole in time (TOWERBOARD_HEAD_TIMEOUT_SECONDS, 2 s here): uvicorn
held one open for ever if it sent nothing, or a header line (or a body byte) now and then
(slowloris), until the service ran out of connections. Requests that come whole,
kept-alive connections between them, and a long response (an event stream) are not
touched."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterable, Iterator

import pytest

from tests.service.harness import Service

# Long enough that a busy host's stall between two kept-alive requests does not close the
# connection in the test below; every test here still waits only a few times it.
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(
        tmp_path_factory.mktemp("head") / "data",
        {"TOWERBOARD_HEAD_TIMEOUT_SECONDS": str(TIMEOUT)},
    )
    svc.start()
    yield svc
    svc.close()


def connect(service: Service) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    return client


def closed_after(client: socket.socket) -> float:
    """Seconds until the service closes the connection (reading whatever it sends)."""
    start = time.monotonic()
    while client.recv(4096):
        pass
    return time.monotonic() - start


def trickled_until_closed(client: socket.socket, pieces: Iterable[bytes]) -> float | None:
    """Send `pieces` one every 0.2 s until the service closes the connection: the seconds
    that took, or None if every piece went and it never closed."""
    start = time.monotonic()
    for piece in pieces:
        try:
            client.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
        readable, _, _ = select.select([client], [], [], 0.2)
        if readable and client.recv(4096) == b"":  # an orderly close
            return time.monotonic() - start
    return None


def request(service: Service, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n\r\n".encode()


def test_a_connection_that_sends_nothing_is_closed(service: Service) -> None:
    with connect(service) as client:
        assert closed_after(client) < TIMEOUT + 5  # and not 10 s: recv would have raised


def test_a_head_sent_a_line_at_a_time_is_closed_at_its_deadline(service: Service) -> None:
    with connect(service) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n")
        # A header line every 0.2 s: each put uvicorn's deadline off.
        took = trickled_until_closed(client, (f"X-Slow-{n}: 1\r\n".encode() for n in range(100)))
        assert took is not None and took < TIMEOUT + 5


def test_kept_alive_requests_and_a_long_stream_are_not_touched(service: Service) -> None:
    with connect(service) as client:
        for _ in range(3):  # a request each quarter-deadline, on one connection
            client.sendall(request(service, "/healthz"))
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):  # the head and body may come apart
                chunk = client.recv(4096)
                assert chunk, f"closed between kept-alive requests, after {answer!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 OK")
            time.sleep(TIMEOUT / 4)
        # Idle after a response past the head deadline: closed (uvicorn's own keep-alive
        # timer is 5 s; the head deadline is the shorter here).
        assert closed_after(client) < TIMEOUT + 5

    with connect(service) as stream:
        stream.sendall(request(service, "/api/v1/events"))
        received = b""
        while b"following every job" not in received:
            received += stream.recv(4096)
        stream.settimeout(TIMEOUT * 3)
        with pytest.raises(TimeoutError):  # still open, nothing to say: not closed
            stream.recv(4096)


def post(path: str, body_length: int, port: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {body_length}\r\n\r\n"
    ).encode()


def test_a_body_that_never_comes_is_closed_at_the_deadline(service: Service) -> None:
    # Every POST's body is read whole before a route runs (`service.bodylimit`): a head
    # that declared one and then nothing held the connection for ever, so a client went
    # round the head's deadline by sending its head whole.
    with connect(service) as client:
        client.sendall(post("/api/v1/jobs", 100, service.port) + b'{"name"')
        assert closed_after(client) < TIMEOUT + 5


def test_a_body_sent_a_byte_at_a_time_is_closed_at_its_deadline(service: Service) -> None:
    body = b'{"name": "' + b"x" * 200 + b'"}'
    with connect(service) as client:
        client.sendall(post("/api/v1/jobs/nosuch/cancel", len(body), service.port))
        took = trickled_until_closed(client, (bytes([b]) for b in body))  # 40 s in all
        assert took is not None and took < TIMEOUT + 5


def test_a_pipelined_request_whose_body_never_comes_is_closed(service: Service) -> None:
    # Its head comes in with the answered request before it: the deadline is the next
    # request's, and its body is part of it.
    with connect(service) as client:
        client.sendall(request(service, "/healthz") + post("/api/v1/jobs", 100, service.port))
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):
            chunk = client.recv(4096)
            assert chunk, f"closed before the first answer, after {answer!r}"
            answer += chunk
        assert closed_after(client) < TIMEOUT + 5


def test_a_body_that_comes_in_time_is_answered(service: Service) -> None:
    body = b"{}"
    with connect(service) as client:
        client.sendall(post("/api/v1/jobs/nosuch/resume", len(body), service.port))
        time.sleep(TIMEOUT / 4)
        client.sendall(body)
        answer = b""
        while b"not found" not in answer:
            chunk = client.recv(4096)
            assert chunk, f"closed before the answer, after {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 404 ")
