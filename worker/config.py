"""ModelConfig / EncoderConfig: what the worker needs from a Hugging Face `config.json`.

Parsing fails with a clear message before any memory is taken: an unsupported architecture,
activation or RoPE type never reaches weight loading.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvledger.gguf_file import is_gguf

DECODER_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# BERT with a pretraining head (its `bert.` encoder, the heads ignored), or a cross-encoder
CROSS_ENCODER = "BertForSequenceClassification"
ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining", CROSS_ENCODER)
ENCODER_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# Types whose frequencies change with the sequence length: served only up to the length where
# they still equal the unscaled ones (see worker/layers/rotary.py, `max_exact_positions`).
LENGTH_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")


class UnsupportedModelError(ValueError):
    pass


# The numbers a config may hold (key: least, greatest, integer?, default when absent): each is
# checked before use, so a NaN RoPE base or a negative layer count stops startup by name
# rather than serving garbage or failing deep in a tensor op.
Bounds = dict[str, tuple[float, float, bool]]
_SIZES: Bounds = {
    "vocab_size": (1, 1 << 22, True),
    "hidden_size": (1, 1 << 16, True),
    "intermediate_size": (1, 1 << 20, True),
    "num_hidden_layers": (1, 1024, True),
    "num_attention_heads": (1, 1024, True),
    "max_position_embeddings": (1, 1 << 24, True),
}
DECODER_NUMBERS: Bounds = {
    **_SIZES,
    "num_key_value_heads": (1, 1024, True),
    "head_dim": (1, 1024, True),
    "rms_norm_eps": (0.0, 0.1, False),
    "sliding_window": (1, 1 << 24, True),
}
ENCODER_NUMBERS: Bounds = {
    **_SIZES,
    "layer_norm_eps": (0.0, 0.1, False),
    "type_vocab_size": (1, 1 << 16, True),
}


def _check_numbers(c: dict[str, Any], bounds: Bounds) -> None:
    """Each present (not null) value of `bounds` is a finite number in its range, an integer
    where one is needed; the first that is not is named."""
    for key, (low, high, integer) in bounds.items():
        value = c.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UnsupportedModelError(f"config {key} = {value!r} is not a number")
        if integer and math.isfinite(value) and value != int(value):
            raise UnsupportedModelError(f"config {key} = {value!r} is not an integer")
        _in_range(key, value, low, high, open_low=not integer)


def _in_range(name: str, value: float, low: float, high: float, open_low: bool = False) -> None:
    above = value > low if open_low else value >= low
    if not (math.isfinite(value) and above and value <= high):
        side = "(" if open_low else "["
        raise UnsupportedModelError(
            f"config {name} = {value!r} is out of range: a finite number in {side}{low:g}, "
            f"{high:g}] is needed"
        )


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"
    # scaling parameters of the type (factor, low_freq_factor, original_max_position_embeddings…)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        config = read_config(model_dir)
        gen_path = Path(model_dir) / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        return cls.from_dict(config, generation)

    @classmethod
    def from_dict(cls, c: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        arch = _architecture(c)
        if arch not in DECODER_ARCHITECTURES:
            raise UnsupportedModelError(f"{arch} is an encoder, not a decoder")
        if c.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"{arch}: activation {c['hidden_act']!r} is not supported (only silu)"
            )
        _check_numbers(c, DECODER_NUMBERS)
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise UnsupportedModelError(
                f"{heads} attention heads are not a multiple of {kv_heads} KV heads"
            )
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = bool(c.get("attention_bias", False))
        return cls(
            architecture=arch,
            model_type=str(c.get("model_type", "")),
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            rope=parse_rope(c),
            # Qwen2 always biases q/k/v and never o; Llama's attention_bias covers all four.
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(c.get("mlp_bias", False)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            sliding_window=_sliding_window(c, arch),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=_eos_ids(c, generation or {}),
            torch_dtype=c.get("torch_dtype") or c.get("dtype"),
        )


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT-family encoder: post-LayerNorm, learned absolute positions, no KV cache."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    hidden_act: str
    torch_dtype: str | None = None
    # sentence-transformers' max_seq_length, when the directory carries one
    max_seq_length: int | None = None
    num_labels: int = 0  # a cross-encoder's classifier outputs (transformers': id2label's size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dir(cls, model_dir: Path) -> EncoderConfig:
        st_path = Path(model_dir) / "sentence_bert_config.json"
        st = json.loads(st_path.read_text()) if st_path.is_file() else {}
        return cls.from_dict(read_config(model_dir), st.get("max_seq_length"))

    @classmethod
    def from_dict(cls, c: dict[str, Any], max_seq_length: int | None = None) -> EncoderConfig:
        arch = _architecture(c)
        if arch not in ENCODER_ARCHITECTURES:
            raise UnsupportedModelError(f"{arch} is a decoder, not an encoder")
        act = c.get("hidden_act", "gelu")
        if act not in ENCODER_ACTIVATIONS:
            raise UnsupportedModelError(
                f"{arch}: activation {act!r} is not supported ({', '.join(ENCODER_ACTIVATIONS)})"
            )
        position_type = c.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise UnsupportedModelError(
                f"{arch}: position_embedding_type {position_type!r} is "
                "not supported (only absolute)"
            )
        _check_numbers(c, ENCODER_NUMBERS)
        heads = int(c["num_attention_heads"])
        if int(c["hidden_size"]) % heads:
            raise UnsupportedModelError(
                f"hidden_size {c['hidden_size']} is not a multiple of {heads} attention heads"
            )
        return cls(
            architecture=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            layer_norm_eps=float(c.get("layer_norm_eps", 1e-12)),
            max_position_embeddings=int(c.get("max_position_embeddings", 512)),
            type_vocab_size=int(c.get("type_vocab_size", 2)),
            hidden_act=act,
            torch_dtype=c.get("torch_dtype") or c.get("dtype"),
            max_seq_length=int(max_seq_length) if max_seq_length else None,
            num_labels=len(c.get("id2label") or {}) or int(c.get("num_labels", 2))
            if arch == CROSS_ENCODER
            else 0,
        )


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json, or for a GGUF file the same fields from its metadata (worker/gguf/)."""
    if is_gguf(model_dir):
        from worker.gguf.checkpoint import open_checkpoint  # needs the gguf package

        return open_checkpoint(model_dir).hf_config
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    return json.loads(path.read_text())


