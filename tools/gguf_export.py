"""Writes a Hugging Face Llama directory's safetensors weights as an F32 GGUF for llama.cpp.

    .venv/bin/python tools/gguf_export.py MODEL_DIR OUT.gguf [TYPE]

TYPE (default F32) may be Q8_0, Q4_0 or Q4_1: every 2-D weight whose rows hold whole blocks is
then stored quantized by `gguf.quants.quantize` (the norms stay F32), as llama-quantize would
store it; the tests serve such files (tests/worker/test_quant_model.py).

Only for benchmarks: the peers script (benchmarks/peers) runs llama.cpp's `llama-server` on
the very weights kvledger serves. The vocabulary is synthetic (same size, placeholder pieces):
the benchmark sends token ids and reads token counts, so text never matters. Needs the `gguf`
package (`pip install -e '.[bench]'`).

Layout notes (read from llama.cpp's own converter, not copied): llama.cpp's RoPE for the
`llama` architecture rotates interleaved pairs, while Hugging Face checkpoints rotate halves,
so the rows of q_proj and k_proj are permuted per head; every other tensor keeps its values,
under llama.cpp's names. A tied checkpoint has no lm_head: llama.cpp then reuses token_embd.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def rotate_half_to_interleaved(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Rows of one head [first half of the rotary dims, second half] -> pairs interleaved."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_name(hf_name: str) -> str:
    if hf_name in TENSOR_NAMES:
        return TENSOR_NAMES[hf_name]
    parts = hf_name.split(".")  # model.layers.N.<module...>.weight
    layer, module = parts[2], ".".join(parts[3:-1])
    return f"blk.{layer}.{LAYER_NAMES[module]}.{parts[-1]}"


def export(model_dir: Path, out: Path, qtype: str = "F32") -> None:
    import gguf
    from gguf.quants import quantize

    kind = gguf.GGMLQuantizationType[qtype]

    cfg = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    vocab = cfg["vocab_size"]
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_file_type(
        gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType[f"MOSTLY_{qtype}"]
    )
    writer.add_vocab_size(vocab)
    _synthetic_vocab(writer, vocab, cfg)
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    for name, value in sorted(tensors.items()):
        array = value.astype(np.float32)
        if name.endswith("q_proj.weight"):
            array = rotate_half_to_interleaved(array, heads)
        elif name.endswith("k_proj.weight"):
            array = rotate_half_to_interleaved(array, kv_heads)
        array = np.ascontiguousarray(array)
        if qtype != "F32" and array.ndim == 2 and array.shape[1] % 32 == 0:
            writer.add_tensor(gguf_name(name), quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _synthetic_vocab(writer, vocab: int, cfg: dict) -> None:  # noqa: ANN001 - gguf's writer
    """A SentencePiece-style vocabulary of placeholder pieces; bos/eos at the model's ids."""
    import gguf

    bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
    eos = eos[0] if isinstance(eos, list) else eos
    tokens = [f"<t{i}>".encode() for i in range(vocab)]
    types = [gguf.TokenType.NORMAL] * vocab
    for special in (0, bos, eos):
        types[special] = gguf.TokenType.CONTROL
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)


if __name__ == "__main__":
    export(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4])
