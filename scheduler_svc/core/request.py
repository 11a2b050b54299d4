"""A request as the ledger sees it: token ids, stop conditions and scheduling state."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum, auto

from scheduler_svc.core.speculative import DraftState


class RequestStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    PREEMPTED = auto()  # waiting again after its blocks were taken back; recomputes from 0
    FINISHED = auto()


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    IGNORED = "ignored"
    ERROR = "error"


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0
    # Who sent it, as the frontend tags an API key (a hash, never the key); '' = no key. The
    # fair policy shares a worker between tenants (core/fair.py); the others ignore it.
    tenant: str = ""
    cache_salt: str | None = None
    skip_prefix_cache: bool = False  # prompt-logprob requests must compute every position
    is_embedding: bool = False  # no output tokens: finishes (STOP) once its prompt is computed
    # False: never drafted for (structured outputs: a draft would need the grammar's verdict)
    may_speculate: bool = True
    # state, owned by the scheduler
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at its first admission, for usage
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    finish_message: str = ""  # e.g. why IGNORED: the frontend turns it into a 400
    num_preemptions: int = 0
    # Sampling steps planned whose token the scheduler does not know yet (async scheduling:
    # the worker computes step N+1 on the token it samples in step N). 0 in lockstep.
    num_placeholders: int = 0
    # Draft tokens of the step in flight (speculative decoding, core/speculative.py): counted
    # in num_computed_tokens until the worker says how many it kept.
    num_drafts: int = 0
    drafting: DraftState | None = field(default=None, repr=False)
    # Tokens known when its full blocks were last committed (hashed and declared written):
    # a block filled by a placeholder is committed only once its token is known.
    num_committed_tokens: int = 0
    # Moves at every reset for recompute: a result item planned for an earlier placement of
    # this request (still in flight when it was requeued) is recognised and ignored.
    placement: int = 0
    arrival_index: int = field(default=-1, init=False)  # set by the scheduler on arrival
    was_admitted: bool = field(default=False, init=False)
    # prompt + outputs in one list, so slicing a block never copies the whole sequence
    _token_ids: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        self.eos_token_ids = frozenset(self.eos_token_ids)
        self.stop_token_ids = frozenset(self.stop_token_ids)
        self._token_ids = self.prompt_token_ids + self.output_token_ids
        if self.is_embedding:  # one whole pass of its own: it neither reads nor fills the cache
            self.skip_prefix_cache = True

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then outputs. Read-only view: use append_output_token to grow it."""
        return self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._token_ids.append(token_id)

    def finish(self, reason: FinishReason, message: str = "") -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finish_message = message

    def reset_for_recompute(self, status: RequestStatus) -> None:
        """Forget every computed position; tokens generated so far are kept."""
        self.status = status
        self.num_computed_tokens = 0
        self.num_placeholders = 0
        self.num_drafts = 0
        self.num_committed_tokens = 0
        self.placement += 1
