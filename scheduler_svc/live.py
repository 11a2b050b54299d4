"""A request the scheduler service is serving: the core's Request plus what the service needs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.output import RequestUpdate
from scheduler_svc.core.request import Request

log = logging.getLogger(__name__)


@dataclass
class RequestFailure:
    """Ends a request's stream with a gRPC status instead of a finish reason."""

    code: grpc.StatusCode
    message: str


@dataclass
class Delivery:
    """One update for the stream (built by convert.delivery_from), with the logprobs of exactly
    its new tokens, the prompt logprobs that arrived since the last update, and, for an
    embedding request's final update, its vector."""

    update: RequestUpdate
    logprobs: list[frontend_pb2.TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[frontend_pb2.TokenLogprob] = field(default_factory=list)
    embedding: list[float] | None = None


@dataclass(eq=False)
class LiveRequest:
    core: Request
    model: str
    sampling: frontend_pb2.SamplingParams
    embed: worker_pb2.EmbedParams | None = None
    updates: asyncio.Queue[Delivery | RequestFailure] = field(default_factory=asyncio.Queue)
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    done: bool = False
    # Prompt logprobs: how many prompt tokens (after the first) have arrived, across recomputes,
    # and those not yet delivered (a prompt chunk that samples nothing makes no update: its
    # entries wait here for the request's next one).
    num_prompt_scored: int = 0
    pending_prompt_logprobs: list[frontend_pb2.TokenLogprob] = field(default_factory=list)

    @property
    def wants_logprobs(self) -> bool:
        return self.sampling.logprobs >= 0

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling.HasField("prompt_logprobs")

    @property
    def prompt_scored(self) -> bool:
        """Every prompt token that has a logprob got one."""
        return self.num_prompt_scored >= len(self.core.prompt_token_ids) - 1

    def receive_prompt_logprobs(
        self, start: int, entries: Sequence[frontend_pb2.TokenLogprob]
    ) -> None:
        """Keeps each prompt token's entry once: a recomputed request (preemption, a lost
        worker) scores its prompt again from the start."""
        if not self.wants_prompt_logprobs:
            return
        seen = self.num_prompt_scored + 1 - start  # entries of this chunk that arrived before
        if seen < 0:  # a hole: a bug signal, and never filled with made-up numbers
            log.warning(
                "request %s: prompt logprobs from token %d, expected %d",
                self.request_id,
                start,
                self.num_prompt_scored + 1,
            )
            return
        fresh = entries[seen:]
        self.pending_prompt_logprobs.extend(fresh)
        self.num_prompt_scored += len(fresh)

    def take_prompt_logprobs(self) -> list[frontend_pb2.TokenLogprob]:
        taken, self.pending_prompt_logprobs = self.pending_prompt_logprobs, []
        return taken

    def plan_sampling(self) -> frontend_pb2.SamplingParams:
        """What the worker gets: a recompute need not score a prompt already scored."""
        if not (self.wants_prompt_logprobs and self.prompt_scored):
            return self.sampling
        sampling = frontend_pb2.SamplingParams()
        sampling.CopyFrom(self.sampling)
        sampling.ClearField("prompt_logprobs")
        return sampling

    @property
    def request_id(self) -> str:
        return self.core.request_id
