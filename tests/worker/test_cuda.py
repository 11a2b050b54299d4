"""The worker on a CUDA GPU: the torch backend equals the CPU, flash-attn equals the torch
backend, and greedy decoding equals transformers.

These run only where torch sees a CUDA device (the build machines have none; a GPU is lent to
some sessions, and docs/architecture.md records what ran on it and when). The flash-attn tests
also need the `flash_attn` package. On CPU the adapter is held to a torch stand-in of
flash-attn's documented semantics instead (test_flash_attn_backend.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.worker.helpers import (
    attention_steps,
    greedy,
    hf_greedy,
    hf_model,
    logits_for,
    make_runner,
    random_tokens,
    run_mixed,
)
from worker.attention import get_backend
from worker.attention.flash_attn_backend import FlashAttention
from worker.runner.batch import SeqChunk
from worker.runner.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"
)
needs_flash_attn = pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="needs the flash-attn package"
)

# the per-layer error of the torch backend itself in half precision, against float32, on these
# inputs (measured on CPU): bf16 <= 0.014, fp16 <= 0.0015; a wrong block or slot moves outputs
# whose magnitude is ~1 by ~0.5
TOLERANCE = {torch.bfloat16: 0.04, torch.float16: 0.006}


def counted(runner: ModelRunner) -> dict[str, int]:
    """Count the real flash-attn calls the runner's backend makes."""
    backend = runner.backend
    assert isinstance(backend, FlashAttention)
    calls = {"varlen": 0, "kvcache": 0}

    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    backend._varlen = wrap("varlen", backend._varlen)
    backend._with_kvcache = wrap("kvcache", backend._with_kvcache)
    return calls


@pytest.mark.parametrize("name", ["llama", "mistral_window", "qwen2"])
def test_torch_backend_on_cuda_equals_cpu(hf_checkpoint, name: str) -> None:
    path = hf_checkpoint(name)
    expected = run_mixed(make_runner(path, num_blocks=24))
    got = run_mixed(make_runner(path, num_blocks=24, device="cuda"))
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-3, rtol=1e-3)


@needs_flash_attn
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    # tiny-llama's shape (8, 2, 32, GQA 4:1); SmolLM2-135M's (9, 3, 64); an uneven head dim
    # (80, run by the 96 kernel); MHA; GQA 8:1 at 32 and 128; 4:1 at 64
    [(4, 2, 64), (8, 2, 32), (9, 3, 64), (8, 2, 64), (4, 4, 80), (8, 1, 32), (8, 1, 128)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [None, 40])
def test_flash_attn_per_layer_equals_float32_torch_backend(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, window: int | None
) -> None:
    """One layer through upstream flash-attn, in half precision, against the torch backend in
    float32 on the same inputs: decode-only and mixed steps over scattered multi-block tables."""
    backend = get_backend("flash_attn", dtype=dtype, block_size=256, device=torch.device("cuda"))
    got, ref = attention_steps(
        backend,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device="cuda",
        window=window,
    )
    err = (got - ref).abs().max().item()
    assert err <= TOLERANCE[dtype], err


def test_greedy_on_cuda_equals_transformers(hf_checkpoint) -> None:
    """float32 on the GPU, the torch backend: token for token what transformers (on CPU) says."""
    for name in ("llama", "mistral_window", "qwen2"):
        path = hf_checkpoint(name)
        prompt = random_tokens(40, 256, seed=3)
        runner = make_runner(path, num_blocks=8, device="cuda")
        assert greedy(runner, prompt, 24) == hf_greedy(hf_model(path), prompt, 24), name


