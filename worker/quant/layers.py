"""Layers that hold a weight as GGUF blocks and multiply by it without a float copy.

`QuantizedLinear` keeps the raw blocks as a uint8 buffer [out_features, bytes_per_row] and
its ggml type; `forward` is `torch.ops.kvledger_quant.linear`, which dequantizes each block in
registers and multiplies it in float32 (`worker/csrc/quant/`): the output equals `x @ W.T` of
the dequantized weight up to the order of the sums. It answers the same calls as the float
layers it replaces (`PackedLinear.split` included), so the forward pass does not change.

With `activations="int8"` the layer runs `torch.ops.kvledger_quant.linear_int8` instead: each
input row is quantized to int8 per block of 32 (as llama.cpp's Q8 activations) and multiplied
by integer dot products (AVX-512 VNNI where the CPU has it): faster at a decode step, and off
the exact product by the activations' rounding (docs/architecture.md states the bound). Q8_0
tiles (below) take those rounded activations through the float tile kernel instead.

On an AVX-512 CPU (with VNNI for int8 activations) a Q4_0/Q4_1/Q8_0 layer of whole groups of
16 rows regroups its blocks sixteen rows at a time (`worker/csrc/quant/rows16.h`: the same bytes,
no second copy) for kernels that spend a fraction of the per-row kernels' cycles a block
(`linear_rows16`, `linear_int8_rows16`); `gguf_blocks()` gives the GGUF rows back. From 128
rows (a prefill) `linear_rows16` dequantizes the tiles into a float32 scratch and multiplies
with torch's float GEMM, which outruns the tiles there.

`QuantizedEmbedding` looks token ids up by dequantizing just their rows; a tied LM head is a
`QuantizedLinear` over the same buffer (one copy of the blocks serves both).

`StackedQuantizedLinear` is a packed layer whose shards come in different types, as a Q4_K_M
file's are (Q6_K v beside Q4_K q and k in some layers): one `QuantizedLinear` per run of
same-typed shards, their outputs side by side.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.layers.linear import shard_slices
from worker.layers.module import Module
from worker.quant import kernels
from worker.quant.formats import INT8_TYPES, format_of

# activations -> the operator (looked up once per layer: the ops are registered on load)
ACTIVATIONS = {
    "float": lambda: torch.ops.kvledger_quant.linear,
    "int8": lambda: torch.ops.kvledger_quant.linear_int8,
}

# the same over rows16 tiles (Q4_0/Q4_1/Q8_0 on AVX-512: worker/csrc/quant/rows16.h), called
# through the module's own entry points: the registered operators' dispatch from Python costs
# more a call, and a decode step calls one per layer (worker/csrc/quant/ops.h)
ROWS16_OPS = {
    "float": lambda: kernels.require().linear_rows16,
    "int8": lambda: kernels.require().linear_int8_rows16,
}


def _check_blocks(blocks: torch.Tensor, ggml_type: int, in_features: int) -> None:
    fmt = format_of(ggml_type)
    want = fmt.row_bytes(in_features)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != want:
        raise ValueError(
            f"{fmt.name} blocks for {in_features} inputs must be uint8 [out, {want}], "
            f"got {blocks.dtype} {tuple(blocks.shape)}"
        )


class QuantizedLinear(Module):
    """y = x @ W.T (+ bias) with W kept as `ggml_type` blocks (a type of `formats.FORMATS`).

    `shard_sizes` (optional) names consecutive row ranges, as `PackedLinear`'s (q/k/v,
    gate/up), for `split`. `isa` forces a kernel path (`kernels.ISAS`); by default the
    `KVLEDGER_QUANT_ISA` environment variable, else the best this CPU runs. `activations`:
    "float" (the exact product) or "int8" (quantized activations, integer dot products).
    `rows16=False` keeps the GGUF rows whatever the CPU.
    """

    def __init__(
        self,
        in_features: int,
        blocks: torch.Tensor,
        ggml_type: int,
        bias: torch.Tensor | None = None,
        shard_sizes: dict[str, int] | None = None,
        isa: str | None = None,
        activations: str = "float",
        rows16: bool = True,
    ) -> None:
        super().__init__()
        _check_blocks(blocks, ggml_type, in_features)
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations {activations!r}: expected one of {list(ACTIVATIONS)}")
        kernels.require()  # registers the operator; refuses now rather than mid-forward
        self.in_features = in_features
        self.out_features = blocks.shape[0]
        self.ggml_type = int(ggml_type)
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        if shard_sizes is not None:  # as PackedLinear's: the loader fills a bias shard by shard
            self.shard_sizes = dict(shard_sizes)
            self.shards = shard_slices(shard_sizes, self.out_features)
        self.isa = kernels.ISAS[isa] if isa is not None else kernels.isa_from_env()
        # the int8 kernels read `INT8_TYPES`: any other type (Q5_0/Q5_1) multiplies float ones
        self.activations = activations if self.ggml_type in INT8_TYPES else "float"
        activations = self.activations
        self.op = ACTIVATIONS[activations]()
        # the rows16 tiles replace the GGUF rows (a tied embedding then reads the tiles)
        self.rows16 = rows16 and kernels.rows16_runs(
            self.ggml_type, self.out_features, activations, self.isa
        )
        if self.rows16:
            self.blocks = torch.ops.kvledger_quant.pack_rows16(
                self.blocks, self.ggml_type, in_features
            )
            self.rows16_op = ROWS16_OPS[activations]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows16:
            y = self.rows16_op(x, self.blocks, self.ggml_type, self.in_features)
        else:
            y = self.op(x, self.blocks, self.ggml_type, self.in_features, self.isa)
        return y if self.bias is None else y + self.bias

    def gguf_blocks(self) -> torch.Tensor:
        """The weight as GGUF rows [out, bytes per row], whatever layout the layer holds."""
        if self.rows16:
            return torch.ops.kvledger_quant.unpack_rows16(
                self.blocks, self.ggml_type, self.in_features
            )
        return self.blocks

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A packed layer's output per shard (as `PackedLinear.split`)."""
        return y.split(list(self.shard_sizes.values()), dim=-1)

    def dequantized(self) -> torch.Tensor:
        """The weight as float32 [out, in] (for tests and comparisons, not the forward)."""
        return torch.ops.kvledger_quant.dequantize(
            self.gguf_blocks(), self.ggml_type, self.in_features
        )

    def extra_repr(self) -> str:
        name = format_of(self.ggml_type).name
        return (
            f"in={self.in_features}, out={self.out_features}, {name}, "
            f"bias={self.bias is not None}, activations={self.activations}"
            + (", rows16" if self.rows16 else "")
        )


