"""Bounds on the lists and strings of a request body, checked before anything is rendered,
tokenized or sent to the scheduler (their values: `Limits`, kvledger/config/frontend.py; the
table in docs/operations.md). Each refusal is a 400 naming the field and the limit.

Why here, before the work: what a client sends reaches memory and CPU in proportion to its
size, often amplified (a template repeats a variable per message; the scheduler keeps a copy
of the stop ids of each of `n` choices). A body of a few MB of stop ids with n 16 took the
scheduler's memory up more than tenfold (docs/performance.md, "Frontend under large
requests"); bounded, the same body is a 400 that costs nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvledger.config.frontend import Limits
from server.errors import APIError

# Nesting past this in chat_template_kwargs is refused: no template reads deeper, and a
# recursive walk of deeper values would be the server's cost.
MAX_KWARGS_DEPTH = 16


def check_names(limits: Limits, **names: str | None) -> None:
    """Short identifying strings (model, user, cache_salt, a message's name)."""
    for field, value in names.items():
        if value is not None and len(value) > limits.max_name_length:
            raise APIError(
                400,
                f"{field} must be at most {limits.max_name_length} characters long",
                param=field,
            )


def check_count(count: int, limit: int, field: str, what: str) -> None:
    if count > limit:
        raise APIError(400, f"at most {limit} {what} per request", param=field)


def check_token_ids(ids: Iterable[int], vocab_size: int, field: str) -> None:
    """Every id inside the model's vocabulary (the first one outside is named)."""
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise APIError(
            400,
            f"{field} must hold token ids below the vocabulary size {vocab_size}, not {bad}",
            param=field,
        )


def check_sampling_lists(
    stop_token_ids: Sequence[int] | None,
    logit_bias: dict[str, float] | None,
    limits: Limits,
    vocab_size: int,
) -> None:
    """stop_token_ids: counted, then each inside the vocabulary; logit_bias: counted (its keys
    are checked against the vocabulary by sampling.check_request)."""
    ids = stop_token_ids or []
    check_count(len(ids), limits.max_stop_token_ids, "stop_token_ids", "stop_token_ids")
    check_token_ids(ids, vocab_size, "stop_token_ids")
    check_count(len(logit_bias or {}), limits.max_logit_bias, "logit_bias", "logit_bias entries")


def check_template_kwargs(kwargs: dict[str, Any] | None, limits: Limits) -> None:
    """chat_template_kwargs: at most `max_chat_template_kwargs_chars` characters (keys and
    strings; one for each other value), MAX_KWARGS_DEPTH levels, and valid Unicode (a lone
    surrogate cannot be rendered or tokenized). Which names it may set is the template's rule
    (chat_template.RESERVED_NAMES)."""
    if not kwargs:
        return
    check_nested(kwargs, "chat_template_kwargs", limits.max_chat_template_kwargs_chars)


def check_nested(value: Any, field: str, max_chars: int, max_depth: int = MAX_KWARGS_DEPTH) -> None:
    """A JSON value of a request (dicts, lists, strings, other scalars): at most `max_chars`
    characters (keys and strings; one for each other value), `max_depth` levels, and valid
    Unicode. Walked without recursion, so no depth costs the server a stack."""
    budget = max_chars
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise APIError(400, f"{field} nests deeper than {max_depth}", param=field)
        if isinstance(value, dict):
            items = list(value.items())
            budget -= sum(_chars(k, field) for k, _ in items)
            stack.extend((v, depth + 1) for _, v in items)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        budget -= _chars(value, field) if isinstance(value, str) else 1
        if budget < 0:
            raise APIError(400, f"{field} must hold at most {max_chars} characters", param=field)


def _chars(text: Any, field: str) -> int:
    if not isinstance(text, str):
        return 1
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400, f"{field} must be valid Unicode text (no lone surrogates)", param=field
        ) from None
    return len(text)
