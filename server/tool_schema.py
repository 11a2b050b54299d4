"""The schema a forced call's arguments are generated under: the function's `parameters`,
as an object, with every object schema in it that lists `properties` and says nothing of
`additionalProperties` closed to those properties (as OpenAI's strict mode closes them).

Why closed: open objects let a model go on adding keys of its own until max_tokens cuts the
JSON short (SmolLM2 did so after the two arguments it was asked for). Every closed object
still validates against the schema the client gave: the constraint only narrows it."""

from __future__ import annotations

from typing import Any

from server.tool_protocol import FunctionDefinition

# A function without parameters takes an empty object.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
# Where a schema holds schemas: one, a list of them, or a name -> schema mapping.
ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
LISTED = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
NAMED = ("properties", "$defs", "definitions", "patternProperties")


def arguments_schema(function: FunctionDefinition) -> dict[str, Any]:
    """The schema a call's arguments follow: always an object."""
    if not function.parameters:
        return NO_ARGUMENTS
    return closed({"type": "object", **function.parameters})


def closed(schema: Any) -> Any:
    """A copy of the schema with its listed-properties objects closed (see the module). The
    depth is bounded before (server/tools.py), so the recursion is too."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in LISTED:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in NAMED:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    says = "additionalProperties" in out or "patternProperties" in out
    if isinstance(out.get("properties"), dict) and not says:
        out["additionalProperties"] = False
    return out
