"""The compiled CPU paged decode kernel (`--attention-backend cpu`, what `auto` picks on CPU)
equals the torch reference backend: on mixed steps (prefills, chunks over cached prefixes,
decodes of different lengths, same-step sharing), with sliding windows, GQA, bfloat16, partial
and long block tables; and greedy generation through it equals transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.serving import REPO
from tests.worker.attention_reference import reference
from tests.worker.helpers import greedy_decode, make_runner, random_tokens, run_mixed
from worker import native
from worker.attention import get_backend
from worker.attention.cpu_backend import CpuPagedAttention
from worker.attention.torch_backend import TorchAttention
from worker.runner.batch import SeqChunk


@pytest.fixture(scope="module")
def kernel():
    module = native.load().require("the tests")  # the test machines build it
    return module.paged_decode


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size", "window"),
    [
        (8, 2, 32, 16, 0),
        (4, 4, 64, 8, 0),
        (6, 1, 16, 4, 5),
        (2, 2, 128, 16, 40),
        (9, 3, 64, 32, 37),
        (12, 2, 64, 16, 0),
        (6, 1, 128, 8, 0),
    ],
)
def test_kernel_equals_attention_over_the_visible_keys(
    kernel, heads: int, kv_heads: int, dim: int, block_size: int, window: int
) -> None:
    gen = torch.Generator().manual_seed(heads * dim + block_size)
    blocks = 40
    k_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen)
    lens = torch.tensor([1, block_size, block_size + 1, 3 * block_size - 1, 7 * block_size])
    width = 7
    perm = torch.randperm(blocks, generator=gen)
    tables = perm[: len(lens) * width].view(len(lens), width)  # scattered blocks, no sharing
    tables[1, 0] = tables[4, 0]  # and one block two sequences share
    q = torch.randn(len(lens), heads, dim, generator=gen)
    got = kernel(q, k_cache, v_cache, tables, lens, window, dim**-0.5)
    expected = reference(q, k_cache, v_cache, tables, lens, window, dim**-0.5)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)
    # One sequence at a time: fewer tasks than twice the threads, so each task's blocks are
    # split into parts (more parts than blocks for the short ones) and merged.
    threads = torch.get_num_threads()
    try:
        for n_threads in (2, 4):
            torch.set_num_threads(n_threads)
            for i in range(len(lens)):
                one = kernel(
                    q[i : i + 1],
                    k_cache,
                    v_cache,
                    tables[i : i + 1],
                    lens[i : i + 1],
                    window,
                    dim**-0.5,
                )
                torch.testing.assert_close(one[0].double(), expected[i], atol=1e-5, rtol=0)
    finally:
        torch.set_num_threads(threads)


def test_kernel_in_bfloat16(kernel) -> None:
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(6, 16, 2, 32, generator=gen).bfloat16()
    v_cache = torch.randn(6, 16, 2, 32, generator=gen).bfloat16()
    q = torch.randn(2, 8, 32, generator=gen).bfloat16()
    tables, lens = torch.tensor([[0, 2, 4], [1, 3, 5]]), torch.tensor([40, 17])
    got = kernel(q, k_cache, v_cache, tables, lens, 0, 32**-0.5)
    expected = reference(q, k_cache, v_cache, tables, lens, 0, 32**-0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected, atol=2e-2, rtol=0)


def test_kernel_refuses_mismatched_inputs(kernel) -> None:
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="multiple of Hkv"):
        kernel(
            torch.zeros(1, 3, 8),
            cache,
            cache,
            torch.zeros(1, 1).long(),
            torch.ones(1).long(),
            0,
            1.0,
        )
    with pytest.raises(RuntimeError, match="int64"):
        kernel(
            torch.zeros(1, 4, 8),
            cache,
            cache,
            torch.zeros(1, 1).int(),
            torch.ones(1).long(),
            0,
            1.0,
        )


@pytest.mark.parametrize(("name", "block_size"), [("llama", 16), ("mistral_window", 8)])
def test_backend_equals_torch_backend_on_mixed_steps(
    kernel, hf_checkpoint, name: str, block_size: int
) -> None:
    path: Path = hf_checkpoint(name)
    expected = run_mixed(make_runner(path, num_blocks=24, block_size=block_size))
    runner = make_runner(path, num_blocks=24, block_size=block_size, attention_backend="cpu")
    assert isinstance(runner.backend, CpuPagedAttention)
    torch.testing.assert_close(run_mixed(runner), expected, atol=1e-5, rtol=0)


def test_decode_only_steps_equal_torch_backend_over_many_steps(kernel, tiny_llama_dir) -> None:
    """Greedy decoding of three sequences of different lengths, step by step, through both
    backends: the same tokens and logits at every step (decode-only steps return the decode
    rows' attention as the layer's whole output)."""
    prompts = [random_tokens(n, 30522, seed=80 + n) for n in (5, 33, 70)]

    def decode(runner) -> tuple[list[list[int]], torch.Tensor]:  # noqa: ANN001
        tables = [list(range(i * 8, i * 8 + 8)) for i in range(3)]
        seqs = [list(p) for p in prompts]
        runner.execute([SeqChunk(f"s{i}", seqs[i], 0, tables[i], False) for i in range(3)])
        return seqs, greedy_decode(runner, seqs, tables, 12)

    ref_seqs, ref_logits = decode(make_runner(tiny_llama_dir, num_blocks=24))
    seqs, logits = decode(make_runner(tiny_llama_dir, num_blocks=24, attention_backend="cpu"))
    assert seqs == ref_seqs
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)


def test_auto_picks_the_kernel_on_cpu_and_torch_when_it_cannot_build(
    kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(get_backend("auto"), CpuPagedAttention)
    monkeypatch.setattr(native, "load", lambda: native.Built(None, "no compiler here"))
    assert type(get_backend("auto")) is TorchAttention
    with pytest.raises(ValueError, match="no compiler here"):
        get_backend("cpu")
    with pytest.raises(ValueError, match="CPU only"):
        get_backend("cpu", device=torch.device("meta"))


def test_a_build_lock_left_by_a_killed_builder_does_not_hang_the_next(kernel) -> None:
    """torch's build lock is a plain file: a worker killed mid-build leaves it, and torch's
    loader would wait on it forever. Ours is held by flock, under which a lock file is stale."""
    (native._build_dir() / "lock").write_text("")
    code = "from worker import native; m = native.load().module; print(type(m).__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    assert done.stdout.strip() == "module", done.stderr[-2000:]
