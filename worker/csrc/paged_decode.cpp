// Paged decode attention on CPU: each query row (a decode's token, or one token of a prefill
// chunk over a cached prefix: worker/attention/cpu_backend.py) attends over its context, read
// in place from the paged KV cache through its block table (no gather copy).
//
// Layout (worker/runner/kv_cache.py): k_cache, v_cache
// [num_blocks, block_size, num_kv_heads, head_dim].
// Work is split over (sequence, KV head), and with fewer such tasks than twice the threads over
// ranges of a task's blocks too, merged at the end; each task keeps the G = H / Hkv query heads
// that share that KV head together, so every key and value row is read once for all of them. Softmax is
// computed online a block at a time (one rescale per block, not per key) in float32, whatever
// the cache dtype; decode_block.h holds that step (and its AVX-512 forms). The cache is the
// queries' dtype, or bfloat16 under float32 queries (--kv-cache-dtype bfloat16: half the bytes
// a step reads, widened to float32 as they load).
// Sequences grouped by a shared prefix of blocks start from their states over it
// (shared_prefix.h) and attend over their own blocks only.
#include "ops.h"
#include "decode_block.h"
#include "shared_prefix.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvledger {
namespace {

// The next block's rows of this KV head, fetched while this one is computed: a table's blocks
// lie anywhere in the cache, so the hardware prefetcher starts each one with a wait on memory
// (it pays where the context is not in cache; docs/performance.md, "Attention").
template <typename T>
inline void prefetch_block(const T* kp, const T* vp, int64_t offset, int64_t bs, int64_t row,
                           int64_t D) {
  const int64_t bytes = D * static_cast<int64_t>(sizeof(T));
  for (int64_t t = 0; t < bs; ++t) {
    const char* k = reinterpret_cast<const char*>(kp + offset + t * row);
    const char* v = reinterpret_cast<const char*>(vp + offset + t * row);
    for (int64_t line = 0; line < bytes; line += 64) {
      __builtin_prefetch(k + line);
      __builtin_prefetch(v + line);
    }
  }
}

// T: the queries' and output's dtype, C: the cache's. kD: the head dimension when known at
// compile time (the common 32, 64, 128: the dot products and updates over it unroll into whole
// vectors), 0 for any other, read at run time.
template <typename T, typename C, int64_t kD>
void decode_kernel(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
    double scale, const at::Tensor& group_of, const at::Tensor& group_blocks, at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = kD ? kD : q.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t G = H / Hkv, width = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const C* kp = k_cache.data_ptr<C>();
  const C* vp = v_cache.data_ptr<C>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t row = Hkv * D;        // one token's stride in a block
  const int64_t block = bs * row;     // one block's stride
  const float fscale = static_cast<float>(scale);
  const float kLowest = std::numeric_limits<float>::lowest();
  PrefixStates pre;
  const bool grouped = group_blocks.numel() > 0;
  if (grouped)
    shared_prefix_states<T, C, kD>(qp, kp, vp, tables, width, n, H, Hkv, D, bs, fscale,
                                group_of.data_ptr<int64_t>(), group_blocks.data_ptr<int64_t>(),
                                group_blocks.numel(), pre);

  // Fewer (sequence, KV head) tasks than twice the threads (one sequence, few KV heads: 3 tasks
  // on 2 threads leave one idle a third of the time): each task's blocks are cut into `parts`
  // ranges, attended apart, and their softmax states merged (m, l and acc rescaled to the
  // largest m), as flash-decoding splits a long context.
  const int64_t tasks = n * Hkv, threads = at::get_num_threads();
  const int64_t parts = threads == 1 || tasks >= 2 * threads ? 1 : (2 * threads + tasks - 1) / tasks;
  // the parts' states, kept for the merge (only when split: then there are few tasks)
  std::vector<float> pm(parts > 1 ? tasks * parts * G : 0), pl(pm.size()), pacc(pm.size() * D);

  // A task's output from the softmax states of its `count` parts (m, l: G floats each, acc:
  // G x D, part after part): each rescaled to the largest m (an empty part has l = 0 and
  // weighs exp(-huge) = 0), summed, normalized. One part: acc / l, as without a split.
  auto write_out = [&](int64_t task, const float* m, const float* l, const float* acc, int64_t count) {
    const int64_t s = task / Hkv, kvh = task % Hkv;
    std::vector<float> w(count, 1.f);
    for (int64_t g = 0; g < G; ++g) {
      float mmax = kLowest, sum = 0.f;
      for (int64_t j = 0; j < count; ++j) mmax = std::max(mmax, m[j * G + g]);
      for (int64_t j = 0; count > 1 && j < count; ++j) w[j] = std::exp(m[j * G + g] - mmax);
      for (int64_t j = 0; j < count; ++j) sum += w[j] * l[j * G + g];
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      T* dst = op + (s * H + kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) {
        float v = 0.f;
        for (int64_t j = 0; j < count; ++j) v += w[j] * acc[(j * G + g) * D + d];
        dst[d] = static_cast<T>(v * inv);
      }
    }
  };

  at::parallel_for(0, tasks * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), scores(G * bs), own_m(G), own_l(G), own_acc(G * D);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t task = job / parts, part = job % parts;
      const int64_t s = task / Hkv, kvh = task % Hkv;
      const int64_t ctx = lens[s];
      const int64_t first = window > 0 ? std::max<int64_t>(0, ctx - window) : 0;
      const int64_t skip = grouped ? pre.skip[s] : 0;
      const int64_t b_first = std::max(first / bs, skip), b_last = std::min<int64_t>((ctx + bs - 1) / bs, width);
      const int64_t span = std::max<int64_t>(b_last - b_first, 0);
      const int64_t b_begin = b_first + span * part / parts, b_end = b_first + span * (part + 1) / parts;
      float* m = parts > 1 ? pm.data() + job * G : own_m.data();
      float* l = parts > 1 ? pl.data() + job * G : own_l.data();
      float* acc = parts > 1 ? pacc.data() + job * G * D : own_acc.data();
      for (int64_t g = 0; g < G; ++g) {
        const T* src = qp + (s * H + kvh * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(src[d]) * fscale;
      }
      if (grouped && part == 0) {  // the shared prefix's state (empty for an ungrouped sequence)
        std::copy_n(pre.acc.data() + task * G * D, G * D, acc);
        std::copy_n(pre.m.data() + task * G, G, m);
        std::copy_n(pre.l.data() + task * G, G, l);
      } else {
        std::fill(acc, acc + G * D, 0.f);
        std::fill(m, m + G, kLowest);
        std::fill(l, l + G, 0.f);
      }
      for (int64_t b = b_begin; b < b_end; ++b) {
        const int64_t id = tables[s * width + b];
        if (b + 1 < b_end) prefetch_block(kp, vp, tables[s * width + b + 1] * block + kvh * D, bs, row, D);
        const int64_t lo = std::max<int64_t>(first - b * bs, 0);
        const int64_t hi = std::min<int64_t>(ctx - b * bs, bs);
        attend<C, kD>(qf.data(), G, D, kp + id * block + kvh * D, vp + id * block + kvh * D,
                      row, bs, lo, hi, scores.data(), m, l, acc);
      }
      if (parts == 1) write_out(task, m, l, acc, 1);  // the common case: on this thread
    }
  });
  for (int64_t task = 0; parts > 1 && task < tasks; ++task) {
    const int64_t j = task * parts;
    write_out(task, pm.data() + j * G, pl.data() + j * G, pacc.data() + j * G * D, parts);
  }
}

