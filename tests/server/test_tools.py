"""A request's tools and tool_choice: what is refused (with the parameter named), and the
constraint a forced call gets: its schema accepts exactly the calls whose arguments validate
against the function's parameters."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvledger.config.frontend import Limits
from server.errors import APIError
from server.tool_protocol import NamedToolChoice, ToolDefinition
from server.tool_schema import NO_ARGUMENTS, closed
from server.tools import tool_plan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# a schema nested past server/tools.py's MAX_SCHEMA_DEPTH
DEEP: dict = {"type": "object"}
for _ in range(40):
    DEEP = {"type": "object", "properties": {"a": DEEP}}
NOW = {"type": "function", "function": {"name": "now", "description": "the time"}}


def plan(tools, choice=None, parallel=None, limits=None):  # noqa: ANN001, ANN201
    tools = None if tools is None else [ToolDefinition(**t) for t in tools]
    if isinstance(choice, dict):
        choice = NamedToolChoice(**choice)
    return tool_plan(tools, choice, parallel, limits or Limits())


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def with_function(**function) -> dict:  # noqa: ANN003
    return {"type": "function", "function": {"name": "f", **function}}


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (None, "auto", "tool_choice"),
        (None, "required", "tool_choice"),
        (None, named("f"), "tool_choice"),
        ([WEATHER], named("unknown"), "tool_choice"),
        ([with_function(name="has space")], None, "tools.0.function.name"),
        ([with_function(name="x" * 65)], None, "tools.0.function.name"),
        ([with_function(name="")], None, "tools.0.function.name"),
        ([WEATHER, WEATHER], None, "tools"),
        ([with_function(parameters={"type": "string"})], None, "tools.0.function.parameters"),
        ([with_function(parameters={"type": "object", "properties": 3})], None,
         "tools.0.function.parameters"),
        ([with_function(parameters={"type": "object", "required": "city"})], None,
         "tools.0.function.parameters"),
        ([NOW] * 129, None, "tools"),
        ([with_function(description="d" * 70000)], None, "tools"),
        ([with_function(parameters=DEEP)], None, "tools"),
    ],
)  # fmt: skip
def test_refused_with_the_parameter_named(tools, choice, param):
    with pytest.raises(APIError) as refused:
        plan(tools, choice)
    assert refused.value.status == 400 and refused.value.param == param


def test_defaults_and_none():
    assert plan(None) is None and plan(None, "none") is None and plan([]) is None
    assert plan([WEATHER]).choice == "auto"
    off = plan([WEATHER], "none")
    assert off.choice == "none" and off.offered == () and off.structured() is None
    assert plan([WEATHER], "auto").structured() is None


def test_the_bounds_are_the_flags():
    small = Limits(max_tools=1, max_tools_chars=100)
    with pytest.raises(APIError, match="at most 1 tools"):
        plan([WEATHER, NOW], limits=small)
    with pytest.raises(APIError, match="at most 100 characters"):
        plan([WEATHER], limits=small)
    assert plan([NOW], limits=small).names == {"now"}


def test_a_named_functions_schema_is_its_arguments():
    spec = plan([WEATHER, NOW], named("get_weather")).structured()
    assert spec.kind == "json"
    schema = json.loads(spec.spec)
    jsonschema.validate({"city": "Paris", "days": 2}, schema)
    for bad in ({}, {"city": 1}, {"city": "Paris", "days": 0}, {"city": "P", "x": 1}, []):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert json.loads(plan([NOW], named("now")).structured().spec) == NO_ARGUMENTS


def test_required_is_an_array_of_calls_over_the_tools():
    schema = json.loads(plan([WEATHER, NOW], "required").structured().spec)
    good = [{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "P"}}]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "now"}],
        [{"name": "get_weather", "arguments": {}}],
        [{"name": "other", "arguments": {}}],
        [{"name": "now", "arguments": {"x": 1}}],
        {"name": "now", "arguments": {}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = json.loads(plan([WEATHER, NOW], "required", parallel=False).structured().spec)
    jsonschema.validate(good[:1], one)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, one)


def test_listed_properties_are_closed_unless_the_schema_says_otherwise():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {}}},
            "b": {"type": "array", "items": {"properties": {"y": {}}}},
            "c": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]},
            "d": {"type": "object", "properties": {}, "additionalProperties": True},
            "properties": {"type": "object", "patternProperties": {"^p": {}}, "properties": {}},
        },
        "$defs": {"e": {"properties": {"w": {}}}},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    props = out["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["b"]["items"]["additionalProperties"] is False
    assert props["c"]["anyOf"][0]["additionalProperties"] is False
    assert props["d"]["additionalProperties"] is True
    assert "additionalProperties" not in props["properties"]
    assert out["$defs"]["e"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # a copy
