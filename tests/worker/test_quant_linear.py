"""The quantized linear kernels (`worker/csrc/quant/`, `worker/quant/`) against the reference:
`gguf.quants.dequantize` of the same blocks (the code llama.cpp's authors maintain) and a
float64 matmul. Every instruction-set path runs where this CPU has it, forced by the layer's
`isa` argument: the float-activation kernels equal `x @ W.T` up to the order of the sums."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from tests.worker.quant_helpers import FLOAT_ONLY_TYPES, K_SHAPES, K_TYPES, SHAPES, TYPES, quantized
from worker.quant import kernels
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear, StackedQuantizedLinear

Q = GGMLQuantizationType
# every type with its shapes: the K-quants' rows hold super-blocks of 256 values
CASES = [(t, s) for t in TYPES + FLOAT_ONLY_TYPES for s in SHAPES] + [
    (t, s) for t in K_TYPES for s in K_SHAPES
]

ISAS = ["scalar", "avx2", "avx512"]
# 4: the most rows Q4_K's factored AVX-512 kernel takes; from 32 rows (a prefill) GGUF rows go
# through the GEMM, from 128 the sixteen-row tiles
ROWS = [1, 3, 4, 16, 64, 130]


@pytest.fixture(scope="module")
def module(kv_cache_dir):  # noqa: ANN001 - the private cache the build goes to
    built = kernels.load().require("the tests")  # the test machines build it
    return built


def assert_matches(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Within 1e-3 of the float64 product, relative to the output's largest magnitude."""
    want = x.double() @ w.double().T
    scale = want.abs().max().clamp_min(1e-12)
    err = ((got.double() - want).abs().max() / scale).item()
    assert got.shape == want.shape and err < 1e-3, err


def isa_or_skip(module, isa: str) -> str:  # noqa: ANN001
    if not module.cpu_has(kernels.ISAS[isa]):
        pytest.skip(f"this CPU cannot run the {isa} path")
    return isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_each_path_equals_the_dequantized_matmul(module, isa, qtype, shape) -> None:  # noqa: ANN001
    isa_or_skip(module, isa)
    blocks, w = quantized(*shape, qtype)
    layer = QuantizedLinear(shape[1], blocks, int(qtype), isa=isa)
    gen = torch.Generator().manual_seed(1)
    for rows in ROWS:
        x = torch.randn(rows, shape[1], generator=gen)
        assert_matches(layer(x), x, w)


def test_dequantize_is_gguf_bit_for_bit(module) -> None:  # noqa: ANN001
    for qtype in TYPES + FLOAT_ONLY_TYPES + K_TYPES:
        blocks, w = quantized(50, 512, qtype, seed=3)
        got = torch.ops.kvledger_quant.dequantize(blocks, int(qtype), 512)
        assert torch.equal(got, w), qtype.name
        ids = torch.tensor([[4, 0], [49, 4]])
        assert torch.equal(
            torch.ops.kvledger_quant.dequantize(blocks, int(qtype), 512, ids), w[ids]
        )


def test_each_type_runs_the_kernel_of_the_isa_asked_for(module) -> None:  # noqa: ANN001
    # every type has a kernel at every set: each runs its own
    for qtype in FLOAT_ONLY_TYPES + K_TYPES:
        for isa in ISAS:
            code = kernels.ISAS[isa]
            if module.cpu_has(code):
                assert module.kernel_isa(int(qtype), code) == code
    best = module.best_isa()
    assert module.kernel_isa(int(Q.Q8_0), 0) == best
    assert module.kernel_isa(int(Q.Q4_K), 0) == best


def test_mixed_type_shards_stack_side_by_side(module) -> None:  # noqa: ANN001
    # a Q4_K_M file's q/k/v: Q4_K q and k, Q6_K v
    (qk, wqk), (v, wv) = quantized(96, 256, Q.Q4_K, seed=1), quantized(32, 256, Q.Q6_K, seed=2)
    bias = torch.randn(128)
    parts = [QuantizedLinear(256, qk, int(Q.Q4_K)), QuantizedLinear(256, v, int(Q.Q6_K))]
    layer = StackedQuantizedLinear(parts, {"q": 64, "k": 32, "v": 32}, bias)
    x = torch.randn(3, 256)
    w = torch.cat([wqk, wv])
    y = layer(x)
    want = x.double() @ w.double().T + bias.double()
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < 1e-3
    assert [t.shape[-1] for t in layer.split(y)] == [64, 32, 32]
    assert layer.shards["v"] == slice(96, 128)
    assert torch.equal(layer.dequantized(), w)


