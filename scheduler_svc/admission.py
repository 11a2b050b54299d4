"""Admission: what a new request must pass before it is placed on a worker.

Pure: each check takes what it weighs as plain data and raises PlacementError with the status
the frontend maps to HTTP (404 unknown model, 503 no worker up, 429 queue full, 400 bad
input). The engine runs them in this order, so a request with several problems always gets
the same answer: request id in use, model (exists, up, right kind, queue), prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from protos import frontend_pb2, worker_pb2
from scheduler_svc.errors import PlacementError


def check_model(
    model: str,
    workers: Sequence[worker_pb2.Registration],
    *,
    known: bool,
    embed: bool,
    num_waiting: int,
    max_waiting: int,
    share: TenantShare | None = None,
) -> worker_pb2.Registration:
    """The model's registration (its workers are interchangeable), when `workers` (those up
    for it) can take one more request: `known` says a worker ever served it (UNAVAILABLE
    rather than NOT_FOUND), `num_waiting` is its queue across workers, `embed` says the call
    embeds (a generate call to an embedding model is refused)."""
    if not workers:
        if known:
            raise PlacementError(
                grpc.StatusCode.UNAVAILABLE, f"no worker for model {model!r} is up"
            )
        raise PlacementError(grpc.StatusCode.NOT_FOUND, f"model {model!r} does not exist")
    reg = workers[0]
    if reg.kind == frontend_pb2.MODEL_KIND_EMBED and not embed:
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT, f"model {model!r} is an embedding model"
        )
    if num_waiting >= max_waiting and (share is None or not share.admits(num_waiting, max_waiting)):
        raise PlacementError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"the queue for model {model!r} is full"
        )
    return reg


@dataclass(frozen=True)
class TenantShare:
    """The fair policy's waiting cap, shared out per tenant. While the queue is below
    max_waiting anyone is admitted, as under every policy. Once it is full, a tenant is still
    admitted while it holds fewer waiting requests than its share, max_waiting divided by the
    tenants with requests waiting (itself counted), up to twice max_waiting in all: a tenant
    that floods the queue fills it, yet one running nothing still gets in. Before, a tenant
    keeping 90 requests in flight against a cap of 64 had every request of another refused."""

    tenant_waiting: int  # this tenant's waiting requests
    num_tenants: int  # tenants with requests waiting, this one counted

    def admits(self, num_waiting: int, max_waiting: int) -> bool:
        share = -(-max_waiting // max(self.num_tenants, 1))
        return num_waiting < 2 * max_waiting and self.tenant_waiting < share


def check_prompt(token_ids: Sequence[int], vocab_size: int) -> None:
    """Not empty, and every id inside the vocabulary (the first one outside is named)."""
    if not token_ids:
        raise PlacementError(grpc.StatusCode.INVALID_ARGUMENT, "the prompt is empty")
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"token id {bad} is out of vocabulary (size {vocab_size})",
        )


def check_continuation(num_resumed: int, max_tokens: int) -> None:
    """A continuation (a request re-submitted after its frontend's scheduler link broke,
    server/resume.py) still has a token to generate: its resumed tokens are outputs, fewer
    than max_tokens (their ids are checked with the prompt's)."""
    if num_resumed and num_resumed >= max_tokens:
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "a continuation must hold fewer resumed tokens than max_tokens",
        )


def check_priority(priority: int, policy: str) -> None:
    """A priority other than 0 needs the priority policy (vLLM refuses it so too): under any
    other it would be silently ignored."""
    if priority and policy != "priority":
        raise PlacementError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"priority {priority} was given, but the scheduling policy is {policy!r}, not "
            "'priority' (start the scheduler with --scheduling-policy priority)",
        )
