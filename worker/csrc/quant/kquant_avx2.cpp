// The AVX2 path (AVX2 + FMA + F16C) for the types the first AVX2 file (avx2.cpp) does not read:
// the K-quants Q4_K, Q5_K, Q6_K (kquants.h) and Q5_0, Q5_1 (blocks.h). The shape is avx2.cpp's:
// 32 values of a weight row are dequantized into four ymm registers, then multiplied into up to
// kRows activation rows, two accumulators each. A K-quant super-block's sub-block factors
// (d * scale, dmin * min) are computed once per 256 values, as gguf-py computes them; a weight is
// then one FMA (or product) of its quant and those factors: the dequantized weight up to one
// rounding, multiplied in float32, so the result equals `x @ dequantize(W).T` up to the order of
// the sums (and that rounding).
//
// It also serves AVX-512 CPUs, which run AVX2 code: linear.cpp's table falls back to it there.
#include "blocks.h"
#include "kquants.h"

#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvledger::quant {
namespace {

#include "kquants_avx2.h"

constexpr int kRows = 4;
constexpr int64_t kOutChunk = 64;

// 8 consecutive bytes widened to 8 int32 lanes.
static inline __m256i bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

static inline __m256i lanes() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }

// Q5_0 / Q5_1: the nibbles as avx2.cpp's, the fifth bits from qh (bit j for value j).
template <bool kOne>
struct Q5 {
  static constexpr int kValues = kBlock, kBytes = kOne ? 24 : 22;
  struct Factors {};
  static inline void factors(const uint8_t*, Factors&) {}
  static inline void load(const uint8_t* b, const Factors&, int, __m256* w) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(read_u16(b)));
    const __m256 m = _mm256_set1_ps(kOne ? _cvtsh_ss(read_u16(b + 2)) : -16.f);
    const __m256i qh = _mm256_set1_epi32(static_cast<int>(read_u32(b + (kOne ? 4 : 2))));
    const uint8_t* qs = b + (kOne ? 8 : 6);
    const __m256i mask = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    for (int i = 0; i < 4; ++i) {
      const __m256i nib = bytes8(qs + 8 * (i % 2));
      const __m256i lo = i < 2 ? _mm256_and_si256(nib, mask) : _mm256_srli_epi32(nib, 4);
      const __m256i shift = _mm256_add_epi32(lanes(), _mm256_set1_epi32(8 * i));
      const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, shift), one), 4);
      const __m256 q = _mm256_cvtepi32_ps(_mm256_or_si256(lo, hi));
      // Q5_1: d * q + m; Q5_0: d * (q - 16), the offset exact in float before the product
      w[i] = kOne ? _mm256_fmadd_ps(q, d, m) : _mm256_mul_ps(d, _mm256_add_ps(q, m));
    }
  }
};

// Q4_K / Q5_K: sub-block g's 32 values (kquants.h).
template <bool kFive>
struct K45 {
  static constexpr int kValues = kSuper, kBytes = kFive ? 176 : 144;
  struct Factors {
    float d[8], m[8];
  };
  static inline void factors(const uint8_t* b, Factors& f) { k4_factors_avx2(b, f.d, f.m); }
  static inline void load(const uint8_t* b, const Factors& f, int g, __m256* w) {
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (g / 2);
    const __m256i mask = _mm256_set1_epi32(15);
    const __m256 d = _mm256_set1_ps(f.d[g]), m = _mm256_set1_ps(f.m[g]);
    for (int i = 0; i < 4; ++i) {
      __m256i q = _mm256_and_si256(_mm256_srli_epi32(bytes8(qs + 8 * i), 4 * (g % 2)), mask);
      if (kFive) {
        const __m256i h = _mm256_and_si256(_mm256_srli_epi32(bytes8(b + 16 + 8 * i), g), _mm256_set1_epi32(1));
        q = _mm256_or_si256(q, _mm256_slli_epi32(h, 4));
      }
      w[i] = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(q), m);
    }
  }
};

