"""gRPC failures become OpenAI-shaped errors that tell clients what they need and no more:
the scheduler's address and transport errors go to the log. An unserved path's 404 comes in
the shape its client reads: Anthropic's under /v1/messages, OpenAI's elsewhere."""

from __future__ import annotations

import logging

import anthropic
import grpc
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from grpc.aio import AioRpcError, Metadata

from server.errors import from_grpc, install_error_handlers

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


@pytest.fixture
def http():
    app = FastAPI()
    install_error_handlers(app)
    with TestClient(app) as client:
        yield client


def test_the_anthropic_client_reads_a_404_under_v1_messages(http):
    """A path under /v1/messages that no route serves (here none is mounted; in the real app,
    Anthropic's batches API) is a 404 in Anthropic's shape: its client raises NotFoundError
    with the message, not a failure to read the body."""
    client = anthropic.Anthropic(
        base_url=str(http.base_url), api_key="unused", http_client=http, max_retries=0
    )
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.body["type"] == "error"
    error = caught.value.body["error"]
    assert error["type"] == "not_found_error"
    assert "/v1/messages is not served" in error["message"]
    assert "/v1/chat/completions" in error["message"]
    batches = http.post("/v1/messages/batches", json={})
    assert batches.status_code == 404 and batches.json()["type"] == "error"
    assert "/v1/messages/batches is not served" in batches.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v1/messagesx", "/v2/messages"])
def test_other_unserved_paths_keep_openais_shape(http, path):
    reply = http.post(path, json={})
    assert reply.status_code == 404
    assert set(reply.json()) == {"error"}
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert path in reply.json()["error"]["message"]
