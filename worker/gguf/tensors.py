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
# Each block type's float16 fields by byte offset: its scale d, and Q4_1/Q5_1's minimum or the
# K-quants' dmin. A NaN or infinite one turns its whole block, and so every output, to garbage.
HALF_FIELDS = {
    Q.Q8_0: ((0, "scale"),),
    Q.Q4_0: ((0, "scale"),),
    Q.Q4_1: ((0, "scale"), (2, "minimum")),
    Q.Q5_0: ((0, "scale"),),
    Q.Q5_1: ((0, "scale"), (2, "minimum")),
    Q.Q4_K: ((0, "scale"), (2, "minimum")),
    Q.Q5_K: ((0, "scale"), (2, "minimum")),
    Q.Q6_K: ((208, "scale"),),
}


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
        """uint8 `(rows, bytes_per_row)` in the model's row order; a view where nothing moves.
        ValueError where a block's scale is not finite (`nonfinite_scale`)."""
        if (bad := nonfinite_scale(self.raw, self.ggml_type)) is not None:
            raise ValueError(f"{self.gguf_name}: {bad}")
        data = self.raw.reshape(self.rows, -1)
        if self.permute is None:
            return data
        return data[unpermute_order(self.rows, self.permute)]

    def dequantize(self) -> torch.Tensor:
        """float32, `shape`, model row order (a fresh tensor: the file is not referenced).
        ValueError where a float tensor holds a NaN or an infinity."""
        values = gguf_dequantize(self.blocks(), self.ggml_type)
        # np.array copies: a float tensor dequantizes to a read-only view of the file
        values = np.array(values, dtype=np.float32)
        if self.ggml_type not in HALF_FIELDS and not np.isfinite(values).all():
            first = int(np.flatnonzero(~np.isfinite(values.reshape(-1)))[0])
            raise ValueError(f"{self.gguf_name}: value {first} is not finite")
        return torch.from_numpy(values).reshape(self.shape)


def nonfinite_scale(raw: np.ndarray, ggml_type: GGMLQuantizationType) -> str | None:
    """What is wrong with the first block of `raw` (a tensor's bytes) whose float16 scale or
    minimum is NaN or infinite, or None: the quants are integers, so these are the only values
    a quantized tensor can hold that are not finite."""
    fields = HALF_FIELDS.get(ggml_type)
    if not fields:
        return None
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[ggml_type][1])
    for offset, field in fields:
        halves = np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16).reshape(-1)
        bad = np.flatnonzero(~np.isfinite(halves))
        if bad.size:
            return f"block {int(bad[0])} has a {field} that is not finite ({halves[bad[0]]})"
    return None


def raw_bytes(data: np.ndarray, ggml_type: GGMLQuantizationType, n_elements: int) -> np.ndarray:
    """GGUFReader's array for a tensor (typed for float types, uint8 for blocks) as flat bytes,
    checked against the size its type and element count imply."""
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    flat = np.asarray(data).reshape(-1).view(np.uint8)
    expected = n_elements // block * type_size
    if flat.size != expected:
        raise ValueError(f"{flat.size} bytes where {ggml_type.name} needs {expected}")
    return flat
