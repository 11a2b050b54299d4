// The exact (float-activation) kernel over the rows16 layout (rows16.h) on AVX-512F.
//
// A chunk holds, in each 32-bit lane, four quant bytes of one of sixteen rows; shifting the
// chunk by 4 * p bits puts value p's nibble in every lane's low four bits, and vpermps looks
// it up in the table 0..15 (it reads only those bits): two instructions turn one of a block's
// 32 values into sixteen floats, one per row, which one FMA multiplies by the broadcast
// activation. Per tile and activation row the block's sum of q * x is then scaled:
//   Q4_1: y += dw * sum(q x) + mw * sum(x)        Q4_0: y += dw * (sum(q x) - 8 * sum(x))
// which is sum((dw q + mw) x) up to the order of the float sums: the exact path's contract
// (linear.cpp). ~3 cycles a row-block at one row, where the per-row kernel spends ~9.
// Function-level target, chosen at run time where the CPU reports AVX-512F (rows16_ops.cpp).
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page

template <bool kQ41, int R>
void group(const Rows16FloatArgs& a, int64_t r0, int64_t g) {
  const int64_t nb = a.in / kBlock, tile = rows16_tile_bytes(a.type);
  const int qat = rows16_quants_at(a.type);
  const uint8_t* t = a.w + g * nb * tile;
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 y[R];
  for (int r = 0; r < R; ++r) y[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += tile) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
    for (int64_t l = 0; l < tile; l += 64) _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetch + l), _MM_HINT_T0);
    for (int k = 0; k < 4; ++k) {
      const __m512i c = _mm512_loadu_si512(t + qat + 64 * k);
      for (int i = 0; i < 4; ++i) {
        const __m512 lo = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * i), table);
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 8 * i + 4), table);
        for (int r = 0; r < R; ++r) {
          const float* xb = a.x + (r0 + r) * a.ldx + b * kBlock;
          acc[r][i] = _mm512_fmadd_ps(lo, _mm512_set1_ps(xb[4 * k + i]), acc[r][i]);
          acc[r][i] = _mm512_fmadd_ps(hi, _mm512_set1_ps(xb[16 + 4 * k + i]), acc[r][i]);
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    for (int r = 0; r < R; ++r) {
      const __m512 qx = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
      const float sx = a.sx[(r0 + r) * nb + b];
      if constexpr (kQ41) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)));
        y[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), _mm512_fmadd_ps(dw, qx, y[r]));
      } else {
        y[r] = _mm512_fmadd_ps(dw, _mm512_sub_ps(qx, _mm512_set1_ps(8.f * sx)), y[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.y + (r0 + r) * a.ldy + g * kGroupRows, y[r]);
}

template <bool kQ41>
void run(const Rows16FloatArgs& a, int64_t g_begin, int64_t g_end) {
  rows16_drive(a.rows, g_begin, g_end, [&a](auto rows, int64_t r0, int64_t g) {
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
