"""A GGUF file's `{arch}.*` metadata as the Hugging Face `config.json` dict it came from, so
`worker/config.py` parses and checks a GGUF model exactly as it does a directory.

What the file does not say takes Hugging Face's default for the architecture; what this worker
cannot run (another architecture, RoPE scaling stored as a `rope_freqs` tensor, a partial
rotary dimension) is refused by name.
"""

from __future__ import annotations

from typing import Any

from kvledger.gguf_file import GGUFError
from worker.gguf.names import ARCHITECTURES

_HF_ARCHITECTURE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_DEFAULT_EPS = {"llama": 1e-5, "qwen2": 1e-6}
_DEFAULT_THETA = {"llama": 10000.0, "qwen2": 1000000.0}


def hf_config(
    meta: dict[str, Any], tensor_names: list[str], vocab_tokens: int, path: str
) -> dict[str, Any]:
    """config.json's fields for the file's architecture, from its metadata, its tensor list and
    the length of its token list (the vocabulary size when `{arch}.vocab_size` is absent)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(this worker runs {', '.join(ARCHITECTURES)})"
        )
    if "rope_freqs.weight" in tensor_names:
        raise GGUFError(f"{path}: RoPE scaling stored as a rope_freqs tensor is not supported")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{path}: metadata lacks {arch}.{key}")
        return value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // max(heads, 1)))  # heads: checked later
    rope_dim = int(get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFError(f"{path}: partial rotary embeddings ({rope_dim} of {head_dim}) unsupported")
    vocab = meta.get(f"{arch}.vocab_size") or vocab_tokens
    if not vocab:
        raise GGUFError(f"{path}: metadata gives no vocabulary size")
    return {
        "architectures": [_HF_ARCHITECTURE[arch]],
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", _DEFAULT_EPS[arch])),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rope_theta": float(get("rope.freq_base", _DEFAULT_THETA[arch])),
        "rope_scaling": _rope_scaling(meta, arch, path),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(meta),
        "torch_dtype": None,
    }


def _rope_scaling(meta: dict[str, Any], arch: str, path: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    raise GGUFError(f"{path}: RoPE scaling {kind!r} in a GGUF file is not supported")


def _eos_ids(meta: dict[str, Any]) -> list[int]:
    """The EOS, and the end-of-turn token where the file names another one (llama.cpp stops
    generation at either)."""
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        token = meta.get(key)
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return ids
