"""Anthropic's reply shapes: a message, a token count, an error (for the OpenAPI schema: the
error bodies themselves are written by server/anthropic/errors.py), and the description of a
stream's events (written by server/anthropic/view.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    """A call: `id` is what the tool_result answering it names."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    """Anthropic's split of the prompt: `cache_read_input_tokens` came from the prefix cache,
    `input_tokens` were computed (their sum is the prompt's length). Nothing is written to a
    cache on request here (no `cache_control` breakpoints): `cache_creation_input_tokens`
    is 0."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every error under /v1/messages, whatever its status: Anthropic's shape."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


STREAM_DESCRIPTION = (
    "The message; with `stream`, server-sent events, each an `event:` line naming its type "
    "and a `data:` line: `message_start` (the message, its content empty), then for each "
    "content block `content_block_start`, `content_block_delta` (`text_delta`, or "
    "`input_json_delta` for a tool_use's input), `content_block_stop`; a `ping` after the "
    "first block starts; `message_delta` (stop_reason, stop_sequence, usage) and "
    "`message_stop`. An error mid-stream is an `error` event in Anthropic's error shape."
)
_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a malformed body, a value out of range, or a field not served.",
    401: "Missing or wrong API key (`x-api-key` or `Authorization: Bearer`).",
    404: "Unknown model.",
    413: "Request body too large.",
    429: "The scheduler's queue is full.",
    500: "The worker failed the request.",
    503: "No worker serves the model, or the scheduler is unavailable.",
}


def anthropic_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for a route's error statuses, in Anthropic's shape."""
    return {
        status: {"model": AnthropicErrorResponse, "description": _ERROR_DESCRIPTIONS[status]}
        for status in statuses
    }
