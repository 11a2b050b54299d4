"""The Responses API's reply shapes: a response, its output items, its usage, a deleted
response and a list of input items (for the OpenAPI schema and the replies themselves), and
the description of a stream's events (written by server/responses_api/view.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["completed", "incomplete", "in_progress"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCall(BaseModel):
    """A call: `call_id` is what the function_call_output answering it names."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """`input_tokens_details.cached_tokens` of the prompt came from the prefix cache."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response as created, streamed (its last event) and read back (`GET`)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Status
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage | FunctionCall]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    truncation: Literal["disabled"] = "disabled"
    background: bool = False
    store: bool
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(BaseModel):
    """The items the model read for a response (stored ones included), oldest first."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool = False


STREAM_DESCRIPTION = (
    "The response; with `stream`, server-sent events, each an `event:` line naming its type "
    "and a `data:` line with a `sequence_number`: `response.created` and "
    "`response.in_progress` (the response, its output empty); for each output item "
    "`response.output_item.added`, then for a message `response.content_part.added`, "
    "`response.output_text.delta`..., `response.output_text.done`, "
    "`response.content_part.done`, for a function call "
    "`response.function_call_arguments.delta`..., `response.function_call_arguments.done`; "
    "`response.output_item.done`; last `response.completed` (or `response.incomplete` when "
    "max_output_tokens ran out) with the whole response. An error mid-stream is an `error` "
    "event."
)
