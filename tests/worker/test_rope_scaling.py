"""Length-dependent RoPE types, `dynamic` (dynamic NTK) and `longrope` (Phi-3 style).

transformers changes their frequencies once a forward pass reaches past a threshold and keeps
the keys it cached with the old ones, so the KV of a block depends on how it was computed; a
paged prefix cache cannot reproduce that (see worker/layers/rotary.py). The worker serves them
up to the threshold, where they equal transformers over any split of the work, and refuses a
longer max_model_len. These tests pin both halves, and the formulas against transformers'.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.helpers import (
    ATOL,
    full_logits,
    greedy,
    hf_greedy,
    hf_logits,
    hf_model,
    logits_for,
    make_runner,
    random_tokens,
    save_hf_model,
)
from worker.config import ModelConfig, RopeConfig, UnsupportedModelError
from worker.layers.rotary import (
    RotaryEmbedding,
    dynamic_ntk_inv_freq,
    longrope_inv_freq,
    max_exact_positions,
)
from worker.runner.batch import SeqChunk

HEAD_DIM = 16  # SMALL: hidden 64 over 4 heads
DYNAMIC = dict(max_position_embeddings=64, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
SHORT = [1.0 + 0.15 * i for i in range(HEAD_DIM // 2)]
LONG = [2.0 + 1.5 * i for i in range(HEAD_DIM // 2)]


def longrope(**extra: float) -> dict:
    """Phi-3 style: max_position_embeddings is the extended length, 4x the original 64."""
    return dict(
        max_position_embeddings=256,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": 64,
            **extra,
        },
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Path] = {}

    def get(kind: str, name: str, overrides: dict) -> Path:
        key = f"{kind}-{name}"
        if key not in made:
            made[key] = save_hf_model(tmp_path_factory.mktemp(key), kind, overrides, seed=5)
        return made[key]

    return get


# ---- dynamic ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_dynamic_matches_transformers_up_to_max_position_embeddings(checkpoints, kind: str) -> None:
    path = checkpoints(kind, "dynamic", DYNAMIC)
    runner = make_runner(path, num_blocks=8)
    assert runner.max_model_len == 64
    hf = hf_model(path)
    for length in (20, 64):  # a short prompt, and one that fills the whole context
        tokens = random_tokens(length, 256, seed=length)
        torch.testing.assert_close(
            full_logits(runner, tokens), hf_logits(hf, tokens), atol=ATOL, rtol=0
        )


def test_dynamic_greedy_generation_to_the_end_of_the_context(checkpoints) -> None:
    path = checkpoints("llama", "dynamic", DYNAMIC)
    prompt = random_tokens(9, 256, seed=3)
    runner = make_runner(path, num_blocks=8, block_size=8)
    assert greedy(runner, prompt, 55) == hf_greedy(hf_model(path), prompt, 55)  # 64 tokens


def test_dynamic_refuses_a_longer_context(checkpoints) -> None:
    path = checkpoints("llama", "dynamic", DYNAMIC)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        make_runner(path, max_model_len=65)
    rope = ModelConfig.from_dir(path).rope
    assert max_exact_positions(rope) == 64
    with pytest.raises(UnsupportedModelError, match="--max-model-len 64 or less"):
        RotaryEmbedding(HEAD_DIM, 65, rope, torch.float32)


def test_why_transformers_dynamic_cannot_share_cached_blocks(checkpoints) -> None:
    """Past max_position_embeddings, transformers' logits at a position depend on how long the
    pass was: the same 16-token block computed inside a 70- and a 200-token prefill differs
    (by more than the parity tolerance), so a block's KV is no function of its tokens, which
    is what a prefix cache keys on."""
    hf = hf_model(checkpoints("llama", "dynamic", DYNAMIC))
    tokens = random_tokens(200, 256, seed=7)
    at_64 = hf_logits(hf, tokens[:64])[:16]
    torch.testing.assert_close(hf_logits(hf, tokens[:40])[:16], at_64, atol=1e-5, rtol=0)
    at_70, at_200 = hf_logits(hf, tokens[:70])[:16], hf_logits(hf, tokens[:200])[:16]
    assert (at_70 - at_64).abs().max() > ATOL and (at_200 - at_70).abs().max() > 10 * ATOL


# ---- longrope -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("llama", {}),  # factor from 256 / 64, attention scaling from it
        ("qwen2", {}),
        ("mistral", {"factor": 2.0, "attention_factor": 1.3}),
    ],
)
def test_longrope_matches_transformers_up_to_the_original_length(
    checkpoints, kind: str, extra: dict
) -> None:
    path = checkpoints(kind, f"longrope{sorted(extra.items())}", longrope(**extra))
    runner = make_runner(path, num_blocks=8, max_model_len=64)
    hf = hf_model(path)
    for length in (20, 64):
        tokens = random_tokens(length, 256, seed=length + 1)
        torch.testing.assert_close(
            full_logits(runner, tokens), hf_logits(hf, tokens), atol=ATOL, rtol=0
        )


def test_longrope_over_the_paged_cache(checkpoints) -> None:
    """A chunked prefill, then a second request hitting the first one's blocks, then decode:
    every piece equals transformers' single pass over the whole sequence."""
    path = checkpoints("llama", "longrope[]", longrope())
    runner = make_runner(path, num_blocks=16, block_size=16, max_model_len=64)
    hf = hf_model(path)
    tokens = random_tokens(64, 256, seed=9)
    expected = hf_logits(hf, tokens)
    table = [3, 7, 1, 5]
    start = 0
    for size in (13, 19, 32):
        got = logits_for(
            runner,
            [SeqChunk("a", tokens[start : start + size], start, table, True)],
            all_tokens=True,
        )
        torch.testing.assert_close(got, expected[start : start + size], atol=ATOL, rtol=0)
        start += size
    other = tokens[:32] + random_tokens(20, 256, seed=10)
    got = logits_for(runner, [SeqChunk("b", other[32:], 32, [3, 7, 9, 11], True)], all_tokens=True)
    torch.testing.assert_close(got, hf_logits(hf, other)[32:], atol=ATOL, rtol=0)
    prompt = random_tokens(9, 256, seed=11)
    assert greedy(runner, prompt, 55) == hf_greedy(hf, prompt, 55)


