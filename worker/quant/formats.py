"""The GGML block formats the quantized kernels read, by their `ggml_type` number.

Each block holds `block_values` consecutive values of a weight row: 32 for Q8_0, Q4_0, Q4_1,
Q5_0 and Q5_1 (a float16 scale, Q4_1/Q5_1 a float16 minimum, Q5_x the fifth bits, then the
quants), 256 for the K-quants Q4_K, Q5_K and Q6_K (super-blocks of sub-blocks with their own
6- or 8-bit scales: worker/csrc/quant/kquants.h). A row of `in` values is `in / block_values`
blocks, so a weight [out, in] is stored as uint8 [out, in / block_values * block_bytes], the
layout GGUF files keep on disk.

`INT8_TYPES` are those the int8-activation kernels read (`--quantization gguf-int8`); a layer
of another type (Q5_0, Q5_1) multiplies float activations whatever that flag says.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_VALUES = 32


@dataclass(frozen=True)
class BlockFormat:
    name: str
    ggml_type: int
    block_bytes: int
    block_values: int = BLOCK_VALUES

    def fits(self, in_features: int) -> bool:
        return in_features > 0 and in_features % self.block_values == 0

    def row_bytes(self, in_features: int) -> int:
        if not self.fits(in_features):
            raise ValueError(
                f"{self.name} rows hold multiples of {self.block_values} values, not {in_features}"
            )
        return in_features // self.block_values * self.block_bytes


FORMATS = {
    f.ggml_type: f
    for f in (
        BlockFormat("Q4_0", 2, 18),
        BlockFormat("Q4_1", 3, 20),
        BlockFormat("Q5_0", 6, 22),
        BlockFormat("Q5_1", 7, 24),
        BlockFormat("Q8_0", 8, 34),
        BlockFormat("Q4_K", 12, 144, 256),
        BlockFormat("Q5_K", 13, 176, 256),
        BlockFormat("Q6_K", 14, 210, 256),
    )
}
INT8_TYPES = (2, 3, 8, 12, 13, 14)  # Q4_0, Q4_1, Q8_0 and the K-quants
BY_NAME = {f.name: f for f in FORMATS.values()}


def format_of(ggml_type: int) -> BlockFormat:
    try:
        return FORMATS[int(ggml_type)]
    except KeyError:
        names = ", ".join(BY_NAME)
        raise ValueError(f"ggml type {ggml_type} has no quantized kernel (only {names})") from None
