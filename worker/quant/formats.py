"""The GGML block formats the quantized kernels read, by their `ggml_type` number.

Each block holds 32 consecutive values of a weight row: a float16 scale (Q4_1: and a float16
minimum), then the quants. A row of `in` values is `in / 32` blocks, so a weight [out, in]
is stored as uint8 [out, in / 32 * block_bytes], the layout GGUF files keep on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_VALUES = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str
    ggml_type: int
    block_bytes: int

    def row_bytes(self, in_features: int) -> int:
        if in_features % BLOCK_VALUES:
            raise ValueError(f"{self.name} rows hold multiples of 32 values, not {in_features}")
        return in_features // BLOCK_VALUES * self.block_bytes


FORMATS = {
    f.ggml_type: f
    for f in (BlockFormat("Q4_0", 2, 18), BlockFormat("Q4_1", 3, 20), BlockFormat("Q8_0", 8, 34))
}
BY_NAME = {f.name: f for f in FORMATS.values()}


def format_of(ggml_type: int) -> BlockFormat:
    try:
        return FORMATS[int(ggml_type)]
    except KeyError:
        names = ", ".join(BY_NAME)
        raise ValueError(f"ggml type {ggml_type} has no quantized kernel (only {names})") from None