def test_longrope_refuses_past_the_original_length(checkpoints) -> None:
    path = checkpoints("llama", "longrope[]", longrope())
    with pytest.raises(UnsupportedModelError, match="past 64 positions.*--max-model-len 64"):
        make_runner(path)  # the default max_model_len is max_position_embeddings, 256


# ---- the formulas, on both sides of the threshold -----------------------------------------


def _hf_config(kind: str, overrides: dict):
    from tests.worker.helpers import SMALL, _hf_classes

    config_cls, _ = _hf_classes(kind)
    return config_cls(**{**SMALL, **overrides})


@pytest.mark.parametrize("seq_len", [None, 10, 64, 65, 100, 1000])
def test_dynamic_formula_equals_transformers(seq_len: int | None) -> None:
    from transformers.modeling_rope_utils import _compute_dynamic_ntk_parameters

    config = _hf_config("llama", DYNAMIC)
    expected, scale = _compute_dynamic_ntk_parameters(config, seq_len=seq_len)
    rope = ModelConfig.from_dict(config.to_dict() | {"architectures": ["LlamaForCausalLM"]}).rope
    ours = dynamic_ntk_inv_freq(HEAD_DIM, rope.theta, rope.params, seq_len)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert scale == 1.0


@pytest.mark.parametrize("extra", [{}, {"factor": 2.0}, {"attention_factor": 0.9}])
@pytest.mark.parametrize("seq_len", [None, 64, 65, 256])
def test_longrope_formula_equals_transformers(extra: dict, seq_len: int | None) -> None:
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    config = _hf_config("llama", longrope(**extra))
    expected, expected_scale = _compute_longrope_parameters(config, seq_len=seq_len)
    rope = ModelConfig.from_dict(config.to_dict() | {"architectures": ["LlamaForCausalLM"]}).rope
    ours, scale = longrope_inv_freq(HEAD_DIM, rope.theta, rope.params, seq_len)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert scale == pytest.approx(expected_scale, rel=1e-12)


def test_other_types_have_no_length_limit() -> None:
    assert max_exact_positions(RopeConfig()) is None
    assert max_exact_positions(RopeConfig(type="yarn", params={"factor": 4.0})) is None
