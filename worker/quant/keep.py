"""Swaps a freshly built model's linear layers for `QuantizedLinear`s over a GGUF file's blocks.

`keep_quantized` runs before the loader: every plain linear layer (and the token embedding
and LM head) whose checkpoint tensor is of a type the kernels read (`formats.FORMATS`: Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) gets the file's blocks, copied as they are, and the
names it took are returned for the loader to skip. A packed layer (q/k/v, gate/up) takes its
shards' blocks stacked in its row order; where its shards differ in type (a Q4_K_M file's Q6_K
v beside Q4_K q and k) each run of same-typed shards is its own part
(`StackedQuantizedLinear`). Every tensor of another type (F32 norms, F16) is left to the
loader, which dequantizes it as before. Tensor-parallel layers are never swapped: their column
shards (row-parallel o/down) would cut blocks apart, so the model runner refuses quantized + TP > 1.

The float layers' `torch.empty` weights were never written, so dropping them frees only
address space: the worker's resident memory holds the blocks, not a float copy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from worker.layers.embedding import Embedding, LMHead
from worker.layers.linear import Linear, PackedLinear
from worker.quant import kernels
from worker.quant.formats import FORMATS
from worker.quant.layers import QuantizedEmbedding, QuantizedLinear, StackedQuantizedLinear

log = logging.getLogger(__name__)


class BlockTensor(Protocol):
    """What `worker/gguf/` hands out per tensor (`GGUFTensor`)."""

    name: str
    ggml_type: Any  # an int-like gguf.GGMLQuantizationType
    shape: tuple[int, ...]

    def blocks(self) -> np.ndarray: ...


def keep_quantized(
    model: nn.Module,
    tensors: Iterable[BlockTensor],
    release: Any = None,
    activations: str = "float",
) -> set[str]:
    """Swap what can run on blocks; returns the checkpoint names now held (for the loader to
    skip). `release(tensor)`, if given, is called once a tensor's blocks are copied;
    `activations` ("float" or "int8") is every new linear layer's (`QuantizedLinear`)."""
    groups = _groups(model, [t for t in tensors if t.name.endswith(".weight")])
    held: set[str] = set()
    for module_name, shards in groups.items():
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue  # the loader reports a tensor the model does not know
        new = _quantized(module, shards, activations)
        if new is None:
            continue
        _replace(model, module_name, new)
        if isinstance(new, QuantizedEmbedding):
            _retie(model, module, new, activations)
        for tensor in shards.values():
            held.add(tensor.name)
            if release is not None:
                release(tensor)
    log.info("kept %d weights as quantized blocks (%s)", len(held), _kernels(model) or "none")
    return held


def _kernels(model: nn.Module) -> str:
    """Each kept type with the instruction set its float kernel runs here (linear.cpp's table),
    e.g. "Q4_K avx512, Q6_K avx512"."""
    types = sorted(_types(model))
    if not types:
        return ""
    names = {code: name for name, code in kernels.ISAS.items()}
    module, isa = kernels.require(), kernels.isa_from_env()
    return ", ".join(f"{FORMATS[t].name} {names[module.kernel_isa(t, isa)]}" for t in types)


def _groups(
    model: nn.Module, tensors: list[BlockTensor]
) -> dict[str, dict[str | None, BlockTensor]]:
    """module name -> {shard name (None: unpacked): its checkpoint tensor}."""
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    groups: dict[str, dict[str | None, BlockTensor]] = {}
    for tensor in tensors:
        module_name, shard = tensor.name.rsplit(".", 1)[0], None
        for ckpt_module, (ours, shard_name) in packed.items():
            marker = f".{ckpt_module}."
            if marker in tensor.name:
                module_name = tensor.name.replace(marker, f".{ours}.").rsplit(".", 1)[0]
                shard = shard_name
                break
        groups.setdefault(module_name, {})[shard] = tensor
    return groups


