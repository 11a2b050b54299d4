// Conversion between GGUF rows and the rows16 layout (rows16.h), both ways; portable C++.
#include "rows16.h"

#include <cstring>

namespace kvledger::quant {
namespace {

// Each piece of row o's block b (its float16 factors, its quant runs: four of 4 bytes for Q4,
// 32 single bytes for Q8_0) between its GGUF place (gguf_row: the row's first byte) and its
// place in tile b of group o / 16. kPack: GGUF -> rows16, else back.
template <bool kPack>
void convert_row(const uint8_t* src, int type, int64_t in, int64_t o, uint8_t* dst, int64_t gguf_row) {
  const int bytes = block_bytes(type), qat = rows16_quants_at(type);
  const int factors = type == kQ4_1 ? 2 : 1;  // d (and m), 2 bytes each, ahead of the quants
  const int64_t nb = in / kBlock, tile = rows16_tile_bytes(type), j = o % kGroupRows;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t gguf = gguf_row + b * bytes;
    const int64_t packed = ((o / kGroupRows) * nb + b) * tile;
    auto move = [&](int64_t at_gguf, int64_t at_packed, int n) {
      if constexpr (kPack) std::memcpy(dst + packed + at_packed, src + gguf + at_gguf, n);
      else std::memcpy(dst + gguf + at_gguf, src + packed + at_packed, n);
    };
    for (int f = 0; f < factors; ++f) move(2 * f, 32 * f + 2 * j, 2);
    if (type == kQ8_0) {
      for (int p = 0; p < kBlock; ++p) move(2 + p, qat + kGroupRows * p + j, 1);
    } else {
      for (int k = 0; k < 4; ++k) move(2 * factors + 4 * k, qat + 64 * k + 4 * j, 4);
    }
  }
}

template <bool kPack>
void convert(const uint8_t* src, int type, int64_t out, int64_t in, uint8_t* dst) {
  const int64_t row_bytes = in / kBlock * block_bytes(type);
  for (int64_t o = 0; o < out; ++o) convert_row<kPack>(src, type, in, o, dst, o * row_bytes);
}

}  // namespace

void rows16_pack(const uint8_t* gguf, int type, int64_t out, int64_t in, uint8_t* dst) {
  convert<true>(gguf, type, out, in, dst);
}

void rows16_unpack(const uint8_t* src, int type, int64_t out, int64_t in, uint8_t* gguf) {
  convert<false>(src, type, out, in, gguf);
}

void rows16_unpack_row(const uint8_t* src, int type, int64_t in, int64_t o, uint8_t* gguf_row) {
  convert_row<false>(src, type, in, o, gguf_row, 0);
}

}  // namespace kvledger::quant
