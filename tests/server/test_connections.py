"""The frontend's connection deadlines (server/connections.py) on real sockets, against a
bare ASGI app served by uvicorn in this process: the cases `tests/e2e/test_slow_clients.py`
does not reach through the whole stack (deadlines off; pipelined requests; a body the app
never read that ends after the response)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from server.connections import with_deadlines
from tests.serving import free_port
from tests.sockets import read_until_closed

SLACK_S = 5.0
EARLY_S = 0.05


async def hello(scope, receive, send) -> None:  # noqa: ANN001
    """Answers without reading the request body."""
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


@contextlib.contextmanager
def serving(header: float, body: float, keep_alive: int = 30) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        hello,
        host="127.0.0.1",
        port=port,
        http=with_deadlines(header, body),
        timeout_keep_alive=keep_alive,
        lifespan="off",
        log_config=None,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def response(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while not data.endswith(b"hello"):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_deadlines_of_0_are_off():
    """A partial header, nothing, and a partial body (answered unread, then uvicorn's
    keep-alive timer stops at its bytes): all kept, as uvicorn alone keeps them."""
    sent = [
        b"GET / HTTP/1.1\r\nHost",
        b"",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab",
    ]
    with serving(0, 0, keep_alive=1) as port:
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in sent]
        try:
            for sock, data in zip(socks, sent, strict=True):
                sock.sendall(data)
            assert response(socks[2]).startswith(b"HTTP/1.1 200")
            socks[2].sendall(b"c")  # a byte of body stops the keep-alive timer
            time.sleep(2.5)
            for sock in socks:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):  # nothing to read, and not closed
                    sock.recv(1)
        finally:
            for sock in socks:
                sock.close()


def test_a_partial_pipelined_request_has_the_header_deadline_from_the_response_before():
    with serving(1, 0) as port, socket.create_connection(("127.0.0.1", port)) as s:
        start = time.monotonic()
        s.sendall(GET + b"GET / HT")
        ended = read_until_closed(s, start, 1 + SLACK_S)
    # the 408 follows the 200's body ("hello", no line end) on the same line
    assert ended.data.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in ended.data
    assert ended.how != "open" and 1 - EARLY_S <= ended.seconds <= 1 + SLACK_S


def test_an_unread_body_that_ends_after_the_response_leaves_the_header_deadline_running():
    """uvicorn's keep-alive timer stopped at the body's late bytes and does not start again;
    the connection waiting for its next request is then the header deadline's."""
    with serving(1, 0, keep_alive=30) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        assert response(s).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)
        start = time.monotonic()  # before the bytes that leave the header deadline running
        s.sendall(b"cd")  # the body is complete, after the response
        ended = read_until_closed(s, start, 1 + SLACK_S)
    assert ended.data == b""
    assert ended.how != "open" and 1 - EARLY_S <= ended.seconds <= 1 + SLACK_S


def test_a_request_in_time_is_served_and_keeps_its_connection():
    with serving(1, 1) as port, socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(2):
            s.sendall(GET[:10])
            time.sleep(0.3)
            s.sendall(GET[10:])
            assert response(s).startswith(b"HTTP/1.1 200")
            time.sleep(1.3)  # idle longer than either deadline: keep-alive's (30 s) to end
