"""The decoder's fused CPU kernels (`worker/csrc/fused.cpp`, `--fused-cpu-ops`, on by default on
CPU) compute what the torch ops they replace compute: each kernel against its torch reference
in float32 and in the half types (where they round at the same points), and whole models with
them against the same models without them and against transformers."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.worker.helpers import (
    full_logits,
    greedy,
    hf_greedy,
    hf_model,
    make_runner,
    random_tokens,
)
from worker import native
from worker.layers.activation import silu_and_mul
from worker.layers.norm import RMSNorm
from worker.layers.rotary import apply_rotary

HALF = (torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def ops(kv_cache_dir):  # noqa: ANN001 - the private cache the build goes to
    module = native.load().require("the tests")  # the test machines build it
    return module


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: equal up to summation order; a half type: within two units in the last place
    of the dtype (torch's vectorized exp and ours may round one intermediate differently,
    and the product after it rounds again)."""
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    else:
        torch.testing.assert_close(got, want, atol=0, rtol=2 * torch.finfo(dtype).eps)


def norm_layer(size: int, dtype: torch.dtype, seed: int) -> RMSNorm:
    layer = RMSNorm(size, 1e-6)
    gen = torch.Generator().manual_seed(seed)
    layer.weight.data = (torch.rand(size, generator=gen) + 0.5).to(dtype)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_rms_norm_and_add_equal_torch(ops, dtype: torch.dtype, rows: int) -> None:
    layer = norm_layer(96, dtype, rows)
    x = (torch.randn(rows, 96) * 3).to(dtype)
    residual = torch.randn(rows, 96).to(dtype)
    want_norm = layer(x)
    want_add = layer.add(x, residual)
    x_before, residual_before = x.clone(), residual.clone()
    layer.use_native(ops)
    close(layer(x), want_norm, dtype)
    normed, summed = layer.add(x, residual)
    assert torch.equal(summed, want_add[1])  # one rounding of one sum: exact
    close(normed, want_add[0], dtype)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # not written


def test_rms_norm_keeps_leading_dimensions_and_strided_inputs(ops) -> None:
    layer = norm_layer(32, torch.float32, 0)
    x = torch.randn(3, 5, 64)[..., ::2]  # not contiguous
    want = layer(x)
    layer.use_native(ops)
    close(layer(x), want, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("rows", [1, 40])
def test_silu_and_mul_equals_torch(ops, dtype: torch.dtype, rows: int) -> None:
    gate_up = (torch.randn(rows, 2 * 88) * 4).to(dtype)
    close(ops.silu_and_mul(gate_up), silu_and_mul(gate_up), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), [(1, 4, 2, 16), (33, 8, 8, 64)])
def test_split_rope_equals_split_then_rotate(
    ops, dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, dim: int
) -> None:
    wide = torch.randn(tokens, (heads + 2 * kv_heads) * dim + 8).to(dtype)
    qkv = wide[:, :-8]  # rows strided, as a slice of a larger output would be
    angles = torch.rand(tokens, 1, dim // 2) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q, k, v = ops.split_rope(qkv, cos, sin, heads, kv_heads, dim)
    want_q, want_k, want_v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    close(q, apply_rotary(want_q.reshape(tokens, heads, dim), cos, sin), dtype)
    close(k, apply_rotary(want_k.reshape(tokens, kv_heads, dim), cos, sin), dtype)
    assert torch.equal(v, want_v.reshape(tokens, kv_heads, dim))
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()


def test_kernels_refuse_shapes_they_cannot_compute(ops) -> None:
    with pytest.raises(RuntimeError, match="weight must match"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="even"):
        ops.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="qkv must be"):
        ops.split_rope(torch.randn(2, 10), torch.ones(2, 4), torch.ones(2, 4), 1, 1, 8)


def test_nan_still_reaches_the_logits(ops) -> None:
    """A poisoned row must stay poisoned (the sampler fails that request alone)."""
    layer = norm_layer(16, torch.float32, 1)
    layer.use_native(ops)
    x = torch.randn(2, 16)
    x[1, 3] = float("nan")
    out = layer(x)
    assert out[1].isnan().all() and out[0].isfinite().all()
    assert ops.silu_and_mul(torch.full((1, 4), float("nan"))).isnan().all()


def uses_native(runner) -> bool:  # noqa: ANN001
    model = runner.model.model
    return all(
        m.native is not None
        for layer in model.layers
        for m in (layer.input_layernorm, layer.self_attn, layer.mlp)
    )


