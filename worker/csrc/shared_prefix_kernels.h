// The micro-kernels of shared-prefix attention (shared_prefix.h): a chunk of keys against a
// block of query rows, laid out one lane per row. Scores come out transposed (a key's scores
// for 16 rows are one vector: one chain of FMAs of the rows' transposed queries by the key's
// values broadcast, nothing reduced across lanes); the softmax folds a chunk into each row's
// (m, l, acc) 16 rows to a vector; the value sums load each value row once for a tile of
// rows. Each tile's counts are compile-time constants so its accumulators stay in registers
// (a run-time count spilled them to the stack, several times slower). AVX-512 forms for
// float32 and a head dimension of 32, 64 or 128; portable loops otherwise.
#pragma once

#include "decode_block.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvledger {

namespace prefix {

constexpr int64_t kChunkKeys = 128;  // keys scored before one softmax update

#if defined(__AVX512F__)
// NV row vectors (16 rows each) by 4 keys: 4 x NV accumulators, in registers because every
// count is known at compile time (a run-time count spilled them to the stack, several times
// slower).
template <int64_t kD, int NV>
inline void scores_tile(const float* Qt, int64_t Rpad, const float* const* k, float* ST,
                        int nk) {
  __m512 a[4][NV];
  for (int jj = 0; jj < 4; ++jj)
    for (int v = 0; v < NV; ++v) a[jj][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < kD; ++d) {
    __m512 q[NV];
    for (int v = 0; v < NV; ++v) q[v] = _mm512_loadu_ps(Qt + d * Rpad + 16 * v);
    for (int jj = 0; jj < 4; ++jj) {
      const __m512 kd = _mm512_set1_ps(k[jj][d]);
      for (int v = 0; v < NV; ++v) a[jj][v] = _mm512_fmadd_ps(q[v], kd, a[jj][v]);
    }
  }
  for (int jj = 0; jj < nk; ++jj)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(ST + jj * Rpad + 16 * v, a[jj][v]);
}
#endif

// A chunk's scores, transposed: ST[j][r] = Q[r] . K[j] for keys j < keys and rows r < Rpad
// (Qt: D x Rpad, the rows' queries transposed and zero-padded to a multiple of 16). One lane
// per row: a key's scores for 16 rows are a chain of D FMAs of the row vector of Qt by the
// key's d-th value broadcast, so nothing is reduced across lanes.
template <int64_t kD>
inline void scores(const float* Qt, int64_t Rpad, int64_t D, const float* const* krows,
                   int64_t keys, float* ST) {
  if (kD) D = kD;
#if defined(__AVX512F__)
  if constexpr (kD > 0) {
    for (int64_t r0 = 0; r0 < Rpad; r0 += 64) {
      const int64_t nv = std::min<int64_t>(4, (Rpad - r0) / 16);
      for (int64_t j0 = 0; j0 < keys; j0 += 4) {
        const int nk = static_cast<int>(std::min<int64_t>(4, keys - j0));
        const float* k[4];  // a short tail repeats its last key, not stored
        for (int jj = 0; jj < 4; ++jj) k[jj] = krows[j0 + std::min(jj, nk - 1)];
        const float* q = Qt + r0;
        float* st = ST + j0 * Rpad + r0;
        switch (nv) {
          case 4: scores_tile<kD, 4>(q, Rpad, k, st, nk); break;
          case 3: scores_tile<kD, 3>(q, Rpad, k, st, nk); break;
          case 2: scores_tile<kD, 2>(q, Rpad, k, st, nk); break;
          default: scores_tile<kD, 1>(q, Rpad, k, st, nk); break;
        }
      }
    }
    return;
  }
#endif
  for (int64_t j = 0; j < keys; ++j) {
    float* s = ST + j * Rpad;
    std::fill(s, s + Rpad, 0.f);
    for (int64_t d = 0; d < D; ++d) {
      const float kd = krows[j][d];
      const float* q = Qt + d * Rpad;
      for (int64_t r = 0; r < Rpad; ++r) s[r] += q[r] * kd;
    }
  }
}

// Folds a chunk's transposed scores into each row's state (m, l: Rpad; acc: R x D), leaving
// e^(s - m) in ST.
inline void softmax_update(float* ST, int64_t R, int64_t Rpad, int64_t D, int64_t keys,
                           float* m, float* l, float* corr, float* acc) {
#if defined(__AVX512F__)
  for (int64_t r0 = 0; r0 < Rpad; r0 += 16) {
    __m512 mx = _mm512_loadu_ps(m + r0);
    for (int64_t j = 0; j < keys; ++j) mx = _mm512_max_ps(mx, _mm512_loadu_ps(ST + j * Rpad + r0));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; ++j) {
      const __m512 p = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(ST + j * Rpad + r0), mx));
      _mm512_storeu_ps(ST + j * Rpad + r0, p);
      sum = _mm512_add_ps(sum, p);
    }
    // m starts at the lowest finite float: the first chunk's correction is e^-huge = 0
    const __m512 c = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(m + r0), mx));
    _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), c, sum));
    _mm512_storeu_ps(m + r0, mx);
    _mm512_storeu_ps(corr + r0, c);
  }
