// The AVX2 path (AVX2 + FMA + F16C): one block of a weight row is dequantized into four ymm
// registers (8 floats each), then multiplied into up to kRows activation rows, each with two
// accumulators (16 registers in all: accumulators, weights and one load).
//
// Compiled with a function-level target (the pragma below), not -march: linear.cpp calls this
// file only where the CPU reports these features.
#include "blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int kRows = 4;
constexpr int64_t kOutChunk = 64;

static inline float scale(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }

static inline __m256 int8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

struct Q8_0 {
  static constexpr int kBytes = 34;
  static inline void load(const uint8_t* b, __m256* w) {
    const __m256 d = _mm256_set1_ps(scale(b));
    for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(d, int8x8(b + 2 + 8 * i));
  }
};

// The 16 bytes of a Q4 block as four groups of 8 values: 0..7, 8..15 (low nibbles), 16..23,
// 24..31 (high nibbles).
static inline void nibbles(const uint8_t* qs, __m256* v) {
  const __m256i mask = _mm256_set1_epi32(15);
  for (int h = 0; h < 2; ++h) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * h)));
    v[h] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
    v[h + 2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
}

struct Q4_0 {
  static constexpr int kBytes = 18;
  static inline void load(const uint8_t* b, __m256* w) {
    const __m256 d = _mm256_set1_ps(scale(b));
    const __m256 off = _mm256_set1_ps(-8.f);
    nibbles(b + 2, w);
    for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(d, _mm256_add_ps(w[i], off));
  }
};

struct Q4_1 {
  static constexpr int kBytes = 20;
  static inline void load(const uint8_t* b, __m256* w) {
    const __m256 d = _mm256_set1_ps(scale(b));
    const __m256 m = _mm256_set1_ps(scale(b + 2));
    nibbles(b + 4, w);
    for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(w[i], d, m);
  }
};

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <class Q, int R>
void tile(const LinearArgs& a, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const int64_t nb = a.in / kBlock;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256 w[4];
      Q::load(row + b * Q::kBytes, w);
      const float* xb = x + b * kBlock;
      for (int r = 0; r < R; ++r) {
        const float* xr = xb + r * a.ldx;
        acc0[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), acc0[r]);
        acc1[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), acc1[r]);
        acc0[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), acc0[r]);
        acc1[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), acc1[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * a.ldy + o] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
  }
}

template <class Q>
void run(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kOutChunk) {
    const int64_t o1 = o0 + kOutChunk < o_end ? o0 + kOutChunk : o_end;
    int64_t r = 0;
    for (; r + kRows <= a.rows; r += kRows) tile<Q, kRows>(a, a.x + r * a.ldx, a.y + r * a.ldy, o0, o1);
    const float* x = a.x + r * a.ldx;
    float* y = a.y + r * a.ldy;
    switch (a.rows - r) {
      case 3: tile<Q, 3>(a, x, y, o0, o1); break;
      case 2: tile<Q, 2>(a, x, y, o0, o1); break;
      case 1: tile<Q, 1>(a, x, y, o0, o1); break;
      default: break;
    }
  }
}

}  // namespace

void linear_avx2(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  switch (a.type) {
    case kQ8_0: run<Q8_0>(a, o_begin, o_end); break;
    case kQ4_0: run<Q4_0>(a, o_begin, o_end); break;
    case kQ4_1: run<Q4_1>(a, o_begin, o_end); break;
    default: break;
  }
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
