"""A Llama-3.2-1B-shaped GGUF with random weights, quantized by llama.cpp's own `llama-quantize`.

    .venv/bin/python benchmarks/gguf_1b.py --llama-quantize PATH [--type Q4_K_M] [--out DIR]

No weights of that size can be downloaded here, and speed and memory depend on the shapes and
the types, not the values: the file has Llama 3.2 1B's shapes (hidden 2048, 16 layers, 32 query
and 8 KV heads of 64, FFN 8192, tied embedding) and SmolLM2-135M-Instruct's tokenizer (its 49,152
tokens, merges and chat template, read from the packaged file), so the chat workload
(benchmarks/peers/chat_workload.py) tokenizes as it does for SmolLM2. Weights are normal with
standard deviation 0.02 in F16, norms 1; `llama-quantize` then stores them as llama.cpp users'
files are (Q4_K_M: Q4_K matrices, Q6_K for the tied embedding and some attn_v / ffn_down, as its
rules choose). Files are cached under the kvledger cache directory (`bench-1b/`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvledger.models import cache_dir, smollm2_path  # noqa: E402

SHAPE = dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, context=4096)
TOKENIZER_PREFIX = "tokenizer."
STD = 0.02


def f16_path(out: Path) -> Path:
    return out / "llama-1b-shaped.F16.gguf"


def write_f16(path: Path, seed: int = 0) -> Path:
    """The random F16 file (once: ~2.1 GB)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    writer = GGUFWriter(str(tmp), "llama")
    s = SHAPE
    head_dim = s["hidden"] // s["heads"]
    writer.add_name("llama-1b-shaped-random")
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    vocab = _copy_tokenizer(writer, smollm2_path())
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * STD).astype(np.float16)

    h, kv = s["hidden"], s["kv_heads"] * head_dim
    writer.add_tensor("token_embd.weight", matrix(vocab, h))
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(s["layers"]):
        for name, rows, cols in (
            ("attn_q", h, h),
            ("attn_k", kv, h),
            ("attn_v", kv, h),
            ("attn_output", h, h),
            ("ffn_gate", s["ffn"], h),
            ("ffn_up", s["ffn"], h),
            ("ffn_down", h, s["ffn"]),
        ):
            writer.add_tensor(f"blk.{i}.{name}.weight", matrix(rows, cols))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(h, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)
    return path


def _copy_tokenizer(writer: GGUFWriter, source: Path) -> int:
    """Every `tokenizer.*` field of `source` (SmolLM2's GGUF) into `writer`; the vocabulary's
    size."""
    reader = GGUFReader(str(source))
    size = 0
    for key, field in reader.fields.items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_array(key, values)
            if key == "tokenizer.ggml.tokens":
                size = len(values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), kind)
    return size


def quantized(qtype: str, llama_quantize: str, out: Path | None = None) -> Path:
    """The 1B-shaped file in `qtype` (F16: the random file itself), made once."""
    out = out or cache_dir() / "bench-1b"
    source = write_f16(f16_path(out))
    if qtype.upper() == "F16":
        return source
    path = out / f"llama-1b-shaped.{qtype.upper()}.gguf"
    if not path.exists():
        tmp = path.with_suffix(".partial")
        subprocess.run([llama_quantize, str(source), str(tmp), qtype.upper()], check=True)
        tmp.rename(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    print(quantized(args.type, args.llama_quantize, args.out))


if __name__ == "__main__":
    main()
