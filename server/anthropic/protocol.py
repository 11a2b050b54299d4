"""Anthropic's Messages API request bodies: `/v1/messages` and `/v1/messages/count_tokens`.

Strict, as every body here (a value of the wrong JSON type is a 400, never coerced), and, as
Anthropic's own API, closed: a field that Anthropic's schema does not define is a 400 naming
it (`Extra inputs are not permitted`). Fields of Anthropic's schema this server does not
implement are declared and refused unless left at a no-op value (NO_OPS, checked by
server/anthropic/translate.py). A content block of a type not served (image, document,
thinking, ...) or a server tool (web search, bash, ...) parses as an `Unserved*` model, so that
its refusal names its type; the bounds on counts and sizes are translate.py's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from server.protocol import INT32_MAX, text_fields

ANTHROPIC_CONFIG = ConfigDict(extra="forbid", strict=True)
# The tags name union members in pydantic's error locations; not identifiers, so the error's
# field path leaves them out (server/errors.py, `_union_tag`).
TEXT, TOOL_USE, TOOL_RESULT, OTHER = "block:text", "block:tool_use", "block:tool_result", "block:*"


class CacheControl(BaseModel):
    """Accepted and ignored: the prefix cache keeps every prompt's blocks, breakpoint or not."""

    model_config = ANTHROPIC_CONFIG
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(BaseModel):
    """`citations` annotate text a model wrote earlier: accepted, not rendered."""

    model_config = ANTHROPIC_CONFIG
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None

    _check_text = text_fields("text")


class UnservedBlock(BaseModel):
    """A block of a type this server does not serve: kept only to be refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


class ToolUseBlock(BaseModel):
    """A call the assistant made: `input` is its arguments object."""

    model_config = ANTHROPIC_CONFIG
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None

    _check_text = text_fields("id", "name")


def text_or(blocks: Any) -> Any:
    """A string, or a list of `blocks`: told apart by the value's JSON type, so that an error
    comes from the one the value is (its field named), not from both."""
    return Annotated[
        Annotated[str, Tag("str")] | Annotated[blocks, Tag("list:blocks")],
        Discriminator(lambda v: "str" if isinstance(v, str) else "list:blocks"),
    ]


def _result_part_tag(value: Any) -> str:
    return TEXT if _type_of(value) == "text" else OTHER


ResultPart = Annotated[
    Annotated[TextBlock, Tag(TEXT)] | Annotated[UnservedBlock, Tag(OTHER)],
    Discriminator(_result_part_tag),
]


class ToolResultBlock(BaseModel):
    """The result of the call `tool_use_id`; `is_error` says the call failed."""

    model_config = ANTHROPIC_CONFIG
    type: Literal["tool_result"]
    tool_use_id: str
    content: text_or(list[ResultPart]) | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    _check_text = text_fields("tool_use_id", "content")


_BLOCK_TAGS = {"text": TEXT, "tool_use": TOOL_USE, "tool_result": TOOL_RESULT}


def _block_tag(value: Any) -> str:
    return _BLOCK_TAGS.get(_type_of(value) or "", OTHER)


def _type_of(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


Block = Annotated[
    Annotated[TextBlock, Tag(TEXT)]
    | Annotated[ToolUseBlock, Tag(TOOL_USE)]
    | Annotated[ToolResultBlock, Tag(TOOL_RESULT)]
    | Annotated[UnservedBlock, Tag(OTHER)],
    Discriminator(_block_tag),
]


class MessageParam(BaseModel):
    """A turn: its content a string (one text block) or blocks."""

    model_config = ANTHROPIC_CONFIG
    role: Literal["user", "assistant"]
    content: text_or(list[Block])

    _check_text = text_fields("content")


class CustomTool(BaseModel):
    """A tool the model may call; `input_schema` is the JSON schema of its input (an object).
    `strict` is accepted either way: a forced call always follows the schema here."""

    model_config = ANTHROPIC_CONFIG
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None

    _check_text = text_fields("name", "description")


class UnservedTool(BaseModel):
    """One of Anthropic's server tools (`web_search_...`, `bash_...`): refused by name."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _tool_tag(value: Any) -> str:
    return "tool:custom" if _type_of(value) in (None, "custom") else "tool:server"


Tool = Annotated[
    Annotated[CustomTool, Tag("tool:custom")] | Annotated[UnservedTool, Tag("tool:server")],
    Discriminator(_tool_tag),
]


class ToolChoiceAuto(BaseModel):
    model_config = ANTHROPIC_CONFIG
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(BaseModel):
    model_config = ANTHROPIC_CONFIG
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(BaseModel):
    model_config = ANTHROPIC_CONFIG
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None

    _check_text = text_fields("name")


class ToolChoiceNone(BaseModel):
    model_config = ANTHROPIC_CONFIG
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class Metadata(BaseModel):
    """Accepted and ignored (nothing is stored); `user_id` is bounded as `user` is."""

    model_config = ANTHROPIC_CONFIG
    user_id: str | None = None

    _check_text = text_fields("user_id")


# Anthropic's fields this server does not implement, each with the values that ask for
# nothing it lacks: those are accepted, any other is a 400 naming the field.
NO_OPS: dict[str, tuple[object, ...]] = {
    "thinking": (None, {"type": "disabled"}),  # no served model thinks
    "output_config": (None, {}),  # no output formats or effort levels
    "mcp_servers": (None, []),  # no MCP connector
    "context_management": (None,),  # no context editing
    "container": (None,),  # no code execution container
    "inference_geo": (None,),  # no regions
    "speed": (None, "standard"),  # one speed
    "diagnostics": (None,),
    "user_profile_id": (None,),
    "workspace_id": (None,),
}
PROMPT_EXAMPLE = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}]}


class CountTokensRequest(BaseModel):
    """What a prompt is made of: `/v1/messages/count_tokens` takes this alone."""

    model_config = ConfigDict(**ANTHROPIC_CONFIG, json_schema_extra={"examples": [PROMPT_EXAMPLE]})
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: text_or(list[TextBlock]) | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    thinking: Any = None
    output_config: Any = None
    mcp_servers: Any = None
    context_management: Any = None

    _check_text = text_fields("model", "system")


class MessagesRequest(CountTokensRequest):
    """`/v1/messages`. `service_tier`: there is one tier, both values are accepted."""

    model_config = ConfigDict(
        **ANTHROPIC_CONFIG, json_schema_extra={"examples": [{**PROMPT_EXAMPLE, "max_tokens": 4}]}
    )
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    container: Any = None
    inference_geo: Any = None
    speed: Any = None
    diagnostics: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    _check_stops = text_fields("stop_sequences")
