"""One GGUF tensor: its raw blocks as stored, and dequantization as a separate step.

A quantized GGUF row is a run of fixed-size blocks (Q8_0: 32 weights in 34 bytes; Q4_K: 256 in
144), and no block spans two rows, so reordering rows (llama.cpp's Q/K permutation) works on the
raw bytes as well as on floats. `blocks()` therefore hands out bytes in the model's row order,
ready for a kernel that consumes them as they are; `dequantize()` turns them into float32 with
`gguf.quants.dequantize`, the reference implementation llama.cpp's authors maintain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from worker.gguf.names import Permute, unpermute_order

Q = GGMLQuantizationType
# What the worker dequantizes at load time; any other type stops startup naming the tensor.
SUPPORTED_TYPES = (
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q8_0,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
)


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor of the file under the model's name (see `worker/gguf/__init__.py`)."""

    name: str
    gguf_name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # logical, PyTorch order
    offset: int  # of its first byte in the file
    raw: np.ndarray  # uint8, file order: view into the mapped file
    permute: Permute | None = None

    @property
    def nbytes(self) -> int:
        return int(self.raw.size)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    def blocks(self) -> np.ndarray:
        """uint8 `(rows, bytes_per_row)` in the model's row order; a view where nothing moves."""
        data = self.raw.reshape(self.rows, -1)
        if self.permute is None:
            return data
        return data[unpermute_order(self.rows, self.permute)]

    def dequantize(self) -> torch.Tensor:
        """float32, `shape`, model row order (a fresh tensor: the file is not referenced)."""
        values = gguf_dequantize(self.blocks(), self.ggml_type)
        # np.array copies: a float tensor dequantizes to a read-only view of the file
        return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(self.shape)


def raw_bytes(data: np.ndarray, ggml_type: GGMLQuantizationType, n_elements: int) -> np.ndarray:
    """GGUFReader's array for a tensor (typed for float types, uint8 for blocks) as flat bytes,
    checked against the size its type and element count imply."""
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    flat = np.asarray(data).reshape(-1).view(np.uint8)
    expected = n_elements // block * type_size
    if flat.size != expected:
        raise ValueError(f"{flat.size} bytes where {ggml_type.name} needs {expected}")
    return flat
