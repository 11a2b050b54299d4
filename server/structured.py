"""A request's structured-output constraint, read and checked before any model work.

Where a request may say it (chat and completions alike): OpenAI's `response_format`
(`json_object`, or `json_schema` with its `schema`; `text` is none), vLLM's
`structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and vLLM's older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`. More than one is a 400:
the output cannot follow two grammars.

The spec is bounded (`--max-structured-chars`; `--max-structured-depth`, first as written,
then through its `$ref`s or rules: kvledger/structured_depth.py), then compiled against the
model's tokenizer, as the worker will compile it, in a child process with a deadline
(server/grammar_sandbox.py): a schema, regex or grammar the engine refuses, that exceeds the
engine's limits or the deadline, or that crashes the engine is a 400 naming the problem, never
a request that fails on the worker or a frontend that dies. A model whose tokenizer the engine
cannot read (WordPiece) refuses every constraint with a 400.
"""

from __future__ import annotations

import threading

from kvledger.config.frontend import Limits
from kvledger.structured import (
    CHOICE,
    GRAMMAR,
    JSON,
    JSON_OBJECT,
    REGEX,
    StructuredError,
    StructuredSpec,
    check_depth,
    choice_spec,
    json_schema_spec,
)
from protos import frontend_pb2
from server.bounds import check_nested
from server.client import ServedModel
from server.errors import APIError
from server.grammar_sandbox import GrammarModel, sandbox
from server.protocol import SamplingRequest

DEFAULT_LIMITS = Limits()
JSON_OBJECT_GIVEN = ""  # the raw value of a constraint that carries none (json_object)


def structured_spec(
    body: SamplingRequest, limits: Limits = DEFAULT_LIMITS
) -> StructuredSpec | None:
    """The request's constraint, or None. A 400 when it gives more than one, a `json_schema`
    response format without its schema, a spec past the bounds, or a knob not served."""
    given = _sources(body)
    for param, _, raw in given:  # bounded before anything walks or serializes it
        # a scalar counts a level here, as a container does
        check_nested(
            raw, _field(param), limits.max_structured_chars, limits.max_structured_depth + 1
        )
    if len(given) > 1:
        names = ", ".join(param for param, _, _ in given)
        raise APIError(
            400,
            f"give at most one structured output constraint, not {len(given)} ({names})",
            param=_field(given[1][0]),
        )
    if not given:
        return None
    param, kind, raw = given[0]
    spec = _spec(kind, raw)
    if len(spec.spec) > limits.max_structured_chars:  # the text form, escapes and all
        raise APIError(
            400,
            f"{param} must hold at most {limits.max_structured_chars} characters",
            param=_field(param),
        )
    return spec


def check_structured(
    body: SamplingRequest, spec: StructuredSpec, model: ServedModel, limits: Limits = DEFAULT_LIMITS
) -> None:
    """The spec compiled against the model's tokenizer, as the worker will compile it, in the
    grammar sandbox (server/grammar_sandbox.py): a 400 naming the problem when it does not
    compile, exceeds a bound, or crashes the compiler (or when the model's tokenizer cannot be
    used)."""
    param = _field(_sources(body)[0][0])
    if body.ignore_eos:
        raise APIError(
            400, "ignore_eos cannot be combined with a structured output", param="ignore_eos"
        )
    try:
        compile_check(spec, model, limits)
    except StructuredError as err:
        raise APIError(400, str(err), param=param) from None


def compile_check(spec: StructuredSpec, model: ServedModel, limits: Limits) -> None:
    """StructuredError when `spec` cannot be served on `model` (the depth bound, checked here
    first, then the compile in the sandbox)."""
    check_depth(spec, limits.max_structured_depth)  # what needs no engine, checked here
    sandbox().check(spec, grammar_model(model), limits, limits.structured_compile_timeout)


def _field(param: str) -> str:
    """The body's top-level field of a source (`structured_outputs.regex` -> its parent)."""
    return param.split(".")[0]


def _sources(body: SamplingRequest) -> list[tuple[str, str, object]]:
    """(where, kind, raw value) of each constraint the request gives."""
    out: list[tuple[str, str, object]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        out.append(("response_format", JSON_OBJECT, JSON_OBJECT_GIVEN))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise APIError(
                400,
                "response_format json_schema needs `json_schema.schema`",
                param="response_format",
            )
        out.append(("response_format", JSON, fmt.json_schema.schema_))
    so = body.structured_outputs
    if so is not None:
        _refuse_extras(so.model_extra or {})
        out += [
            ("structured_outputs.json", JSON, so.json_),
            ("structured_outputs.regex", REGEX, so.regex),
            ("structured_outputs.choice", CHOICE, so.choice),
            ("structured_outputs.grammar", GRAMMAR, so.grammar),
            (
                "structured_outputs.json_object",
                JSON_OBJECT,
                JSON_OBJECT_GIVEN if so.json_object else None,
            ),
        ]
    out += [
        ("guided_json", JSON, body.guided_json),
        ("guided_regex", REGEX, body.guided_regex),
        ("guided_choice", CHOICE, body.guided_choice),
        ("guided_grammar", GRAMMAR, body.guided_grammar),
    ]
    return [(param, kind, raw) for param, kind, raw in out if raw is not None]


def _refuse_extras(extra: dict[str, object]) -> None:
    """vLLM's other structured_outputs knobs (whitespace_pattern, structural_tag, ...) are
    not served: set, they are a 400 naming them, never ignored."""
    for name, value in extra.items():
        if value is not None and value is not False:
            raise APIError(
                400,
                f"structured_outputs.{name} is not supported by this server",
                param="structured_outputs",
            )


def _spec(kind: str, raw: object) -> StructuredSpec:
    if kind == JSON:
        return StructuredSpec(JSON, raw) if isinstance(raw, str) else json_schema_spec(raw)
    if kind == CHOICE:
        return choice_spec(raw)  # type: ignore[arg-type]
    return StructuredSpec(kind, raw)  # type: ignore[arg-type]


_models: dict[tuple[str, int, tuple[int, ...]], GrammarModel] = {}
_lock = threading.Lock()


def grammar_model(model: ServedModel) -> GrammarModel:
    """What the sandbox compiles against for a model: its tokenizer's JSON, once per tokenizer."""
    info = model.info
    key = (info.tokenizer_path or info.model_path, info.vocab_size, tuple(info.eos_token_ids))
    with _lock:
        built = _models.get(key)
        if built is None:
            built = GrammarModel(
                "|".join(map(str, key)),
                model.tokenizer.to_str(),
                info.vocab_size,
                tuple(info.eos_token_ids),
            )
            _models[key] = built
    return built


def to_wire(spec: StructuredSpec) -> frontend_pb2.StructuredOutput:
    return frontend_pb2.StructuredOutput(kind=spec.kind, spec=spec.spec)
