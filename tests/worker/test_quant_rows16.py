"""The rows16 layout (worker/csrc/quant/rows16.h) and its two kernels.

Packing is a permutation of bytes: it must round-trip exactly, and a layer holding tiles must
dequantize to the very weight it was given. The exact kernel must equal the float64 product
of the dequantized weight up to float32 rounding, as the per-row kernels do; the int8 kernel
must compute the int8 rule (tests/worker/test_quant_int8.py) within its bound; both at every
row count (int8 activations on Q8_0 tiles run their own VNNI kernel where the CPU has
AVX512-VBMI, else the exact kernel on the int8 activations dequantized). A layer takes the
tiles only where the CPU runs its kernel; an embedding whose tied head takes them reads its
rows from the same tiles.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from tests.worker.quant_helpers import int8_activations, int8_rule, quantized
from worker.quant import kernels
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear

Q4 = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1]
TYPES = [*Q4, GGMLQuantizationType.Q8_0]  # the types tiles hold
SHAPES = [(16, 32), (48, 96), (208, 576), (64, 1536)]
ROWS = [1, 2, 3, 4, 5, 9, 16, 33]  # the tiles (16 or 4 activation rows) and remainders
GEMM_ROWS = [127, 128, 300]  # the exact path's prefill: a float GEMM from 128 rows
RULE_TOLERANCE = 1e-5  # float32 rounding, relative to the output's largest magnitude
ops = torch.ops.kvledger_quant


@pytest.fixture(scope="module")
def module(kv_cache_dir):  # noqa: ANN001 - the private cache the build goes to
    built = kernels.load().require("the tests")  # the test machines build it
    return built


def forced_below_avx512() -> bool:
    """KVLEDGER_QUANT_ISA names a path without tiles (scalar, avx2): layers keep the rows."""
    return kernels.isa_from_env() not in (kernels.ISAS["auto"], kernels.ISAS["avx512"])


def has_avx512(module) -> bool:  # noqa: ANN001
    return bool(module.cpu_has(kernels.ISAS["avx512"])) and not forced_below_avx512()


def has_vnni(module) -> bool:  # noqa: ANN001
    return bool(module.cpu_has_int8(kernels.ISAS["avx512"])) and not forced_below_avx512()


def vnni_or_skip(module) -> None:  # noqa: ANN001
    if not has_vnni(module):
        pytest.skip("no AVX-512 VNNI here, or a path without it forced: layers keep the rows")


def avx512_or_skip(module) -> None:  # noqa: ANN001
    if not has_avx512(module):
        pytest.skip("no AVX-512 here, or a path without it forced: layers keep the rows")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_packing_round_trips(module, qtype, shape) -> None:  # noqa: ANN001
    out, inp = shape
    blocks, _ = quantized(out, inp, qtype, seed=out)
    tiles = ops.pack_rows16(blocks, int(qtype), inp)
    assert tiles.shape == (out // 16, blocks.shape[1] * 16)  # the same bytes, regrouped
    assert not torch.equal(tiles.view(-1), blocks.view(-1))
    assert torch.equal(ops.unpack_rows16(tiles, int(qtype), inp), blocks)


def test_packing_refuses_what_it_cannot_hold(module) -> None:  # noqa: ANN001
    q5, _ = quantized(32, 64, GGMLQuantizationType.Q5_0)
    with pytest.raises(RuntimeError, match="ggml type 6 is not"):
        ops.pack_rows16(q5, int(GGMLQuantizationType.Q5_0), 64)

    q4, _ = quantized(40, 64, GGMLQuantizationType.Q4_1)
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        ops.pack_rows16(q4, int(GGMLQuantizationType.Q4_1), 64)
    tiles = ops.pack_rows16(q4[:32].contiguous(), int(GGMLQuantizationType.Q4_1), 64)
    with pytest.raises(RuntimeError, match="tiles must be"):
        ops.unpack_rows16(tiles, int(GGMLQuantizationType.Q4_1), 96)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_exact_kernel_is_the_float_product(module, qtype, shape) -> None:  # noqa: ANN001
    avx512_or_skip(module)
    out, inp = shape
    blocks, w = quantized(out, inp, qtype, seed=inp)
    layer = QuantizedLinear(inp, blocks, int(qtype))
    assert layer.rows16
    for rows in ROWS + GEMM_ROWS:
        x = int8_activations(rows, inp, rows)  # an all-zero block and an outlier as well
        want = x.double() @ w.double().T
        err = (layer(x).double() - want).abs().max().item()
        assert err <= RULE_TOLERANCE * want.abs().max().item(), (rows, err)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [*SHAPES, (1040, 4096)], ids=str)
def test_the_prefill_gemm_dequantizes_the_tiles_exactly(module, qtype, shape) -> None:  # noqa: ANN001
    """The GEMM path's operand, W^T in float32, is the GGUF dequantization value for value
    (a wrong column, block or scale would move the product by far more than rounding); and an
    input of more dimensions takes that path as a flat batch of rows. 1040 x 4096 outgrows the
    8 MiB scratch: three slabs of output columns, the last a partial one."""
    avx512_or_skip(module)
    out, inp = shape
    blocks, w = quantized(out, inp, qtype, seed=inp + 1)
    layer = QuantizedLinear(inp, blocks, int(qtype))
    wt = ops.dequantize_rows16_t(layer.blocks, int(qtype), inp)
    assert wt.shape == (inp, out) and torch.equal(wt.T, layer.dequantized())
    x = int8_activations(256, inp, 5).view(2, 128, inp)
    want = x.double() @ w.double().T
    err = (layer(x).double() - want).abs().max().item()
    assert layer(x).shape == (2, 128, out) and err <= RULE_TOLERANCE * want.abs().max().item()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_int8_kernel_computes_the_int8_rule(module, qtype, shape) -> None:  # noqa: ANN001
    vnni_or_skip(module)
    out, inp = shape
    blocks, w = quantized(out, inp, qtype, seed=inp)
    layer = QuantizedLinear(inp, blocks, int(qtype), activations="int8")
    assert layer.rows16 and "rows16" in repr(layer)
    reference = QuantizedLinear(inp, blocks, int(qtype), isa="scalar", activations="int8")
    assert not reference.rows16
    for rows in ROWS:
        x = int8_activations(rows, inp, rows)
        got = layer(x).double()
        xq, d = int8_rule(x)
        want = xq.double() @ w.double().T
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= RULE_TOLERANCE * scale, rows
        assert (got - reference(x).double()).abs().max().item() <= RULE_TOLERANCE * scale, rows
        bound = (d.double() / 2) @ w.double().abs().view(out, inp // 32, 32).sum(-1).T
        assert ((got - x.double() @ w.double().T).abs() <= bound + RULE_TOLERANCE * scale).all()


@pytest.mark.parametrize("acts", ["float", "int8"])
@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_a_row_does_not_depend_on_its_batch(module, acts, qtype) -> None:  # noqa: ANN001
    """Bit for bit: 19 rows run as tiles of 16, 2 and 1 (the exact kernel's sixteen-row tile
    runs its two chains one after the other, smaller tiles both at once), each row alone as a
    tile of one."""
    if acts == "int8":
        vnni_or_skip(module)
    else:
        avx512_or_skip(module)
    blocks, _ = quantized(96, 576, qtype, seed=3)
    layer = QuantizedLinear(576, blocks, int(qtype), activations=acts)
    assert layer.rows16
    x = int8_activations(19, 576, 7)
    together = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(19)])
    assert torch.equal(alone, together)
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_the_layers_entry_points_are_the_registered_operators(module, qtype) -> None:  # noqa: ANN001
    """The layers call the module's pybind entry points (no torch.ops dispatch): the same
    functions as the registered operators, bit for bit, with the same checks on their input."""
    avx512_or_skip(module)
    blocks, _ = quantized(48, 96, qtype, seed=11)
    tiles = ops.pack_rows16(blocks, int(qtype), 96)
    x = int8_activations(5, 96, 2)
    direct = module.linear_rows16(x, tiles, int(qtype), 96)
    assert torch.equal(direct, ops.linear_rows16(x, tiles, int(qtype), 96))
    if module.cpu_has_int8(kernels.ISAS["avx512"]):
        got = module.linear_int8_rows16(x, tiles, int(qtype), 96)
        assert torch.equal(got, ops.linear_int8_rows16(x, tiles, int(qtype), 96))
    with pytest.raises(RuntimeError, match="x must be CPU"):
        module.linear_rows16(x[:, :64].contiguous(), tiles, int(qtype), 96)
    f32 = torch.randn(3, 64, 16)  # float32 tiles of 40 rows (worker/layers/linear.py)
    xf = torch.randn(3, 64)
    assert torch.equal(module.linear_f32_rows16(xf, f32, 40), ops.linear_f32_rows16(xf, f32, 40))


def test_layers_take_tiles_only_where_they_run(module) -> None:  # noqa: ANN001
    vnni, avx512 = has_vnni(module), has_avx512(module)  # the default path, KVLEDGER_QUANT_ISA's
    cpu_vnni = bool(module.cpu_has_int8(kernels.ISAS["avx512"]))
    cpu_avx512 = bool(module.cpu_has(kernels.ISAS["avx512"]))
    q41 = GGMLQuantizationType.Q4_1
    blocks, w = quantized(48, 64, q41)
    cases = {
        (None, "int8"): vnni,
        ("avx512", "int8"): cpu_vnni,
        ("avx2", "int8"): False,  # a path named by the caller keeps its own layout
        (None, "float"): avx512,
        ("avx512", "float"): cpu_avx512,
        ("scalar", "float"): False,
    }
    for (isa, acts), want in cases.items():
        layer = QuantizedLinear(64, blocks, int(q41), isa=isa, activations=acts)
        if isa == "avx2" and not module.cpu_has(kernels.ISAS["avx2"]):
            continue
        assert layer.rows16 == want, (isa, acts)
        assert torch.equal(layer.gguf_blocks(), blocks)
        assert torch.equal(layer.dequantized(), w)
    odd, _ = quantized(40, 64, q41)  # not whole groups of 16
    q8, w8 = quantized(48, 64, GGMLQuantizationType.Q8_0)
    for acts in ("float", "int8"):
        assert not QuantizedLinear(64, odd, int(q41), activations=acts).rows16
        layer = QuantizedLinear(64, q8, int(GGMLQuantizationType.Q8_0), activations=acts)
        assert layer.rows16 == (vnni if acts == "int8" else avx512), acts
        assert torch.equal(layer.dequantized(), w8)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0])
def test_a_tied_head_shares_the_embeddings_blocks(module, qtype) -> None:  # noqa: ANN001
    """One copy of the blocks, in the head's layout: where the head runs on tiles the
    embedding's lookups read the tiles, and stay the exact dequantized rows either way."""
    blocks, w = quantized(64, 64, qtype, seed=11)
    embed = QuantizedEmbedding(64, blocks, int(qtype))
    ids = torch.tensor([[0, 17], [63, 5]])
    assert torch.equal(embed(ids), w[ids])
    with pytest.raises(RuntimeError, match="out of range"):  # GGUF rows
        embed(torch.tensor([64]))
    x = int8_activations(3, 64, 2)
    for acts in ("float", "int8", "float"):
        head = embed.tied_head(activations=acts)
        assert head.blocks.data_ptr() == embed.blocks.data_ptr()
        runs = kernels.rows16_runs(int(qtype), 64, acts, kernels.isa_from_env())
        assert embed.rows16 == head.rows16 == runs
        assert torch.equal(embed.blocks, blocks) != embed.rows16  # tiles are the bytes regrouped
        assert torch.equal(embed(ids), w[ids]), acts
        assert torch.equal(head.gguf_blocks(), blocks)
        if acts == "float":
            want = x.double() @ w.double().T
        else:  # the int8 rule, as the GGUF rows' scalar path computes it
            ref = QuantizedLinear(64, blocks, int(qtype), isa="scalar", activations="int8")
            want = ref(x).double()
        err = (head(x).double() - want).abs().max().item()
        assert err <= RULE_TOLERANCE * want.abs().max().item(), acts
    with pytest.raises(RuntimeError, match="out of range"):  # the tiles, where taken
        embed(torch.tensor([-1]))
