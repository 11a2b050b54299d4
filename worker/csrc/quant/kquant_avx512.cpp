// The AVX-512 path (AVX512F/BW + FMA + F16C) for the K-quants Q4_K, Q5_K, Q6_K (kquants.h) and
// Q5_0, Q5_1 (blocks.h), the types avx512.cpp does not read. The shape is avx512.cpp's: the 32
// values of a (sub-)block are dequantized into two zmm registers, then multiplied into up to
// kRows activation rows, two accumulators each, so one decode of a weight serves eight rows.
// A weight is dequantized exactly as kquant_avx2.cpp does it (the super-block's factors from
// kquants_avx2.h, then one FMA or product of a quant and its factors): both paths multiply the
// same float32 weights, and the result equals `x @ dequantize(W).T` up to the order of the sums.
#include "blocks.h"
#include "kquants.h"

#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

#include "kquants_avx2.h"

constexpr int kRows = 8;
constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page
constexpr int64_t kOutChunk = 64;    // weight rows kept hot in L1/L2 while every row tile passes

// 16 consecutive bytes widened to 16 int32 lanes.
static inline __m512i bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

static inline __m512i bits(__m512i v, int shift, int mask) {
  return _mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask));
}

// Q5_0 / Q5_1: values 0-15 are the low nibbles, 16-31 the high ones; bit j of qh is value j's
// fifth bit.
template <bool kOne>
struct Q5 {
  static constexpr int kValues = kBlock, kBytes = kOne ? 24 : 22;
  struct Factors {};
  static inline void factors(const uint8_t*, Factors&) {}
  static inline void load(const uint8_t* b, const Factors&, int, __m512* w) {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(read_u16(b)));
    const __m512 m = _mm512_set1_ps(kOne ? _cvtsh_ss(read_u16(b + 2)) : -16.f);
    const __m512i qh = _mm512_set1_epi32(static_cast<int>(read_u32(b + (kOne ? 4 : 2))));
    const __m512i nib = bytes16(b + (kOne ? 8 : 6));
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int i = 0; i < 2; ++i) {
      const __m512i lo = bits(nib, 4 * i, 15);
      const __m512i shift = _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * i));
      const __m512i hi = _mm512_slli_epi32(bits(_mm512_srlv_epi32(qh, shift), 0, 1), 4);
      const __m512 q = _mm512_cvtepi32_ps(_mm512_or_si512(lo, hi));
      // Q5_1: d * q + m; Q5_0: d * (q - 16), the offset exact in float before the product
      w[i] = kOne ? _mm512_fmadd_ps(q, d, m) : _mm512_mul_ps(d, _mm512_add_ps(q, m));
    }
  }
};

// Q4_K / Q5_K: sub-block g's 32 values.
template <bool kFive>
struct K45 {
  static constexpr int kValues = kSuper, kBytes = kFive ? 176 : 144;
  struct Factors {
    float d[8], m[8];
  };
  static inline void factors(const uint8_t* b, Factors& f) { k4_factors_avx2(b, f.d, f.m); }
  static inline void load(const uint8_t* b, const Factors& f, int g, __m512* w) {
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (g / 2);
    const __m512 d = _mm512_set1_ps(f.d[g]), m = _mm512_set1_ps(f.m[g]);
    for (int i = 0; i < 2; ++i) {
      __m512i q = bits(bytes16(qs + 16 * i), 4 * (g % 2), 15);
      if (kFive) q = _mm512_or_si512(q, _mm512_slli_epi32(bits(bytes16(b + 16 + 16 * i), g, 1), 4));
      w[i] = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(q), m);
    }
  }
};

// Q6_K: the super-block's 256 quants are assembled as int8 (q - 32) once, 64 at a time with byte
// operations (each half h's 64 ql bytes hold sub-blocks 4h..4h+3 in their nibbles, its 32 qh
// bytes their high two bits), then sub-block g's 32 values are widened from there, each 16 with
// its own factor: a few instructions per 16 values where unpacking each from the bytes took ~11.
struct K6 {
  static constexpr int kValues = kSuper, kBytes = 210;
  struct Factors {
    alignas(64) int8_t q[kSuper];
    float f[16];
  };
  static inline void factors(const uint8_t* b, Factors& f) {
    k6_factors_avx2(b, f.f);
    const __m512i low4 = _mm512_set1_epi8(15), low2 = _mm512_set1_epi8(3), off = _mm512_set1_epi8(32);
    // per 16-bit lane: shift the first 32 bytes' qh by 0 (k = 0) or 4 (k = 2), the last by 2 or 6
    const __m512i s01 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i s23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      const __m512i h01 = _mm512_and_si512(_mm512_srlv_epi16(qh, s01), low2);
      const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(qh, s23), low2);
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(h01, 4));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), _mm512_slli_epi16(h23, 4));
      _mm512_store_si512(f.q + 128 * h, _mm512_sub_epi8(q01, off));
      _mm512_store_si512(f.q + 128 * h + 64, _mm512_sub_epi8(q23, off));
    }
  }
  static inline void load(const uint8_t*, const Factors& f, int g, __m512* w) {
    for (int i = 0; i < 2; ++i) {
      const __m128i q = _mm_load_si128(reinterpret_cast<const __m128i*>(f.q + 32 * g + 16 * i));
      w[i] = _mm512_mul_ps(_mm512_set1_ps(f.f[2 * g + i]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
  }
};

template <class Q, int R>
void tile(const LinearArgs& a, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const int64_t nb = a.in / Q::kValues;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch + l), _MM_HINT_T0);
    __m512 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = row + b * Q::kBytes;
      typename Q::Factors f;
      Q::factors(block, f);
      for (int g = 0; g < Q::kValues / kBlock; ++g) {
        __m512 w[2];
        Q::load(block, f, g, w);
        const float* xb = x + b * Q::kValues + g * kBlock;
        for (int r = 0; r < R; ++r) {
          acc0[r] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xb + r * a.ldx), acc0[r]);
          acc1[r] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xb + r * a.ldx + 16), acc1[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) y[r * a.ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
  }
}