@needs_flash_attn
@pytest.mark.parametrize("graphs", [0, 8], ids=["eager", "cuda-graphs"])
def test_flash_attn_greedy_on_tiny_llama_is_transformers_greedy_up_to_rounding(
    tiny_llama_dir: Path, graphs: int
) -> None:
    """tiny-llama in bfloat16 through flash-attn, decoded greedily as the worker serves it.
    Half precision moves logits by rounding, so each chosen token must be transformers' float32
    argmax or within `tie` of it at that position (teacher-forced on our own tokens); a stale or
    misplaced KV block moves them by whole units."""
    tie = 0.03  # ~7x the largest bf16 gap seen on CPU; the median top-2 margin is ~0.16
    prompt = random_tokens(300, 30000, seed=11)
    runner = make_runner(
        tiny_llama_dir,
        num_blocks=4,
        block_size=256,
        device="cuda",
        dtype="bfloat16",
        attention_backend="flash_attn",
        cuda_graph_max_batch=graphs,
    )
    assert (runner.graphs is not None) == bool(graphs)
    calls = counted(runner)
    tokens = greedy(runner, prompt, 32)
    # a graph replays its kernels without calling the adapter
    assert calls["kvcache"] >= 31 if not graphs else calls["kvcache"] == 0, calls
    ref = hf_model(tiny_llama_dir).to("cuda")
    with torch.no_grad():
        logits = ref(torch.tensor([prompt + tokens], device="cuda")).logits[0].float()
    at = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    chosen = at[torch.arange(len(tokens)), torch.tensor(tokens)]
    gap = (at.max(dim=-1).values - chosen).cpu()
    assert gap.max().item() <= tie, (gap.max().item(), tokens)
    exact = sum(int(t == a) for t, a in zip(tokens, at.argmax(dim=-1).tolist(), strict=True))
    print(f"flash bf16 greedy: {exact}/{len(tokens)} tokens are the fp32 argmax exactly")


def graphed_runner(path: Path) -> ModelRunner:
    return make_runner(
        path,
        num_blocks=10,
        block_size=256,
        device="cuda",
        dtype="bfloat16",
        attention_backend="flash_attn",
        cuda_graph_max_batch=8,
    )


def prefilled(runner: ModelRunner) -> list[SeqChunk]:
    """Three sequences of 300, 40 and 700 tokens over scattered tables, prefilled; returns
    their next decode step."""
    tables = {"a": [6, 1], "b": [4], "c": [9, 0, 3]}
    lengths = {"a": 300, "b": 40, "c": 700}
    prompts = {n: random_tokens(k + 1, 30000, seed=i) for i, (n, k) in enumerate(lengths.items())}
    runner.execute([SeqChunk(n, prompts[n][:k], 0, tables[n], False) for n, k in lengths.items()])
    return [SeqChunk(n, [prompts[n][k]], k, tables[n], True) for n, k in lengths.items()]


@needs_flash_attn
def test_cuda_graph_replay_is_the_eager_forward_bit_for_bit(tiny_llama_dir: Path) -> None:
    """A replay computes exactly what the model computes eagerly on the same static inputs."""
    runner = graphed_runner(tiny_llama_dir)
    assert runner.graphs is not None and runner.graphs.sizes == [1, 2, 4, 8]
    step = prefilled(runner)
    with torch.inference_mode():
        for n in (1, 3):
            eager = runner.graphs.run(step[:n], runner.limits, replay=False).clone()
            replayed = runner.graphs.run(step[:n], runner.limits).clone()
            assert torch.equal(replayed, eager), (replayed - eager).abs().max().item()


@needs_flash_attn
def test_cuda_graph_decode_equals_the_eager_step(tiny_llama_dir: Path) -> None:
    """The graphed step against the ordinary eager one (prepare_batch, the adapter's own
    plan): equal up to the order flash-attn's split-KV combine adds in (its split count
    follows the block table's width, which the graph pads to max_model_len)."""
    runner = graphed_runner(tiny_llama_dir)
    step = prefilled(runner)
    graphs = runner.graphs
    got = logits_for(runner, step)
    runner.graphs = None
    expected = logits_for(runner, step)
    runner.graphs = graphs
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.02)
