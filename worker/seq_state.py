"""What the executor keeps between steps: each request's state, and the counters the worker
exports (worker/executor.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.link.step import EmbedParams
from worker.sample.constraints import Constraint
from worker.sample.sampling_params import SamplingParams


@dataclass
class SeqState:
    request_id: str
    token_ids: list[int]
    block_table: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    sampling: SamplingParams
    embed: EmbedParams | None
    # Structured outputs: the grammar matcher, made at the first chunk; a request placed
    # again (preemption, a lost worker) is a new SeqState whose matcher replays its outputs.
    constraint: Constraint | None = None
    # Speculative decoding: the tokens the current plan drafted after the last known one.
    drafts: list[int] = field(default_factory=list)


@dataclass
class StepCounters:
    stale_block_hits: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
