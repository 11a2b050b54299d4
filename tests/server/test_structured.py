"""Where a request says its structured-output constraint (server/structured.py): each of
OpenAI's and vLLM's fields becomes the same spec on chat and completions, `text` is none, two
at once are a 400, the bounds hold before anything walks the schema, and a spec that does not
compile, or a model whose tokenizer the engine cannot read, is a 400 naming the problem."""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from kvledger.config.frontend import Limits
from kvledger.structured import StructuredSpec
from protos import frontend_pb2
from server.chat_protocol import ChatCompletionRequest
from server.client import ServedModel
from server.errors import APIError
from server.protocol import CompletionRequest
from server.structured import check_structured, structured_spec
from server.token_bytes import byte_of_char

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
COMPACT = json.dumps(SCHEMA, separators=(",", ":"))


def completion(**fields) -> CompletionRequest:  # noqa: ANN003
    return CompletionRequest.model_validate({"model": "m", "prompt": "p", **fields})


def chat(**fields) -> ChatCompletionRequest:  # noqa: ANN003
    messages = [{"role": "user", "content": "hi"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})


@pytest.mark.parametrize(
    ("fields", "spec"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, StructuredSpec("json_object", "")),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },  # noqa: E501
            StructuredSpec("json", COMPACT),
        ),
        ({"structured_outputs": {"json": SCHEMA}}, StructuredSpec("json", COMPACT)),
        (
            {"structured_outputs": {"json": '{"type": "string"}'}},
            StructuredSpec("json", '{"type": "string"}'),
        ),  # noqa: E501
        ({"structured_outputs": {"regex": "[a-z]+"}}, StructuredSpec("regex", "[a-z]+")),
        ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredSpec("choice", '["a", "b"]')),
        (
            {"structured_outputs": {"grammar": 'start: "x"'}},
            StructuredSpec("grammar", 'start: "x"'),
        ),  # noqa: E501
        ({"structured_outputs": {"json_object": True}}, StructuredSpec("json_object", "")),
        ({"guided_json": SCHEMA}, StructuredSpec("json", COMPACT)),
        ({"guided_regex": "a|b"}, StructuredSpec("regex", "a|b")),
        ({"guided_choice": ["x"]}, StructuredSpec("choice", '["x"]')),
        ({"guided_grammar": 'start: "y"'}, StructuredSpec("grammar", 'start: "y"')),
    ],
)
def test_every_field_gives_the_same_spec_on_both_endpoints(fields, spec):
    assert structured_spec(completion(**fields)) == spec
    assert structured_spec(chat(**fields)) == spec


def refused(body, limits: Limits | None = None) -> APIError:  # noqa: ANN001
    limits = limits or Limits()
    with pytest.raises(APIError) as caught:
        structured_spec(body, limits)
    assert caught.value.status == 400
    return caught.value


def test_two_constraints_at_once_are_refused():
    err = refused(completion(guided_regex="a", response_format={"type": "json_object"}))
    assert "at most one" in err.message and err.param == "guided_regex"


def test_a_json_schema_format_needs_its_schema():
    err = refused(chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}))
    assert err.param == "response_format" and "schema" in err.message


def test_an_unknown_response_format_type_is_refused_by_validation():
    with pytest.raises(ValueError):
        chat(response_format={"type": "xml"})


def test_knobs_not_served_are_refused_by_name():
    err = refused(completion(structured_outputs={"regex": "a", "whitespace_pattern": " "}))
    assert "whitespace_pattern" in err.message


def test_bounds_hold_before_the_schema_is_walked():
    deep: dict = {"type": "object"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    assert "nests deeper" in refused(completion(guided_json=deep)).message
    long_regex = completion(guided_regex="a" * 70_000)
    assert "at most 65536" in refused(long_regex).message
    assert structured_spec(long_regex, Limits(max_structured_chars=80_000)) is not None


def served(tokenizer: Tokenizer, path: str, eos: int) -> ServedModel:
    """`path` keys the frontend's cache of engine tokenizers: one per test model."""
    info = frontend_pb2.ModelInfo(name="m", model_path=path, vocab_size=300)
    info.eos_token_ids.append(eos)
    return ServedModel(info, tokenizer)


@pytest.fixture(scope="module")
def byte_model() -> ServedModel:
    char = {b: c for c, b in byte_of_char().items()}
    tokenizer = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    return served(tokenizer, "/byte-level", 256)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"guided_regex": "a(b"}, "guided_regex", "regex"),
        ({"guided_json": {"type": "foo"}}, "guided_json", "foo"),
        ({"structured_outputs": {"json": "{"}}, "structured_outputs", "not valid JSON"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "undefined_rule"),
        ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos", "ignore_eos"),
    ],
)
def test_a_spec_that_does_not_compile_is_a_400_naming_it(byte_model, fields, param, words):
    body = completion(**fields)
    with pytest.raises(APIError) as caught:
        check_structured(body, structured_spec(body), byte_model)
    assert caught.value.status == 400 and caught.value.param == param
    assert words in caught.value.message


def test_a_good_spec_passes(byte_model):
    body = chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    check_structured(body, structured_spec(body), byte_model)


def test_a_wordpiece_model_refuses_every_constraint():
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    body = completion(guided_regex="a")
    with pytest.raises(APIError) as caught:
        check_structured(body, structured_spec(body), served(tokenizer, "/wordpiece", 0))
    assert "not available for this model" in caught.value.message
