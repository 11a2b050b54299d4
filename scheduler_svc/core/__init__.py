"""The ledger: pure, synchronous, deterministic scheduling core (no gRPC, asyncio, torch, clock)."""

from scheduler_svc.core.block_hash import BlockHash, BlockHasher, sha256_block_hash
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.output import (
    BlockHashPair,
    ModelResult,
    RequestUpdate,
    ScheduledCont,
    ScheduledNew,
    SchedulerOutput,
)
from scheduler_svc.core.request import FinishReason, Request, RequestStatus
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.stats import (
    RELEASE_REASONS,
    STALE_SOURCES,
    SchedulerSnapshot,
    SchedulerStats,
)
from scheduler_svc.core.violation import InvariantViolation

__all__ = [
    "RELEASE_REASONS",
    "STALE_SOURCES",
    "BlockHash",
    "BlockHashPair",
    "BlockHasher",
    "FinishReason",
    "InvariantViolation",
    "ModelResult",
    "Request",
    "RequestStatus",
    "RequestUpdate",
    "ScheduledCont",
    "ScheduledNew",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerSnapshot",
    "SchedulerOutput",
    "SchedulerStats",
    "sha256_block_hash",
]
