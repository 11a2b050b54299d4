"""The frontend's HTTP/1.1 connections: uvicorn's h11 protocol with deadlines for clients that
trickle a request in.

uvicorn times out nothing while a request arrives: its keep-alive timer starts only after a
response, so a client that sends half a header block, or a body, a byte at a time holds its
connection (and a descriptor, and a place under --limit-concurrency) for as long as it likes.
Here:

- **Headers.** The request line and headers must be complete within `header_timeout` seconds
  of the connection opening or, on a kept-alive connection, of the first byte of the next
  request: the idle time before that byte stays --timeout-keep-alive's, as before. (Pipelined
  bytes already buffered start it at the previous response's end; and where uvicorn's
  keep-alive timer does not run, as when the rest of a body the app never read arrives after
  the response, the wait for the next request is the header deadline's too.) Past it the
  connection is closed: with a 408 in OpenAI's error shape when part of a request had arrived,
  silently when nothing had (as the keep-alive timeout closes an idle connection: a client may
  be about to reuse it and must not read a 408 as the answer to its next request).
- **Bodies.** The app answers a body that is still arriving `body_timeout` seconds after its
  headers with a 408 and closes the connection (`server.limits.BodyDeadline`). That covers a
  body the app reads; a body the app never reads (a 404, a 413 on its declared length, a route
  without one) would otherwise keep the connection as long as the client trickles it after
  the response. So this protocol closes a connection whose request body is still arriving
  `body_timeout + BODY_CLOSE_GRACE_SECONDS` after its headers, whatever the app did.

A deadline of 0 turns that deadline off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import h11
from prometheus_client import Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.errors import APIError

log = logging.getLogger(__name__)

# After the body deadline, the time the app has to send its own 408 before the connection is
# closed under it.
BODY_CLOSE_GRACE_SECONDS = 2.0


def header_timeout_message(seconds: float) -> str:
    return f"the request line and headers did not arrive within {seconds:g} s"


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a body backstop (module docstring).
    Use `with_deadlines` to get a class with its deadlines set; uvicorn takes it as `http=`."""

    header_timeout: float = 0.0
    body_timeout: float = 0.0
    timeouts: Counter | None = None  # kvledger_http_request_timeouts_total{phase}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # The moments the state can change: the connection opens, data arrives, a response ends,
    # the connection goes.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel_timers()  # the connection is another protocol's from here on
        super().handle_websocket_upgrade(event)

    def _watch(self) -> None:
        """Arms or cancels each deadline for the state h11 is in now."""
        if self.transport is None or self.transport.is_closing():
            self._cancel_timers()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # Waiting for a request. While nothing of it has arrived, uvicorn's keep-alive
            # timer bounds the wait where it runs (after a response); where it does not (a
            # new connection; the rest of an unread body arrived after the response), and as
            # soon as part of a request is here, the header deadline does.
            pending, _ = self.conn.trailing_data
            unbounded = pending or self.timeout_keep_alive_task is None
            if self.header_timeout > 0 and self._header_timer is None and unbounded:
                self._header_timer = self.loop.call_later(
                    self.header_timeout, self._on_header_timeout
                )
        else:
            self._cancel_header_timer()
        if state is h11.SEND_BODY:
            if self.body_timeout > 0 and self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self.body_timeout + BODY_CLOSE_GRACE_SECONDS, self._on_body_timeout
                )
        else:
            self._cancel_body_timer()

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        pending, _ = self.conn.trailing_data
        self._count("header")
        log.debug("closing a connection whose request headers did not arrive in time")
        if pending:
            self._send_408(header_timeout_message(self.header_timeout))
        else:
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        self._count("body")
        log.debug("closing a connection whose request body did not arrive in time")
        self.transport.close()

    def _send_408(self, message: str) -> None:
        """A 408 in OpenAI's shape, written before any request was read (h11 allows a
        response from the idle state, as uvicorn's own 400 for a malformed request does)."""
        body = json.dumps(APIError(408, message).body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass  # not in a state to answer: the close alone says it

    def _count(self, phase: str) -> None:
        if self.timeouts is not None:
            self.timeouts.labels(phase).inc()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()


def with_deadlines(
    header_timeout: float, body_timeout: float, timeouts: Counter | None = None
) -> type[DeadlineH11Protocol]:
    """The protocol class for uvicorn's `http=`, with these deadlines (0 = off) and, if given,
    a counter of the connections each closed (label `phase`: header or body)."""
    return type(
        "DeadlineH11Protocol",
        (DeadlineH11Protocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout, "timeouts": timeouts},
    )
