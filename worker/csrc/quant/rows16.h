// The rows16 layout: Q4_0, Q4_1 and Q8_0 weights regrouped sixteen output rows at a time: for
// Q4, each 32-bit lane of a 512-bit register holds quants of one of sixteen rows: one VNNI
// instruction multiplies four quants of each row by the same four int8 activations (a 32-bit
// broadcast; rows16_vnni.cpp), or a shift and a table lookup make one value of each row a
// float for one FMA (rows16_avx512.cpp, the exact path); a block's sixteen scales are one
// conversion. Both kernels prefetch the tiles 2 KiB ahead: the hardware prefetcher stops at
// each 4 KiB page, and without it a decode step's weights streamed well below the memory's
// rate (docs/performance.md, "Quantized kernels").
//
// Group g (rows 16g .. 16g+15) holds its blocks in order; block b of the group is a tile of
//   d[16]    float16, row j's scale                                   (32 bytes)
//   m[16]    float16, row j's minimum (Q4_1 only)                      (32 bytes)
//   q[4][64] chunk k: row j's bytes qs[4k .. 4k+3] at 4j .. 4j+3       (256 bytes)
// so a chunk's low nibbles are values 4k .. 4k+3 of each row and its high nibbles values
// 16+4k .. 16+4k+3 (blocks.h). Q8_0 (the exact kernel's) keeps its values value-major:
//   d[16]    float16, row j's scale                                   (32 bytes)
//   q[32][16] int8, row j's value p at 16p + j                         (512 bytes)
// so one sign extension loads value p of all sixteen rows. A tile is 16 x the block's bytes:
// the layout costs no memory, and it replaces the GGUF blocks (rows16.cpp converts both ways).
#pragma once

#include <cstdint>
#include <type_traits>

#include "blocks.h"

namespace kvledger::quant {

constexpr int kGroupRows = 16;

// The types the layout holds (every kernel runs all three; int8 activations on Q8_0 tiles need
// AVX512-VBMI beside VNNI, else they go through the exact kernel dequantized: rows16_ops.cpp).
static inline bool rows16_type(int type) { return type == kQ4_0 || type == kQ4_1 || type == kQ8_0; }

// Bytes of one tile (16 rows x one block), and where its quants start.
static inline int64_t rows16_tile_bytes(int type) { return kGroupRows * block_bytes(type); }
static inline int rows16_quants_at(int type) { return type == kQ4_1 ? 64 : 32; }

// y = dequantize(W) x over the int8 activations `x` (rows [0, rows)), groups [g_begin, g_end).
struct Rows16Args {
  int type;
  const uint8_t* w;  // group g's tiles start at w + g * nb * tile_bytes
  int64_t in;
  Int8Acts x;
  int64_t rows;
  float* y;  // row r's output o at y[r * ldy + o]
  int64_t ldy;
  const int32_t* qsum = nullptr;  // Q8_0: each activation block's sum of quants (rows16_vnni_q8.cpp)
};

// y = dequantize(W) x over float activations (the exact path), rows [0, rows), groups
// [g_begin, g_end).
struct Rows16FloatArgs {
  int type;
  const uint8_t* w;
  int64_t in;
  const float* x;  // row r at x + r * ldx
  int64_t ldx;
  int64_t rows;
  float* y;
  int64_t ldy;
};

// The loop both kernels run over groups [g_begin, g_end) and activation rows [0, rows): groups
// in chunks of four (64 weight rows stay in cache while every activation row passes over
// them), activation rows kRows at a time (each tile read once feeds kRows rows' sums), then
// the rest in tiles of kRows / 2, kRows / 4, ... 1 (13 rows after none of 16: 8 + 4 + 1).
// `group(std::integral_constant<int, R>{}, r0, g)` computes rows r0 .. r0 + R - 1 of group g;
// R is a compile-time constant so its accumulators stay in registers. A quantized kernel must
// give each row the same sums whatever tile it falls in: a row's output never depends on its
// batch (the float32 layers' kernel, rows16_f32.cpp, is exempt and says why).
// Plain loops with no intrinsics: each kernel file instantiates it with its own group function.
template <int R, class Group>
inline int64_t rows16_tiles(int64_t rows, int64_t r, int64_t g0, int64_t g1, const Group& group) {
  for (; r + R <= rows; r += R)
    for (int64_t g = g0; g < g1; ++g) group(std::integral_constant<int, R>{}, r, g);
  if constexpr (R > 1) r = rows16_tiles<R / 2>(rows, r, g0, g1, group);
  return r;
}

template <int kRows, class Group>
inline void rows16_drive(int64_t rows, int64_t g_begin, int64_t g_end, const Group& group) {
  constexpr int64_t kChunk = 4;
  for (int64_t g0 = g_begin; g0 < g_end; g0 += kChunk) {
    const int64_t g1 = g0 + kChunk < g_end ? g0 + kChunk : g_end;
    rows16_tiles<kRows>(rows, 0, g0, g1, group);
  }
}

// GGUF rows [out, in / 32 blocks] <-> the rows16 layout (out a multiple of 16), byte for byte.
void rows16_pack(const uint8_t* gguf, int type, int64_t out, int64_t in, uint8_t* dst);
void rows16_unpack(const uint8_t* src, int type, int64_t out, int64_t in, uint8_t* gguf);
// Row o of the tiles as one GGUF row (row_bytes), for an embedding's lookups.
void rows16_unpack_row(const uint8_t* src, int type, int64_t in, int64_t o, uint8_t* gguf_row);

void rows16_vnni512(const Rows16Args& a, int64_t g_begin, int64_t g_end);
void rows16_vnni512_q8(const Rows16Args& a, int64_t g_begin, int64_t g_end);  // needs VBMI too
void rows16_avx512(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end);
// The transposed float32 weight of groups [g_begin, g_end): wt[k * ldw + 16 (g - g_begin) + j]
// is row 16 g + j's value k, dequantized (AVX-512F; the exact path's prefill multiplies by it
// with a float GEMM, rows16_ops.cpp).
void rows16_dequantize_t(int type, const uint8_t* w, int64_t in, float* wt, int64_t ldw,
                         int64_t g_begin, int64_t g_end);

}  // namespace kvledger::quant
