"""Small random Llama-shaped GGUF files, written with `gguf.GGUFWriter` as llama.cpp's
converter writes them: llama.cpp's tensor names, q/k rows in ggml's order, norms in F32 and
every matrix in the type under test.

Weights come from a random transformers model. Types `gguf` can quantize (F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1) quantize those weights; the K-quants (which `gguf` only dequantizes) get
random blocks whose float16 scales are set to small finite values, so the file is still a valid
model for both readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from tests.worker.helpers import save_hf_model

Q = GGMLQuantizationType
# hidden 256: a K-quant block is 256 weights along a row
SHAPE = dict(
    vocab_size=300,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# where each K-quant block keeps its float16 scale(s): byte offsets within the block
_F16_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82)}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def ggml_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute`: each head's two halves interleaved in pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def random_blocks(rows: int, cols: int, qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    # Q6_K's int8 sub-block scales reach 127 (the others' 6-bit ones 63): a smaller d keeps
    # its weights, like the others', within a few tenths
    low, high = (1e-5, 3e-5) if qtype == Q.Q6_K else (2e-4, 1e-3)
    for offset in _F16_FIELDS[qtype]:
        scale = rng.uniform(low, high, size=(rows, cols // block)).astype(np.float16)
        data[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


def write_llama_gguf(
    out: Path,
    qtype: GGMLQuantizationType,
    tied: bool = False,
    seed: int = 0,
    odd_one: tuple[str, GGMLQuantizationType] | None = None,
    metadata: dict[str, object] | None = None,
    long_token: int = 0,
    mix: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """A GGUF of a random Llama (SHAPE) with every matrix in `qtype`; `odd_one` stores one
    tensor (by llama.cpp name) in another type, `mix` any number of them (as llama-quantize's
    Q4_K_M mixes types). `metadata` overrides SHAPE's values in the file's metadata only (the
    weights keep SHAPE); `long_token` makes one control token a string of that many bytes."""
    hf_dir = save_hf_model(out / "hf", "llama", dict(SHAPE, tie_word_embeddings=tied), seed)
    from safetensors.torch import load_file

    weights = load_file(str(hf_dir / "model.safetensors"))
    path = out / f"model-{qtype.name}.gguf"
    writer = GGUFWriter(str(path), "llama")
    _metadata(writer, {**SHAPE, **(metadata or {})}, long_token)
    for i, (hf, tensor) in enumerate(sorted(weights.items())):
        if tied and hf == "lm_head.weight":
            continue
        name = gguf_name(hf)
        w = tensor.to(torch.float32).numpy()
        if name.endswith("attn_q.weight"):
            w = ggml_permute(w, SHAPE["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            w = ggml_permute(w, SHAPE["num_key_value_heads"])
        kind = odd_one[1] if odd_one and odd_one[0] == name else (mix or {}).get(name, qtype)
        _add(writer, name, w, Q.F32 if w.ndim == 1 else kind, seed + i)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add(
    writer: GGUFWriter, name: str, w: np.ndarray, kind: GGMLQuantizationType, seed: int
) -> None:
    if kind == Q.F32:
        writer.add_tensor(name, w)
    elif kind == Q.F16:
        writer.add_tensor(name, w.astype(np.float16))
    elif kind in _F16_FIELDS:
        writer.add_tensor(name, random_blocks(*w.shape, kind, seed), raw_dtype=kind)
    else:
        writer.add_tensor(name, quantize(w, kind), raw_dtype=kind)


def _metadata(writer: GGUFWriter, s: dict, long_token: int) -> None:
    writer.add_context_length(s["max_position_embeddings"])
    writer.add_embedding_length(s["hidden_size"])
    writer.add_block_count(s["num_hidden_layers"])
    writer.add_feed_forward_length(s["intermediate_size"])
    writer.add_head_count(s["num_attention_heads"])
    writer.add_head_count_kv(s["num_key_value_heads"])
    writer.add_rope_dimension_count(s["hidden_size"] // s["num_attention_heads"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(s["rms_norm_eps"])
    writer.add_vocab_size(s["vocab_size"])
    tokens, types, merges = byte_vocabulary(s["vocab_size"])
    if long_token:
        tokens[0] = "<" + "x" * (long_token - 2) + ">"
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def byte_vocabulary(size: int) -> tuple[list[str], list[int], list[str]]:
    """Special tokens, the 256 byte-level symbols, then merges of common pairs up to `size`."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = SPECIAL + alphabet
    merges: list[str] = []
    pairs = [("Ġ", "t"), ("Ġ", "a"), ("h", "e"), ("i", "n"), ("Ġt", "he"), ("e", "r"), ("o", "n")]
    for left, right in pairs:
        if len(tokens) < size:
            merges.append(f"{left} {right}")
            tokens.append(left + right)
    filler = 0
    while len(tokens) < size:  # never produced by a merge: only widens the vocabulary
        tokens.append(f"<unused{filler}>")
        filler += 1
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    return tokens, types, merges
