"""When a freshly sampled token ends its request: the token-level checks of one step."""

from __future__ import annotations

from scheduler_svc.core.request import FinishReason, Request

STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def stop_reason(request: Request, token: int, max_len: int) -> FinishReason | None:
    """STOP on eos (unless ignore_eos) or a stop token once min_tokens are out, else LENGTH at
    max_tokens or the context limit. Stop strings are the frontend's: it sees the text."""
    num_outputs = len(request.output_token_ids)
    if num_outputs >= request.min_tokens and (
        token in request.stop_token_ids
        or (not request.ignore_eos and token in request.eos_token_ids)
    ):
        return STOP
    if num_outputs >= request.max_tokens or len(request.all_token_ids) >= max_len:
        return LENGTH
    return None


def at_length(request: Request, max_len: int) -> bool:
    return (
        len(request.output_token_ids) >= request.max_tokens or len(request.all_token_ids) >= max_len
    )
