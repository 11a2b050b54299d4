// Shared-prefix (cascade) decode attention: sequences whose block tables begin with the same
// blocks (a system prompt the prefix cache serves to all of them) attend over those blocks
// together, as one product of all their query rows with each key and value, instead of once
// per sequence. paged_decode.cpp then goes on from these softmax states over each sequence's
// own blocks.
//
// Why: the per-sequence kernel (decode_block.h) reads a row-major key block and must transpose
// 16 partial sums per head to get 16 scores; it spends ~600 cycles a block for SmolLM2's 3
// query heads. Here a group's query rows (16 sequences x 3 heads = 48 in the chat benchmark)
// are transposed once, so a key's scores for 16 rows are one chain of FMAs with nothing to
// reduce across lanes, the softmax runs 16 rows to a vector, and each value row is loaded
// once for several rows' sums. The states are the same float32 online softmax (m, l,
// unnormalized acc), merged like flash-decoding's parts; the result differs from the
// per-sequence kernel only in the order of float32 sums (~1e-7 here).
#pragma once

#include "decode_block.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvledger {

// Softmax states of every (sequence, KV head, query head of the group) row over the blocks the
// sequence shares with its group: m, l [n * Hkv * G], acc [n * Hkv * G * D]; a sequence in no
// group keeps the empty state (m lowest, l 0, acc 0) and skips no block.
struct PrefixStates {
  std::vector<float> m, l, acc;
  std::vector<int64_t> skip;  // leading blocks of each sequence's table already attended
};

