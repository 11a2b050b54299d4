// The int8-activation path on AVX2 (`int8_tile.h` with maddubs + madd as the dot product), and
// the activation quantizer every vector path uses. Function-level target, chosen at run time
// (linear.cpp): the module still loads on a CPU without AVX2.
#include "blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvledger::quant {
namespace {

// u8 x s8 pairs summed to int16 (no saturation here: |u| <= 128, |s| <= 127), then to int32.
static inline __m256i dot32(__m256i acc, __m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

#include "int8_tile.h"

static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

static inline int hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void int8_avx2(const Int8Args& a, int64_t o_begin, int64_t o_end) { int8_dispatch(a, o_begin, o_end); }

// The rule of `quantize_acts` (int8_scalar.cpp), eight floats at a time: the same scale, the
// same product x * (127 / amax) rounded to nearest-even (the MXCSR default), so the same bytes.
void quantize_acts_avx2(const float* x, int64_t rows, int64_t in, int8_t* q, float* d, float* sd) {
  const int64_t n = rows * (in / kBlock);
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < n; ++i) {
    const float* xb = x + i * kBlock;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    const float amax = hmax8(m);
    const __m256 id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i iv[4];
    for (int k = 0; k < 4; ++k) iv[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    const int sum = hsum8i(_mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3])));
    // int32 -> int16 -> int8 packs work per 128-bit lane: the permute puts the values back in order
    const __m256i p16a = _mm256_packs_epi32(iv[0], iv[1]), p16b = _mm256_packs_epi32(iv[2], iv[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * kBlock), p8);
    d[i] = amax * (1.f / 127.f);
    sd[i] = d[i] * static_cast<float>(sum);
  }
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
