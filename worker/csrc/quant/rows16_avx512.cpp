// The exact (float-activation) kernel over the rows16 layout (rows16.h) on AVX-512F.
//
// A chunk holds, in each 32-bit lane, four quant bytes of one of sixteen rows; shifting the
// chunk by 4 * p bits puts value p's nibble in every lane's low four bits, and vpermps looks
// it up in the table 0..15 (it reads only those bits). One FMA then dequantizes it, w = d q + m
// (Q4_0: d q - 8 d) for sixteen rows, with the same rounding as `rows16_dequantize_t` (the
// prefill's weight): three instructions make one of a block's 32 values a float in each of
// sixteen rows, and each activation row multiplies it with one FMA on a broadcast. Q8_0's
// value-major tiles take a sign extension, a conversion and the scale's product (w = d q).
//
// Up to sixteen activation rows share each dequantized value (19 instructions for 16 FMAs; the
// old tiles of four took 27). A row's sum is two chains, values 0..15 and 16..31 of every
// block in order, added at the end: sixteen rows hold 32 accumulators, more than the registers
// with the weights, so they run the two chains one after the other (the low chain's sums wait
// in y), fewer rows run both at once, and every tile gives a row the same sums: below the GEMM
// path's 128 rows (rows16_ops.cpp) its output does not depend on its batch. Function-level target, chosen at run time where the CPU reports
// AVX-512F (rows16_ops.cpp).
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page

constexpr int kTileRows = 16;  // activation rows per tile: all of a 16-sequence decode step

// A block's scale and offset for sixteen rows: w = d q + m (Q4_0: m = -8 d; Q8_0: w = d q).
template <int kType>
struct Factors {
  __m512 d, m;
  explicit Factors(const uint8_t* t) {
    d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    if constexpr (kType == kQ4_1) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)));
    else m = _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
  }
};

// Value v (0..31) of tile t's block for its sixteen rows, dequantized with one rounding, as
// the GGUF rows' dequantize does.
template <int kType>
inline __m512 value(const uint8_t* t, int v, const Factors<kType>& f) {
  if constexpr (kType == kQ8_0) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 32 + kGroupRows * v));
    return _mm512_mul_ps(f.d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  } else {
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i c = _mm512_loadu_si512(t + rows16_quants_at(kType) + 64 * (v % 16 / 4));
    const __m512 q = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * (v % 4) + 4 * (v / 16)), table);
    return _mm512_fmadd_ps(f.d, q, f.m);
  }
}

// acc[h - H0][r] += the dequantized values of chain h (0: values 0..15 of each block, 1:
// 16..31) times activation row r0 + r, over every block of group g.
template <int kType, int R, int H0, int H1>
void chains(const Rows16FloatArgs& a, int64_t r0, int64_t g, __m512 (&acc)[H1 - H0][R]) {
  const int64_t nb = a.in / kBlock, tile = rows16_tile_bytes(kType);
  const uint8_t* t = a.w + g * nb * tile;
  const float* x = a.x + r0 * a.ldx;
  for (int h = 0; h < H1 - H0; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += tile) {
    for (int64_t l = 0; l < tile; l += 64) _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetch + l), _MM_HINT_T0);
    const Factors<kType> f(t);
    const float* xb = x + b * kBlock;
#pragma GCC unroll 16  // constant shifts and offsets for every value
    for (int v = 0; v < 16; ++v) {
      for (int h = H0; h < H1; ++h) {
        const __m512 w = value<kType>(t, 16 * h + v, f);
        const float* xv = xb + 16 * h + v;
        for (int r = 0; r < R; ++r)
          acc[h - H0][r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xv[r * a.ldx]), acc[h - H0][r]);
      }
    }
  }
}

template <int kType, int R>
void group(const Rows16FloatArgs& a, int64_t r0, int64_t g) {
  float* y = a.y + r0 * a.ldy + g * kGroupRows;
  if constexpr (R > kTileRows / 2) {
    __m512 acc[1][R];
    chains<kType, R, 0, 1>(a, r0, g, acc);
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * a.ldy, acc[0][r]);
    chains<kType, R, 1, 2>(a, r0, g, acc);
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(y + r * a.ldy, _mm512_add_ps(_mm512_loadu_ps(y + r * a.ldy), acc[0][r]));
  } else {
    __m512 acc[2][R];
    chains<kType, R, 0, 2>(a, r0, g, acc);
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * a.ldy, _mm512_add_ps(acc[0][r], acc[1][r]));
  }
}

template <int kType>
void run(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end) {
  rows16_drive<kTileRows>(a.rows, g_begin, g_end, [&a](auto rows, int64_t r0, int64_t g) {
    group<kType, decltype(rows)::value>(a, r0, g);
  });
}

template <int kType>
void dequantize_t(const uint8_t* w, int64_t in, float* wt, int64_t ldw, int64_t g_begin, int64_t g_end) {
  const int64_t nb = in / kBlock, tile = rows16_tile_bytes(kType);
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* t = w + g * nb * tile;
    for (int64_t b = 0; b < nb; ++b, t += tile) {
      const Factors<kType> f(t);
      float* col = wt + b * kBlock * ldw + (g - g_begin) * kGroupRows;
#pragma GCC unroll 32
      for (int v = 0; v < kBlock; ++v) _mm512_storeu_ps(col + v * ldw, value<kType>(t, v, f));
    }
  }
}

}  // namespace

void rows16_avx512(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end) {
  switch (a.type) {
    case kQ4_0: run<kQ4_0>(a, g_begin, g_end); break;
    case kQ4_1: run<kQ4_1>(a, g_begin, g_end); break;
    case kQ8_0: run<kQ8_0>(a, g_begin, g_end); break;
    default: break;
  }
}

void rows16_dequantize_t(int type, const uint8_t* w, int64_t in, float* wt, int64_t ldw,
                         int64_t g_begin, int64_t g_end) {
  switch (type) {
    case kQ4_0: dequantize_t<kQ4_0>(w, in, wt, ldw, g_begin, g_end); break;
    case kQ4_1: dequantize_t<kQ4_1>(w, in, wt, ldw, g_begin, g_end); break;
    case kQ8_0: dequantize_t<kQ8_0>(w, in, wt, ldw, g_begin, g_end); break;
    default: break;
  }
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