class StackedQuantizedLinear(Module):
    """y = x @ W.T (+ bias) for a packed layer held as `parts`, `QuantizedLinear`s over
    consecutive row ranges (each of one type); answers as `QuantizedLinear` with shards does
    (`split`, `dequantized`, the loader's bias shard by shard)."""

    def __init__(
        self,
        parts: list[QuantizedLinear],
        shard_sizes: dict[str, int],
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.shard_sizes = dict(shard_sizes)
        self.shards = shard_slices(shard_sizes, self.out_features)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(list(self.shard_sizes.values()), dim=-1)

    def dequantized(self) -> torch.Tensor:
        return torch.cat([part.dequantized() for part in self.parts])

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class QuantizedEmbedding(Module):
    """Token embedding over `ggml_type` blocks [vocab, bytes_per_row]: each lookup dequantizes
    only the rows asked for (exactly, as `gguf.quants.dequantize` does), in `dtype`. Once a
    tied head takes the blocks as rows16 tiles, the lookups read the tiles."""

    def __init__(
        self, dim: int, blocks: torch.Tensor, ggml_type: int, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        _check_blocks(blocks, ggml_type, dim)
        kernels.require()
        self.dim = dim
        self.ggml_type = int(ggml_type)
        self.dtype = dtype
        self.rows16 = False
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.rows16:
            rows = torch.ops.kvledger_quant.dequantize_rows16(
                self.blocks, self.ggml_type, self.dim, ids
            )
        else:
            rows = torch.ops.kvledger_quant.dequantize(self.blocks, self.ggml_type, self.dim, ids)
        return rows if self.dtype == torch.float32 else rows.to(self.dtype)

    def tied_head(self, isa: str | None = None, activations: str = "float") -> QuantizedLinear:
        """The LM head that shares this embedding's blocks (no second copy). Where the head
        runs on rows16 tiles (AVX-512: the 16-row decode step's head is its largest product),
        the embedding gives up its GGUF rows and reads the head's tiles. Called once, by the
        loader: a later call makes a new head, and an earlier one keeps its own tiles."""
        blocks = self.blocks
        if self.rows16:
            blocks = torch.ops.kvledger_quant.unpack_rows16(blocks, self.ggml_type, self.dim)
        head = QuantizedLinear(self.dim, blocks, self.ggml_type, isa=isa, activations=activations)
        self.blocks, self.rows16 = head.blocks, head.rows16
        return head