def is_encoder(model_dir: Path) -> bool:
    """True for a BERT-family encoder (embeddings only), False for a decoder; refuses the rest."""
    return _architecture(read_config(model_dir)) in ENCODER_ARCHITECTURES


def _architecture(c: dict[str, Any]) -> str:
    archs = c.get("architectures") or []
    for arch in archs:
        if arch in DECODER_ARCHITECTURES or arch in ENCODER_ARCHITECTURES:
            return arch
    found = ", ".join(archs) or f"model_type {c.get('model_type')!r}"
    raise UnsupportedModelError(
        f"unsupported architecture {found}; this worker runs "
        f"{', '.join(DECODER_ARCHITECTURES + ENCODER_ARCHITECTURES)}"
    )


def parse_rope(c: dict[str, Any]) -> RopeConfig:
    """Both spellings: transformers 5 `rope_parameters`, and `rope_theta` + `rope_scaling`."""
    scaling = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in scaling.values()):
        raise UnsupportedModelError("per-layer-type RoPE parameters are not supported")
    theta = float(scaling.get("rope_theta") or c.get("rope_theta") or 10000.0)
    _in_range("rope_theta", theta, 1.0, 1e12)
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} is not supported ({', '.join(ROPE_TYPES)})"
        )
    params = {k: v for k, v in scaling.items() if k not in ("rope_theta", "rope_type", "type")}
    if rope_type in ("llama3", "yarn", "longrope"):
        # transformers' standardize_rope_params: a top-level original_max_position_embeddings
        # (Phi-3 writes one) wins over the one inside the RoPE parameters.
        if c.get("original_max_position_embeddings"):
            params["original_max_position_embeddings"] = c["original_max_position_embeddings"]
        params.setdefault(
            "original_max_position_embeddings", c.get("max_position_embeddings", 2048)
        )
    if rope_type in LENGTH_DEPENDENT_ROPE_TYPES:
        # dynamic's threshold, and longrope's default factor, come from max_position_embeddings.
        params["max_position_embeddings"] = int(c.get("max_position_embeddings", 2048))
    if rope_type == "dynamic" and "factor" not in params:
        raise UnsupportedModelError("RoPE type 'dynamic' needs a factor")
    if rope_type == "longrope":
        dim = int(c.get("head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
        for key in ("short_factor", "long_factor"):
            if len(params.get(key) or ()) != dim // 2:
                raise UnsupportedModelError(
                    f"RoPE type 'longrope' needs a {key} of {dim // 2} values (head_dim / 2)"
                )
    if params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings are not supported")
    for key, value in params.items():  # factors, frequencies, lengths: finite and positive
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int | float) and not isinstance(item, bool):
                _in_range(f"RoPE {key}", item, 0.0, 1e12, open_low=True)
    return RopeConfig(theta=theta, type=rope_type, params=params)


def _sliding_window(c: dict[str, Any], arch: str) -> int | None:
    if arch == "Qwen2ForCausalLM":
        if c.get("use_sliding_window"):
            # Qwen2 windows only the layers past max_window_layers; not implemented here.
            raise UnsupportedModelError("Qwen2 with use_sliding_window is not supported")
        return None
    window = c.get("sliding_window")
    return int(window) if window else None


def _eos_ids(c: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (c.get("eos_token_id"), generation.get("eos_token_id")):
        for token in source if isinstance(source, list) else [source]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    return tuple(ids)