def _quantized(
    module: nn.Module, shards: dict[str | None, BlockTensor], activations: str
) -> nn.Module | None:
    """The quantized replacement of `module`, or None where it keeps its float weight."""
    types = {int(t.ggml_type) for t in shards.values()}
    if not types <= set(FORMATS):
        return None
    kind = type(module)  # exactly the single-process layers: never a tensor-parallel subclass
    if kind is PackedLinear:
        assert isinstance(module, PackedLinear)
        in_f = module.weight.shape[1]
        if set(shards) != set(module.shards) or not all(FORMATS[t].fits(in_f) for t in types):
            return None
        return _packed(module, shards, in_f, activations)
    if None not in shards or len(shards) != 1:
        return None
    tensor, ggml_type = shards[None], types.pop()
    if kind is Linear or (kind is LMHead and not module.tied):
        out_f, in_f = module.weight.shape
        bias = None if getattr(module, "bias", None) is None else module.bias.data
        if tuple(tensor.shape) != (out_f, in_f) or not FORMATS[ggml_type].fits(in_f):
            return None
        return QuantizedLinear(in_f, _copy(tensor), ggml_type, bias, activations=activations)
    if kind is Embedding:
        rows, dim = module.weight.shape
        if tuple(tensor.shape) != (rows, dim) or not FORMATS[ggml_type].fits(dim):
            return None
        return QuantizedEmbedding(dim, _copy(tensor), ggml_type, module.weight.dtype)
    return None


def _packed(
    module: PackedLinear, shards: dict[str | None, BlockTensor], in_f: int, activations: str
) -> nn.Module:
    """One `QuantizedLinear` over the stacked shards where they share a type, else a
    `StackedQuantizedLinear` of one part per run of same-typed shards (in row order)."""
    bias = None if module.bias is None else module.bias.data
    runs: list[list[str]] = []
    for name in module.shards:  # row order
        if runs and int(shards[runs[-1][0]].ggml_type) == int(shards[name].ggml_type):
            runs[-1].append(name)
        else:
            runs.append([name])
    if len(runs) == 1:
        blocks = _stack(module, shards, runs[0], in_f)
        ggml_type = int(shards[runs[0][0]].ggml_type)
        return QuantizedLinear(
            in_f, blocks, ggml_type, bias, module.shard_sizes, activations=activations
        )
    parts = [
        QuantizedLinear(
            in_f,
            _stack(module, shards, run, in_f),
            int(shards[run[0]].ggml_type),
            activations=activations,
        )
        for run in runs
    ]
    return StackedQuantizedLinear(parts, module.shard_sizes, bias)


def _stack(
    module: PackedLinear, shards: dict[str | None, BlockTensor], names: list[str], in_f: int
) -> torch.Tensor:
    """The blocks of shards `names` (consecutive, one type) stacked in row order."""
    first, last = module.shards[names[0]], module.shards[names[-1]]
    fmt = FORMATS[int(shards[names[0]].ggml_type)]
    out = torch.empty(last.stop - first.start, fmt.row_bytes(in_f), dtype=torch.uint8)
    for name in names:
        tensor, rows = shards[name], module.shards[name]
        if tuple(tensor.shape) != (rows.stop - rows.start, in_f):
            raise ValueError(f"{tensor.name} has shape {tuple(tensor.shape)}, expected rows {rows}")
        out[rows.start - first.start : rows.stop - first.start].numpy()[:] = tensor.blocks()
    return out


def _copy(tensor: BlockTensor) -> torch.Tensor:
    """The blocks in memory of our own (not a view into the mapped file)."""
    source = tensor.blocks()
    out = torch.empty(source.shape, dtype=torch.uint8)
    out.numpy()[:] = source
    return out


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _retie(model: nn.Module, old: nn.Module, embed: QuantizedEmbedding, activations: str) -> None:
    """A head tied to the replaced embedding now reads the same blocks."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LMHead) and module.tied and module.weight is old.weight:
            _replace(model, name, embed.tied_head(activations=activations))


def _types(model: nn.Module) -> set[int]:
    return {
        m.ggml_type for m in model.modules() if isinstance(m, QuantizedLinear | QuantizedEmbedding)
    }
