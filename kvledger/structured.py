"""Structured outputs: what a request constrains its output to (`StructuredSpec`), and that
constraint as a grammar of the engine, llguidance (docs/structured-outputs.md).

The frontend turns a request's `response_format` / `structured_outputs` / `guided_*` field into
a spec and refuses one that does not compile (`check`); the worker compiles the same spec
again, against its own tokenizer, and masks every token the grammar does not allow before it
samples. Both sides read the spec through `grammar_of`, so they never disagree on what it means.

Kinds and their spec text:
- `json`: a JSON schema (text); `json_object`: any JSON object (spec "");
- `regex`: a regular expression (Rust `regex` syntax), matched by the whole output;
- `choice`: a JSON array of strings, the output being exactly one of them;
- `grammar`: a Lark grammar in llguidance's dialect (a GBNF grammar, with `::=` rules as
  llama.cpp writes them, is converted to Lark first).

JSON is generated compactly (`", "` and `": "` separators, no other whitespace): a model may
not pad an object with whitespace until max_tokens runs out.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import llguidance

JSON, JSON_OBJECT, REGEX, CHOICE, GRAMMAR = "json", "json_object", "regex", "choice", "grammar"
KINDS = (JSON, JSON_OBJECT, REGEX, CHOICE, GRAMMAR)
# How generated JSON is laid out (a schema's own `x-guidance` may say otherwise).
JSON_OPTIONS: llguidance.JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class StructuredError(ValueError):
    """A spec that cannot be served; the message names the problem (a 400 at the frontend, a
    failed request at the worker)."""


@dataclass(frozen=True)
class StructuredSpec:
    """A request's constraint: `kind` (one of KINDS) and its `spec` text (see the module)."""

    kind: str
    spec: str


def json_schema_spec(schema: Any) -> StructuredSpec:
    """A `json` spec from a parsed schema (dict or bool), as compact, key-ordered text."""
    return StructuredSpec(JSON, json.dumps(schema, ensure_ascii=False, separators=(",", ":")))


def choice_spec(choices: list[str]) -> StructuredSpec:
    return StructuredSpec(CHOICE, json.dumps(choices, ensure_ascii=False))


@functools.lru_cache(maxsize=256)
def grammar_of(spec: StructuredSpec) -> str:
    """The llguidance grammar of a spec; StructuredError when the spec text is malformed (a
    schema that is no JSON, an empty choice list). Whether the grammar compiles is `check`'s."""
    if spec.kind == JSON:
        schema = _json(spec.spec, "the JSON schema")
        if not isinstance(schema, dict | bool):
            raise StructuredError("the JSON schema must be an object or a boolean")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if spec.kind == JSON_OBJECT:
        return llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"}, defaults=JSON_OPTIONS
        )
    if spec.kind == REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec.spec)
    if spec.kind == CHOICE:
        return llguidance.LLMatcher.grammar_from_lark(_choice_lark(spec.spec))
    if spec.kind == GRAMMAR:
        return llguidance.LLMatcher.grammar_from_lark(_lark(spec.spec))
    raise StructuredError(f"unknown structured output kind {spec.kind!r} (one of {KINDS})")


def check(spec: StructuredSpec, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """StructuredError naming the problem when the spec does not compile (against `tokenizer`
    when given, as the worker will compile it)."""
    grammar = grammar_of(spec)
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise StructuredError(_what(spec.kind) + " does not compile: " + _one_line(error))


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise StructuredError(f"{what} is not valid JSON: {err}") from None


def _choice_lark(text: str) -> str:
    choices = _json(text, "the choices")
    if not isinstance(choices, list) or not choices:
        raise StructuredError("choice must be a non-empty list of strings")
    if not all(isinstance(c, str) and c for c in choices):
        raise StructuredError("each choice must be a non-empty string")
    # A Lark string literal takes JSON's escapes: each choice is matched as written.
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _lark(text: str) -> str:
    """Lark as given; a GBNF grammar (llama.cpp's `rule ::= ...`) converted to Lark."""
    if "::=" not in text:
        return text
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(text)
    except Exception as err:  # the converter's own parse errors, of several types
        raise StructuredError(f"the GBNF grammar does not parse: {_one_line(str(err))}") from None


def _what(kind: str) -> str:
    return {
        JSON: "the JSON schema",
        JSON_OBJECT: "the JSON object grammar",
        REGEX: "the regex",
        CHOICE: "the choices",
        GRAMMAR: "the grammar",
    }.get(kind, "the structured output spec")


def _one_line(text: str, limit: int = 500) -> str:
    """llguidance's multi-line error (with a caret under the spot) as one short line."""
    line = " ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."
