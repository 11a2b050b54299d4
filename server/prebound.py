"""A parsed JSON body's lists counted before it is validated (server/body_offload.py).

pydantic validates a body in one call that holds the GIL: 120,000 empty messages took it
seconds, during which no other request's tokens were streamed. Counting is Python code
(the event loop gets its turns) and stops at the first list past its bound, so the model is
validated only on bodies whose lists are within the documented limits (`Limits`). The same
limits are checked again on the validated model, where the routes need them."""

from __future__ import annotations

from typing import Any

from kvledger.config.frontend import Limits
from server.bounds import check_count


def prebound(data: Any, limits: Limits) -> None:
    """400 naming the first top-level list past its limit: messages (and the content parts in
    them), stop strings and ids, logit_bias, a cross-encoder's texts, prompts and the token
    ids in them, tokens."""
    if not isinstance(data, dict):
        return
    messages = data.get("messages")
    if isinstance(messages, list):
        check_count(len(messages), limits.max_messages, "messages", "messages")
        parts = sum(len(m["content"]) for m in messages if _has_parts(m))
        check_count(parts, limits.max_content_parts, "messages", "content parts")
    for field, limit, what in (
        ("stop", limits.max_stop_strings, "stop strings"),
        ("stop_sequences", limits.max_stop_strings, "stop_sequences"),  # Anthropic's `stop`
        ("stop_token_ids", limits.max_stop_token_ids, "stop_token_ids"),
        ("logit_bias", limits.max_logit_bias, "logit_bias entries"),
    ):
        value = data.get(field)
        if isinstance(value, list | dict):
            check_count(len(value), limit, field, what)
    for field in ("documents", "text_1", "text_2"):  # the cross-encoder routes' texts
        value = data.get(field)
        if isinstance(value, list):
            check_count(len(value), limits.max_rerank_documents, field, f"texts in {field}")
    for field in ("prompt", "input", "tokens"):
        value = data.get(field)
        if isinstance(value, list):
            check_count(_num_ids(value), limits.max_token_ids, field, "token ids")


def _has_parts(message: Any) -> bool:
    return isinstance(message, dict) and isinstance(message.get("content"), list)


def _num_ids(prompts: list[Any]) -> int:
    """Token ids in a prompt field: a list of ids, or of lists of ids (texts count none)."""
    return sum(len(p) if isinstance(p, list) else 1 for p in prompts if not isinstance(p, str))