// A group's claim is the kernel's to check, not to trust: its sequences' tables agree over the
// shared blocks and every one of those keys is visible to each of them (no window).
void check_groups(const at::Tensor& tables, const at::Tensor& lens, int64_t bs, int64_t window,
                  const at::Tensor& group_of, const at::Tensor& group_blocks) {
  TORCH_CHECK(group_of.scalar_type() == at::kLong && group_blocks.scalar_type() == at::kLong &&
                  group_of.dim() == 1 && group_blocks.dim() == 1,
              "paged_decode: group_of and group_blocks must be 1-d int64");
  const int64_t n = tables.size(0), width = tables.size(1), groups = group_blocks.numel();
  TORCH_CHECK(group_of.numel() == (groups ? n : group_of.numel()),
              "paged_decode: one group (or -1) per query");
  TORCH_CHECK(groups == 0 || window == 0, "paged_decode: shared prefixes with a sliding window");
  const int64_t* t = tables.data_ptr<int64_t>();
  const int64_t* len = lens.data_ptr<int64_t>();
  const int64_t* of = group_of.data_ptr<int64_t>();
  const int64_t* blocks = group_blocks.data_ptr<int64_t>();
  std::vector<int64_t> first(groups, -1);
  for (int64_t s = 0; groups && s < n; ++s) {
    const int64_t g = of[s];
    TORCH_CHECK(g >= -1 && g < groups, "paged_decode: group ", g, " out of range");
    if (g < 0) continue;
    TORCH_CHECK(blocks[g] >= 1 && blocks[g] <= width && blocks[g] * bs <= len[s],
                "paged_decode: sequence ", s, " does not hold group ", g, "'s ", blocks[g],
                " shared blocks in its context");
    if (first[g] < 0) first[g] = s;
    for (int64_t b = 0; b < blocks[g]; ++b)
      TORCH_CHECK(t[s * width + b] == t[first[g] * width + b], "paged_decode: sequence ", s,
                  "'s block ", b, " is not its group's shared block");
  }
  for (int64_t g = 0; g < groups; ++g)
    TORCH_CHECK(first[g] >= 0, "paged_decode: group ", g, " has no sequence");
}

}  // namespace