// Q6_K: the super-block's 256 quants assembled as int8 (q - 32) once, 32 at a time with byte
// operations (each half h's 64 ql bytes hold sub-blocks 4h..4h+3 in their nibbles, its 32 qh
// bytes their high two bits), then widened 8 at a time, each 16 values with their factor.
struct K6 {
  static constexpr int kValues = kSuper, kBytes = 210;
  struct Factors {
    alignas(32) int8_t q[kSuper];
    float f[16];
  };
  static inline void factors(const uint8_t* b, Factors& f) {
    k6_factors_avx2(b, f.f);
    const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i lo[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), low2);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[k], _mm256_slli_epi16(hi, 4)), off);
        _mm256_store_si256(reinterpret_cast<__m256i*>(f.q + 128 * h + 32 * k), q);
      }
    }
  }
  static inline void load(const uint8_t*, const Factors& f, int g, __m256* w) {
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(f.q + 32 * g + 8 * i));
      w[i] = _mm256_mul_ps(_mm256_set1_ps(f.f[2 * g + i / 2]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
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
  const int64_t nb = a.in / Q::kValues;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = row + b * Q::kBytes;
      typename Q::Factors f;
      Q::factors(block, f);
      for (int g = 0; g < Q::kValues / kBlock; ++g) {
        __m256 w[4];
        Q::load(block, f, g, w);
        const float* xb = x + b * Q::kValues + g * kBlock;
        for (int r = 0; r < R; ++r) {
          const float* xr = xb + r * a.ldx;
          acc0[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), acc0[r]);
          acc1[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), acc1[r]);
          acc0[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), acc0[r]);
          acc1[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), acc1[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) y[r * a.ldy + o] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
  }
}

// Q4_K at up to kRows rows: d_g * sum(q * x) - m_g * sum(x) per sub-block (as kquant_avx512.cpp
// computes it), the sums of x per 32 values (`sx`) taken once per call, the mins' term added
// into the second accumulator: per sub-block 4 widenings and conversions shared by the rows, and
// per row 5 float operations, where dequantizing first costs ~20 shared and 4 per row.
template <int R>
void factored_q4k(const LinearArgs& a, const float* sx, int64_t o_begin, int64_t o_end) {
  const int64_t ns = a.in / kSuper, nsub = a.in / kBlock;
  const __m256i mask = _mm256_set1_epi32(15);
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < ns; ++s) {
      const uint8_t* blk = row + s * 144;
      alignas(32) float dg[8], mg[8];
      k4_factors_avx2(blk, dg, mg);
      for (int r = 0; r < R; ++r)
        acc1[r] = _mm256_fnmadd_ps(_mm256_load_ps(mg), _mm256_loadu_ps(sx + r * nsub + s * 8), acc1[r]);
      if constexpr (R == 1) {  // one row: a pair's bytes widened once for both sub-blocks
        for (int p = 0; p < 4; ++p) {
          const uint8_t* qs = blk + 16 + 32 * p;
          const float* xb = a.x + s * kSuper + 64 * p;
          __m256 te = _mm256_setzero_ps(), tu = _mm256_setzero_ps();
          for (int i = 0; i < 4; ++i) {
            const __m256i v = bytes8(qs + 8 * i);
            const __m256 e = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
            const __m256 u = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
            te = _mm256_fmadd_ps(e, _mm256_loadu_ps(xb + 8 * i), te);
            tu = _mm256_fmadd_ps(u, _mm256_loadu_ps(xb + 32 + 8 * i), tu);
          }
          acc0[0] = _mm256_fmadd_ps(_mm256_set1_ps(dg[2 * p]), te, acc0[0]);
          acc0[0] = _mm256_fmadd_ps(_mm256_set1_ps(dg[2 * p + 1]), tu, acc0[0]);
        }
        continue;
      }
      for (int j = 0; j < 8; ++j) {  // sub-block j's 32 values: nibbles j % 2 of bytes 32 (j / 2)
        const uint8_t* qs = blk + 16 + 32 * (j / 2);
        __m256 q[4];
        for (int i = 0; i < 4; ++i)
          q[i] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(bytes8(qs + 8 * i), 4 * (j % 2)), mask));
        const __m256 d = _mm256_set1_ps(dg[j]);
        for (int r = 0; r < R; ++r) {
          const float* xb = a.x + r * a.ldx + s * kSuper + 32 * j;
          __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
          t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
          t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
          t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
          acc0[r] = _mm256_fmadd_ps(d, t, acc0[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) a.y[r * a.ldy + o] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
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
      const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
      sums[r * nsub + b] = hsum(v);
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
      case 3: tile<Q, 3>(a, x, y, o0, o1); break;
      case 2: tile<Q, 2>(a, x, y, o0, o1); break;
      case 1: tile<Q, 1>(a, x, y, o0, o1); break;
      default: break;
    }
  }
}

}  // namespace

void linear_avx2_k(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
  switch (a.type) {
    case kQ5_0: run<Q5<false>>(a, o_begin, o_end); break;
    case kQ5_1: run<Q5<true>>(a, o_begin, o_end); break;
    case kQ4_K:
      if (a.rows <= kRows) run_q4k(a, o_begin, o_end);
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
