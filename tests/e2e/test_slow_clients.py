"""Slow or idle clients cannot lock others out: past --limit-concurrency open connections the
frontend answers new requests 503 at once instead of queueing them behind descriptors it has
run out of, and serves again as soon as they go. (A header block still incomplete past 16 KiB is
refused rather than buffered, by h11's incomplete-event limit; not timed here: whether a fast
client's headers arrive whole or in pieces decides whether the limit applies.) And they go by
themselves: headers not in within --timeout-request-header, or a body not in within
--timeout-request-body, and the frontend closes the connection (with a 408 in OpenAI's shape
where it can), while kept-alive connections idle by --timeout-keep-alive as before. Real
sockets against `kvledger serve`."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx

from server.connections import BODY_CLOSE_GRACE_SECONDS
from tests.e2e.stacks import Stack
from tests.serving import metric_sum, scrape, start_serve
from tests.sockets import Ended, read_until_closed


def _trickling(port: int) -> socket.socket:
    """A connection that sent half a request line and nothing since."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    return sock


def test_trickling_connections_past_the_limit_do_not_lock_out_others(tmp_path):
    served = start_serve(tmp_path, "--limit-concurrency", "4")
    socks: list[socket.socket] = []
    try:
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        socks = [_trickling(served.port) for _ in range(6)]
        refused = httpx.get(f"{served.url}/health", timeout=10)
        assert refused.status_code == 503
        for sock in socks:
            sock.close()
        socks = []
        reply = httpx.post(
            f"{served.url}/v1/completions",
            json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2},
            timeout=60,
        )
        assert reply.status_code == 200
    finally:
        for sock in socks:
            sock.close()
        served.stop()


# Deadlines of the stack below: short, so each case takes seconds; bounds are derived from them
# with generous slack for a slow, loaded CI machine (a timer never fires early, so the lower
# bounds are exact but for clock granularity).
HEADER_S = 2.0
BODY_S = 2.0
KEEP_ALIVE_S = 4
LIMIT = 16
SLACK_S = 5.0
EARLY_S = 0.05
JSON = {"content-type": "application/json"}
COMPLETION = b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}'


STACK = Stack(
    (
        "--timeout-request-header",
        str(HEADER_S),
        "--timeout-request-body",
        str(BODY_S),
        "--timeout-keep-alive",
        str(KEEP_ALIVE_S),
        "--limit-concurrency",
        str(LIMIT),
    )
)


def _trickle(sock: socket.socket, data: bytes, every: float = 1.0) -> threading.Thread:
    """Sends `data` a byte every `every` seconds until it is all sent or the server closes."""

    def run() -> None:
        for byte in data:
            time.sleep(every)
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _request(path: str, body: bytes = b"", method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def _partial_header(port: int) -> tuple[socket.socket, float]:
    start = time.monotonic()  # before the connection: the server's timer cannot start earlier
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    _trickle(sock, b"Content-Type: application/json\r\n")
    return sock, start


def _slow_body(port: int, path: str = "/v1/completions", method: str = "POST") -> tuple:
    sock = socket.create_connection(("127.0.0.1", port))
    whole = _request(path, COMPLETION, method)
    cut = whole.index(b"\r\n\r\n") + 4 + 10
    start = time.monotonic()  # before the headers: the body's timer cannot start earlier
    sock.sendall(whole[:cut])
    _trickle(sock, whole[cut:])
    return sock, start


def _assert_closed_at(ended: Ended, deadline: float) -> None:
    assert ended.how in ("eof", "reset"), f"still open after {ended.seconds:.1f} s"
    assert deadline - EARLY_S <= ended.seconds <= deadline + SLACK_S, ended.seconds


def _one_response(sock: socket.socket) -> bytes:
    """Reads one response with a Content-Length body (the server's answers here have one)."""
    sock.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_headers_trickled_a_byte_a_second_are_cut_at_the_header_deadline(served):
    sock, start = _partial_header(served.port)
    with sock:
        ended = read_until_closed(sock, start, HEADER_S + SLACK_S + 1)
    _assert_closed_at(ended, HEADER_S)
    assert ended.statuses == [408]
    error = ended.error()
    assert error["type"] == "invalid_request_error" and "headers" in error["message"]


def test_a_connection_that_sends_nothing_is_closed_silently_at_the_header_deadline(served):
    """No 408 there: a client may be about to use it, and must not read one as its answer."""
    start = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", served.port))
    with sock:
        ended = read_until_closed(sock, start, HEADER_S + SLACK_S + 1)
    _assert_closed_at(ended, HEADER_S)
    assert ended.data == b""


def test_a_body_trickled_a_byte_a_second_gets_a_408_and_the_connection_closes(served):
    sock, start = _slow_body(served.port)
    with sock:
        ended = read_until_closed(sock, start, BODY_S + SLACK_S + 1)
    _assert_closed_at(ended, BODY_S)
    assert ended.statuses == [408]
    assert b"connection: close" in ended.data.lower()
    error = ended.error()
    assert error["type"] == "invalid_request_error" and "body" in error["message"]


def test_a_trickled_body_the_app_never_reads_does_not_hold_the_connection(served):
    """/version answers without reading the body; the server still closes the connection
    (the app's 408 was not needed: its grace is spent) while the client keeps trickling."""
    sock, start = _slow_body(served.port, "/version", "GET")
    with sock:
        ended = read_until_closed(sock, start, BODY_S + BODY_CLOSE_GRACE_SECONDS + SLACK_S + 1)
    _assert_closed_at(ended, BODY_S + BODY_CLOSE_GRACE_SECONDS)
    assert ended.statuses == [200]


def test_a_request_that_arrives_in_time_in_pieces_is_served(served):
    """Headers and body in pieces, each part well within its deadline, then a second request
    on the same connection: both served, nothing closed."""
    whole = _request("/v1/completions", COMPLETION)
    cut = whole.index(b"\r\n\r\n") + 4
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(whole[:20])
        time.sleep(HEADER_S / 4)
        sock.sendall(whole[20:cut])
        time.sleep(BODY_S / 4)
        sock.sendall(whole[cut : cut + 10])
        time.sleep(BODY_S / 4)
        sock.sendall(whole[cut + 10 :])
        first = _one_response(sock)
        assert first.startswith(b"HTTP/1.1 200"), first
        assert json.loads(first.partition(b"\r\n\r\n")[2])["choices"][0]["text"] is not None
        sock.sendall(whole)
        assert _one_response(sock).startswith(b"HTTP/1.1 200")


def test_an_idle_kept_alive_connection_lives_by_the_keep_alive_timeout(served):
    """Idle between requests past the header deadline (but within --timeout-keep-alive) it is
    still open and serves the next request; idle past --timeout-keep-alive it is closed."""
    assert KEEP_ALIVE_S > HEADER_S + 1
    version = _request("/version", method="GET")
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(version)
        assert _one_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_S + 0.5)
        start = time.monotonic()  # before the request whose response arms the keep-alive timer
        sock.sendall(version)
        assert _one_response(sock).startswith(b"HTTP/1.1 200")
        ended = read_until_closed(sock, start, KEEP_ALIVE_S + SLACK_S + 1)
    _assert_closed_at(ended, KEEP_ALIVE_S)
    assert ended.data == b""


