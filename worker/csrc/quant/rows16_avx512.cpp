// The exact (float-activation) kernel over the rows16 layout (rows16.h) on AVX-512F.
//
// A chunk holds, in each 32-bit lane, four quant bytes of one of sixteen rows; shifting the
// chunk by 4 * p bits puts value p's nibble in every lane's low four bits, and vpermps looks
// it up in the table 0..15 (it reads only those bits). One FMA then dequantizes it, w = d q + m
// (Q4_0: d q - 8 d) for sixteen rows, with the same rounding as `rows16_dequantize_t` (the
// prefill's weight): three instructions make one of a block's 32 values a float in each of
// sixteen rows, and each activation row multiplies it with one FMA on a broadcast.
//
// Up to sixteen activation rows share each dequantized value (19 instructions for 16 FMAs; the
// old tiles of four took 27). A row's sum is two chains, values 0..15 and 16..31 of every
// block in order, added at the end: sixteen rows hold 32 accumulators, more than the registers
// with the weights, so they run the two chains one after the other (the low chain's sums wait
// in y), fewer rows run both at once, and every tile gives a row the same sums: its output
// never depends on its batch. Function-level target, chosen at run time where the CPU reports
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

// acc[h - H0][r] += the dequantized values of chain h (0: values 0..15 of each block, 1:
// 16..31) times activation row r0 + r, over every block of group g.
template <bool kQ41, int R, int H0, int H1>
void chains(const Rows16FloatArgs& a, int64_t r0, int64_t g, __m512 (&acc)[H1 - H0][R]) {
  const int64_t nb = a.in / kBlock, tile = rows16_tile_bytes(a.type);
  const int qat = rows16_quants_at(a.type);
  const uint8_t* t = a.w + g * nb * tile;
  const float* x = a.x + r0 * a.ldx;
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int h = 0; h < H1 - H0; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += tile) {
    for (int64_t l = 0; l < tile; l += 64) _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetch + l), _MM_HINT_T0);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    const __m512 mw = kQ41 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)))
                           : _mm512_mul_ps(dw, _mm512_set1_ps(-8.f));
    const float* xb = x + b * kBlock;
    for (int k = 0; k < 4; ++k) {
      const __m512i c = _mm512_loadu_si512(t + qat + 64 * k);
      for (int i = 0; i < 4; ++i) {
        for (int h = H0; h < H1; ++h) {
          const __m512 q = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * i + 4 * h), table);
          const __m512 w = _mm512_fmadd_ps(dw, q, mw);
          const float* xv = xb + 16 * h + 4 * k + i;
          for (int r = 0; r < R; ++r)
            acc[h - H0][r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xv[r * a.ldx]), acc[h - H0][r]);
        }
      }
    }
  }
}

template <bool kQ41, int R>
void group(const Rows16FloatArgs& a, int64_t r0, int64_t g) {
  float* y = a.y + r0 * a.ldy + g * kGroupRows;
  if constexpr (R > kTileRows / 2) {
    __m512 acc[1][R];
    chains<kQ41, R, 0, 1>(a, r0, g, acc);
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * a.ldy, acc[0][r]);
    chains<kQ41, R, 1, 2>(a, r0, g, acc);
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(y + r * a.ldy, _mm512_add_ps(_mm512_loadu_ps(y + r * a.ldy), acc[0][r]));
  } else {
    __m512 acc[2][R];
    chains<kQ41, R, 0, 2>(a, r0, g, acc);
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * a.ldy, _mm512_add_ps(acc[0][r], acc[1][r]));
  }
}

template <bool kQ41>
void run(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end) {
  rows16_drive<kTileRows>(a.rows, g_begin, g_end, [&a](auto rows, int64_t r0, int64_t g) {
    group<kQ41, decltype(rows)::value>(a, r0, g);
  });
}

template <bool kQ41>
void dequantize_t(const uint8_t* w, int64_t in, float* wt, int64_t ldw, int64_t g_begin, int64_t g_end) {
  const int type = kQ41 ? kQ4_1 : kQ4_0;
  const int64_t nb = in / kBlock, tile = rows16_tile_bytes(type);
  const int qat = rows16_quants_at(type);
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* t = w + g * nb * tile;
    for (int64_t b = 0; b < nb; ++b, t += tile) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
      // Q4_1: d q + m; Q4_0: d (q - 8) = d q - 8 d, both with the one rounding of an FMA
      const __m512 mw = kQ41 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)))
                             : _mm512_mul_ps(dw, _mm512_set1_ps(-8.f));
      float* col = wt + b * kBlock * ldw + (g - g_begin) * kGroupRows;
      for (int k = 0; k < 4; ++k) {
        const __m512i c = _mm512_loadu_si512(t + qat + 64 * k);
        for (int i = 0; i < 4; ++i) {
          const __m512 lo = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * i), table);
          const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * i + 4), table);
          _mm512_storeu_ps(col + (4 * k + i) * ldw, _mm512_fmadd_ps(dw, lo, mw));
          _mm512_storeu_ps(col + (16 + 4 * k + i) * ldw, _mm512_fmadd_ps(dw, hi, mw));
        }
      }
    }
  }
}

}  // namespace

void rows16_avx512(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end) {
  if (a.type == kQ4_1) run<true>(a, g_begin, g_end);
  if (a.type == kQ4_0) run<false>(a, g_begin, g_end);
}

void rows16_dequantize_t(int type, const uint8_t* w, int64_t in, float* wt, int64_t ldw,
                         int64_t g_begin, int64_t g_end) {
  if (type == kQ4_1) dequantize_t<true>(w, in, wt, ldw, g_begin, g_end);
  if (type == kQ4_0) dequantize_t<false>(w, in, wt, ldw, g_begin, g_end);
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