#else
  for (int64_t r = 0; r < Rpad; ++r) {
    float mx = m[r], sum = 0.f;
    for (int64_t j = 0; j < keys; ++j) mx = std::max(mx, ST[j * Rpad + r]);
    for (int64_t j = 0; j < keys; ++j) sum += (ST[j * Rpad + r] = std::exp(ST[j * Rpad + r] - mx));
    corr[r] = std::exp(m[r] - mx);
    l[r] = l[r] * corr[r] + sum;
    m[r] = mx;
  }
#endif
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= corr[r];
}

#if defined(__AVX512F__)
// NR rows' value sums over the chunk's keys, NR x kD / 16 accumulators in registers.
template <int64_t kD, int NR>
inline void values_tile(const float* PT, int64_t Rpad, const float* const* vrows, int64_t keys,
                        float* acc) {
  constexpr int C = static_cast<int>(kD / 16);
  __m512 a[NR][C];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_loadu_ps(acc + r * kD + 16 * c);
  for (int64_t j = 0; j < keys; ++j) {
    __m512 v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_ps(vrows[j] + 16 * c);
    for (int r = 0; r < NR; ++r) {
      const __m512 p = _mm512_set1_ps(PT[j * Rpad + r]);
      for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(p, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + r * kD + 16 * c, a[r][c]);
}
#endif

// acc[r] += sum_j PT[j][r] V[j] over keys j (V's rows through vrows), rows r < R.
template <int64_t kD>
inline void values(const float* PT, int64_t R, int64_t Rpad, int64_t D, const float* const* vrows,
                   int64_t keys, float* acc) {
  if (kD) D = kD;
#if defined(__AVX512F__)
  if constexpr (kD > 0 && kD % 16 == 0) {
    constexpr int kRows = kD >= 128 ? 2 : kD == 64 ? 4 : 8;  // 16 accumulators
    int64_t r0 = 0;
    for (; r0 + kRows <= R; r0 += kRows) values_tile<kD, kRows>(PT + r0, Rpad, vrows, keys, acc + r0 * kD);
    for (; r0 < R; ++r0) values_tile<kD, 1>(PT + r0, Rpad, vrows, keys, acc + r0 * kD);
    return;
  }
#endif
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t r = 0; r < R; ++r) {
      const float p = PT[j * Rpad + r];
      for (int64_t d = 0; d < D; ++d) acc[r * D + d] += p * vrows[j][d];
    }
}

// One cache row of D values as float32 (exact for a 16-bit cache: every bfloat16 and float16
// value is a float32 value); whole vectors where the width is known.
template <int64_t kD, typename C>
inline void widen(const C* src, float* dst, int64_t D) {
#if defined(__AVX512F__)
  if constexpr (kD > 0 && kD % 16 == 0 && kWideLoads<C>) {
    for (int64_t d = 0; d < kD; d += 16) _mm512_storeu_ps(dst + d, load16(src + d));
    return;
  }
#endif
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]);
}

// Starts fetching the rows of blocks [b0, b1) of this KV head: the shared blocks of every
// layer do not stay in cache between steps (SmolLM2's 400 shared tokens are 0.6 MB a layer),
// and their rows lie 16 to a block anywhere in the cache, where the hardware prefetcher
// starts every block with a wait on memory.
template <typename T>
inline void prefetch_blocks(const T* kp, const T* vp, const int64_t* table, int64_t b0,
                            int64_t b1, int64_t block, int64_t bs, int64_t row, int64_t offset,
                            int64_t D) {
  const int64_t bytes = D * static_cast<int64_t>(sizeof(T));
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0; t < bs; ++t) {
      const char* k = reinterpret_cast<const char*>(kp + table[b] * block + t * row + offset);
      const char* v = reinterpret_cast<const char*>(vp + table[b] * block + t * row + offset);
      for (int64_t line = 0; line < bytes; line += 64) {
        __builtin_prefetch(k + line);
        __builtin_prefetch(v + line);
      }
    }
}

}  // namespace prefix

}  // namespace kvledger
