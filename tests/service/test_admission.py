"""The admission checks (scheduler_svc/admission.py) on plain data: the status each refusal
answers with, which the frontend maps to HTTP."""

from __future__ import annotations

import grpc
import pytest

from protos import frontend_pb2, worker_pb2
from scheduler_svc.admission import TenantShare, check_model, check_priority, check_prompt
from scheduler_svc.errors import PlacementError

GENERATE = worker_pb2.Registration(
    worker_id="w0", model_name="m", kind=frontend_pb2.MODEL_KIND_GENERATE, vocab_size=10
)
EMBED = worker_pb2.Registration(
    worker_id="e0", model_name="e", kind=frontend_pb2.MODEL_KIND_EMBED, vocab_size=10
)


def refused(check, *args, **kw) -> PlacementError:  # noqa: ANN001
    with pytest.raises(PlacementError) as err:
        check(*args, **kw)
    return err.value


def opts(**changes) -> dict:
    """check_model's keywords: a known model, a generate call, an empty queue of room 4."""
    return dict(known=True, embed=False, num_waiting=0, max_waiting=4) | changes


def test_an_up_model_with_room_gives_its_registration():
    assert check_model("m", [GENERATE], **opts()) is GENERATE
    assert check_model("e", [EMBED], **opts(embed=True)) is EMBED


def test_an_unknown_model_is_not_found_and_a_known_one_with_no_worker_unavailable():
    err = refused(check_model, "x", [], **opts(known=False))
    assert (err.code, err.message) == (grpc.StatusCode.NOT_FOUND, "model 'x' does not exist")
    err = refused(check_model, "m", [], **opts())
    assert (err.code, err.message) == (grpc.StatusCode.UNAVAILABLE, "no worker for model 'm' is up")


def test_generating_with_an_embedding_model_is_invalid_argument():
    err = refused(check_model, "e", [EMBED], **opts(embed=False))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message == "model 'e' is an embedding model"


def test_a_full_queue_is_resource_exhausted():
    check_model("m", [GENERATE], **opts(num_waiting=3, max_waiting=4))
    err = refused(check_model, "m", [GENERATE], **opts(num_waiting=4))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_prompt_must_be_non_empty_and_inside_the_vocabulary():
    check_prompt([0, 9], 10)
    assert refused(check_prompt, [], 10).message == "the prompt is empty"
    err = refused(check_prompt, [1, 10, 11], 10)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message == "token id 10 is out of vocabulary (size 10)"


def test_under_fair_a_full_queue_still_admits_a_tenant_below_its_share():
    """The red team's case: one tenant fills the queue (64 of 64); another, waiting on
    nothing, is admitted up to its share (32 of 2 tenants); the flooder is not."""
    full = opts(num_waiting=64, max_waiting=64)
    newcomer = TenantShare(tenant_waiting=0, num_tenants=2)
    assert check_model("m", [GENERATE], **full, share=newcomer) is GENERATE
    flooder = TenantShare(tenant_waiting=64, num_tenants=2)
    assert refused(check_model, "m", [GENERATE], **full, share=flooder).code == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    at_share = TenantShare(tenant_waiting=32, num_tenants=2)
    assert refused(check_model, "m", [GENERATE], **opts(num_waiting=96, max_waiting=64),
                   share=at_share).code == grpc.StatusCode.RESOURCE_EXHAUSTED  # fmt: skip
    # Never past twice the cap, whatever the tenants' shares.
    many = TenantShare(tenant_waiting=0, num_tenants=3)
    refused(check_model, "m", [GENERATE], **opts(num_waiting=128, max_waiting=64), share=many)
    # A lone tenant's share is the whole queue: as without the fair policy.
    alone = TenantShare(tenant_waiting=64, num_tenants=1)
    refused(check_model, "m", [GENERATE], **full, share=alone)


def test_priority_needs_the_priority_policy():
    check_priority(0, "fcfs")
    check_priority(-3, "priority")
    for policy in ("fcfs", "fair"):
        err = refused(check_priority, 1, policy)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "--scheduling-policy priority" in err.message
