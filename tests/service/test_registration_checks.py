"""The registration checks (scheduler_svc/registration.py) on plain messages: the peers are an
argument, so no scheduler, no gRPC server, no loop."""

from __future__ import annotations

import grpc
import pytest

from kvledger.config.scheduler import EngineConfig
from protos import frontend_pb2
from scheduler_svc.errors import PlacementError
from scheduler_svc.registration import (
    REGISTRATION_LIMITS,
    check_against_peers,
    check_consistent,
    check_unused_id,
    check_well_formed,
    ledger_config,
)
from tests.service.helpers import registration as reg


def refusal(check, *args) -> PlacementError:  # noqa: ANN001
    with pytest.raises(PlacementError) as err:
        check(*args)
    return err.value


def test_a_well_formed_registration_passes():
    check_well_formed(reg())
    check_well_formed(reg(kind=frontend_pb2.MODEL_KIND_EMBED, num_blocks=0))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"worker_id": ""}, "worker_id is empty"),
        ({"model_name": ""}, "model_name is empty"),
        ({"kind": frontend_pb2.MODEL_KIND_UNSPECIFIED}, "neither generate nor embed"),
        ({"block_size": 0}, "block_size is 0, must be at least 1"),
        ({"max_model_len": 0}, "max_model_len is 0"),
        ({"vocab_size": 0}, "vocab_size is 0"),
        ({"num_blocks": 0}, "a generative worker needs KV blocks"),
        ({"num_blocks": REGISTRATION_LIMITS["num_blocks"] + 1}, "num_blocks is 4194305, more"),
        ({"embedding_size": REGISTRATION_LIMITS["embedding_size"] + 1}, "embedding_size is"),
    ],
)
def test_a_malformed_registration_is_invalid_argument_naming_the_field(changes, named):
    err = refusal(check_well_formed, reg(**changes))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith("malformed registration of worker") and named in err.message


def test_every_problem_is_named_at_once():
    err = refusal(check_well_formed, reg(block_size=0, vocab_size=0))
    assert "block_size" in err.message and "vocab_size" in err.message


def test_an_id_held_by_a_connected_worker_is_already_exists():
    assert check_unused_id(reg(), [reg(worker_id="other")]) is None
    err = refusal(check_unused_id, reg(), [reg(worker_id="other"), reg(model_name="x")])
    assert err.code == grpc.StatusCode.ALREADY_EXISTS
    assert err.message == "worker 'w0' is already connected"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", frontend_pb2.MODEL_KIND_EMBED),
        ("vocab_size", 999),
        ("max_model_len", 128),
        ("embedding_size", 8),
    ],
)
def test_a_model_s_workers_must_be_interchangeable(field, value):
    peer = reg(worker_id="p")
    err = refusal(check_consistent, reg(**{field: value}), [peer])
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.message == (
        f"worker 'w0' serves 'm' with {field} {value}, but worker 'p' has {getattr(peer, field)}"
    )


def test_other_models_and_pool_sizes_may_differ():
    check_consistent(reg(num_blocks=8, block_size=16), [reg(worker_id="p")])
    check_consistent(reg(vocab_size=5), [reg(worker_id="p", model_name="other")])


def test_the_attach_time_check_sees_both_a_taken_id_and_a_differing_peer():
    assert refusal(check_against_peers, reg(), [reg()]).code == grpc.StatusCode.ALREADY_EXISTS
    err = refusal(check_against_peers, reg(vocab_size=5), [reg(worker_id="p")])
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION


def test_the_ledger_follows_the_scheduler_s_config_and_the_registration():
    cfg = ledger_config(reg(), EngineConfig(max_num_seqs=7, max_num_batched_tokens=32), [])
    assert (cfg.num_blocks, cfg.block_size, cfg.max_model_len) == (64, 4, 256)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (7, 32)
    assert cfg.kv_cache and cfg.enable_prefix_caching and cfg.enable_chunked_prefill


def test_without_chunked_prefill_the_budget_rises_to_a_whole_prompt():
    config = EngineConfig(max_num_batched_tokens=32, enable_chunked_prefill=False)
    assert ledger_config(reg(), config, []).max_num_batched_tokens == 256


def test_an_embedding_worker_gets_a_ledger_without_kv_cache_or_chunks():
    embed = reg(kind=frontend_pb2.MODEL_KIND_EMBED, num_blocks=0, embedding_size=8)
    cfg = ledger_config(embed, EngineConfig(max_num_batched_tokens=32), [])
    assert not (cfg.kv_cache or cfg.enable_prefix_caching or cfg.enable_chunked_prefill)
    assert cfg.max_num_batched_tokens == 256


def test_checks_run_in_order_id_first_then_form_then_peers():
    # a malformed registration under a taken id is refused for the id (the worker retries)
    err = refusal(ledger_config, reg(block_size=0), EngineConfig(), [reg()])
    assert err.code == grpc.StatusCode.ALREADY_EXISTS
    peer = reg(worker_id="p")
    err = refusal(ledger_config, reg(block_size=0, vocab_size=5), EngineConfig(), [peer])
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_registration_no_ledger_can_be_built_for_is_invalid_argument():
    err = refusal(ledger_config, reg(), EngineConfig(scheduling_policy="nonsense"), [])
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith("worker 'w0' cannot be served: ")
