"""Scheduler configuration: the knobs of one ledger (one worker's KV pool).

The scheduler service's flags (`EngineConfig`, kvledger/config/scheduler.py) carry the same
defaults and policy names (tests/test_flags.py keeps them equal: the core imports nothing outside
itself), and the engine passes every knob to each ledger under the same name. `num_blocks`,
`block_size` and `max_model_len` come from the worker's registration, never from the
scheduler's flags; their defaults serve direct users of the core (its tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.core.speculative import SpecConfig

POLICIES = ("fcfs", "priority", "fair")


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # "fcfs"; "priority": lower value is served first, as in vLLM; "fair": tenants take
    # turns, each in arrival order (core/fair.py)
    scheduling_policy: str = "fcfs"
    kv_cache: bool = True  # False: the no-KV manager (embedding models)
    # speculative decoding's drafting (core/speculative.py); None: off
    speculative: SpecConfig | None = None
    debug_invariants: bool = False

    def __post_init__(self) -> None:
        if self.kv_cache and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {self.num_blocks}")
        if self.num_blocks < 0:
            raise ValueError(f"num_blocks must not be negative, got {self.num_blocks}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {POLICIES}, got {self.scheduling_policy!r}"
            )
        # Without chunking a resumed request is recomputed in one step, so any length up to
        # the context must fit the budget or it could wait forever.
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be at least max_model_len when chunked prefill "
                f"is off ({self.max_num_batched_tokens} < {self.max_model_len})"
            )

    @property
    def caches_prefixes(self) -> bool:
        return self.kv_cache and self.enable_prefix_caching
