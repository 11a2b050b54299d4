// The K-quant super-block factors (kquants.h) with AVX2 and F16C: the same floats as
// `k4_factors` / `k6_factors` (the same products, each value's 6- or 8-bit scale times the
// super-block's float16 d), a few instructions instead of a branchy loop per sub-block, which
// at one activation row cost as much as the int8 dot products themselves.
//
// Included only after a file's `#pragma GCC target("avx2,fma,f16c")`, inside its namespace.
#pragma once

// Q4_K/Q5_K: the 12 scale bytes rearranged so that bytes 0-7 are the 8 scales and bytes 8-15
// the 8 mins (the unpacking of `scale_min`, four at a time in 32-bit words).
static inline void k4_factors_avx2(const uint8_t* b, float* dg, float* mg) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // mins 4-7
  const uint32_t mins = u[1] & kLow6;                            // mins 0-3
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);          // scales 4-7
  u[2] = mins;
  u[0] &= kLow6;  // scales 0-3
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
  const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
  _mm256_storeu_ps(dg, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(read_u16(b))), sc));
  _mm256_storeu_ps(mg, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(read_u16(b + 2))), mn));
}

// Q6_K: the 16 int8 scales times d.
static inline void k6_factors_avx2(const uint8_t* b, float* f) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(read_u16(b + 208)));
  _mm256_storeu_ps(f, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
  _mm256_storeu_ps(f + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}
