"""Registration: what the scheduler checks before it serves a worker, and the ledger it builds
for it.

Pure apart from one log line: each check takes the registration and the workers connected
now (their registrations), and raises PlacementError with the status the worker acts on:

- ALREADY_EXISTS: the id is held by a connection not dropped yet; the worker retries.
- INVALID_ARGUMENT: the registration could never work (malformed, out of bounds, or no ledger
  can be built for it); the worker takes it as final, since retrying would only repeat it.
- FAILED_PRECONDITION: it differs from the model's other workers, which must be
  interchangeable because requests move between them.

A ledger takes seconds to build for a large pool, off the event loop, while other workers
come and go: what depends on the peers is checked again when the worker is attached
(`check_against_peers`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

from kvledger.config.speculative import parse_speculative_config
from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.speculative import SpecConfig
from scheduler_svc.errors import PlacementError

if TYPE_CHECKING:
    from kvledger.config.scheduler import EngineConfig

log = logging.getLogger(__name__)

# Sane bounds of a registration. The ledger keeps a Python object per KV block (~150 bytes):
# 2^22 blocks is ~600 MB, built off the event loop; a registration of ten million one-token
# blocks once took the scheduler past a gigabyte and froze every call while it was built
# (docs/performance.md, "Scheduler").
REGISTRATION_LIMITS = {
    "num_blocks": 1 << 22,
    "block_size": 1 << 12,
    "max_model_len": 1 << 24,
    "vocab_size": 1 << 24,
    "embedding_size": 1 << 16,
    "num_labels": 1 << 16,
}

# What workers of one model name must agree on.
INTERCHANGEABLE_FIELDS = ("kind", "vocab_size", "max_model_len", "embedding_size", "num_labels")


def ledger_config(
    reg: worker_pb2.Registration,
    config: EngineConfig,
    connected: Iterable[worker_pb2.Registration],
) -> SchedulerConfig:
    """The ledger a registration asks for, under the scheduler's `config`; PlacementError when
    it cannot be served next to the `connected` workers."""
    connected = list(connected)
    check_unused_id(reg, connected)
    check_well_formed(reg)
    is_embed = reg.kind == frontend_pb2.MODEL_KIND_EMBED
    chunked = config.enable_chunked_prefill and not is_embed
    budget = config.max_num_batched_tokens
    if not chunked and budget < reg.max_model_len:
        # A whole prompt must fit one step when it cannot be split.
        log.info(
            "worker %s: token budget raised to max_model_len %d (no chunked prefill)",
            reg.worker_id,
            reg.max_model_len,
        )
        budget = reg.max_model_len
    try:
        cfg = SchedulerConfig(
            num_blocks=reg.num_blocks,
            block_size=reg.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=reg.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching and not is_embed,
            enable_chunked_prefill=chunked,
            scheduling_policy=config.scheduling_policy,
            kv_cache=not is_embed,
            speculative=None if is_embed else speculative_of(config.speculative_config),
            debug_invariants=config.debug_invariants,
        )
    except ValueError as err:  # a registration no ledger can be built for: permanent
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"worker {reg.worker_id!r} cannot be served: {err}",
        ) from err
    check_consistent(reg, connected)
    return cfg


def speculative_of(text: str) -> SpecConfig | None:
    """The core's drafting settings from `--speculative-config` (checked when parsed)."""
    fields = parse_speculative_config(text)
    return None if fields is None else SpecConfig(**fields)


def check_against_peers(
    reg: worker_pb2.Registration, connected: Iterable[worker_pb2.Registration]
) -> None:
    """What may have changed while the ledger was built: another worker may have taken the
    id, or registered the model differently."""
    connected = list(connected)
    check_unused_id(reg, connected)
    check_consistent(reg, connected)


def check_unused_id(
    reg: worker_pb2.Registration, connected: Iterable[worker_pb2.Registration]
) -> None:
    if any(peer.worker_id == reg.worker_id for peer in connected):
        raise PlacementError(
            grpc.StatusCode.ALREADY_EXISTS,
            f"worker {reg.worker_id!r} is already connected",
        )


def check_well_formed(reg: worker_pb2.Registration) -> None:
    """A registration that could never work, every problem named at once."""
    problems = []
    if not reg.worker_id:
        problems.append("worker_id is empty")
    if not reg.model_name:
        problems.append("model_name is empty")
    if reg.kind not in (frontend_pb2.MODEL_KIND_GENERATE, frontend_pb2.MODEL_KIND_EMBED):
        problems.append(f"kind {reg.kind} is neither generate nor embed")
    for field in ("block_size", "max_model_len", "vocab_size"):
        if getattr(reg, field) < 1:
            problems.append(f"{field} is {getattr(reg, field)}, must be at least 1")
    if reg.kind != frontend_pb2.MODEL_KIND_EMBED and reg.num_blocks < 1:
        problems.append(f"num_blocks is {reg.num_blocks}: a generative worker needs KV blocks")
    for field, limit in REGISTRATION_LIMITS.items():
        if getattr(reg, field) > limit:
            problems.append(f"{field} is {getattr(reg, field)}, more than {limit}")
    if problems:
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed registration of worker {reg.worker_id!r}: " + "; ".join(problems),
        )


def check_consistent(
    reg: worker_pb2.Registration, connected: Iterable[worker_pb2.Registration]
) -> None:
    """Workers of one model name must be interchangeable: requests move between them."""
    for peer in connected:
        if peer.model_name != reg.model_name:
            continue
        for field in INTERCHANGEABLE_FIELDS:
            if getattr(reg, field) != getattr(peer, field):
                raise PlacementError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"worker {reg.worker_id!r} serves {reg.model_name!r} with {field} "
                    f"{getattr(reg, field)}, but worker {peer.worker_id!r} has "
                    f"{getattr(peer, field)}",
                )
