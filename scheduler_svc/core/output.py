"""What one scheduling step hands to the worker, and what comes back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain

from scheduler_svc.core.request import FinishReason, Request

BlockHashPair = tuple[int, bytes]  # (block_id, content hash) declared to the worker


@dataclass(slots=True)
class ScheduledNew:
    """First placement on the worker, or a resume after preemption (recompute)."""

    request_id: str
    token_ids: list[int]  # every token to date (prompt + outputs)
    block_ids: list[int]  # the whole block table
    num_computed_tokens: int  # tokens already in KV (prefix-cache hit), before this step
    num_scheduled_tokens: int
    num_prompt_tokens: int
    claimed: list[BlockHashPair]  # cache-hit blocks the plan claims already hold this content
    written: list[BlockHashPair]  # blocks that become full in this step, with their hash
    samples: bool = False  # this chunk reaches the end of the sequence: it samples a token
    placement: int = 0  # Request.placement when planned


@dataclass(slots=True)
class ScheduledCont:
    """A request the worker already holds."""

    request_id: str
    new_block_ids: list[int]  # appended to its table
    num_computed_tokens: int
    num_scheduled_tokens: int
    # blocks that are full of known tokens and computed by this step or an earlier one (a
    # block filled by a placeholder token is declared once that token is known)
    written: list[BlockHashPair]
    samples: bool = False
    placement: int = 0
    # Speculative decoding: tokens guessed to follow the last one, scheduled after it (counted
    # in num_scheduled_tokens); the worker keeps those its sampling agrees with.
    draft_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RequestUpdate:
    """What the engine streams to the frontend for one request."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    finish_message: str = ""
    num_cached_tokens: int = 0
    num_prompt_tokens: int = 0
    # Opaque to the core: what the worker returned with this step's token or embedding
    # (ModelResult.payloads), carried unread from the result to the delivery.
    payload: object = None


def update_of(
    request: Request, new_token_ids: list[int] | None = None, payload: object = None
) -> RequestUpdate:
    """The request's update as it stands: its finish, if it ended, and its usage; `payload`
    is the worker's per-request payload of the step (ModelResult.payloads), carried unread."""
    return RequestUpdate(
        request_id=request.request_id,
        new_token_ids=new_token_ids if new_token_ids is not None else [],
        finish_reason=request.finish_reason,
        finish_message=request.finish_message,
        num_cached_tokens=request.num_cached_tokens,
        num_prompt_tokens=request.num_prompt_tokens,
        payload=payload,
    )


@dataclass(slots=True)
class SchedulerOutput:
    step_id: int
    new: list[ScheduledNew]
    cont: list[ScheduledCont]
    dropped_request_ids: list[str]  # finished/aborted/preempted since the last plan
    finished: list[RequestUpdate]  # requests that ended inside schedule() (e.g. IGNORED)
    num_batched_tokens: int

    @property
    def is_empty(self) -> bool:
        return not (self.new or self.cont or self.dropped_request_ids)


def declared_written(outputs: Iterable[SchedulerOutput], request_ids: set[str]) -> list[int]:
    """The blocks these plans declared written by these requests."""
    return [
        block_id
        for out in outputs
        for item in chain(out.new, out.cont)
        if item.request_id in request_ids
        for block_id, _ in item.written
    ]


@dataclass(slots=True)
class ModelResult:
    """What the worker reported for one SchedulerOutput."""

    sampled: dict[str, int] = field(default_factory=dict)
    # request_id -> how many of its draft tokens the worker kept (ahead of its sampled token)
    accepted: dict[str, int] = field(default_factory=dict)
    errored: dict[str, str] = field(default_factory=dict)  # request_id -> message
    stale_request_ids: list[str] = field(default_factory=list)  # refused claims: recompute
    # not run, their grammar still compiling while others ran: back to the queue, no cost
    deferred_request_ids: list[str] = field(default_factory=list)
    embedded: list[str] = field(default_factory=list)
    removed_block_ids: list[int] = field(default_factory=list)
    all_cleared: bool = False  # the worker (re)started: every cached hash is gone
    # request_id -> what came with its sampled token or embedding; opaque to the core, which
    # copies it onto that request's update (RequestUpdate.payload)
    payloads: dict[str, object] = field(default_factory=dict)
