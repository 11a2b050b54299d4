"""Tool calls in the chat API's shapes: the tools a request offers, its tool_choice, the calls
an assistant message made (requests), and the calls a reply or a chunk carries (responses).

Request models are strict (REQUEST_CONFIG); what the shapes cannot say (names, schemas, sizes,
which function tool_choice names) is checked by server/tools.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from server.protocol import REQUEST_CONFIG, text_fields


class FunctionDefinition(BaseModel):
    """A function the model may call; `parameters` is the JSON schema of its arguments (an
    object). Left out, the function takes no arguments."""

    model_config = REQUEST_CONFIG
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments always follow the schema here: accepted

    _check_text = text_fields("name", "description")


class ToolDefinition(BaseModel):
    model_config = REQUEST_CONFIG
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = REQUEST_CONFIG
    name: str

    _check_text = text_fields("name")


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: the model must call that function."""

    model_config = REQUEST_CONFIG
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    """A call as an assistant message of the conversation carries it: `arguments` is the JSON
    text the model wrote (OpenAI's shape)."""

    model_config = REQUEST_CONFIG
    name: str
    arguments: str

    _check_text = text_fields("name", "arguments")


class MessageToolCall(BaseModel):
    model_config = REQUEST_CONFIG
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    _check_text = text_fields("id")


class CalledFunction(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class ToolCall(BaseModel):
    """A call in a reply's message: `id` is what the tool message answering it names."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class _SetFieldsOnly(BaseModel):
    """A streamed part: the fields it does not carry are left out, as OpenAI sends them."""

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class FunctionDelta(_SetFieldsOnly):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_SetFieldsOnly):
    """A call's part in a chunk: its first carries id, type, name and arguments' start; later
    ones, by `index`, more of the arguments' text."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


def absent(value: object) -> bool:
    return value is None


def tool_calls_field() -> Any:
    """A message's tool_calls: left out of the reply when the model made none."""
    return Field(None, exclude_if=absent)
