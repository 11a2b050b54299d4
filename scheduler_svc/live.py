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


@dataclass(eq=False)
class LiveRequest:
    core: Request
    model: str
    sampling: frontend_pb2.SamplingParams
    embed: worker_pb2.EmbedParams | None = None
    updates: asyncio.Queue[RequestUpdate | RequestFailure] = field(default_factory=asyncio.Queue)
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    embedding: list[float] | None = None
    done: bool = False
    # Logprobs of this step's sampled token, and those not yet streamed (aligned with tokens).
    step_logprob: frontend_pb2.TokenLogprob | None = None
    logprobs_out: list[frontend_pb2.TokenLogprob] = field(default_factory=list)

    @property
    def wants_logprobs(self) -> bool:
        return self.sampling.logprobs >= 0

    @property
    def request_id(self) -> str:
        return self.core.request_id
