"""gRPC settings and protocol limits every service shares."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Most logprobs (top alternatives) per token, sampled or prompt: OpenAI's own bound for
# completions' `logprobs` and chat's `top_logprobs`. A limit of the protocol: the frontend
# checks it, the worker enforces it.
MAX_LOGPROBS = 20

# Initial metadata the scheduler sends once it has admitted a Generate call: from then on the
# request is live, and the frontend re-submits it if the link breaks (server/resume.py); a
# call that fails before it was never admitted and fails as it did.
ADMITTED = ("kvledger-admitted", "1")

# HTTP/2 keepalive pings: a worker or scheduler that vanished without closing its connection
# (power loss, partition, SIGSTOP) breaks the stream within ~15 s instead of never. The ping's
# own timeout is `http2.ping_timeout_ms` (60 s by default): `keepalive_timeout_ms` alone did
# not shorten it, and a frozen peer took ~70 s to notice.
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]
_MESSAGES = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]

# A lost scheduler is reconnected to within ~2 s of its return (gRPC's default backoff grows
# to 120 s): live requests and workers wait on it (--scheduler-reconnect-timeout). Not
# `grpc.min_reconnect_backoff_ms`: gRPC core reads it as each attempt's minimum connect
# timeout (20 s by default), and a small one would fail slow handshakes between hosts.
_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

CHANNEL_OPTIONS = _MESSAGES + _KEEPALIVE + _RECONNECT
SERVER_OPTIONS = (
    _MESSAGES
    + _KEEPALIVE
    + [
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
)
