"""Linear layers without init cost, and packed ones that load several checkpoint tensors.

Parameters are created with `torch.empty`: the loader overwrites every one of them, and
initializing a large model's weights only to discard them costs seconds.

On CPU, after loading, each linear layer re-lays its weight for oneDNN (`CpuMatmul`): the same
products, computed faster than `F.linear` at decode sizes; a small model also keeps float32
sixteen-row tiles that decode-sized batches stream through kvledger's own kernel
(`benchmarks/linear_layouts.py` measures every layout side by side; docs/performance.md,
"Linear layers and the LM head", has the figures).
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.module import Module
from worker.layers.native_ops import UsesNative

log = logging.getLogger(__name__)

# Below this many weights oneDNN's per-call cost outweighs its faster kernel at one row
# (tiny-llama's 256x256 o_proj runs faster as MKL's `x @ w_t`; docs/performance.md, "Linear
# layers and the LM head").
ONEDNN_MIN_ELEMENTS = 1 << 18


# Models whose linear weights total at most this keep a second copy of each float32 weight for
# decode-sized batches (see CpuMatmul): at most this much more memory, for a faster single
# stream on a small model such as tiny-llama. A larger model keeps one copy: the second would
# cost as much memory as its weights (the worker should stay within ~1.2x its weights plus its
# KV pool).
BOTH_LAYOUTS_MAX_BYTES = 256 * 2**20

# Up to this many rows (a decode step's batch) the second copy is kvledger's float32
# sixteen-row tiles where the CPU has AVX-512 (`kvledger_quant::linear_f32_rows16`).
TILE_MAX_ROWS = 16


def f32_tiles(weight: torch.Tensor) -> torch.Tensor:
    """A float32 [out, in] weight as sixteen-row tiles [ceil(out / 16), in, 16]: tiles[g][k][j]
    is row 16 g + j's value k, rows past `out` zeros (worker/csrc/quant/rows16_f32.cpp)."""
    out, inp = weight.shape
    groups = -(-out // 16)
    padded = weight.new_zeros(groups * 16, inp)
    padded[:out] = weight
    return padded.view(groups, 16, inp).transpose(1, 2).contiguous()


@functools.cache
def tiles_run() -> bool:
    """Whether the float32 tiles' kernel runs here: the quantized kernels' extension built, an
    AVX-512 CPU, and KVLEDGER_QUANT_ISA left to the CPU or naming AVX-512 (a narrower path
    forced for the quantized kernels keeps float layers off AVX-512 too)."""
    from worker.quant import kernels  # the extension builds on first use, not at import

    if kernels.isa_from_env() not in (kernels.ISAS["auto"], kernels.ISAS["avx512"]):
        return False
    module = kernels.load().module
    return module is not None and bool(module.cpu_has(kernels.ISAS["avx512"]))


class CpuMatmul:
    """`x @ w.T` for a fixed CPU weight, in the fastest layout available here.

    oneDNN's prepacked weight (`mkldnn._reorder_linear_weight`, what torch.compile's CPU
    backend uses for frozen linear layers) beats MKL's sgemm on `F.linear`, from an LM head at
    16 rows to a mid-sized model's MLP at one row. Where oneDNN is absent or refuses the dtype,
    the weight is stored input-major ([in, out], contiguous) and multiplied as `x @ w_t`, which
    MKL runs faster than `F.linear` at one row.

    At decode sizes a layer is a stream of its weights, and neither library streams it at the
    memory's rate. With `both_layouts` (a small model) a float32 weight is also kept as
    sixteen-row tiles (`f32_tiles`) that kvledger's kernel reads with a prefetch ahead, and
    batches of up to TILE_MAX_ROWS rows take them; larger ones take oneDNN, or for a layer
    too small for oneDNN the input-major copy (MKL's blocked sums: the kernel's one FMA chain
    a row over a 24-row prefill moved a Q5_K test model's logits of ~150 by 1.2e-4, past the
    1e-4 that tests/worker/test_gguf.py holds them to): docs/performance.md has the figures. On a
    CPU without AVX-512 the second copy is the input-major one, for single rows, where MKL's
    `x @ w_t` outruns oneDNN on a small model's LM head.
    """

    def __init__(self, weight: torch.Tensor, both_layouts: bool = False) -> None:
        self.out_features = weight.shape[0]
        self.packed: torch.Tensor | None = None
        self.weight_t: torch.Tensor | None = None
        self.tiles: torch.Tensor | None = None
        if torch.backends.mkldnn.is_available() and weight.numel() >= ONEDNN_MIN_ELEMENTS:
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
                self(torch.zeros(1, weight.shape[1], dtype=weight.dtype))  # refuses early
            except RuntimeError as err:
                log.debug("oneDNN linear unavailable for %s: %s", weight.dtype, err)
                self.packed = None
        if both_layouts and weight.dtype == torch.float32 and tiles_run():
            self.tiles = f32_tiles(weight)
            from worker.quant import kernels

            # the kernel's own entry point: torch.ops' dispatch costs more a call
            # (worker/csrc/quant/ops.h)
            self.kernels = kernels.require()
        if self.packed is None or (both_layouts and self.tiles is None):
            self.weight_t = weight.t().contiguous()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if self.tiles is not None and rows <= TILE_MAX_ROWS:
            out = self.kernels.linear_f32_rows16(flat, self.tiles, self.out_features)
            out = out.view(*x.shape[:-1], self.out_features)
            return out if bias is None else out + bias
        if self.packed is not None and (rows > 1 or self.weight_t is None):
            out = torch.ops.mkldnn._linear_pointwise(
                flat.contiguous(), self.packed, bias, "none", [], ""
            )
            return out.view(*x.shape[:-1], self.out_features)
        assert self.weight_t is not None
        out = x @ self.weight_t
        return out if bias is None else out + bias


def release(weight: nn.Parameter) -> None:
    """Frees a weight whose values now live in a CpuMatmul (memory stays at one copy)."""
    weight.data = weight.data.new_empty(0)


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.cpu_matmul: CpuMatmul | None = None  # set by prepare_for_cpu()

    def prepare_for_cpu(self, both_layouts: bool = False) -> None:
        self.cpu_matmul = CpuMatmul(self.weight.data, both_layouts)
        release(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_matmul is None:
            return F.linear(x, self.weight, self.bias)
        return self.cpu_matmul(x, self.bias)


def shard_slices(shard_sizes: dict[str, int], out_features: int) -> dict[str, slice]:
    """Each shard's rows, consecutive in the order given; they must cover `out_features`."""
    shards: dict[str, slice] = {}
    start = 0
    for name, size in shard_sizes.items():
        shards[name] = slice(start, start + size)
        start += size
    if start != out_features:
        raise ValueError(f"shards {shard_sizes} do not cover {out_features} rows")
    return shards


class PackedLinear(Linear):
    """Several projections of the same input in one matmul (q/k/v, gate/up).

    `shards` names the row range each checkpoint tensor fills, e.g. {"q": slice(0, 256), ...}.
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_sizes = dict(shard_sizes)
        self.shards = shard_slices(shard_sizes, sum(shard_sizes.values()))

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(list(self.shard_sizes.values()), dim=-1)


def prepare_for_device(
    model: nn.Module, device: torch.device, native: ModuleType | None = None
) -> None:
    """After the weights are loaded: on CPU, every layer that has a faster CPU layout takes
    it (`prepare_for_cpu`; a small model keeps two, see `CpuMatmul`), and with the compiled
    CPU kernels (`native`, from `worker/native.py`) every module that can run its steps
    through them does (`use_native`). CUDA's GEMMs run either layout at the same speed."""
    if device.type != "cpu":
        return
    preparing = [m for m in model.modules() if hasattr(m, "prepare_for_cpu")]
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in preparing)
    both = weight_bytes <= BOTH_LAYOUTS_MAX_BYTES
    for module in preparing:
        module.prepare_for_cpu(both)
    if native is not None:
        for module in model.modules():
            if isinstance(module, UsesNative):
                module.use_native(native)
