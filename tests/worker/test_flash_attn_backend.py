"""The flash_attn adapter, run against a torch stand-in of flash-attn's documented semantics,
equals the torch backend; and it refuses clearly what upstream flash-attn cannot run.

No GPU here: the stand-in module is injected as `flash_attn`, and the adapter is constructed
directly (`FlashAttention()`), which skips `check_flash_attn` — the explicit seam that lets it
run in fp32 on CPU, so the comparison with the torch backend is exact to 1e-5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.worker import flash_attn_standin as standin
from tests.worker.helpers import (
    attention_steps,
    logits_for,
    make_runner,
    random_tokens,
    run_mixed,
    use_backend,
)
from worker.attention import flash_attn_backend as fa
from worker.attention import get_backend
from worker.attention.flash_attn_backend import FlashAttention, FlashAttnUnsupported
from worker.attention.torch_backend import TorchAttention
from worker.runner.batch import SeqChunk
from worker.runner.model_runner import ModelRunner

BS = 16
CUDA = torch.device("cuda")


@pytest.fixture
def flash_attn(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "flash_attn", standin.module())
    monkeypatch.setattr(standin, "calls", {"varlen": 0, "kvcache": 0})
    return standin


def test_standin_follows_the_documented_masks() -> None:
    """The docstring's examples: causal, aligned to the bottom-right corner."""
    assert standin.visibility(2, 5, True, (-1, -1)).int().tolist() == [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    assert standin.visibility(5, 2, True, (-1, -1)).int().tolist() == [
        [0, 0],
        [0, 0],
        [0, 0],
        [1, 0],
        [1, 1],
    ]
    q, k = torch.randn(5, 2, 8), torch.randn(2, 1, 8)
    out = standin.attend(q, k, k, 1.0, True, (-1, -1))
    assert torch.equal(out[:3], torch.zeros(3, 2, 8)), "rows with nothing visible are zero"
    # window (1, 0) around i + sk - sq: query 1 of (2 queries, 5 keys) sees keys 3 and 4
    assert standin.visibility(2, 5, True, (1, 0))[1].nonzero().flatten().tolist() == [3, 4]


@pytest.mark.parametrize(("name", "block_size"), [("llama", BS), ("mistral_window", 8)])
def test_adapter_equals_torch_backend(
    flash_attn, hf_checkpoint, name: str, block_size: int
) -> None:
    path: Path = hf_checkpoint(name)
    expected = run_mixed(make_runner(path, num_blocks=24, block_size=block_size))
    flash = use_backend(make_runner(path, num_blocks=24, block_size=block_size), FlashAttention())
    got = run_mixed(flash)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert flash_attn.calls["kvcache"] > 0 and flash_attn.calls["varlen"] > 0


def test_adapter_equals_torch_backend_with_256_token_blocks(flash_attn, hf_checkpoint) -> None:
    """The mixed steps at upstream's block size (every length x16: prompts of hundreds of
    tokens, a cached prefix over several blocks), as tests/worker/test_cuda.py runs them on a
    GPU with the real package."""
    path: Path = hf_checkpoint("llama_long")
    expected = run_mixed(make_runner(path, num_blocks=24, block_size=256), scale=16)
    flash = use_backend(make_runner(path, num_blocks=24, block_size=256), FlashAttention())
    got = run_mixed(flash, scale=16)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert flash_attn.calls["kvcache"] > 0 and flash_attn.calls["varlen"] > 0


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 64), (8, 2, 32), (4, 4, 80)])
@pytest.mark.parametrize("window", [None, 40])
def test_adapter_equals_torch_backend_per_layer(
    flash_attn, heads: int, kv_heads: int, head_dim: int, window: int | None
) -> None:
    """One layer's attention over scattered multi-block tables, as test_cuda.py runs it with
    the real package on a GPU."""
    got, ref = attention_steps(
        FlashAttention(),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=torch.float32,
        window=window,
    )
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert flash_attn.calls["kvcache"] == 1 and flash_attn.calls["varlen"] == 1


def test_block_size_256_and_bfloat16(flash_attn, tiny_llama_dir: Path) -> None:
    """The block size upstream needs and a dtype it runs (the stand-in computes in fp32)."""
    tokens = random_tokens(300, 30522, seed=70)
    chunks = [
        SeqChunk("a", tokens[:260], 0, [1, 0], False),
        SeqChunk("b", tokens[:40], 0, [2], True),
    ]
    follow = [
        SeqChunk("a", tokens[260:], 260, [1, 0], True),
        SeqChunk("b", tokens[40:41], 40, [2], True),
    ]

    def logits(runner: ModelRunner) -> torch.Tensor:
        runner.execute(chunks)
        return logits_for(runner, follow, all_tokens=True)

    def runner() -> ModelRunner:
        return make_runner(tiny_llama_dir, num_blocks=3, block_size=256, dtype="bfloat16")

    expected = logits(runner())
    got = logits(use_backend(runner(), FlashAttention()))
    cosine = torch.nn.functional.cosine_similarity(got, expected)
    assert cosine.min().item() > 0.999, cosine


# ---- refusals and the choice of backend ------------------------------------------------


def test_refuses_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import raises ImportError
    with pytest.raises(FlashAttnUnsupported, match="needs the flash-attn package"):
        get_backend("flash_attn", dtype=torch.bfloat16, block_size=256, device=CUDA)


@pytest.mark.parametrize(
    ("dtype", "block_size", "device", "capability", "message"),
    [
        (torch.bfloat16, 256, torch.device("cpu"), (8, 0), "needs a CUDA device"),
        (torch.bfloat16, 256, CUDA, (7, 5), r"Ampere or newer .* is 7\.5"),
        (torch.float32, 256, CUDA, (8, 6), "float16 and bfloat16 only"),
        (torch.float16, 16, CUDA, (9, 0), "divisible by 256, got 16"),
    ],
)
def test_refuses_what_upstream_cannot_run(
    flash_attn, monkeypatch: pytest.MonkeyPatch, dtype, block_size, device, capability, message: str
) -> None:
    monkeypatch.setattr(fa, "device_capability", lambda _device: capability)
    with pytest.raises(FlashAttnUnsupported, match=message):
        get_backend("flash_attn", dtype=dtype, block_size=block_size, device=device)


def test_runner_refuses_before_taking_memory(flash_attn, hf_checkpoint) -> None:
    with pytest.raises(FlashAttnUnsupported, match="CUDA"):
        make_runner(hf_checkpoint("llama"), attention_backend="flash_attn")


def test_auto_picks_flash_attn_only_where_it_runs(
    flash_attn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fa, "device_capability", lambda _device: (8, 0))
    cpu = get_backend("auto", dtype=torch.bfloat16, block_size=256)
    assert isinstance(cpu, TorchAttention)
    cuda = get_backend("auto", dtype=torch.bfloat16, block_size=256, device=CUDA)
    assert isinstance(cuda, FlashAttention)
    small_blocks = get_backend("auto", dtype=torch.bfloat16, block_size=16, device=CUDA)
    assert isinstance(small_blocks, TorchAttention)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    assert isinstance(
        get_backend("auto", dtype=torch.bfloat16, block_size=256, device=CUDA), TorchAttention
    )
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_backend("xformers")
