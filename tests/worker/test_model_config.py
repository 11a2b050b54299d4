"""ModelConfig reads Llama/Mistral/Qwen2 config.json in both RoPE spellings, refuses the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.config import EncoderConfig, ModelConfig, UnsupportedModelError, is_encoder

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "eos_token_id": 2,
}


def cfg(**overrides) -> ModelConfig:
    return ModelConfig.from_dict({**BASE, **overrides})


def test_llama_defaults() -> None:
    c = cfg()
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (8, 2, 8)
    assert c.rope.type == "default" and c.rope.theta == 10000.0
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias or c.tie_word_embeddings)
    assert c.eos_token_ids == (2,)
    assert cfg(head_dim=32).head_dim == 32
    assert cfg(num_key_value_heads=None).num_kv_heads == 8


LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "spelling",
    [
        {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},
        {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3}},
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}},
    ],
)
def test_rope_both_spellings(spelling: dict) -> None:
    rope = cfg(**spelling).rope
    assert (rope.type, rope.theta) == ("llama3", 500000.0)
    assert rope.params == LLAMA3


def test_length_dependent_rope_types_keep_their_thresholds() -> None:
    dynamic = cfg(rope_scaling={"rope_type": "dynamic", "factor": 2.0}).rope
    assert dynamic.params == {"factor": 2.0, "max_position_embeddings": 512}
    factors = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    longrope = cfg(
        rope_scaling={"rope_type": "longrope", **factors, "original_max_position_embeddings": 128}
    ).rope
    assert longrope.params["original_max_position_embeddings"] == 128
    assert longrope.params["max_position_embeddings"] == 512
    # Phi-3 writes the original length at the top level; like transformers, it wins
    phi3 = cfg(
        original_max_position_embeddings=64,
        rope_scaling={"rope_type": "longrope", **factors, "original_max_position_embeddings": 128},
    ).rope
    assert phi3.params["original_max_position_embeddings"] == 64


def test_rope_parameters_default_type() -> None:
    rope = cfg(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}).rope
    assert (rope.type, rope.theta, rope.params) == ("default", 1e6, {})


def test_llama3_original_length_defaults_to_max_positions() -> None:
    params = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    rope = cfg(rope_scaling={"rope_type": "llama3", **params}).rope
    assert rope.params["original_max_position_embeddings"] == 512


def test_biases() -> None:
    qwen = cfg(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    assert qwen.qkv_bias and not qwen.o_bias
    llama = cfg(attention_bias=True, mlp_bias=True)
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias


def test_sliding_window() -> None:
    assert cfg(architectures=["MistralForCausalLM"], sliding_window=4096).sliding_window == 4096
    assert cfg(architectures=["MistralForCausalLM"], sliding_window=None).sliding_window is None
    qwen = dict(architectures=["Qwen2ForCausalLM"], sliding_window=4096)
    assert cfg(**qwen, use_sliding_window=False).sliding_window is None
    with pytest.raises(UnsupportedModelError, match="sliding"):
        cfg(**qwen, use_sliding_window=True)


def test_eos_ids_from_list_and_generation_config(tmp_path: Path) -> None:
    assert cfg(eos_token_id=[128001, 128009]).eos_token_ids == (128001, 128009)
    assert cfg(eos_token_id=None).eos_token_ids == ()
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, "BertModel is an encoder"),
        ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture GPT2LMHeadModel"),
        ({"architectures": []}, "model_type 'llama'"),
        ({"hidden_act": "gelu"}, "activation"),
        (
            {"rope_scaling": {"rope_type": "proportional", "factor": 2.0}},
            "RoPE type 'proportional'",
        ),
        ({"rope_scaling": {"rope_type": "dynamic"}}, "'dynamic' needs a factor"),
        (
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 4,
                    "long_factor": [2.0] * 3,
                }
            },
            "long_factor of 4 values",
        ),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"partial_rotary_factor": 0.5}, "partial"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial"),
    ],
)
def test_refuses_clearly(overrides: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        cfg(**overrides)


BERT = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "vocab_size": 100,
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "hidden_act": "gelu",
}


def test_encoder_config_and_kind(tmp_path: Path) -> None:
    enc = EncoderConfig.from_dict(BERT, max_seq_length=32)
    assert (enc.head_dim, enc.layer_norm_eps, enc.type_vocab_size) == (12, 1e-12, 2)
    assert enc.max_seq_length == 32
    (tmp_path / "config.json").write_text(json.dumps(BERT))
    assert is_encoder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert not is_encoder(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "is a decoder"),
        ({"hidden_act": "swish"}, "activation 'swish'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"num_attention_heads": 5}, "multiple of 5"),
    ],
)
def test_encoder_refuses_clearly(overrides: dict, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        EncoderConfig.from_dict({**BERT, **overrides})