def test_int8_activations_on_a_type_without_int8_kernels_stay_float(module) -> None:  # noqa: ANN001
    blocks, w = quantized(64, 256, Q.Q5_0)
    layer = QuantizedLinear(256, blocks, int(Q.Q5_0), activations="int8")
    assert layer.activations == "float"
    x = torch.randn(2, 256)
    assert_matches(layer(x), x, w)
    with pytest.raises(RuntimeError, match="no int8 kernel"):
        torch.ops.kvledger_quant.linear_int8(x, blocks, int(Q.Q5_0), 256, 0)


def test_the_default_path_is_the_best_this_cpu_runs(module, monkeypatch) -> None:  # noqa: ANN001
    # the paths this CPU runs, best last
    available = [name for name, code in kernels.ISAS.items() if code and module.cpu_has(code)]
    assert available[0] == "scalar" and module.best_isa() == kernels.ISAS[available[-1]]
    blocks, w = quantized(64, 64, TYPES[0])
    monkeypatch.setenv(kernels.ISA_ENV, "scalar")
    assert QuantizedLinear(64, blocks, int(TYPES[0])).isa == kernels.ISAS["scalar"]
    monkeypatch.setenv(kernels.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="KVLEDGER_QUANT_ISA"):
        QuantizedLinear(64, blocks, int(TYPES[0]))
    monkeypatch.delenv(kernels.ISA_ENV)
    assert QuantizedLinear(64, blocks, int(TYPES[0])).isa == kernels.ISAS["auto"]


def test_bias_leading_dims_halves_and_shards(module) -> None:  # noqa: ANN001
    blocks, w = quantized(96, 64, GGMLQuantizationType.Q4_1)
    bias = torch.randn(96)
    layer = QuantizedLinear(64, blocks, int(GGMLQuantizationType.Q4_1), bias, {"q": 64, "k": 32})
    x = torch.randn(2, 5, 64)
    want = x.double() @ w.double().T + bias.double()
    y = layer(x)
    assert y.shape == (2, 5, 96)
    assert ((y.double() - want).abs().max() / want.abs().max()).item() < 1e-3
    q, k = layer.split(y)
    assert q.shape[-1] == 64 and k.shape[-1] == 32
    plain = QuantizedLinear(64, blocks, int(GGMLQuantizationType.Q4_1))
    half = plain(x.bfloat16())  # computed in float32, returned in the activations' dtype
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half, plain(x.bfloat16().float()).bfloat16())
    assert layer(torch.empty(0, 64)).shape == (0, 96)


def test_embedding_and_its_tied_head_share_one_copy(module) -> None:  # noqa: ANN001
    qtype = GGMLQuantizationType.Q8_0
    blocks, w = quantized(300, 64, qtype)
    embed = QuantizedEmbedding(64, blocks, int(qtype))
    ids = torch.tensor([0, 299, 17, 17])
    assert torch.equal(embed(ids), w[ids])
    head = embed.tied_head()
    assert head.blocks.data_ptr() == embed.blocks.data_ptr()
    x = torch.randn(3, 64)
    assert_matches(head(x), x, w)


def test_bad_blocks_and_types_are_refused(module) -> None:  # noqa: ANN001
    blocks, _ = quantized(8, 64, GGMLQuantizationType.Q8_0)
    with pytest.raises(ValueError, match="uint8 \\[out, 36\\]"):
        QuantizedLinear(64, blocks, int(GGMLQuantizationType.Q4_0))
    with pytest.raises(ValueError, match="no quantized kernel"):
        QuantizedLinear(64, blocks, int(GGMLQuantizationType.Q2_K))
    with pytest.raises(ValueError, match="multiples of 256"):
        QuantizedLinear(64, blocks, int(GGMLQuantizationType.Q4_K))
    with pytest.raises(ValueError, match="multiples of 32"):
        QuantizedLinear(48, blocks, int(GGMLQuantizationType.Q8_0))
    with pytest.raises(RuntimeError, match="x must be CPU"):
        torch.ops.kvledger_quant.linear(torch.randn(2, 32), blocks, 8, 64, 0)
    with pytest.raises(RuntimeError, match="unknown isa"):
        torch.ops.kvledger_quant.linear(torch.randn(2, 64), blocks, 8, 64, 9)
