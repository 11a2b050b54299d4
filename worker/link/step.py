"""What the scheduler hands the worker in one step, and what the worker hands back, as plain
dataclasses: the executor and the provenance check work on these, never on wire messages.
`worker/link/wire.py` is the one place that translates (as `scheduler_svc/wire.py` is for the
scheduler's core)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.sample.sampler import PromptLogprobs, Sample
from worker.sample.sampling_params import SamplingParams

BlockHashPair = tuple[int, bytes]  # (block_id, content hash) as the scheduler declared it


@dataclass(frozen=True, slots=True)
class EmbedParams:
    normalize: bool
    dimensions: int  # 0: the model's full size
    type_start: int = 0  # a text pair's second text from this token on; 0: one text


@dataclass(slots=True)
class NewSeq:
    """First placement of a request on this worker, or its return after preemption."""

    request_id: str
    token_ids: list[int]  # every token to date (prompt, then outputs)
    block_ids: list[int]  # the whole block table
    num_computed_tokens: int  # tokens already in KV (verified cache hits), before this step
    num_scheduled_tokens: int
    num_prompt_tokens: int
    sampling: SamplingParams
    claimed: list[BlockHashPair]  # cache hits: checked before they are read
    written: list[BlockHashPair]  # blocks this step fills: recorded once it ran
    embed: EmbedParams | None = None  # set: an embedding request, one pass, no KV kept


@dataclass(slots=True)
class ContinueSeq:
    """A request the worker already holds."""

    request_id: str
    new_block_ids: list[int]  # appended to its table
    num_computed_tokens: int
    num_scheduled_tokens: int
    written: list[BlockHashPair]
    # Speculative decoding: tokens drafted to follow the last one, the last of the scheduled
    # tokens; every position is sampled and the drafts sampling agrees with are kept.
    draft_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class StepPlan:
    """One step the scheduler asks of this worker: requests placed anew, requests it holds
    continued, requests dropped (the wire's `Plan` message, `worker/link/wire.py`)."""

    step_id: int = 0
    new: list[NewSeq] = field(default_factory=list)
    cont: list[ContinueSeq] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def items(self) -> tuple[NewSeq | ContinueSeq, ...]:
        """Every request the plan schedules: new ones first, as the wire orders them."""
        return (*self.new, *self.cont)


@dataclass(slots=True)
class StepOutput:
    """One plan's outcome. Each list keeps the order in which the executor produced it."""

    step_id: int = 0
    sampled: list[tuple[str, Sample]] = field(default_factory=list)  # request id, its token
    prompt_logprobs: list[tuple[str, PromptLogprobs]] = field(default_factory=list)
    embeddings: list[tuple[str, list[float]]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # request id, message
    stale_request_ids: list[str] = field(default_factory=list)  # refused by provenance
    # not run: their grammar still compiles and other requests ran (worker/executor.py)
    deferred_request_ids: list[str] = field(default_factory=list)
    stored: list[BlockHashPair] = field(default_factory=list)  # content now written
    removed_block_ids: list[int] = field(default_factory=list)  # dropped or refused
    step_seconds: float = 0.0
