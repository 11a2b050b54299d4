// The AVX-512 path (AVX512F + FMA + F16C): one block of a weight row is dequantized into two
// zmm registers (16 floats each), then multiplied into up to kRows activation rows, each with
// its own two accumulators: one weight read and one dequantization serve them all.
//
// Compiled with a function-level target (the pragma below), not -march: the module runs on
// every x86-64 CPU, and linear.cpp calls this file only where the CPU reports these features.
#include "blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")

namespace kvledger::quant {
namespace {

constexpr int kRows = 8;
constexpr int64_t kPrefetch = 2048;  // bytes ahead: the hardware prefetcher stops at each 4 KiB page
constexpr int64_t kOutChunk = 64;  // weight rows kept hot in L1/L2 while every row tile passes

static inline float scale(const uint8_t* p) { return _cvtsh_ss(read_u16(p)); }

struct Q8_0 {
  static constexpr int kBytes = 34;
  static inline void load(const uint8_t* b, __m512& w0, __m512& w1) {
    const __m512 d = _mm512_set1_ps(scale(b));
    const __m128i* q = reinterpret_cast<const __m128i*>(b + 2);
    w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
    w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
  }
};

// The 16 bytes of a Q4 block as values 0..15 (low nibbles) and 16..31 (high nibbles).
static inline void nibbles(const uint8_t* qs, __m512& lo, __m512& hi) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i mask = _mm512_set1_epi32(15);
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, mask));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}

struct Q4_0 {
  static constexpr int kBytes = 18;
  static inline void load(const uint8_t* b, __m512& w0, __m512& w1) {
    const __m512 d = _mm512_set1_ps(scale(b));
    const __m512 off = _mm512_set1_ps(-8.f);
    __m512 lo, hi;
    nibbles(b + 2, lo, hi);
    w0 = _mm512_mul_ps(d, _mm512_add_ps(lo, off));
    w1 = _mm512_mul_ps(d, _mm512_add_ps(hi, off));
  }
};

struct Q4_1 {
  static constexpr int kBytes = 20;
  static inline void load(const uint8_t* b, __m512& w0, __m512& w1) {
    const __m512 d = _mm512_set1_ps(scale(b));
    const __m512 m = _mm512_set1_ps(scale(b + 2));
    __m512 lo, hi;
    nibbles(b + 4, lo, hi);
    w0 = _mm512_fmadd_ps(lo, d, m);
    w1 = _mm512_fmadd_ps(hi, d, m);
  }
};

template <class Q, int R>
void tile(const LinearArgs& a, const float* x, float* y, int64_t o_begin, int64_t o_end) {
  const int64_t nb = a.in / kBlock;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = a.w + o * a.row_bytes;
    for (int64_t l = 0; l < a.row_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch + l), _MM_HINT_T0);
    __m512 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512 w0, w1;
      Q::load(row + b * Q::kBytes, w0, w1);
      const float* xb = x + b * kBlock;
      for (int r = 0; r < R; ++r) {
        acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb + r * a.ldx), acc0[r]);
        acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + r * a.ldx + 16), acc1[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * a.ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
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

void linear_avx512(const LinearArgs& a, int64_t o_begin, int64_t o_end) {
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
