// One KV block's keys [lo, hi) folded into the online-softmax state (m, l, acc) of the G query
// heads that share a KV head: paged_decode.cpp's inner step, in two forms.
//
// `attend_block` is the portable form, for every dtype and head dimension. With AVX-512 (the
// module is built with -march=native) a float32 cache with a head dimension of 32, 64 or 128
// takes `attend_block_avx512`: the scores of 16 keys are reduced together into one vector (a
// transpose of their partial sums, not one horizontal sum per key), so the block's maximum,
// exp (a polynomial, inline: no call into libm) and sum are single vector operations, and the
// value rows go into accumulators held in registers for the whole block, several independent
// sums each so that the FMAs do not wait on one another. Both forms compute the same sums in float32, in a different order
// (within ~1e-6 of each other).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvledger {

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

// The float32 form for kD in {32, 64, 128}, keys taken 16 at a time (any block size).
template <int64_t kD>
inline void attend_block_avx512(const float* qf, int64_t G, const float* kb, const float* vb,
                                int64_t row, int64_t lo, int64_t hi, float* m, float* l,
                                float* acc) {
  constexpr int C = static_cast<int>(kD / 16);
  constexpr int kSets = C >= 8 ? 1 : 8 / C;
  const __m512 lowest = _mm512_set1_ps(std::numeric_limits<float>::lowest());
  for (int64_t g = 0; g < G; ++g) {
    __m512 q[C], a[C];
    for (int c = 0; c < C; ++c) {
      q[c] = _mm512_loadu_ps(qf + g * kD + 16 * c);
      a[c] = _mm512_loadu_ps(acc + g * kD + 16 * c);
    }
    float mg = m[g], lg = l[g];
    for (int64_t t0 = lo; t0 < hi; t0 += 16) {
      const int64_t count = std::min<int64_t>(16, hi - t0);
      const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1u);
      __m512 dots[16];
      for (int64_t j = 0; j < 16; ++j) {  // keys past `count` may lie past the block: not read
        if (j >= count) {
          dots[j] = _mm512_setzero_ps();
          continue;
        }
        const float* kr = kb + (t0 + j) * row;
        dots[j] = _mm512_mul_ps(q[0], _mm512_loadu_ps(kr));
        for (int c = 1; c < C; ++c) dots[j] = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kr + 16 * c), dots[j]);
      }
      const __m512 sv = _mm512_mask_mov_ps(lowest, valid, sum_lanes16(dots));
      const float mnew = std::max(mg, _mm512_reduce_max_ps(sv));
      const float correction = std::exp(mg - mnew);
      const __m512 p = _mm512_maskz_mov_ps(valid, exp_nonpositive(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
      lg = lg * correction + _mm512_reduce_add_ps(p);
      const __m512 corr = _mm512_set1_ps(correction);
      for (int c = 0; c < C; ++c) a[c] = _mm512_mul_ps(a[c], corr);
      alignas(64) float s[16];
      _mm512_store_ps(s, p);
      // kSets independent sums per accumulator, keys taken in turn: a chain of 16 dependent
      // FMAs would wait on each one's latency (4 cycles) rather than on the FMA units.
      __m512 part[kSets > 1 ? kSets - 1 : 1][C];
      for (int k = 0; k + 1 < kSets; ++k)
        for (int c = 0; c < C; ++c) part[k][c] = _mm512_setzero_ps();
      for (int64_t j = 0; j < count; ++j) {
        const __m512 pj = _mm512_set1_ps(s[j]);
        const float* vr = vb + (t0 + j) * row;
        const int k = static_cast<int>(j % kSets);
        for (int c = 0; c < C; ++c) {
          __m512& sum = k == 0 ? a[c] : part[k - 1][c];
          sum = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * c), sum);
        }
      }
      for (int k = 0; k + 1 < kSets; ++k)
        for (int c = 0; c < C; ++c) a[c] = _mm512_add_ps(a[c], part[k][c]);
      mg = mnew;
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * kD + 16 * c, a[c]);
    m[g] = mg;
    l[g] = lg;
  }
}

#endif  // __AVX512F__

// The block step for this dtype and head dimension: the AVX-512 form where it applies.
template <typename T, int64_t kD>
inline void attend(const float* qf, int64_t G, int64_t D, const T* kb, const T* vb, int64_t row,
                   int64_t bs, int64_t lo, int64_t hi, float* scores, float* m, float* l,
                   float* acc) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && kD > 0 && kD % 16 == 0) {
    attend_block_avx512<kD>(qf, G, kb, vb, row, lo, hi, m, l, acc);
    return;
  }
#endif
  attend_block<T, kD>(qf, G, D, kb, vb, row, bs, lo, hi, scores, m, l, acc);
}

}  // namespace kvledger
