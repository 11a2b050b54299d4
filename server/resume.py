"""Requests that outlive a scheduler restart.

The frontend holds everything a live request needs to go on: its Generate request and the
tokens already streamed to its client. When the link to the scheduler breaks mid-request
(the scheduler died or became unreachable), the request is not failed: it is re-submitted,
once the scheduler answers again, as a continuation: the same prompt and sampling, with the
streamed tokens as `resumed_token_ids`, which the ledger admits as outputs. max_tokens,
min_tokens, penalties and per-position seeds therefore go on exactly, greedy output equals an
undisturbed run, and the client's stream continues without an error or a repeated token.

Only a live request is re-submitted: one the scheduler admitted (it says so in its initial
metadata, `kvledger.rpc.ADMITTED`). A call that fails before that fails as it always did: a
new request is not held while no scheduler answers (the frontend's /health is 503 then).

What counts as a broken link: UNAVAILABLE from the transport (the scheduler's own UNAVAILABLE,
"no worker for model ... is up", is an answer, not a broken link). While resuming, a restarted
scheduler that has not seen the model's workers register yet (UNAVAILABLE "no worker", or
NOT_FOUND for a model it has never seen) is waited for too. Past the deadline
(`--scheduler-reconnect-timeout`), the request fails as it would have without resumption.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from kvledger.rpc import ADMITTED
from protos import frontend_pb2
from server.errors import scheduler_unreachable

FIRST_RETRY_SECONDS = 0.05
MAX_RETRY_SECONDS = 0.5


def waiting_for_workers(err: grpc.aio.AioRpcError) -> bool:
    """A (restarted) scheduler that does not serve the model yet: its workers re-register."""
    return err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)


@dataclass
class Resumer:
    """One request's resumption state: whether it is live, and while its link is broken, when
    it gives up. Continuations are numbered (`attempts`) for their request ids."""

    timeout: float  # seconds from the break; 0 = never resume
    admitted: bool = False  # the scheduler admitted the request: it is live
    deadline: float | None = None  # set while the link is broken
    attempts: int = 0

    @property
    def resuming(self) -> bool:
        return self.deadline is not None

    def retry_after(self, err: grpc.aio.AioRpcError) -> float | None:
        """Seconds to wait before re-submitting, or None: give up and fail with `err`."""
        if self.timeout <= 0 or not self.admitted:
            return None
        if not (scheduler_unreachable(err) or (self.resuming and waiting_for_workers(err))):
            return None
        now = asyncio.get_running_loop().time()
        if self.deadline is None:
            self.deadline = now + self.timeout
        if now >= self.deadline:
            return None
        self.attempts += 1
        delay = min(FIRST_RETRY_SECONDS * 2 ** (self.attempts - 1), MAX_RETRY_SECONDS)
        return min(delay, self.deadline - now)

    def time_left(self) -> float:
        """Seconds a continuation has left to be admitted (a scheduler that accepts
        connections but never answers must not hold the request past the deadline)."""
        assert self.deadline is not None
        return max(self.deadline - asyncio.get_running_loop().time(), 0.0)

    def resumed(self) -> None:
        """A continuation was admitted: a later break gets a whole deadline of its own."""
        self.deadline = None


async def admitted(call: grpc.aio.UnaryStreamCall) -> bool:
    """Waits for the call's initial metadata: True when the scheduler admitted the request
    (False when the call failed first; iterating it then raises the error)."""
    return ADMITTED in tuple(await call.initial_metadata() or ())


def continuation(
    original: frontend_pb2.GenerateRequest,
    streamed: list[int],
    attempt: int,
    prompt_logprobs_received: bool,
) -> frontend_pb2.GenerateRequest:
    """The request to re-submit: the original with the tokens streamed so far, under a new id
    (the old scheduler, if it lives, may still hold the old one until it sees the cancel).
    Prompt logprobs all come before or with the first token: once received, not again."""
    request = frontend_pb2.GenerateRequest()
    request.CopyFrom(original)
    request.request_id = f"{original.request_id}-resume{attempt}"
    request.resumed_token_ids[:] = streamed
    if prompt_logprobs_received:
        request.sampling.ClearField("prompt_logprobs")
    return request