@pytest.mark.parametrize("name", ["llama", "llama_tied_bias", "mistral_window", "qwen2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_models_with_and_without_fused_ops_agree(hf_checkpoint, name: str, dtype: str) -> None:
    path = hf_checkpoint(name)
    fused = make_runner(path, dtype=dtype, attention_backend="auto")
    plain = make_runner(path, dtype=dtype, attention_backend="auto", fused_cpu_ops=False)
    assert uses_native(fused) and not uses_native(plain)
    tokens = random_tokens(50, 256, seed=5)
    atol = 1e-5 if dtype == "float32" else 5e-2
    torch.testing.assert_close(
        full_logits(fused, tokens).float(), full_logits(plain, tokens).float(), atol=atol, rtol=0
    )
    if dtype == "float32":
        prompt = random_tokens(9, 256, seed=6)
        assert greedy(fused, prompt, 24) == hf_greedy(hf_model(path), prompt, 24)


def test_a_failed_build_falls_back_to_torch_ops(
    tiny_llama_dir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    want = full_logits(make_runner(tiny_llama_dir), [101, 2023, 2003])
    monkeypatch.setattr(native, "load", lambda: native.Built(None, "no compiler here"))
    with caplog.at_level(logging.WARNING):
        runner = make_runner(tiny_llama_dir)
    assert not uses_native(runner)
    assert "fused CPU ops: no compiler here; using torch ops" in caplog.text
    got = full_logits(runner, [101, 2023, 2003])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_equals_torch_and_takes_the_first_of_ties(ops, dtype: torch.dtype) -> None:
    logits = torch.randn(9, 30522).to(dtype)
    logits[3, 17] = logits[3, 4000] = 50.0  # a tie: the first index wins, as in torch
    logits[5] = -1.0  # a flat row: index 0
    logits[6, -1] = 60.0  # the last column
    got = ops.argmax_rows(logits)
    assert got.dtype == torch.long
    assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert got[3] == 17 and got[5] == 0 and got[6] == 30521


def test_argmax_rows_at_every_width_around_its_16_wide_chunks(ops) -> None:
    """Vocabularies shorter than, equal to and just past a chunk, and ties inside one chunk,
    across two and between a chunk and the tail: always torch's first largest index."""
    gen = torch.Generator().manual_seed(0)
    for vocab in [1, 2, 15, 16, 17, 31, 32, 33, 47, 100]:
        logits = torch.randint(-3, 4, (64, vocab), generator=gen).float()  # many ties
        assert ops.argmax_rows(logits).tolist() == logits.argmax(dim=-1).tolist(), vocab
    row = torch.zeros(1, 40)
    row[0, 35] = row[0, 21] = row[0, 18] = 2.0  # the tail, then twice in the second chunk
    assert ops.argmax_rows(row).tolist() == [18]


def test_the_greedy_sampler_uses_the_kernel_and_still_fails_nonfinite_rows(ops) -> None:
    from worker.runner.batch import SeqChunk
    from worker.sample.sampler import NONFINITE_LOGITS, Sampler

    logits = torch.randn(4, 300)
    logits[2, 7] = float("nan")
    chunks = [SeqChunk(f"r{i}", [1], 3, [0], True) for i in range(4)]
    fused, plain = Sampler(0, ops)(logits, chunks), Sampler(0)(logits, chunks)
    assert [s.token_id for s in fused] == [s.token_id for s in plain]
    assert fused[2].error == NONFINITE_LOGITS
    assert [s.token_id for i, s in enumerate(fused) if i != 2] == [
        int(logits[i].argmax()) for i in (0, 1, 3)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_equals_torchs_indexed_copies(ops, dtype: torch.dtype) -> None:
    """The compiled KV write (the CPU backend's) puts every row where torch's two `index_copy_`
    calls do, from strided views too, and leaves every other slot alone."""
    from worker.attention.torch_backend import write_kv

    gen = torch.Generator().manual_seed(3)
    shape = (6, 16, 3, 64)  # blocks, block size, KV heads, head dim
    k_cache, v_cache = torch.randn(shape, generator=gen).to(dtype), torch.randn(shape).to(dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(5, 9, 64, generator=gen).to(dtype)
    k, v = qkv[:, 3:6], qkv[:, 6:]  # views into a packed projection, as split gives them
    slots = torch.tensor([0, 17, 95, 40, 41])
    write_kv(k, v, want_k, want_v, slots)
    ops.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_write_kv_refuses_what_index_copy_refuses(ops) -> None:
    cache = torch.zeros(2, 16, 3, 64)
    k = torch.randn(1, 3, 64)
    for bad in (torch.tensor([32]), torch.tensor([-1])):
        with pytest.raises(RuntimeError, match="outside the 32 slots"):
            ops.write_kv(k, k, cache, cache.clone(), bad)
    assert cache.eq(0).all()  # a refused write writes nothing
    with pytest.raises(RuntimeError, match="k and v must be"):
        ops.write_kv(k.double(), k, cache, cache.clone(), torch.tensor([1]))
    with pytest.raises(RuntimeError, match="slot_mapping must be int64"):
        ops.write_kv(k, k, cache, cache.clone(), torch.tensor([1], dtype=torch.int32))


def test_the_cpu_backend_writes_through_the_kernel(ops) -> None:
    from worker.attention import TorchAttention, get_backend

    assert get_backend("cpu").write_kv is ops.write_kv
    assert TorchAttention().write_kv is not ops.write_kv  # the reference keeps torch's copies
