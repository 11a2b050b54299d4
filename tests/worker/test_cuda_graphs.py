"""Decode steps as CUDA graphs (worker/runner/cuda_graphs.py) and the CUDA defaults
(worker/device_defaults.py), as far as a machine without a GPU can check them.

Capturing and replaying a graph needs a GPU (tests/worker/test_cuda.py does it there). What
does not: the buckets, and the padded static inputs a graph reads. `DecodeGraphs.run(...,
replay=False)` runs the model eagerly on exactly those inputs, so on CPU, with the flash-attn
stand-in, it must give what the ordinary eager step gives, and the padded rows must write only
the scratch block.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.worker import flash_attn_standin as standin
from tests.worker.helpers import logits_for, make_runner, random_tokens, use_backend
from worker.attention.flash_attn_backend import FlashAttention
from worker.device_defaults import choose
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.cuda_graphs import DecodeGraphs, buckets


@pytest.fixture
def flash_attn(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "flash_attn", standin.module())
    return standin


def test_buckets() -> None:
    assert buckets(1) == [1]
    assert buckets(8) == [1, 2, 4, 8]
    assert buckets(20) == [1, 2, 4, 8, 16, 20]
    assert buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


@pytest.mark.parametrize("name", ["llama", "mistral_window"])
def test_padded_static_inputs_compute_the_eager_step(flash_attn, hf_checkpoint, name) -> None:
    """Three decodes padded to a bucket of 4 over scattered multi-block tables: the same
    logits as the eager step, and the pool's blocks untouched but for the three new slots."""
    bs, pool = 16, 12
    runner = use_backend(
        make_runner(hf_checkpoint(name), num_blocks=pool + 1, block_size=bs), FlashAttention()
    )
    limits = BatchLimits(bs, pool, runner.vocab_size, runner.max_model_len)
    graphs = DecodeGraphs(
        runner.model,
        max_batch=4,
        block_size=bs,
        max_model_len=runner.max_model_len,
        scratch_block=pool,
        sliding_window=runner.config.sliding_window,
        device=runner.device,
    )
    tables = {"a": [5, 1, 9], "b": [0], "c": [7, 3, 11, 2]}
    lengths = {"a": 40, "b": 9, "c": 61}
    prompts = {n: random_tokens(k + 1, 256, seed=i) for i, (n, k) in enumerate(lengths.items())}
    runner.execute([SeqChunk(n, prompts[n][:k], 0, tables[n], False) for n, k in lengths.items()])
    step = [SeqChunk(n, [prompts[n][k]], k, tables[n], True) for n, k in lengths.items()]
    before = [k.clone() for k in runner.kv_cache.k]
    expected = logits_for(runner, step)
    after_eager = [k.clone() for k in runner.kv_cache.k]
    with torch.inference_mode():
        hidden = graphs.run(step, limits, replay=False)
        got = runner.model.compute_logits(hidden).float()
    assert hidden.shape[0] == 3
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    written = {tables[n][k // bs] * bs + k % bs for n, k in lengths.items()}
    for layer, (old, new) in enumerate(zip(before, runner.kv_cache.k, strict=True)):
        changed = (old != new).flatten(2).any(-1)  # [blocks, block_size]
        slots = set(changed[:pool].flatten().nonzero().flatten().tolist())
        assert slots == written, layer
        assert changed[pool].any(), "the padded row writes the scratch block"
        torch.testing.assert_close(new[:pool], after_eager[layer][:pool], atol=1e-6, rtol=0)


def test_graphs_are_off_on_cpu(hf_checkpoint) -> None:
    runner = make_runner(hf_checkpoint("llama"), num_blocks=8, cuda_graph_max_batch=8)
    assert runner.graphs is None
    assert runner.kv_cache.k[0].shape[0] == 8, "no scratch block without graphs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphs_need_the_flash_attn_backend(hf_checkpoint) -> None:
    runner = make_runner(
        hf_checkpoint("llama"), num_blocks=8, device="cuda", cuda_graph_max_batch=8
    )
    assert runner.graphs is None  # float32, torch backend: eager, saying why


# ---- the CUDA defaults -----------------------------------------------------------------


def test_cpu_defaults_are_unchanged() -> None:
    got = choose("cpu", None, None, "auto", flash_installed=True)
    assert (got.dtype, got.block_size, got.reason) == ("float32", 16, "")


def test_cuda_auto_picks_flash_attn_at_256_token_blocks_in_bfloat16() -> None:
    got = choose("cuda", None, None, "auto", flash_installed=True)
    assert (got.dtype, got.block_size, got.attention) == ("bfloat16", 256, "flash_attn")
    assert "multiple of 256" in got.reason
    assert choose("cuda:1", "float16", 512, "auto", flash_installed=True).block_size == 512


@pytest.mark.parametrize(
    ("dtype", "block_size", "installed", "why"),
    [
        (None, None, False, "not installed"),
        ("float32", None, True, "bfloat16 and float16 only"),
        (None, 16, True, "--block-size 16"),
    ],
)
def test_cuda_auto_says_why_it_runs_torch(dtype, block_size, installed, why) -> None:
    got = choose("cuda", dtype, block_size, "auto", flash_installed=installed)
    assert got.attention == "torch" and why in got.reason
    assert got.block_size == (block_size or 16)


def test_explicit_backends_keep_their_block_sizes() -> None:
    assert choose("cuda", None, None, "flash_attn", flash_installed=False).block_size == 256
    assert choose("cuda", None, None, "torch").block_size == 16
    assert choose("cuda", "float32", None, "torch").dtype == "float32"


def test_worker_flags_leave_dtype_and_block_size_to_the_device() -> None:
    from kvledger.flags import WORKER, config_for, parse
    from worker.runner.config import runner_config

    cpu = runner_config(config_for(WORKER, parse(WORKER, [], "")), Path("m"))
    assert (cpu.dtype, cpu.block_size, cpu.cuda_graph_max_batch) == ("float32", 16, 64)
    argv = ["--device", "cuda", "--no-cuda-graphs", "--attention-backend", "torch"]
    cuda = runner_config(config_for(WORKER, parse(WORKER, argv, "")), Path("m"))
    assert (cuda.dtype, cuda.block_size, cuda.cuda_graph_max_batch) == (
        "bfloat16",
        16,
        0,
    )