def test_the_next_request_on_a_kept_alive_connection_has_the_header_deadline(served):
    """Once its first byte arrives, the keep-alive timer stops and the header deadline runs."""
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(_request("/version", method="GET"))
        assert _one_response(sock).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        _trickle(sock, b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n", every=0.5)
        ended = read_until_closed(sock, start, HEADER_S + SLACK_S + 1)
    _assert_closed_at(ended, HEADER_S + 0.5)  # the deadline starts with the first byte, at 0.5 s
    assert ended.statuses == [408]


def test_others_are_served_while_slow_clients_wait_for_their_deadlines(served):
    """Trickling headers, trickling bodies and a silent connection at once, under the
    connection limit: a completion is served meanwhile, and each slow one is closed at its
    deadline."""
    slow = [_partial_header(served.port) for _ in range(4)]
    slow += [_slow_body(served.port) for _ in range(4)]
    results: list[Ended] = [None] * len(slow)  # type: ignore[list-item]

    def watch(i: int) -> None:
        sock, start = slow[i]
        results[i] = read_until_closed(sock, start, max(HEADER_S, BODY_S) + SLACK_S + 1)

    watchers = [threading.Thread(target=watch, args=(i,)) for i in range(len(slow))]
    for thread in watchers:
        thread.start()
    try:
        began = time.monotonic()
        reply = httpx.post(
            f"{served.url}/v1/completions", content=COMPLETION, headers=JSON, timeout=60
        )
        assert reply.status_code == 200
        assert time.monotonic() - began < min(HEADER_S, BODY_S), "waited for a slow client"
    finally:
        for thread in watchers:
            thread.join()  # each within its bounded wait
        for sock, _ in slow:
            sock.close()
    for ended in results[:4]:
        _assert_closed_at(ended, HEADER_S)
        assert ended.statuses == [408] and "headers" in ended.error()["message"]
    for ended in results[4:]:
        _assert_closed_at(ended, BODY_S)
        assert ended.statuses == [408] and "body" in ended.error()["message"]
    timeouts = scrape(f"{served.url}/metrics")
    assert metric_sum(timeouts, "kvledger_http_request_timeouts_total", phase="header") >= 4
    assert metric_sum(timeouts, "kvledger_http_request_timeouts_total", phase="body") >= 4


def test_connections_past_the_limit_are_freed_by_the_header_deadline(served):
    """The issue's lock-out: more stalled connections than --limit-concurrency shut everyone
    else out (503) until the header deadline closes them, with no help from their clients."""
    stalled = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(LIMIT + 4)]
    start = time.monotonic()
    try:
        for sock in stalled:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 503
        for sock in stalled:
            _assert_closed_at(read_until_closed(sock, start, HEADER_S + SLACK_S + 1), HEADER_S)
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200
    finally:
        for sock in stalled:
            sock.close()