namespace prefix {

constexpr int64_t kChunkKeys = 128;  // keys scored before one softmax update

#if defined(__AVX512F__)
// NV row vectors (16 rows each) by 4 keys: 4 x NV accumulators, in registers because every
// count is known at compile time (a run-time count spilled them to the stack, 5x slower).
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

// The states of every grouped sequence over its group's shared blocks. group_of[s]: the group
// of sequence s or -1; group_blocks[g]: the leading blocks all of group g's sequences share
// (their tables agree there and each one's context covers them: checked by the caller).
// Work is split over (group, KV head) and, with fewer of those than twice the threads, over
// ranges of the shared blocks, merged at the end.
template <typename T, int64_t kD>
void shared_prefix_states(const T* qp, const T* kp, const T* vp, const int64_t* tables,
                          int64_t width, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                          int64_t bs, float scale, const int64_t* group_of,
                          const int64_t* group_blocks, int64_t groups, PrefixStates& out) {
  if (kD) D = kD;
  const int64_t G = H / Hkv, row = Hkv * D, block = bs * row;
  const float kLowest = std::numeric_limits<float>::lowest();
  out.m.assign(n * Hkv * G, kLowest);
  out.l.assign(n * Hkv * G, 0.f);
  out.acc.assign(n * Hkv * G * D, 0.f);
  out.skip.assign(n, 0);
  std::vector<std::vector<int64_t>> members(groups);
  for (int64_t s = 0; s < n; ++s)
    if (group_of[s] >= 0) {
      members[group_of[s]].push_back(s);
      out.skip[s] = group_blocks[group_of[s]];
    }
  const int64_t threads = at::get_num_threads(), base = groups * Hkv;
  const int64_t parts = threads == 1 || base >= 2 * threads ? 1 : (2 * threads + base - 1) / base;
  // each job's states: rows of its group, job after job
  std::vector<int64_t> offset(groups * Hkv * parts + 1, 0);
  for (int64_t job = 0; job < groups * Hkv * parts; ++job)
    offset[job + 1] = offset[job] + static_cast<int64_t>(members[job / (Hkv * parts)].size()) * G;
  std::vector<float> jm(offset.back(), kLowest), jl(offset.back(), 0.f), jacc(offset.back() * D, 0.f);

  at::parallel_for(0, groups * Hkv * parts, 1, [&](int64_t begin, int64_t end) {
    // whole blocks a chunk: one block of more than kChunkKeys keys is a chunk of its own
    const int64_t per_chunk = std::max<int64_t>(1, prefix::kChunkKeys / bs);
    const int64_t chunk = per_chunk * bs;
    std::vector<float> Qt, ST, mv, lv, cv, conv;  // conv: a chunk's K and V in float32
    std::vector<const float*> krows(chunk), vrows(chunk);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t g = job / (Hkv * parts), kvh = job / parts % Hkv, part = job % parts;
      const std::vector<int64_t>& mem = members[g];
      const int64_t R = static_cast<int64_t>(mem.size()) * G, Rpad = (R + 15) / 16 * 16;
      const int64_t P = group_blocks[g], b_begin = P * part / parts, b_end = P * (part + 1) / parts;
      const int64_t* table = tables + mem[0] * width;
      float* acc = jacc.data() + offset[job] * D;
      Qt.assign(D * Rpad, 0.f);
      ST.resize(chunk * Rpad);
      mv.assign(Rpad, kLowest);
      lv.assign(Rpad, 0.f);
      cv.resize(Rpad);
      for (size_t i = 0; i < mem.size(); ++i)
        for (int64_t h = 0; h < G; ++h)
          for (int64_t d = 0; d < D; ++d)
            Qt[d * Rpad + static_cast<int64_t>(i) * G + h] =
                static_cast<float>(qp[(mem[i] * H + kvh * G + h) * D + d]) * scale;
      prefix::prefetch_blocks(kp, vp, table, b_begin, std::min(b_end, b_begin + per_chunk),
                              block, bs, row, kvh * D, D);
      for (int64_t c0 = b_begin; c0 < b_end; c0 += per_chunk) {
        const int64_t c1 = std::min(b_end, c0 + per_chunk), keys = (c1 - c0) * bs;
        prefix::prefetch_blocks(kp, vp, table, c1, std::min(b_end, c1 + per_chunk), block, bs,
                                row, kvh * D, D);
        krows.resize(keys);
        vrows.resize(keys);
        if constexpr (!std::is_same_v<T, float>) conv.resize(2 * keys * D);
        for (int64_t j = 0; j < keys; ++j) {
          const int64_t at = table[c0 + j / bs] * block + (j % bs) * row + kvh * D;
          if constexpr (std::is_same_v<T, float>) {  // read in place
            krows[j] = kp + at;
            vrows[j] = vp + at;
          } else {
            float* kf = conv.data() + j * D;
            float* vf = conv.data() + (keys + j) * D;
            for (int64_t d = 0; d < D; ++d) kf[d] = static_cast<float>(kp[at + d]);
            for (int64_t d = 0; d < D; ++d) vf[d] = static_cast<float>(vp[at + d]);
            krows[j] = kf;
            vrows[j] = vf;
          }
        }
        prefix::scores<kD>(Qt.data(), Rpad, D, krows.data(), keys, ST.data());
        prefix::softmax_update(ST.data(), R, Rpad, D, keys, mv.data(), lv.data(), cv.data(), acc);
        prefix::values<kD>(ST.data(), R, Rpad, D, vrows.data(), keys, acc);
      }
      std::copy_n(mv.data(), R, jm.data() + offset[job]);
      std::copy_n(lv.data(), R, jl.data() + offset[job]);
    }
  });

  // Merge each row's parts (rescaled to the largest m) into its sequence's state.
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (size_t i = 0; i < members[g].size(); ++i)
        for (int64_t h = 0; h < G; ++h) {
          const int64_t r = static_cast<int64_t>(i) * G + h;
          const int64_t dst = (members[g][i] * Hkv + kvh) * G + h;
          const int64_t first = (g * Hkv + kvh) * parts;
          float mmax = kLowest;
          for (int64_t j = 0; j < parts; ++j) mmax = std::max(mmax, jm[offset[first + j] + r]);
          float sum = 0.f;
          float* acc = out.acc.data() + dst * D;
          for (int64_t j = 0; j < parts; ++j) {
            const float w = parts == 1 ? 1.f : std::exp(jm[offset[first + j] + r] - mmax);
            sum += w * jl[offset[first + j] + r];
            const float* src = jacc.data() + (offset[first + j] + r) * D;
            for (int64_t d = 0; d < D; ++d) acc[d] += w * src[d];
          }
          out.m[dst] = mmax;
          out.l[dst] = sum;
        }
}

}  // namespace kvledger
