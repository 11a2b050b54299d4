"""OpenAI's Responses API request body (`POST /v1/responses`) and its input items.

As every OpenAI body here: strict (a value of the wrong JSON type is a 400, never coerced),
and open (a field no schema defines is accepted and ignored, as OpenAI's clients expect).
Fields of OpenAI's schema this server does not implement are refused unless left at a value
that asks for nothing (NO_OPS, checked by server/responses_api/translate.py). An input item,
content part, tool or tool_choice of a type not served parses as an `Unserved*` model, so that
its refusal names its type."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from server.protocol import INT32_MAX, REQUEST_CONFIG, StreamOptions, text_fields

UNSERVED_CONFIG = ConfigDict(extra="allow", strict=True)
# What each unimplemented field may be set to and still ask for nothing this server lacks.
NO_OPS: dict[str, tuple[object, ...]] = {
    "background": (None, False),  # every response is answered in its request
    "conversation": (None,),  # conversations are chained by previous_response_id only
    "include": (None, []),
    "max_tool_calls": (None,),
    "prompt": (None,),  # stored prompt templates
    "reasoning": (None, {}, {"effort": None}, {"effort": "none"}),  # no served model reasons
    "service_tier": (None, "auto", "default"),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),  # a conversation too long for the context is a 400
    "moderation": (None,),
    "context_management": (None, []),
    "prompt_cache_retention": (None, "in_memory"),
    "prompt_cache_options": (None, {}, {"mode": "implicit"}),
}


def _type_of(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


class Unserved(BaseModel):
    """An item, part, tool or tool_choice of a type not served: kept to be refused by name."""

    model_config = UNSERVED_CONFIG
    type: str | None = None


class TextPart(BaseModel):
    """`input_text` (a user's, system's or developer's) or `output_text` (an assistant's, as a
    response's output comes back as input; its annotations and logprobs are not read)."""

    model_config = REQUEST_CONFIG
    type: Literal["input_text", "output_text"]
    text: str

    _check_text = text_fields("text")


def _part_tag(value: Any) -> str:
    return "part:text" if _type_of(value) in ("input_text", "output_text") else "part:*"


Part = Annotated[
    Annotated[TextPart, Tag("part:text")] | Annotated[Unserved, Tag("part:*")],
    Discriminator(_part_tag),
]


def text_or_parts() -> Any:
    return Annotated[
        Annotated[str, Tag("str")] | Annotated[list[Part], Tag("list:parts")],
        Discriminator(lambda v: "str" if isinstance(v, str) else "list:parts"),
    ]


class MessageItem(BaseModel):
    """A turn: `type` may be left out (OpenAI's "easy" input message). `id`, `status` and
    `phase` come with a response's output passed back as input, and are not read."""

    model_config = REQUEST_CONFIG
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: text_or_parts()

    _check_text = text_fields("content")


class FunctionCallItem(BaseModel):
    """A call the model made; `call_id` is what its output names."""

    model_config = REQUEST_CONFIG
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None

    _check_text = text_fields("call_id", "name", "arguments")


class FunctionCallOutputItem(BaseModel):
    """The result of call `call_id`: text, or input_text parts."""

    model_config = REQUEST_CONFIG
    type: Literal["function_call_output"]
    call_id: str
    output: text_or_parts()
    id: str | None = None

    _check_text = text_fields("call_id", "output")


_ITEM_TAGS = {
    None: "item:message",
    "message": "item:message",
    "function_call": "item:function_call",
    "function_call_output": "item:function_call_output",
}

Item = Annotated[
    Annotated[MessageItem, Tag("item:message")]
    | Annotated[FunctionCallItem, Tag("item:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item:function_call_output")]
    | Annotated[Unserved, Tag("item:*")],
    Discriminator(lambda v: _ITEM_TAGS.get(_type_of(v), "item:*")),
]


class FunctionTool(BaseModel):
    """A function the model may call (the Responses shape: no nested `function`). `strict` is
    accepted either way: a forced call always follows the schema here."""

    model_config = REQUEST_CONFIG
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _check_text = text_fields("name", "description")


Tool = Annotated[
    Annotated[FunctionTool, Tag("tool:function")] | Annotated[Unserved, Tag("tool:*")],
    Discriminator(lambda v: "tool:function" if _type_of(v) == "function" else "tool:*"),
]


class FunctionChoice(BaseModel):
    """`{"type": "function", "name": ...}`: the model must call that function."""

    model_config = REQUEST_CONFIG
    type: Literal["function"]
    name: str

    _check_text = text_fields("name")


def _choice_tag(value: Any) -> str:
    if isinstance(value, str):
        return "choice:mode"
    return "choice:function" if _type_of(value) == "function" else "choice:*"


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("choice:mode")]
    | Annotated[FunctionChoice, Tag("choice:function")]
    | Annotated[Unserved, Tag("choice:*")],
    Discriminator(_choice_tag),
]


class TextFormat(BaseModel):
    """`text.format`: free `text`, any `json_object`, or a `json_schema` (its `name`, `schema`,
    `description`, `strict` beside `type`, not nested as chat's are)."""

    model_config = REQUEST_CONFIG
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = REQUEST_CONFIG
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the one verbosity: the model's own


class ResponsesRequest(BaseModel):
    """`input` (text, or items), what the conversation so far is (`previous_response_id`),
    how to answer (`instructions`, tools, `text.format`, sampling) and whether to keep it."""

    # The example is the documentation's, and the API fuzz test's one certain valid body (as
    # chat's: server/chat_protocol.py).
    model_config = ConfigDict(
        **REQUEST_CONFIG,
        json_schema_extra={
            "examples": [{"model": "tiny-llama", "input": "Hello", "max_output_tokens": 4}]
        },
    )
    model: str
    input: (
        Annotated[
            Annotated[str, Tag("str")] | Annotated[list[Item], Tag("list:items")],
            Discriminator(lambda v: "str" if isinstance(v, str) else "list:items"),
        ]
        | None
    ) = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    # accepted, no effect (as on the chat route: docs/api.md)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # OpenAI's, not implemented: refused unless a no-op (NO_OPS)
    background: bool | None = None
    conversation: Any = None
    include: list[Any] | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    moderation: Any = None
    context_management: list[Any] | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None

    _check_text = text_fields("model", "input", "instructions", "previous_response_id")