// Q4_K at up to kFactoredRows rows: d_g * sum(q * x) - m_g * sum(x) per sub-block, the sums of
// x per 32 values (`sx`, taken once per call) shared by every weight row. A quant converts to
// float exactly and meets x directly, so a sub-block pair costs 2 widenings, 4 conversions and
// per row 6 float operations, where dequantizing first costs ~24 shared and 4 per row: fewer
// operations up to ~6 rows, and one activation row (a decode at c=1) is where it counts. The
// same products as dequantizing first, rounded in another order.
constexpr int kFactoredRows = 4;

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
void factored_q4k(const LinearArgs& a, const float* sx, int64_t o_begin, int64_t o_end) {
  const int64_t ns = a.in / kSuper, nsub = a.in / kBlock;
  const __m512i mask = _mm512_set1_epi32(15);
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch + l), _MM_HINT_T0);
    __m512 acc0[R], acc1[R];
    __m256 cacc[R];
    for (int r = 0; r < R; ++r) {
      acc0[r] = acc1[r] = _mm512_setzero_ps();
      cacc[r] = _mm256_setzero_ps();
    }
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* blk = row + s * 144;
      alignas(32) float dg[8], mg[8];
      k4_factors_avx2(blk, dg, mg);
      for (int r = 0; r < R; ++r)
        cacc[r] = _mm256_fnmadd_ps(_mm256_load_ps(mg), _mm256_loadu_ps(sx + r * nsub + s * 8), cacc[r]);
      for (int j = 0; j < 4; ++j) {
        const __m512i v0 = bytes16(blk + 16 + 32 * j), v1 = bytes16(blk + 32 + 32 * j);
        const __m512 e0 = _mm512_cvtepi32_ps(_mm512_and_si512(v0, mask));
        const __m512 e1 = _mm512_cvtepi32_ps(_mm512_and_si512(v1, mask));
        const __m512 u0 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v0, 4));
        const __m512 u1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v1, 4));
        const __m512 de = _mm512_set1_ps(dg[2 * j]), du = _mm512_set1_ps(dg[2 * j + 1]);
        for (int r = 0; r < R; ++r) {
          const float* xb = a.x + r * a.ldx + s * kSuper + 64 * j;
          __m512 se = _mm512_mul_ps(e0, _mm512_loadu_ps(xb));
          se = _mm512_fmadd_ps(e1, _mm512_loadu_ps(xb + 16), se);
          __m512 su = _mm512_mul_ps(u0, _mm512_loadu_ps(xb + 32));
          su = _mm512_fmadd_ps(u1, _mm512_loadu_ps(xb + 48), su);
          acc0[r] = _mm512_fmadd_ps(de, se, acc0[r]);
          acc1[r] = _mm512_fmadd_ps(du, su, acc1[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      a.y[r * a.ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + hsum8(cacc[r]);
  }
}

// The sums of each 32 values of a.x's rows, into the calling thread's scratch.
const float* block_sums(const LinearArgs& a) {
  const int64_t nsub = a.in / kBlock;
  thread_local std::vector<float> sums;
  sums.resize(a.rows * nsub);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t b = 0; b < nsub; ++b) {
      const float* xb = a.x + r * a.ldx + b * kBlock;
      sums[r * nsub + b] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)));
    }
  return sums.data();
}

void run_q4k(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  const float* sx = block_sums(a);
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kOutChunk) {
    const int64_t o1 = o0 + kOutChunk < o_end ? o0 + kOutChunk : o_end;
    switch (a.rows) {
      case 4: factored_q4k<4>(a, sx, o0, o1); break;
      case 3: factored_q4k<3>(a, sx, o0, o1); break;
      case 2: factored_q4k<2>(a, sx, o0, o1); break;
      case 1: factored_q4k<1>(a, sx, o0, o1); break;
      default: break;
    }
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
      case 7: tile<Q, 7>(a, x, y, o0, o1); break;
      case 6: tile<Q, 6>(a, x, y, o0, o1); break;
      case 5: tile<Q, 5>(a, x, y, o0, o1); break;
      case 4: tile<Q, 4>(a, x, y, o0, o1); break;
      case 3: tile<Q, 3>(a, x, y, o0, o1); break;
      case 2: tile<Q, 2>(a, x, y, o0, o1); break;
      case 1: tile<Q, 1>(a, x, y, o0, o1); break;
      default: break;
    }
  }
}

}  // namespace

void linear_avx512_k(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  switch (a.type) {
    case kQ5_0: run<Q5<false>>(a, o_begin, o_end); break;
    case kQ5_1: run<Q5<true>>(a, o_begin, o_end); break;
    case kQ4_K:
      if (a.rows <= kFactoredRows) run_q4k(a, o_begin, o_end);
      else run<K45<false>>(a, o_begin, o_end);
      break;
    case kQ5_K: run<K45<true>>(a, o_begin, o_end); break;
    case kQ6_K: run<K6>(a, o_begin, o_end); break;
    default: break;
  }
}

}  // namespace kvledger::quant

#pragma GCC pop_options
#endif  // __x86_64__
