"""The CPU linear layers' layouts (`worker/layers/linear.py`): oneDNN's prepacked weight for
batches of rows, and for a small model also the input-major copy for single rows; every layout
computes `F.linear`, and only small models pay for the second copy."""

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


def weight(out: int = 1024, inp: int = 512) -> torch.Tensor:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(0))


@needs_onednn
@pytest.mark.parametrize("both", [False, True])
def test_every_layout_computes_f_linear(both: bool) -> None:
    w, bias = weight(), torch.randn(1024)
    mm = CpuMatmul(w, both_layouts=both)
    assert mm.packed is not None and (mm.weight_t is not None) == both
    for rows in (1, 2, 16):
        x = torch.randn(rows, 512)
        torch.testing.assert_close(mm(x), F.linear(x, w), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(mm(x, bias), F.linear(x, w, bias), atol=1e-4, rtol=1e-5)
    x = torch.randn(3, 1, 512)  # leading dimensions: one row each
    assert mm(x).shape == (3, 1, 1024)


@needs_onednn
def test_one_row_takes_the_input_major_copy_and_more_rows_take_onednn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mm = CpuMatmul(weight(), both_layouts=True)
    assert mm.weight_t is not None
    calls: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def counting(x, *args):  # noqa: ANN001, ANN002
        calls.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counting)
    mm(torch.randn(1, 512))
    assert calls == []
    mm(torch.randn(4, 512))
    assert calls == [4]


def test_only_small_models_keep_two_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    def model() -> nn.Module:
        layers = nn.ModuleList([Linear(512, 1024), Linear(1024, 512)])
        for layer in layers:
            layer.weight.data = weight(*layer.weight.shape)
        return layers

    small = model()
    prepare_for_device(small, torch.device("cpu"))
    assert all(layer.cpu_matmul.weight_t is not None for layer in small)
    assert all(layer.weight.numel() == 0 for layer in small)  # the parameter is released
    monkeypatch.setattr(linear, "BOTH_LAYOUTS_MAX_BYTES", 4 * 1024 * 512)  # under 2 weights
    large = model()
    prepare_for_device(large, torch.device("cpu"))
    for layer in large:
        kept = layer.cpu_matmul
        assert (kept.packed is None) != (kept.weight_t is None)  # exactly one layout
