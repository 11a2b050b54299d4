"""gRPC failures become OpenAI-shaped errors that tell clients what they need and no more:
the scheduler's address and transport errors go to the log."""

from __future__ import annotations

import logging

import grpc
from grpc.aio import AioRpcError, Metadata

from server.errors import from_grpc

INTERNAL_DETAILS = (
    "failed to connect to all addresses; last error: 10.0.3.7:50051: Connection refused"
)


def _err(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details)


def test_an_unreachable_scheduler_is_a_plain_503_and_the_details_are_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="server.errors"):
        error = from_grpc(_err(grpc.StatusCode.UNAVAILABLE, INTERNAL_DETAILS))
    assert error.status == 503
    assert "10.0.3.7" not in error.message and "connect" not in error.message
    assert "10.0.3.7" in caplog.text


def test_no_worker_keeps_its_message_and_client_errors_pass_through():
    unavailable = from_grpc(_err(grpc.StatusCode.UNAVAILABLE, "no worker for model 'm' is up"))
    assert unavailable.status == 503 and "no worker" in unavailable.message
    bad = from_grpc(_err(grpc.StatusCode.INVALID_ARGUMENT, "the prompt is empty"))
    assert (bad.status, bad.message) == (400, "the prompt is empty")


def test_an_internal_scheduler_error_is_not_passed_to_the_client():
    error = from_grpc(_err(grpc.StatusCode.INTERNAL, "Traceback ... engine.py line 12"))
    assert error.status == 500 and "engine.py" not in error.message
