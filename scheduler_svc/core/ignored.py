"""Requests that can never run: they finish as IGNORED at arrival, with a reason.

A request that no step could ever admit (an empty prompt, one longer than the context or than
the whole pool, an embedding larger than a step's token budget, `max_tokens` below 1) would
otherwise sit at the head of the queue and block every request behind it. It is refused before
it gets a tracker entry, and the reason goes to the frontend, which answers 400.
"""

from __future__ import annotations

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.request import Request


def why_ignored(
    request: Request, config: SchedulerConfig, token_capacity: int | None
) -> str | None:
    """Why the request can never run, or None if it can. `token_capacity`: the most tokens a
    request can hold in this pool (KVManager.token_capacity; None when unbounded)."""
    num_prompt = request.num_prompt_tokens
    if num_prompt == 0:
        return "the prompt is empty"
    if num_prompt > config.max_model_len:
        return (
            f"the prompt has {num_prompt} tokens, more than the maximum context length "
            f"of {config.max_model_len}"
        )
    if token_capacity is not None and num_prompt > token_capacity:
        return (
            f"the prompt has {num_prompt} tokens, more than a worker of this model can "
            "hold in its KV cache"
        )
    if request.is_embedding and num_prompt > config.max_num_batched_tokens:
        return (
            f"an embedding input of {num_prompt} tokens exceeds the step's token budget "
            f"of {config.max_num_batched_tokens}"
        )
    if not request.is_embedding and request.max_tokens < 1:
        return "max_tokens must be at least 1"
    return None
