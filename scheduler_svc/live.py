"""A request the scheduler service is serving: the core's Request plus what the service needs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc

from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.output import RequestUpdate
from scheduler_svc.core.request import Request


@dataclass
class RequestFailure:
    """Ends a request's stream with a gRPC status instead of a finish reason."""

    code: grpc.StatusCode
    message: str


@dataclass
class Delivery:
    """One update for the stream, with the logprobs of exactly its new tokens."""

    update: RequestUpdate
    logprobs: list[frontend_pb2.TokenLogprob] = field(default_factory=list)


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
    embedding: list[float] | None = None
    done: bool = False
    step_logprob: frontend_pb2.TokenLogprob | None = None  # of this step's sampled token

    @property
    def wants_logprobs(self) -> bool:
        return self.sampling.logprobs >= 0

    @property
    def request_id(self) -> str:
        return self.core.request_id
