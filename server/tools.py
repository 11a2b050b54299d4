"""A chat request's `tools` and `tool_choice`: checked, then what they ask of the generation.

The rules. Tools are functions (`type: function`) with a name of 1 to 64 letters, digits,
`_` or `-` (OpenAI's rule), unique in the request, and an optional `parameters` JSON schema for
an object (checked against its metaschema). Their number and size are bounded (`--max-tools`,
`--max-tools-chars`) before anything walks them. `tool_choice` defaults to `auto` when tools
are given; any other value without tools is a 400 (as OpenAI's).

What each choice asks: `none` describes no tool and parses nothing; `auto` describes the tools
and parses calls from the text (server/tool_parser.py); a named function and `required` also
constrain the output (a StructuredSpec), so that every call's arguments parse and validate
against its function's schema (server/tool_schema.py): the named function's arguments object,
or for `required` an array of one or more `{"name", "arguments"}` objects over the tools
(vLLM's scheme)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from kvledger.config.frontend import Limits
from kvledger.structured import StructuredError, StructuredSpec, json_schema_spec
from server.bounds import check_count, check_nested
from server.client import ServedModel
from server.errors import APIError
from server.protocol import SamplingRequest
from server.structured import compile_check
from server.tool_protocol import FunctionDefinition, NamedToolChoice, ToolDefinition
from server.tool_schema import arguments_schema

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Nesting past this in a parameters schema is refused: the metaschema check and the grammar
# compiler walk it recursively.
MAX_SCHEMA_DEPTH = 32
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class ToolPlan:
    """`choice` is `none`, `auto`, `required` or `named` (then `named` is the function)."""

    choice: str
    functions: tuple[FunctionDefinition, ...]
    named: str | None = None
    parallel: bool = True  # parallel_tool_calls: false allows one call

    @property
    def offered(self) -> tuple[FunctionDefinition, ...]:
        """The functions the prompt describes (none with tool_choice none)."""
        return () if self.choice == "none" else self.functions

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.functions)

    def structured(self) -> StructuredSpec | None:
        """The constraint of a forced call, None when the model chooses."""
        if self.choice == "named":
            function = next(f for f in self.functions if f.name == self.named)
            return json_schema_spec(arguments_schema(function))
        if self.choice == "required":
            return json_schema_spec(self._calls_schema())
        return None

    def _calls_schema(self) -> dict[str, Any]:
        one_of_each = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [f.name]},
                    "arguments": arguments_schema(f),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in self.functions
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one_of_each}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema


def tool_plan(
    tools: list[ToolDefinition] | None,
    choice: str | NamedToolChoice | None,
    parallel: bool | None,
    limits: Limits,
) -> ToolPlan | None:
    """The request's tools, checked; None when it offers none."""
    if not tools:
        if choice is not None and choice != "none":
            raise APIError(
                400, "tool_choice is only allowed when tools are given", param="tool_choice"
            )
        return None
    check_count(len(tools), limits.max_tools, "tools", "tools")
    raw = [t.model_dump(exclude_none=True) for t in tools]
    check_nested(raw, "tools", limits.max_tools_chars, MAX_SCHEMA_DEPTH)
    functions = tuple(t.function for t in tools)
    for index, function in enumerate(functions):
        _check_function(function, index)
    names = [f.name for f in functions]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise APIError(400, f"tools: the function name `{duplicate}` is given twice", "tools")
    plan_parallel = parallel is not False
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(
                400,
                f"tool_choice names the function `{choice.function.name[:64]}`, which is not "
                "among the tools",
                param="tool_choice",
            )
        return ToolPlan("named", functions, choice.function.name, plan_parallel)
    return ToolPlan(choice or "auto", functions, None, plan_parallel)


def tool_constraint(
    plan: ToolPlan,
    spec: StructuredSpec | None,
    body: SamplingRequest,
    model: ServedModel,
    limits: Limits,
) -> StructuredSpec | None:
    """The request's constraint: a forced call's, compiled here as the worker will compile it
    (a 400 when it does not), else the one the request gave itself (`spec`, which then holds
    with `auto`: the text follows it, and calls are parsed from it). A forced call and a
    constraint of the request's own cannot both hold."""
    forced = plan.structured()
    if forced is None:
        return spec
    if spec is not None:
        raise APIError(
            400,
            "tool_choice `required` or a named function constrains the output to the calls: "
            "it cannot be combined with response_format, structured_outputs or guided_*",
            param="tool_choice",
        )
    if body.ignore_eos:
        raise APIError(
            400, "ignore_eos cannot be combined with a forced tool call", param="ignore_eos"
        )
    try:
        compile_check(forced, model, limits)
    except StructuredError as err:
        raise APIError(400, f"the tools cannot be constrained: {err}", param="tools") from None
    return forced


def _check_function(function: FunctionDefinition, index: int) -> None:
    where = f"tools.{index}.function"
    if not NAME.fullmatch(function.name):
        raise APIError(
            400,
            f"{where}.name must be 1 to 64 letters, digits, underscores or dashes",
            param=f"{where}.name",
        )
    schema = function.parameters
    if schema is None:
        return
    if schema.get("type", "object") != "object":
        raise APIError(
            400,
            f"{where}.parameters must be the schema of an object (its `type` is `object`)",
            param=f"{where}.parameters",
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        raise APIError(
            400,
            f"{where}.parameters is not a valid JSON schema: {err.message[:MAX_REASON_CHARS]}",
            param=f"{where}.parameters",
        ) from None
