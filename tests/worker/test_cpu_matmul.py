"""The CPU linear layers' layouts (`worker/layers/linear.py`): oneDNN's prepacked weight for
batches of rows, and for a small model also float32 sixteen-row tiles for decode-sized batches
(AVX-512; the input-major copy for single rows elsewhere); every layout computes `F.linear`, and
only small models pay for the second copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.layers import linear
from worker.layers.linear import CpuMatmul, Linear, prepare_for_device

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


@pytest.fixture(autouse=True)
def private_build(kv_cache_dir):  # noqa: ANN001 - the quant kernels build into the test cache
    return kv_cache_dir


def weight(out: int = 1024, inp: int = 512) -> torch.Tensor:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(0))


@needs_onednn
@pytest.mark.parametrize("both", [False, True])
def test_every_layout_computes_f_linear(both: bool) -> None:
    w, bias = weight(), torch.randn(1024)
    mm = CpuMatmul(w, both_layouts=both)
    assert mm.packed is not None
    assert (mm.weight_t is not None or mm.tiles is not None) == both
    for rows in (1, 2, 16, 17):
        x = torch.randn(rows, 512)
        torch.testing.assert_close(mm(x), F.linear(x, w), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(mm(x, bias), F.linear(x, w, bias), atol=1e-4, rtol=1e-5)
    x = torch.randn(3, 1, 512)  # leading dimensions: one row each
    assert mm(x).shape == (3, 1, 1024)


def row_counts(monkeypatch: pytest.MonkeyPatch, namespace: object, op: str) -> list[int]:
    """The row count of every call to `namespace.op` from now on (the op still runs)."""
    calls: list[int] = []
    real = getattr(namespace, op)

    def counting(x, *args):  # noqa: ANN001, ANN002
        calls.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(namespace, op, counting)
    return calls


def onednn_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return row_counts(monkeypatch, torch.ops.mkldnn, "_linear_pointwise")


@needs_onednn
def test_without_tiles_one_row_takes_the_input_major_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear, "tiles_run", lambda: False)
    mm = CpuMatmul(weight(), both_layouts=True)
    assert mm.weight_t is not None and mm.tiles is None
    calls = onednn_calls(monkeypatch)
    mm(torch.randn(1, 512))
    assert calls == []
    mm(torch.randn(4, 512))
    assert calls == [4]


@needs_onednn
@pytest.mark.usefixtures("f32_tiles_kernel")
def test_decode_batches_take_the_tiles_and_larger_ones_onednn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mm = CpuMatmul(weight(), both_layouts=True)
    assert mm.tiles is not None and mm.weight_t is None  # one extra copy, not two
    calls = onednn_calls(monkeypatch)
    for rows in (1, 4, linear.TILE_MAX_ROWS):
        mm(torch.randn(rows, 512))
    assert calls == []
    mm(torch.randn(linear.TILE_MAX_ROWS + 1, 512))
    assert calls == [linear.TILE_MAX_ROWS + 1]


@pytest.mark.usefixtures("f32_tiles_kernel")
@pytest.mark.parametrize(("out", "inp"), [(1024, 512), (1000, 256), (30, 77), (16, 1), (5, 3)])
def test_tiles_compute_f_linear_at_every_row_count(out: int, inp: int) -> None:
    w = weight(out, inp)
    tiles = linear.f32_tiles(w)
    assert tiles.shape == (-(-out // 16), inp, 16)
    for rows in (*range(1, 18), 40):
        x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(rows))
        got = torch.ops.kvledger_quant.linear_f32_rows16(x, tiles, out)
        ref = F.linear(x.double(), w.double())
        assert got.shape == (rows, out)
        # float32 sums in another order: a few ulps of the sum of |products|
        bound = 1e-6 * (x.double().abs() @ w.double().abs().t()).max().item() + 1e-7
        assert (got.double() - ref).abs().max().item() < bound, rows


@pytest.mark.usefixtures("f32_tiles_kernel")
def test_tiles_kernel_refuses_what_it_cannot_multiply() -> None:
    tiles = linear.f32_tiles(weight(40, 64))
    op = torch.ops.kvledger_quant.linear_f32_rows16
    with pytest.raises(RuntimeError, match="x must be CPU float32"):
        op(torch.randn(2, 63), tiles, 40)
    with pytest.raises(RuntimeError, match="x must be CPU float32"):
        op(torch.randn(2, 64, dtype=torch.float64), tiles, 40)
    with pytest.raises(RuntimeError, match="tiles must be"):
        op(torch.randn(2, 64), tiles, 60)  # 60 rows need 4 tiles, not 3
    with pytest.raises(RuntimeError, match="tiles must be"):
        op(torch.randn(2, 64), tiles.transpose(1, 2), 40)
    assert op(torch.randn(0, 64), tiles, 40).shape == (0, 40)
    empty = linear.f32_tiles(torch.randn(40, 0))
    assert op(torch.randn(3, 0), empty, 40).eq(0).all()  # empty sums, as F.linear


@pytest.mark.usefixtures("f32_tiles_kernel")
def test_a_layer_too_small_for_onednn_takes_the_tiles_then_the_input_major_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, bias = weight(256, 256), torch.randn(256)  # under ONEDNN_MIN_ELEMENTS
    mm = CpuMatmul(w, both_layouts=True)
    assert mm.packed is None and mm.weight_t is not None and mm.tiles is not None
    calls = row_counts(monkeypatch, mm.kernels, "linear_f32_rows16")
    for rows in (1, 16, 17, 300):
        x = torch.randn(rows, 256)
        torch.testing.assert_close(mm(x, bias), F.linear(x, w, bias), atol=1e-4, rtol=1e-5)
    assert calls == [1, 16]


@pytest.mark.usefixtures("f32_tiles_kernel")
def test_a_narrower_isa_forced_keeps_float_layers_off_the_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVLEDGER_QUANT_ISA", "avx2")
    linear.tiles_run.cache_clear()
    try:
        mm = CpuMatmul(weight(), both_layouts=True)
        assert mm.tiles is None and mm.weight_t is not None
    finally:
        monkeypatch.delenv("KVLEDGER_QUANT_ISA")
        linear.tiles_run.cache_clear()


@needs_onednn
def test_only_small_models_keep_two_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    def model() -> nn.Module:
        layers = nn.ModuleList([Linear(512, 1024), Linear(1024, 512)])
        for layer in layers:
            layer.weight.data = weight(*layer.weight.shape)
        return layers

    small = model()
    prepare_for_device(small, torch.device("cpu"))
    for layer in small:  # oneDNN's copy and exactly one more
        kept = layer.cpu_matmul
        assert kept.packed is not None
        assert (kept.weight_t is not None) != (kept.tiles is not None)
    assert all(layer.weight.numel() == 0 for layer in small)  # the parameter is released
    monkeypatch.setattr(linear, "BOTH_LAYOUTS_MAX_BYTES", 4 * 1024 * 512)  # under 2 weights
    large = model()
    prepare_for_device(large, torch.device("cpu"))
    for layer in large:
        kept = layer.cpu_matmul
        assert (kept.packed is None) != (kept.weight_t is None)  # exactly one layout
        assert kept.tiles is None
