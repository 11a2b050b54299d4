"""What the scheduler answers a registering worker, and what the worker does with the answer:
a malformed registration is refused for good; an id still held by a connection the scheduler
has not dropped yet is retried."""

from __future__ import annotations

import threading

import grpc
import pytest

from protos import frontend_pb2, worker_pb2
from tests.service.helpers import (
    PositionRunner,
    Worker,
    expected_tokens,
    generate,
    ledger_idle,
    wait_for,
)
from tests.service.helpers import (
    registration as stand_in_registration,
)
from worker.executor import Executor
from worker.link.client import WorkerLinkClient
from worker.metrics import WorkerMetrics


def registration(**changes) -> worker_pb2.Registration:
    return stand_in_registration(**{"worker_id": "bad", **changes})


def run_client(target: str, reg: worker_pb2.Registration) -> tuple[WorkerLinkClient, dict]:
    client = WorkerLinkClient(
        target, reg, Executor(PositionRunner()), WorkerMetrics("m", reg.worker_id)
    )
    outcome: dict = {}

    def run() -> None:
        try:
            client.run_forever()
        except SystemExit as exit_:
            outcome["exit"] = str(exit_)

    outcome["thread"] = threading.Thread(target=run, daemon=True)
    outcome["thread"].start()
    return client, outcome


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"block_size": 0}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"worker_id": ""}, "worker_id"),
        ({"kind": frontend_pb2.MODEL_KIND_UNSPECIFIED}, "kind"),
    ],
)
def test_a_malformed_registration_is_refused_and_the_worker_stops(scheduler, changes, named):
    client, outcome = run_client(scheduler.target, registration(**changes))
    try:
        outcome["thread"].join(5)
        assert not outcome["thread"].is_alive(), "the worker keeps retrying a hopeless registration"
        assert "malformed registration" in outcome["exit"] and named in outcome["exit"]
        assert not scheduler.engine.links
    finally:
        client.stop()


def test_the_refusal_is_invalid_argument(scheduler):
    # The status the worker acts on, seen by a bare client.
    from protos import worker_pb2_grpc

    stub = worker_pb2_grpc.WorkerLinkStub(grpc.insecure_channel(scheduler.target))
    call = stub.Connect(iter([worker_pb2.WorkerMessage(registration=registration(num_blocks=0))]))
    with pytest.raises(grpc.RpcError) as err:
        next(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_worker_whose_id_is_still_held_retries_until_it_is_free(scheduler):
    first = Worker(scheduler.target, "w0")
    wait_for(lambda: len(scheduler.engine.links) == 1)
    held = scheduler.engine.links["w0"]
    # A replacement with the same fixed --worker-id, before the old connection is dropped.
    replacement = Worker(scheduler.target, "w0")
    try:
        replacement.thread.join(1.0)  # ALREADY_EXISTS at least twice (backoff 0.2 s, 0.4 s)
        assert replacement.thread.is_alive(), "the replacement gave up on ALREADY_EXISTS"
        assert scheduler.engine.links["w0"] is held
        first.stop()
        wait_for(lambda: scheduler.engine.links.get("w0") not in (None, held))
        out = [t for r in generate(scheduler.target, "r1", [1, 2, 3], 4) for t in r.token_ids]
        assert out == expected_tokens(3, 4)
        wait_for(lambda: ledger_idle(scheduler))
    finally:
        first.stop()
        replacement.stop()


def test_an_embedding_worker_needs_no_kv_blocks(scheduler):
    reg = registration(
        worker_id="e0", kind=frontend_pb2.MODEL_KIND_EMBED, num_blocks=0, embedding_size=8
    )
    client, outcome = run_client(scheduler.target, reg)
    try:
        wait_for(lambda: "e0" in scheduler.engine.links)
        assert "exit" not in outcome
    finally:
        client.stop()
