"""The int8-activation kernels (`kvledger_quant::linear_int8`, `--quantization gguf-int8`)
against the rule they implement and the bound it implies.

The rule (worker/csrc/quant/blocks.h, `Int8Acts`): each row of x is cut into blocks of 32, a
block's scale is d = max|x| / 127 and its values become round(x * 127 / max|x|) (nearest, ties
to even), as llama.cpp quantizes activations to Q8; the product is then exact integer dot
products scaled per block. So each path must equal the float64 product of those dequantized
activations with the dequantized weight (up to float rounding), and its distance from the exact
product `x @ W.T` is at most, per output, the sum over blocks of d / 2 * sum |w| of the block
(each activation moves by at most half a step). Every instruction-set path runs where this CPU
has it, forced by the `isa` argument.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from tests.worker.quant_helpers import (
    K_SHAPES,
    K_TYPES,
    SHAPES,
    TYPES,
    int8_activations,
    int8_rule,
    quantized,
)
from worker.quant import kernels
from worker.quant.layers import QuantizedLinear

ISAS = ["scalar", "avx2", "avx512"]
ROWS = [1, 2, 3, 4, 9, 33, 130]  # the integer kernel's tiles, from 4 the float ones, 128 a GEMM
RULE_TOLERANCE = 1e-5  # float rounding, relative to the output's largest magnitude


@pytest.fixture(scope="module")
def module(kv_cache_dir):  # noqa: ANN001 - the private cache the build goes to
    built = kernels.load().require("the tests")  # the test machines build it
    return built


def int8_isa_or_skip(module, isa: str) -> str:  # noqa: ANN001
    if not module.cpu_has_int8(kernels.ISAS[isa]):
        pytest.skip(f"this CPU cannot run the int8 {isa} path")
    return isa


# every type with an int8 kernel, with its shapes (the K-quants' rows hold 256-value blocks)
CASES = [(t, s) for t in TYPES for s in SHAPES] + [(t, s) for t in K_TYPES for s in K_SHAPES]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_each_path_computes_the_rule_within_its_bound(module, isa, qtype, shape) -> None:  # noqa: ANN001
    int8_isa_or_skip(module, isa)
    out, inp = shape
    blocks, w = quantized(out, inp, qtype)
    layer = QuantizedLinear(inp, blocks, int(qtype), isa=isa, activations="int8")
    assert layer.activations == "int8"
    for rows in ROWS:
        x = int8_activations(rows, inp, rows)
        got = layer(x).double()
        xq, d = int8_rule(x)
        want = xq.double() @ w.double().T
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= RULE_TOLERANCE * scale
        exact = x.double() @ w.double().T
        w_l1 = w.double().abs().view(out, inp // 32, 32).sum(-1)  # [out, blocks]
        bound = (d.double() / 2) @ w_l1.T  # [rows, out]
        assert ((got - exact).abs() <= bound + RULE_TOLERANCE * scale).all()


def test_paths_and_batch_sizes_agree(module) -> None:  # noqa: ANN001
    """A row's result depends on neither the path nor the rows beside it (up to rounding)."""
    qtype = GGMLQuantizationType.Q4_1
    blocks, _ = quantized(130, 576, qtype, seed=4)
    x = int8_activations(9, 576, 5)
    isas = [i for i in ISAS if module.cpu_has_int8(kernels.ISAS[i])]
    assert "scalar" in isas
    ref = QuantizedLinear(576, blocks, int(qtype), isa="scalar", activations="int8")(x)
    tol = RULE_TOLERANCE * ref.abs().max().item()
    for isa in isas:
        layer = QuantizedLinear(576, blocks, int(qtype), isa=isa, activations="int8")
        assert (layer(x) - ref).abs().max().item() <= tol
        alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
        assert (alone - ref).abs().max().item() <= tol


def test_int8_runs_only_where_the_cpu_can(module) -> None:  # noqa: ANN001
    blocks, _ = quantized(8, 64, TYPES[0])
    assert module.cpu_has_int8(module.best_int8_isa())
    if module.best_int8_isa() != kernels.ISAS["avx512"]:  # no AVX-512 VNNI: refused by name
        with pytest.raises(RuntimeError, match="cannot run"):
            torch.ops.kvledger_quant.linear_int8(torch.randn(1, 64), blocks, 8, 64, 3)
    layer = QuantizedLinear(64, blocks, int(TYPES[0]), activations="int8")
    assert "activations=int8" in repr(layer)
    with pytest.raises(ValueError, match="activations"):
        QuantizedLinear(64, blocks, int(TYPES[0]), activations="fp8")
