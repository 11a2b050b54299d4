"""/v1/chat/completions: its request body, and its response and chunk shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from kvledger.rpc import MAX_LOGPROBS
from server.protocol import INT32_MAX, REQUEST_CONFIG, SamplingRequest, text_fields
from server.responses import Usage
from server.tool_protocol import (
    MessageToolCall,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    tool_calls_field,
)

FinishReason = Literal["stop", "length", "tool_calls"]

# Parameters of OpenAI's chat API this server does not implement: a request that sets one is a
# 400 naming it, never a reply that silently ignores it.
UNSUPPORTED = (
    # OpenAI's deprecated names for tools and tool_choice (refused with a pointer to those)
    "functions",
    "function_call",
    "audio",
    # a request's own template would run a client's code in the server's sandbox
    "chat_template",
    "echo",
)


class ContentPart(BaseModel):
    """One part of a message's content; only `{"type": "text", "text": ...}` is served."""

    model_config = REQUEST_CONFIG
    type: str
    text: str | None = None

    _check_text = text_fields("text")


class ChatMessage(BaseModel):
    """A message of the conversation: an assistant's may carry the `tool_calls` it made (its
    content then may be null), a `tool` message the result of one, by `tool_call_id`. OpenAI's
    `developer` role (its newer name for instructions) is the system turn, as vLLM and
    llama.cpp take it: chat templates know no other."""

    model_config = REQUEST_CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    _check_text = text_fields("content", "name", "tool_call_id")

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        return "system" if role == "developer" else role


class ChatTemplateOptions(BaseModel):
    """How the messages become a prompt (vLLM's names)."""

    model_config = REQUEST_CONFIG
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the template writes the model's special tokens itself
    chat_template_kwargs: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingRequest, ChatTemplateOptions):
    # The example is the documentation's, and the API fuzz test's one certain valid body: with
    # tools, messages and their roles, a generated body is almost never valid as a whole.
    model_config = ConfigDict(
        **REQUEST_CONFIG,
        json_schema_extra={
            "examples": [
                {
                    "model": "tiny-llama",
                    "messages": [{"role": "user", "content": "Hello"}],
                    "max_tokens": 4,
                }
            ]
        },
    )
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    parallel_tool_calls: bool | None = None
    chat_template: str | None = None
    echo: bool = False

    @property
    def token_limit(self) -> int | None:
        """`max_completion_tokens` is OpenAI's newer name for `max_tokens`."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = tool_calls_field()


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    """What a chunk adds to a choice's message; fields it does not carry are left out (the
    last chunk's delta is `{}`), as OpenAI sends them."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion (`data: {...}`); the stream ends
    with `data: [DONE]`. The last chunk before it carries `usage` (and no choices) when
    `stream_options.include_usage`; an error mid-stream comes as `data: {"error": {...}}`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
