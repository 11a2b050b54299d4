"""llama.cpp's tensor names -> the model's (Hugging Face) names, per GGUF architecture.

llama.cpp's converter (convert_hf_to_gguf.py) renames every tensor (`blk.3.attn_q.weight` is
`model.layers.3.self_attn.q_proj.weight`) and, for the `llama` architecture only, reorders the
rows of q_proj and k_proj within each head: Hugging Face keeps RoPE's two halves of a head
apart (rotate_half), ggml interleaves them in pairs. `Permute` says which tensors to reorder
back and with how many heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Same layout and the same converter path as llama; Mistral and Llama 3 files say `llama` too.
PERMUTED_ARCHITECTURES = ("llama",)
# Qwen2 keeps Hugging Face's q/k row order (its converter does not permute) and biases q/k/v.
ARCHITECTURES = ("llama", "qwen2")

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


class UnknownTensorError(ValueError):
    pass


@dataclass(frozen=True)
class Permute:
    """Undo llama.cpp's Q/K row order: rows of `heads` heads, each in pairs -> two halves."""

    heads: int


def hf_name(gguf_name: str) -> str:
    """The model's name for a llama.cpp tensor name; UnknownTensorError for one not mapped."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    match = _LAYER_NAME.match(gguf_name)
    if match is None or match.group(2) not in _LAYER:
        raise UnknownTensorError(f"tensor {gguf_name} has no counterpart in the model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER[part]}.{kind}"


def permutation(
    gguf_name: str, architecture: str, num_heads: int, num_kv_heads: int
) -> Permute | None:
    """The row reordering a tensor needs, or None (every tensor of an unpermuted arch)."""
    if architecture not in PERMUTED_ARCHITECTURES:
        return None
    match = _LAYER_NAME.match(gguf_name)
    if match is None:
        return None
    if match.group(2) == "attn_q":
        return Permute(num_heads)
    if match.group(2) == "attn_k":
        return Permute(num_kv_heads)
    return None


def unpermute_order(rows: int, permute: Permute) -> list[int]:
    """Source row for each model row: model row (head h, half s, i) was ggml row (h, i, s).

    The converter reshapes rows to (heads, 2, rows/heads/2) and swaps the last two axes; this
    is the inverse as an index list, so it applies to float rows and to quantized rows (bytes)
    alike.
    """
    if rows % (2 * permute.heads):
        raise ValueError(f"{rows} rows do not split into {permute.heads} heads of two halves")
    half = rows // permute.heads // 2
    heads = range(permute.heads)
    return [h * 2 * half + i * 2 + s for h in heads for s in range(2) for i in range(half)]
