// Shared-prefix (cascade) decode attention: sequences whose block tables begin with the same
// blocks (a system prompt the prefix cache serves to all of them) attend over those blocks
// together, as one product of all their query rows with each key and value, instead of once
// per sequence. paged_decode.cpp then goes on from these softmax states over each sequence's
// own blocks. A row is a query token: a decode's one, or each token of a prefill chunk over
// a cached prefix (worker/attention/cpu_backend.py). shared_prefix_kernels.h holds the
// micro-kernels.
//
// Why: the per-sequence kernel (decode_block.h) reads a row-major key block and must transpose
// 16 partial sums per head to get 16 scores, and runs far below the FMA peak for SmolLM2's 3
// query heads (docs/performance.md, "Attention"). Here a group's query rows (16 sequences x 3
// heads = 48 in the chat benchmark) are transposed once, so a key's scores for 16 rows are one
// chain of FMAs with nothing to reduce across lanes, the softmax runs 16 rows to a vector, and
// each value row is loaded once for several rows' sums. The states are the same float32 online softmax (m, l,
// unnormalized acc), merged like flash-decoding's parts; the result differs from the
// per-sequence kernel only in the order of float32 sums (~1e-7 here).
#pragma once

#include "shared_prefix_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace kvledger {

// Softmax states of every (sequence, KV head, query head of the group) row over the blocks the
// sequence shares with its group: m, l [n * Hkv * G], acc [n * Hkv * G * D]; a sequence in no
// group keeps the empty state (m lowest, l 0, acc 0) and skips no block.
struct PrefixStates {
  std::vector<float> m, l, acc;
  std::vector<int64_t> skip;  // leading blocks of each sequence's table already attended
};

// The states of every grouped sequence over its group's shared blocks. group_of[s]: the group
// of sequence s or -1; group_blocks[g]: the leading blocks all of group g's sequences share
// (their tables agree there and each one's context covers them: checked by the caller).
// A group's rows (member after member, G query heads each) are cut into blocks of up to
// kRowBlock, each (group, KV head, row block) a task: a block's transposed queries and scores
// stay in the core's cache (a prefill's 576 x 3 rows at once would not), and tasks need no
// merge. With fewer tasks than twice the threads (a decode step: one block of 48 rows a KV
// head) each task's shared blocks are cut into parts too, merged at the end.
constexpr int64_t kRowBlock = 256;

