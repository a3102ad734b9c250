"""The CLI's transport against a server that closes a kept-alive connection as a request
arrives on it: the race every keep-alive client meets with an idle timeout."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from service.client.api import ReusedConnectionRetry

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


@pytest.fixture(params=["read", "unread"])
def closes_on_second_request(request) -> Iterator[tuple[str, list[str]]]:
    """A server on a free loopback port: on each connection it answers the first request
    (kept alive) and closes without a word when the second one's head is in: having read
    it (the client sees a disconnect), or with it unread (a reset). Yields its URL and the
    request lines it saw, in order."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                head = _read_head(conn)
                if not head:
                    continue
                seen.append(head.split(b"\r\n")[0].decode())
                conn.sendall(ANSWER + b'{"n": 1}')
                if request.param == "read":
                    head = _read_head(conn)
                else:  # wait for it to arrive, and leave it in the socket
                    head = conn.recv(4096, socket.MSG_PEEK)
                # Nothing: the client closed the connection (its last one, as it closed)
                # without sending a second request, which is no request to record.
                if head:
                    seen.append(head.split(b"\r\n")[0].decode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept(): close() alone does not
    server.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


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
