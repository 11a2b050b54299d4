// One KV block's keys [lo, hi) folded into the online-softmax state (m, l, acc) of the G query
// heads that share a KV head: paged_decode.cpp's inner step, in two forms.
//
// `attend_block` is the portable form, for every dtype and head dimension. With AVX-512 (the
// module is built with -march=native) a float32, bfloat16 or float16 cache with a head
// dimension of 32, 64 or 128 takes `attend_block_avx512`: a 16-bit cache's rows widen to
// float32 as they load (exactly: every bfloat16 and float16 value is a float32 value), so it
// computes what the float32 form computes on the widened cache, reading half the bytes. A
// head's step is a chain of dependent operations (scores -> block maximum -> exp -> value
// sums) that the portable loop runs head after head, one key at a time; here up to four heads
// go through each stage together, so their chains interleave, and each stage is whole
// vectors: 16 keys' scores are reduced together into one vector (a transpose of their partial
// sums, not one horizontal sum per key), the exp is an inline polynomial, each value row is
// loaded once for all the heads, and the value sums stay in registers for the whole block.
// Both forms compute the same sums in float32, in a different order (within ~1e-6 of each
// other).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvledger {

#if defined(__AVX512F__)
// 16 cache values as float32: a bfloat16 is a float32's upper half, a float16 widens by
// vcvtph2ps (AVX512F); both exact.
template <typename C>
inline __m512 load16(const C* p) {
  if constexpr (std::is_same_v<C, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<C, c10::BFloat16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    static_assert(std::is_same_v<C, c10::Half>, "a float32, bfloat16 or float16 cache");
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// Whether a cache of this dtype has the AVX-512 forms.
template <typename C>
constexpr bool kWideLoads = std::is_same_v<C, float> || std::is_same_v<C, c10::BFloat16> ||
                            std::is_same_v<C, c10::Half>;
#endif

// qf: G x D scaled queries; kb, vb: this KV head's row of the block's first key, `row` floats
// from one key to the next; scores: G x block_size scratch; m, l: G; acc: G x D.
template <typename T, int64_t kD>
inline void attend_block(const float* qf, int64_t G, int64_t D, const T* kb, const T* vb,
                         int64_t row, int64_t bs, int64_t lo, int64_t hi, float* scores,
                         float* m, float* l, float* acc) {
  const float kLowest = std::numeric_limits<float>::lowest();
  if (kD) D = kD;
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = qf + g * D;
    float* sg = scores + g * bs;
    float bmax = kLowest;
    for (int64_t t = lo; t < hi; ++t) {
      const T* kr = kb + t * row;
      float dot = 0.f;
      for (int64_t d = 0; d < D; ++d) dot += qg[d] * static_cast<float>(kr[d]);
      sg[t] = dot;
      bmax = std::max(bmax, dot);
    }
    const float mnew = std::max(m[g], bmax);
    // m starts at the lowest finite float, so the first block's correction is exp(-huge) = 0
    // with no infinity involved (the build assumes finite math to vectorize exp).
    const float correction = std::exp(m[g] - mnew);
    for (int64_t t = lo; t < hi; ++t) sg[t] = std::exp(sg[t] - mnew);  // vectorized
    float* ag = acc + g * D;
    float sum = l[g] * correction;
    for (int64_t d = 0; d < D; ++d) ag[d] *= correction;
    for (int64_t t = lo; t < hi; ++t) {
      const float p = sg[t];
      sum += p;
      const T* vr = vb + t * row;
      for (int64_t d = 0; d < D; ++d) ag[d] += p * static_cast<float>(vr[d]);
    }
    m[g] = mnew;
    l[g] = sum;
  }
}

#if defined(__AVX512F__)

// exp(x) for x <= 0 (scores minus their running maximum): x = n ln2 + r, |r| <= ln2 / 2, and
// e^r by its Taylor series to r^7 (relative error ~6e-9, below float32's rounding), scaled by
// 2^n with scalef, which goes to 0 without a denormal trap below -87.
static inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));  // e^-104 is 0 in float32
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// out[j] = the sum of v[j]'s 16 lanes, for 16 vectors at once: a transpose by pairwise
// shuffles and adds (45 operations, against ~8 for each vector's own reduction).
static inline __m512 sum_lanes16(const __m512* v) {
  __m512 a[8], c[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (x0+x2, y0+y2, x1+x3, y1+y3)
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the four vectors' partial sums, in order
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Heads [0, NG) of qf (NG at once: their chains of dependent operations, scores -> maximum
// -> exp -> value sums, interleave instead of waiting one after another), keys [lo, hi) taken
// 16 at a time (any block size). kD in {32, 64, 128}.
template <typename C, int64_t kD, int NG>
inline void attend_heads_avx512(const float* qf, const C* kb, const C* vb, int64_t row,
                                int64_t lo, int64_t hi, float* m, float* l, float* acc) {
  constexpr int kC = static_cast<int>(kD / 16);
  // independent sums per value accumulator: at least 8 chains of FMAs in flight
  constexpr int kSets = NG * kC >= 8 ? 1 : 8 / (NG * kC);
  const __m512 lowest = _mm512_set1_ps(std::numeric_limits<float>::lowest());
  __m512 a[kSets][NG][kC];
  for (int h = 0; h < NG; ++h)
    for (int c = 0; c < kC; ++c) {
      a[0][h][c] = _mm512_loadu_ps(acc + h * kD + 16 * c);
      for (int k = 1; k < kSets; ++k) a[k][h][c] = _mm512_setzero_ps();
    }
  float mh[NG], lh[NG];
  for (int h = 0; h < NG; ++h) mh[h] = m[h], lh[h] = l[h];
  for (int64_t t0 = lo; t0 < hi; t0 += 16) {
    const int64_t count = std::min<int64_t>(16, hi - t0);
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1u);
    __m512 p[NG];
    for (int h = 0; h < NG; ++h) {
      __m512 q[kC], dots[16];
      for (int c = 0; c < kC; ++c) q[c] = _mm512_loadu_ps(qf + h * kD + 16 * c);
      for (int64_t j = 0; j < 16; ++j) {  // keys past `count` may lie past the block: not read
        if (j >= count) {
          dots[j] = _mm512_setzero_ps();
          continue;
        }
        const C* kr = kb + (t0 + j) * row;
        dots[j] = _mm512_mul_ps(q[0], load16(kr));
        for (int c = 1; c < kC; ++c) dots[j] = _mm512_fmadd_ps(q[c], load16(kr + 16 * c), dots[j]);
      }
      p[h] = _mm512_mask_mov_ps(lowest, valid, sum_lanes16(dots));
    }
    alignas(64) float mnew[16], prev[16];
    for (int h = 0; h < NG; ++h) {
      mnew[h] = std::max(mh[h], _mm512_reduce_max_ps(p[h]));
      prev[h] = mh[h] - mnew[h];
      p[h] = _mm512_maskz_mov_ps(valid, exp_nonpositive(_mm512_sub_ps(p[h], _mm512_set1_ps(mnew[h]))));
    }
    // every head's correction e^(m - mnew) in one vector exp (the first block's: e^-huge = 0)
    alignas(64) float corr[16];
    _mm512_store_ps(corr, exp_nonpositive(_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << NG) - 1u), prev)));
    alignas(64) float ps[NG][16];
    for (int h = 0; h < NG; ++h) {
      lh[h] = lh[h] * corr[h] + _mm512_reduce_add_ps(p[h]);
      mh[h] = mnew[h];
      const __m512 ch = _mm512_set1_ps(corr[h]);
      for (int k = 0; k < kSets; ++k)
        for (int c = 0; c < kC; ++c) a[k][h][c] = _mm512_mul_ps(a[k][h][c], ch);
      _mm512_store_ps(ps[h], p[h]);
    }
    for (int64_t j = 0; j < count; ++j) {
      const C* vr = vb + (t0 + j) * row;
      const int k = static_cast<int>(j % kSets);
      __m512 v[kC];
      for (int c = 0; c < kC; ++c) v[c] = load16(vr + 16 * c);
      for (int h = 0; h < NG; ++h) {
        const __m512 ph = _mm512_set1_ps(ps[h][j]);
        for (int c = 0; c < kC; ++c) a[k][h][c] = _mm512_fmadd_ps(ph, v[c], a[k][h][c]);
      }
    }
  }
  for (int h = 0; h < NG; ++h) {
    for (int c = 0; c < kC; ++c) {
      __m512 sum = a[0][h][c];
      for (int k = 1; k < kSets; ++k) sum = _mm512_add_ps(sum, a[k][h][c]);
      _mm512_storeu_ps(acc + h * kD + 16 * c, sum);
    }
    m[h] = mh[h];
    l[h] = lh[h];
  }
}

