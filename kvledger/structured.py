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

from kvledger.groups import GrammarLimits
from kvledger.structured_depth import lark_depth, schema_depth

JSON, JSON_OBJECT, REGEX, CHOICE, GRAMMAR = "json", "json_object", "regex", "choice", "grammar"
KINDS = (JSON, JSON_OBJECT, REGEX, CHOICE, GRAMMAR)
# How generated JSON is laid out (a schema's own `x-guidance` may say otherwise).
JSON_OPTIONS: llguidance.JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


# How a worker's error for a request whose constraint failed begins (a grammar refused while
# it ran: the engine's limits at a later mask, a compile that failed there): the client's spec,
# not the server, so the frontend answers a 400.
CONSTRAINT_FAILED = "structured output: "


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


DEFAULT_LIMITS = GrammarLimits()


@functools.lru_cache(maxsize=256)
def grammar_of(spec: StructuredSpec, max_depth: int = DEFAULT_LIMITS.max_structured_depth) -> str:
    """The llguidance grammar of a spec; StructuredError when the spec text is malformed (a
    schema that is no JSON, an empty choice list), goes deeper than `max_depth` through its
    references (structured_depth.py: measured before the engine, which recurses on it, sees
    it), or holds a value the engine cannot take (an integer past 64 bits). Whether the
    grammar compiles is `check`'s."""
    try:
        return _grammar_of(spec, max_depth)
    except (ValueError, TypeError, OverflowError) as err:
        if isinstance(err, StructuredError):
            raise
        raise StructuredError(
            f"{what_kind(spec.kind)} cannot be compiled: {_one_line(str(err))}"
        ) from None


def _grammar_of(spec: StructuredSpec, max_depth: int) -> str:
    check_depth(spec, max_depth)
    if spec.kind == JSON:
        schema = _json(spec.spec, "the JSON schema")
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


def check_depth(spec: StructuredSpec, max_depth: int) -> None:
    """StructuredError when the spec's text is malformed or it goes deeper than `max_depth`
    through its references (kvledger/structured_depth.py). Pure Python, no recursion: what a
    process that must not crash checks before it hands the spec to the engine."""
    if spec.kind == JSON:
        schema = _json(spec.spec, "the JSON schema")
        if not isinstance(schema, dict | bool):
            raise StructuredError("the JSON schema must be an object or a boolean")
        _bound(schema_depth(schema), max_depth, spec.kind, "objects and arrays, through $ref")
    elif spec.kind == GRAMMAR:
        depth = lark_depth(_lark(spec.spec))
        _bound(depth, max_depth, spec.kind, "rules, each rule it names followed")


def _bound(depth: int, max_depth: int, kind: str, counted: str) -> None:
    if depth > max_depth:
        raise StructuredError(
            f"{what_kind(kind)} goes {depth} levels deep ({counted}); at most {max_depth} are "
            "accepted (--max-structured-depth)"
        )


def engine_limits(limits: GrammarLimits = DEFAULT_LIMITS) -> llguidance.LLParserLimits:
    """The engine's resource limits from the settings; its diagnostics stay off stderr (a
    failure's message is the request's error, and may not echo the grammar)."""
    return llguidance.LLParserLimits(
        max_grammar_size=limits.grammar_max_size,
        initial_lexer_fuel=limits.grammar_initial_lexer_fuel,
        step_lexer_fuel=limits.grammar_step_lexer_fuel,
        step_max_items=limits.grammar_step_max_items,
        max_lexer_states=limits.grammar_max_lexer_states,
        verbose_errors=False,
    )


def compile_matcher(
    spec: StructuredSpec,
    tokenizer: llguidance.LLTokenizer,
    limits: GrammarLimits = DEFAULT_LIMITS,
) -> llguidance.LLMatcher:
    """A matcher for `spec` under the settings' limits; StructuredError naming the problem
    when the spec is refused, does not compile, or exceeds a limit."""
    grammar = grammar_of(spec, limits.max_structured_depth)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=engine_limits(limits))
    if matcher.is_error():
        raise StructuredError(
            what_kind(spec.kind) + " does not compile: " + engine_message(matcher.get_error())
        )
    return matcher


def check(
    spec: StructuredSpec,
    tokenizer: llguidance.LLTokenizer | None = None,
    limits: GrammarLimits = DEFAULT_LIMITS,
) -> None:
    """StructuredError naming the problem when the spec does not compile (against `tokenizer`
    when given, as the worker will compile it: then its first mask is computed too, the
    engine's limits applying, so a grammar whose first step exceeds them is refused here)."""
    if tokenizer is None:
        grammar = grammar_of(spec, limits.max_structured_depth)
        error = llguidance.LLMatcher.validate_grammar(grammar, None, limits=engine_limits(limits))
        if error:
            raise StructuredError(
                what_kind(spec.kind) + " does not compile: " + engine_message(error)
            )
        return
    matcher = compile_matcher(spec, tokenizer, limits)
    matcher.compute_bitmask()
    if matcher.is_error():
        raise StructuredError(
            what_kind(spec.kind) + " exceeds a limit: " + engine_message(matcher.get_error())
        )


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


def what_kind(kind: str) -> str:
    return {
        JSON: "the JSON schema",
        JSON_OBJECT: "the JSON object grammar",
        REGEX: "the regex",
        CHOICE: "the choices",
        GRAMMAR: "the grammar",
    }.get(kind, "the structured output spec")


def engine_message(text: str) -> str:
    """An error of the engine as one line, without its `<non-verbose/>` marker."""
    return _one_line(text.replace("<non-verbose/>", ""))


def _one_line(text: str, limit: int = 500) -> str:
    """llguidance's multi-line error (with a caret under the spot) as one short line."""
    line = " ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."