// q [n, H, D]; caches [num_blocks, block_size, Hkv, D]; block_tables [n, width] int64;
// context_lens [n] int64 (keys visible to each query: its position + 1); window 0 = none.
// group_of [n] int64 (a shared-prefix group or -1), group_blocks [groups] int64 (the leading
// blocks each group's tables share); both empty: no groups.
at::Tensor paged_decode_shared(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
    double scale, const at::Tensor& group_of, const at::Tensor& group_blocks) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode: q [n, H, D], caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0,
              "paged_decode: head_dim differs or H is not a multiple of Hkv");
  const bool wide_q = q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK((q.scalar_type() == k_cache.scalar_type() || wide_q) &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "paged_decode: the caches must share q's dtype, or be bfloat16 under float32 q");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "paged_decode: block_tables and context_lens must be int64");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0),
              "paged_decode: one block table and one context length per query");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode: caches must be contiguous");
  const at::Tensor qc = q.contiguous();
  const at::Tensor tables = block_tables.contiguous();
  const at::Tensor lens = context_lens.contiguous();
  const at::Tensor of = group_of.contiguous(), blocks = group_blocks.contiguous();
  check_groups(tables, lens, k_cache.size(1), window, of, blocks);
  at::Tensor out = at::empty_like(qc);
  auto run = [&](auto q_type, auto cache_type) {
    using T = decltype(q_type);
    using C = decltype(cache_type);
    switch (q.size(2)) {
      case 32: return decode_kernel<T, C, 32>(qc, k_cache, v_cache, tables, lens, window, scale, of, blocks, out);
      case 64: return decode_kernel<T, C, 64>(qc, k_cache, v_cache, tables, lens, window, scale, of, blocks, out);
      case 128: return decode_kernel<T, C, 128>(qc, k_cache, v_cache, tables, lens, window, scale, of, blocks, out);
      default: return decode_kernel<T, C, 0>(qc, k_cache, v_cache, tables, lens, window, scale, of, blocks, out);
    }
  };
  if (wide_q) {
    run(float{}, c10::BFloat16{});
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode",
                                  [&] { run(scalar_t{}, scalar_t{}); });
  return out;
}

at::Tensor paged_decode(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
    double scale) {
  const at::Tensor none = at::empty({0}, block_tables.options().dtype(at::kLong));
  return paged_decode_shared(q, k_cache, v_cache, block_tables, context_lens, window, scale,
                             none, none);
}

}  // namespace kvledger
