"""OpenAI request bodies. Fields no schema defines are accepted and ignored, as OpenAI's
clients expect; OpenAI's and vLLM's that this server does not implement are refused by name
(NOT_IMPLEMENTED, NOT_IMPLEMENTED_UNLESS; every field's decision: docs/api.md).

`SamplingRequest` holds what completions and chat share; each endpoint adds its own fields."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvledger.rpc import MAX_LOGPROBS

INT32_MAX = 2**31 - 1
# strict: JSON true/false or 1.5 are not token ids (lax mode read true as 1)
TokenId = Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)]
# Every request body validates strictly: a JSON value of the wrong type ("0.5", false, 1.0 for
# an integer) is a 400, as the published schema says, never coerced. Fields no schema
# defines are accepted and ignored, as OpenAI's clients expect.
REQUEST_CONFIG = ConfigDict(extra="allow", strict=True)
Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]
LOGIT_BIAS_LIMIT = 100.0
# vLLM's and OpenAI's parameters this server does not implement: set to anything but null,
# false or empty, a 400 names them (server/sampling.py), never a reply that ignores them.
# Structured outputs are served (server/structured.py); these knobs of vLLM's are not.
NOT_IMPLEMENTED = (
    "guided_whitespace_pattern",
    "guided_decoding_backend",
    "use_beam_search",
    "prompt_logprobs",
    "logits_processors",
    "allowed_token_ids",
    "bad_words",
    "truncate_prompt_tokens",
    "return_tokens_as_token_ids",
    "prediction",
)
# OpenAI's parameters this server does not implement, each with the values that ask for
# nothing it lacks: those are accepted, any other is a 400 naming the parameter
# (server/sampling.py). `web_search_options: {}` asks for a search with the defaults, so only
# null is a no-op there; `in_memory` is the only retention this server's prefix cache has.
NOT_IMPLEMENTED_UNLESS: dict[str, tuple[object, ...]] = {
    "reasoning_effort": (None, "none"),  # no served model reasons
    "service_tier": (None, "auto", "default"),  # one tier: this server's
    "verbosity": (None,),
    "modalities": (None, ["text"]),  # text out only: audio output is not served
    "store": (None, False),  # nothing is stored: no API reads a completion back
    "web_search_options": (None,),
    "moderation": (None,),
    "prompt_cache_retention": (None, "in_memory"),
    "prompt_cache_options": (None, {}, {"mode": "implicit"}),
}
# OpenAI's metadata-like parameters (`user`, `metadata`, `safety_identifier`,
# `prompt_cache_key`) are accepted and have no effect (docs/api.md): the prefix cache is
# shared by prompt (and tenant), not by a client's key.


def _unicode_text(value: object) -> object:
    """JSON can escape a lone UTF-16 surrogate (`"\\ud800"`); a string holding one is not text:
    it cannot be tokenized, hashed, or written back in a response."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


def text_fields(*names: str) -> Any:
    """A validator for a model's fields that carry text the server reads."""
    return field_validator(*names)(_unicode_text)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class StreamOptions(BaseModel):
    """`include_obfuscation` (OpenAI's padding of stream events against size side channels)
    is not implemented: only false is accepted, never a stream that silently lacks it."""

    model_config = REQUEST_CONFIG
    include_usage: bool = False
    include_obfuscation: bool = False

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream obfuscation is not supported by this server")
        return value


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema the output must validate against.
    `strict` is accepted either way: the output is constrained to the schema in both."""

    model_config = REQUEST_CONFIG
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free `text`, any `json_object`, or a `json_schema`."""

    model_config = REQUEST_CONFIG
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one constraint of these (server/structured.py)."""

    model_config = REQUEST_CONFIG
    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    _check_text = text_fields("json_", "regex", "choice", "grammar")


class SamplingRequest(BaseModel):
    """The fields every generating endpoint takes, with OpenAI's defaults and vLLM's extras."""

    model_config = REQUEST_CONFIG

    model: str
    temperature: float | None = Field(1.0, ge=0.0, le=2.0)
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=INT32_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (as a string) -> bias from -100 to 100, added to its logit"
    )
    user: str | None = None
    # widely used extras
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    # lower is served first; anything but 0 needs --scheduling-policy priority (else a 400)
    priority: int = Field(0, ge=-INT32_MAX, le=INT32_MAX)
    # a stop string ends the text rather than being cut off (vLLM's)
    include_stop_str_in_output: bool = False
    # only None or n: this server returns every sample it generates
    best_of: int | None = Field(None, ge=1, le=INT32_MAX)
    # Structured outputs (constrained decoding): at most one of these (server/structured.py).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    _check_finite = field_validator(
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "min_p",
        "repetition_penalty",
    )(_finite)
    _check_text = text_fields(
        "model", "stop", "cache_salt", "guided_regex", "guided_choice", "guided_grammar"
    )

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isascii() or not key.isdigit() or int(key) > INT32_MAX:
                raise ValueError(f"keys must be token ids (as strings), not {key!r}")
            if not math.isfinite(bias) or abs(bias) > LOGIT_BIAS_LIMIT:
                raise ValueError(f"values must be from -100 to 100, not {bias}")
        return value

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0, le=INT32_MAX)  # 0: with echo, the prompt alone
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    add_special_tokens: bool = True
    # OpenAI's, not implemented here: refused with a 400 naming it unless left at its no-op
    # value (None or ""), never silently ignored
    suffix: str | None = None

    _check_prompt = text_fields("prompt")

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (text insertion) is not supported by this server")
        return value


class EmbeddingRequest(BaseModel):
    model_config = REQUEST_CONFIG

    model: str
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX)
    user: str | None = None

    _check_text = text_fields("model", "input")


class DetokenizeRequest(BaseModel):
    """`model` may be left out when one generative model is served (server/deps.py)."""

    model_config = REQUEST_CONFIG
    model: str | None = None
    tokens: list[TokenId]

    _check_text = text_fields("model")