// The G heads in groups of up to kMax (their accumulators, kMax x kD / 16 registers, stay in
// registers).
template <typename C, int64_t kD>
inline void attend_block_avx512(const float* qf, int64_t G, const C* kb, const C* vb,
                                int64_t row, int64_t lo, int64_t hi, float* m, float* l,
                                float* acc) {
  constexpr int kMax = kD >= 128 ? 2 : 4;
  for (int64_t h0 = 0; h0 < G; h0 += kMax) {
    const float* q = qf + h0 * kD;
    float *mh = m + h0, *lh = l + h0, *ah = acc + h0 * kD;
    switch (std::min<int64_t>(kMax, G - h0)) {
      case 4: attend_heads_avx512<C, kD, kMax >= 4 ? 4 : 1>(q, kb, vb, row, lo, hi, mh, lh, ah); break;
      case 3: attend_heads_avx512<C, kD, kMax >= 3 ? 3 : 1>(q, kb, vb, row, lo, hi, mh, lh, ah); break;
      case 2: attend_heads_avx512<C, kD, 2>(q, kb, vb, row, lo, hi, mh, lh, ah); break;
      default: attend_heads_avx512<C, kD, 1>(q, kb, vb, row, lo, hi, mh, lh, ah); break;
    }
  }
}

#endif  // __AVX512F__

// The block step for this dtype and head dimension: the AVX-512 form where it applies.
template <typename T, int64_t kD>
inline void attend(const float* qf, int64_t G, int64_t D, const T* kb, const T* vb, int64_t row,
                   int64_t bs, int64_t lo, int64_t hi, float* scores, float* m, float* l,
                   float* acc) {
#if defined(__AVX512F__)
  if constexpr (kWideLoads<T> && kD > 0 && kD % 16 == 0) {
    attend_block_avx512<T, kD>(qf, G, kb, vb, row, lo, hi, m, l, acc);
    return;
  }
#endif
  attend_block<T, kD>(qf, G, D, kb, vb, row, bs, lo, hi, scores, m, l, acc);
}

}  // namespace kvledger