template <typename T, typename C, int64_t kD>
void shared_prefix_states(const T* qp, const C* kp, const C* vp, const int64_t* tables,
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
  struct Task {
    int64_t g, kvh, r0, rows;
  };
  std::vector<Task> tasks;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t R = static_cast<int64_t>(members[g].size()) * G;
    for (int64_t kvh = 0; kvh < Hkv; ++kvh)
      for (int64_t r0 = 0; r0 < R; r0 += kRowBlock)
        tasks.push_back({g, kvh, r0, std::min(kRowBlock, R - r0)});
  }
  const int64_t nt = static_cast<int64_t>(tasks.size()), threads = at::get_num_threads();
  const int64_t parts = threads == 1 || nt >= 2 * threads ? 1 : (2 * threads + nt - 1) / nt;
  // where row r of task t lands in `out`: (member, KV head, query head)
  auto dst = [&](const Task& t, int64_t r) {
    const int64_t i = (t.r0 + r) / G, h = (t.r0 + r) % G;
    return (members[t.g][i] * Hkv + t.kvh) * G + h;
  };
  // the parts' states, kept for the merge (only when split: then there are few tasks)
  std::vector<int64_t> offset(parts > 1 ? nt * parts + 1 : 0, 0);
  for (int64_t job = 0; parts > 1 && job < nt * parts; ++job)
    offset[job + 1] = offset[job] + tasks[job / parts].rows;
  const int64_t kept = offset.empty() ? 0 : offset.back();
  std::vector<float> jm(kept, kLowest), jl(kept, 0.f), jacc(kept * D, 0.f);

  at::parallel_for(0, nt * parts, 1, [&](int64_t begin, int64_t end) {
    // whole blocks a chunk: one block of more than kChunkKeys keys is a chunk of its own
    const int64_t per_chunk = std::max<int64_t>(1, prefix::kChunkKeys / bs);
    const int64_t chunk = per_chunk * bs;
    std::vector<float> Qt, ST, mv, lv, cv, acc, conv;  // conv: a chunk's K and V in float32
    std::vector<const float*> krows(chunk), vrows(chunk);
    for (int64_t job = begin; job < end; ++job) {
      const Task& t = tasks[job / parts];
      const int64_t part = job % parts, R = t.rows, Rpad = (R + 15) / 16 * 16;
      const std::vector<int64_t>& mem = members[t.g];
      const int64_t P = group_blocks[t.g], b_begin = P * part / parts, b_end = P * (part + 1) / parts;
      const int64_t* table = tables + mem[0] * width;
      Qt.assign(D * Rpad, 0.f);
      ST.resize(chunk * Rpad);
      mv.assign(Rpad, kLowest);
      lv.assign(Rpad, 0.f);
      cv.resize(Rpad);
      acc.assign(R * D, 0.f);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (t.r0 + r) / G, h = (t.r0 + r) % G;
        const T* src = qp + (mem[i] * H + t.kvh * G + h) * D;
        for (int64_t d = 0; d < D; ++d) Qt[d * Rpad + r] = static_cast<float>(src[d]) * scale;
      }
      prefix::prefetch_blocks(kp, vp, table, b_begin, std::min(b_end, b_begin + per_chunk),
                              block, bs, row, t.kvh * D, D);
      for (int64_t c0 = b_begin; c0 < b_end; c0 += per_chunk) {
        const int64_t c1 = std::min(b_end, c0 + per_chunk), keys = (c1 - c0) * bs;
        prefix::prefetch_blocks(kp, vp, table, c1, std::min(b_end, c1 + per_chunk), block, bs,
                                row, t.kvh * D, D);
        krows.resize(keys);
        vrows.resize(keys);
        if constexpr (!std::is_same_v<C, float>) conv.resize(2 * keys * D);
        for (int64_t j = 0; j < keys; ++j) {
          const int64_t at = table[c0 + j / bs] * block + (j % bs) * row + t.kvh * D;
          if constexpr (std::is_same_v<C, float>) {  // read in place
            krows[j] = kp + at;
            vrows[j] = vp + at;
          } else {  // widened once a chunk: the micro-kernels read each key many times
            float* kf = conv.data() + j * D;
            float* vf = conv.data() + (keys + j) * D;
            prefix::widen<kD>(kp + at, kf, D);
            prefix::widen<kD>(vp + at, vf, D);
            krows[j] = kf;
            vrows[j] = vf;
          }
        }
        prefix::scores<kD>(Qt.data(), Rpad, D, krows.data(), keys, ST.data());
        prefix::softmax_update(ST.data(), R, Rpad, D, keys, mv.data(), lv.data(), cv.data(),
                               acc.data());
        prefix::values<kD>(ST.data(), R, Rpad, D, vrows.data(), keys, acc.data());
      }
      if (parts == 1) {  // the common case: straight into the sequences' states
        for (int64_t r = 0; r < R; ++r) {
          const int64_t at = dst(t, r);
          out.m[at] = mv[r];
          out.l[at] = lv[r];
          std::copy_n(acc.data() + r * D, D, out.acc.data() + at * D);
        }
      } else {
        std::copy_n(mv.data(), R, jm.data() + offset[job]);
        std::copy_n(lv.data(), R, jl.data() + offset[job]);
        std::copy_n(acc.data(), R * D, jacc.data() + offset[job] * D);
      }
    }
  });

  // Merge each row's parts (rescaled to the largest m; an empty part weighs e^-huge = 0).
  for (int64_t ti = 0; parts > 1 && ti < nt; ++ti)
    for (int64_t r = 0; r < tasks[ti].rows; ++r) {
      const int64_t at = dst(tasks[ti], r);
      float mmax = kLowest, sum = 0.f;
      for (int64_t j = 0; j < parts; ++j) mmax = std::max(mmax, jm[offset[ti * parts + j] + r]);
      float* acc = out.acc.data() + at * D;
      for (int64_t j = 0; j < parts; ++j) {
        const int64_t from = offset[ti * parts + j] + r;
        const float w = std::exp(jm[from] - mmax);
        sum += w * jl[from];
        for (int64_t d = 0; d < D; ++d) acc[d] += w * jacc[from * D + d];
      }
      out.m[at] = mmax;
      out.l[at] = sum;
    }
}

}  // namespace kvledger
