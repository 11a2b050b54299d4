// The int8-activation kernel over the rows16 layout (rows16.h) on AVX-512 VNNI.
//
// A tile's four 64-byte chunks become eight registers of unsigned nibbles; each meets a
// 32-bit broadcast of four int8 activations in one vpdpbusd, so 8 instructions hold the 32
// products of 16 rows, with 4 integer accumulators per activation row to keep the chains short.
// Per tile and activation row the exact integer sums are scaled once:
//   Q4_1: y += dw * (d * dot) + mw * sd        Q4_0: y += dw * (d * dot - 8 * sd)
// (blocks.h, `Int8Args`, the same terms as the per-row kernels). The GGUF layout's kernel is
// bound by its arithmetic at one activation row; this one spends a fraction of its cycles a
// row-block, so the product streams its weights at memory speed (docs/performance.md,
// "Quantized kernels"). Function-level target, chosen at run time
// only where the CPU reports avx512_vnni (rows16_ops.cpp).
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page

static inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

template <bool kQ41, int R>
void group(const Rows16Args& a, int64_t r0, int64_t g) {
  const int64_t nb = a.in / kBlock, tile = rows16_tile_bytes(a.type);
  const int qat = rows16_quants_at(a.type);
  const uint8_t* t = a.w + g * nb * tile;
  const __m512i mask = _mm512_set1_epi8(15);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, t += tile) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (kQ41) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32)));
    for (int64_t l = 0; l < tile; l += 64) _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetch + l), _MM_HINT_T0);
    __m512i lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i c = _mm512_loadu_si512(t + qat + 64 * k);
      lo[k] = _mm512_and_si512(c, mask);
      hi[k] = _mm512_and_si512(_mm512_srli_epi16(c, 4), mask);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * nb + b;
      const int8_t* xq = a.x.q + i * kBlock;
      __m512i s[4];
      for (int k = 0; k < 4; ++k) {
        s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[k], bcast4(xq + 4 * k));
        s[k] = _mm512_dpbusd_epi32(s[k], hi[k], bcast4(xq + 16 + 4 * k));
      }
      const __m512i dot = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
      const __m512 fdot = _mm512_cvtepi32_ps(dot);
      if constexpr (kQ41) {
        acc[r] = _mm512_fmadd_ps(dw, _mm512_mul_ps(fdot, _mm512_set1_ps(a.x.d[i])), acc[r]);
        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.x.sd[i]), acc[r]);
      } else {
        const __m512 v = _mm512_fmadd_ps(fdot, _mm512_set1_ps(a.x.d[i]), _mm512_set1_ps(-8.f * a.x.sd[i]));
        acc[r] = _mm512_fmadd_ps(dw, v, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.y + (r0 + r) * a.ldy + g * kGroupRows, acc[r]);
}

template <bool kQ41>
void run(const Rows16Args& a, int64_t g_begin, int64_t g_end) {
  rows16_drive<4>(a.rows, g_begin, g_end, [&a](auto rows, int64_t r0, int64_t g) {
    group<kQ41, decltype(rows)::value>(a, r0, g);
  });
}

}  // namespace

void rows16_vnni512(const Rows16Args& a, int64_t g_begin, int64_t g_end) {
  if (a.type == kQ4_1) run<true>(a, g_begin, g_end);
  if (a.type == kQ4_0) run<false>(a, g_begin, g_end);
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
