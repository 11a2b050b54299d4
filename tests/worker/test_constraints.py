"""The sampler's grammar masks (worker/sample/constraints.py), on a small byte-level tokenizer and
random logits: every structured row samples only what its grammar allows, greedy and random
alike, while other rows of the batch sample as before; a finished grammar forces EOS (even
against min_tokens); a matcher rebuilt from a request's outputs is where the old one was; a
spec that does not compile fails its request with a message; a random walk through a JSON
schema's grammar always ends in JSON that validates; and the engine's tokenizer is built when
the worker starts (from a GGUF model's already parsed file), not by the first request."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
import torch

from kvledger.structured import StructuredError, StructuredSpec, choice_spec, json_schema_spec
from server.token_bytes import byte_of_char
from tests.worker.byte_tokenizer import EOS, VOCAB
from worker.runner.batch import SeqChunk
from worker.sample.constraints import Grammars, allowed
from worker.sample.sampler import Sampler
from worker.sample.sampling_params import SamplingParams

PROMPT = [1, 2, 3]


@pytest.fixture
def grammars(byte_tokenizer_dir) -> Grammars:
    return Grammars(str(byte_tokenizer_dir), VOCAB, [EOS])


def chunk(grammars: Grammars, spec: StructuredSpec | None, outputs: list[int], **kw) -> SeqChunk:  # noqa: ANN003
    tokens = PROMPT + outputs
    return SeqChunk(
        "r",
        tokens[-1:],
        len(tokens) - 1,
        [0],
        True,
        SamplingParams(**kw),
        tokens,
        len(PROMPT),
        constraint=grammars.constraint(spec) if spec else None,
    )


def sample(grammars: Grammars, logits: torch.Tensor, chunks: list[SeqChunk]) -> list:
    rows = [
        (i, c.constraint, c.all_token_ids[c.num_prompt_tokens :])
        for i, c in enumerate(chunks)
        if c.constraint is not None
    ]
    masks = grammars.start(rows).result() if rows else None
    return Sampler(0)(logits, chunks, masks)


def text(ids: list[int]) -> str:
    char = {b: c for c, b in byte_of_char().items()}
    pieces = {b: bytes([b]) for b in range(256)} | {256: b'":', 257: b'{"'}
    assert char  # the byte table is the tokenizer's
    return b"".join(pieces[i] for i in ids).decode()


def test_the_bitmask_unpacks_to_the_allowed_ids():
    mask = torch.tensor([[0b101, -(2**31), 1]], dtype=torch.int32)  # bit 31: the sign bit
    ok = allowed(mask, 70)
    assert ok.shape == (1, 70)
    assert ok[0].nonzero().flatten().tolist() == [0, 2, 63, 64]


def test_greedy_picks_the_best_allowed_token_and_other_rows_are_untouched(grammars):
    logits = torch.randn(3, VOCAB)
    logits[:, ord("z")] = 50.0  # the free favourite, which no grammar here allows
    chunks = [
        chunk(grammars, choice_spec(["yes", "no"]), []),
        chunk(grammars, None, []),
        chunk(grammars, StructuredSpec("regex", "[0-9]+"), []),
    ]
    out = [s.token_id for s in sample(grammars, logits, chunks)]
    assert out[0] == max((ord("y"), ord("n")), key=lambda t: logits[0, t])
    assert out[1] == ord("z")
    digits = range(ord("0"), ord("9") + 1)
    assert out[2] == max(digits, key=lambda t: logits[2, t])


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_random_rows_draw_only_allowed_tokens(grammars, temperature):
    logits = torch.randn(32, VOCAB) * 4
    spec = StructuredSpec("regex", "[a-c]{2}")
    chunks = [chunk(grammars, spec, [], temperature=temperature, seed=s) for s in range(32)]
    assert {s.token_id for s in sample(grammars, logits, chunks)} <= {97, 98, 99}


def test_a_finished_grammar_forces_eos_even_against_min_tokens(grammars):
    spec = choice_spec(["ab"])
    logits = torch.randn(2, VOCAB)
    chunks = [
        chunk(grammars, spec, [97, 98], temperature=1.0, seed=3),
        chunk(grammars, spec, [97, 98, EOS], min_tokens=9, min_tokens_masked=(EOS,)),
    ]
    assert [s.token_id for s in sample(grammars, logits, chunks)] == [EOS, EOS]


def test_a_rebuilt_matcher_replays_the_outputs(grammars):
    """A request placed again (preemption, a lost worker, a resumed stream) gets a fresh
    matcher with its outputs so far: it allows what the one that saw them one by one does."""
    spec = json_schema_spec({"type": "object", "properties": {"k": {"type": "integer"}}})
    outputs = [257, 107, 256, 32]  # {"k":␠
    walked = chunk(grammars, spec, [])
    for n in range(1, len(outputs) + 1):
        walked.all_token_ids = PROMPT + outputs[:n]
        grammars.compute([(0, walked.constraint, outputs[:n])])
    fresh = chunk(grammars, spec, outputs)
    a = grammars.compute([(0, walked.constraint, outputs)]).bitmask
    b = grammars.compute([(0, fresh.constraint, outputs)]).bitmask
    assert torch.equal(a, b)
    assert allowed(a, VOCAB)[0].nonzero().flatten().tolist() == [ord("-"), *range(48, 58)]


def test_a_token_the_grammar_refuses_fails_the_request_alone(grammars):
    chunks = [chunk(grammars, choice_spec(["ab"]), [ord("x")]), chunk(grammars, None, [])]
    out = sample(grammars, torch.randn(2, VOCAB), chunks)
    assert out[0].error is not None and "structured output" in out[0].error
    assert out[1].error is None


def test_a_spec_that_does_not_compile_fails_its_request_alone_by_name(grammars):
    """The compile runs on the compile thread; its failure is the request's error at its first
    mask, and the other rows of the batch sample as usual."""
    for spec, why in [
        (StructuredSpec("regex", "a(b"), "unclosed"),
        (StructuredSpec("json", "{"), "not valid JSON"),
        (json_schema_spec({"type": "string", "maxLength": 10**30}), "cannot be compiled"),
    ]:
        chunks = [chunk(grammars, spec, []), chunk(grammars, None, [])]
        out = sample(grammars, torch.randn(2, VOCAB), chunks)
        assert out[0].error is not None and why in out[0].error, out[0].error
        assert out[1].error is None


def test_grammars_compile_once_per_spec(grammars):
    spec = StructuredSpec("regex", "x+")
    grammars.constraint(spec)
    grammars.constraint(StructuredSpec("regex", "y+"))
    compiled = dict(grammars._compiled)
    grammars.constraint(spec)
    assert grammars._compiled[spec] is compiled[spec]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": -5, "maximum": 500},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b\\"]}, "maxItems": 3},
    },
    "required": ["name", "n", "ok", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(12))
def test_a_random_walk_through_a_schema_always_validates(grammars, seed):
    """Random logits stand in for a model: whatever it prefers, the output parses and
    validates, and the grammar ends it with EOS."""
    spec = json_schema_spec(SCHEMA)
    torch.manual_seed(seed)
    outputs: list[int] = []
    c = chunk(grammars, spec, [], temperature=1.0, seed=seed)
    for _ in range(200):
        c.all_token_ids = PROMPT + outputs
        c.start_pos = len(c.all_token_ids) - 1
        token = sample(grammars, torch.randn(1, VOCAB) * 3, [c])[0].token_id
        if token == EOS:
            break
        outputs.append(token)
    else:
        pytest.fail(f"no EOS after 200 tokens: {text(outputs)!r}")
    jsonschema.validate(json.loads(text(outputs)), SCHEMA)


def test_the_tokenizer_is_built_at_start_not_by_the_first_request(byte_tokenizer_dir, tmp_path):
    """`prepare` (called when the worker starts) builds the engine's tokenizer; a request
    after it builds nothing: here the files it was built from are gone by then."""
    source = tmp_path / "tok"
    source.mkdir()
    (source / "tokenizer.json").write_bytes((byte_tokenizer_dir / "tokenizer.json").read_bytes())
    grammars = Grammars(str(source), VOCAB, [EOS])
    assert grammars.prepare() is grammars.prepare()  # started once
    grammars.prepare().result(timeout=60)
    (source / "tokenizer.json").unlink()
    spec = choice_spec(["ab"])
    out = sample(grammars, torch.randn(1, VOCAB), [chunk(grammars, spec, [97])])
    assert out[0].token_id == 98


def test_a_gguf_worker_reports_the_grammar_engine_ready_at_start(tmp_path, caplog, kv_cache_dir):
    """A GGUF model's worker reports the grammar engine ready right after it starts, without
    any request; a request then builds nothing."""
    from gguf import GGMLQuantizationType

    from tests.worker.gguf_files import write_llama_gguf
    from tests.worker.helpers import make_runner

    path = write_llama_gguf(tmp_path, GGMLQuantizationType.F32)
    caplog.set_level("INFO", logger="worker.sample.constraints")
    runner = make_runner(path)
    deadline = time.monotonic() + 60
    while not any("ready" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.01)
    assert runner.grammars.prepare().done()
    constraint = runner.constraint(StructuredSpec("regex", "[0-9]+"))
    masks = runner.grammars.compute([(0, constraint, [])])
    assert allowed(masks.bitmask, runner.vocab_size)[0].any()


def test_a_parsed_gguf_file_gives_its_tokenizer_without_a_second_parse(
    tmp_path, monkeypatch, kv_cache_dir
):
    """The worker's checkpoint keeps the file's vocabulary from its one parse; the grammar
    engine's tokenizer is built from it (parsing a real vocabulary again takes seconds)."""
    from gguf import GGMLQuantizationType

    import kvledger.gguf_file
    import kvledger.gguf_tokenizer
    from kvledger.grammar_tokenizer import build_grammar_tokenizer
    from tests.worker.gguf_files import write_llama_gguf
    from worker.gguf import open_checkpoint

    path = write_llama_gguf(tmp_path, GGMLQuantizationType.F32)
    meta = open_checkpoint(path).tokenizer_metadata()
    assert len(meta["tokenizer.ggml.tokens"]) == 300

    def no_second_parse(_path):  # noqa: ANN001, ANN202
        raise AssertionError("the GGUF file was parsed again for its tokenizer")

    monkeypatch.setattr(kvledger.gguf_tokenizer, "open_reader", no_second_parse)
    monkeypatch.setattr(kvledger.gguf_file, "open_reader", no_second_parse)
    built = build_grammar_tokenizer(str(path), 300, (2,), gguf_metadata=meta)
    assert not isinstance(built, StructuredError), built
    assert build_grammar_tokenizer(str(path), 300, (2,)).__class__ is StructuredError


def test_a_tokenizer_the_engine_cannot_read_is_refused_at_start_and_per_request(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    grammars = Grammars(str(tmp_path), VOCAB, [EOS])
    assert isinstance(grammars.prepare().result(timeout=60), StructuredError)
    with pytest.raises(StructuredError, match="tokenizer cannot be loaded"):
        grammars.constraint(choice_spec(["a"]))
