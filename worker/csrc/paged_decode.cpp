// Paged decode attention on CPU: one query token per sequence attends over its context, read in
// place from the paged KV cache through its block table (no gather copy).
//
// Layout (worker/runner/kv_cache.py): k_cache, v_cache
// [num_blocks, block_size, num_kv_heads, head_dim].
// Work is split over (sequence, KV head); each task keeps the G = H / Hkv query heads that share
// that KV head together, so every key and value row is read once for all of them. Softmax is
// computed online a block at a time (one rescale per block, not per key) in float32, whatever
// the cache dtype.
#include "ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvledger {
namespace {

// kD: the head dimension when known at compile time (the common 32, 64, 128: the dot products
// and updates over it unroll into whole vectors), 0 for any other, read at run time.
template <typename T, int64_t kD>
void decode_kernel(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
    double scale, at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = kD ? kD : q.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t G = H / Hkv, width = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t row = Hkv * D;        // one token's stride in a block
  const int64_t block = bs * row;     // one block's stride
  const float fscale = static_cast<float>(scale);
  const float kLowest = std::numeric_limits<float>::lowest();

  at::parallel_for(0, n * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), scores(G * bs), m(G), l(G);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / Hkv, kvh = task % Hkv;
      const int64_t ctx = lens[s];
      const int64_t first = window > 0 ? std::max<int64_t>(0, ctx - window) : 0;
      for (int64_t g = 0; g < G; ++g) {
        const T* src = qp + (s * H + kvh * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(src[d]) * fscale;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kLowest);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t b = first / bs; b * bs < ctx && b < width; ++b) {
        const int64_t id = tables[s * width + b];
        const int64_t lo = std::max<int64_t>(first - b * bs, 0);
        const int64_t hi = std::min<int64_t>(ctx - b * bs, bs);
        const T* kb = kp + id * block + kvh * D;
        const T* vb = vp + id * block + kvh * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qf.data() + g * D;
          float* sg = scores.data() + g * bs;
          float bmax = kLowest;
          for (int64_t t = lo; t < hi; ++t) {
            const T* kr = kb + t * row;
            float dot = 0.f;
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * static_cast<float>(kr[d]);
            sg[t] = dot;
            bmax = std::max(bmax, dot);
          }
          const float mnew = std::max(m[g], bmax);
          // m starts at the lowest finite float, so the first block's correction is exp(-huge)
          // = 0 with no infinity involved (the build assumes finite math to vectorize exp).
          const float correction = std::exp(m[g] - mnew);
          for (int64_t t = lo; t < hi; ++t) sg[t] = std::exp(sg[t] - mnew);  // vectorized
          float* ag = acc.data() + g * D;
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
      for (int64_t g = 0; g < G; ++g) {
        T* dst = op + (s * H + kvh * G + g) * D;
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[g * D + d] * inv);
      }
    }
  });
}

}  // namespace

// q [n, H, D]; caches [num_blocks, block_size, Hkv, D]; block_tables [n, width] int64;
// context_lens [n] int64 (keys visible to each query: its position + 1); window 0 = none.
at::Tensor paged_decode(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
    double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode: q [n, H, D], caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0,
              "paged_decode: head_dim differs or H is not a multiple of Hkv");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "paged_decode: q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "paged_decode: block_tables and context_lens must be int64");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0),
              "paged_decode: one block table and one context length per query");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode: caches must be contiguous");
  const at::Tensor qc = q.contiguous();
  const at::Tensor tables = block_tables.contiguous();
  const at::Tensor lens = context_lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    switch (q.size(2)) {
      case 32: return decode_kernel<scalar_t, 32>(qc, k_cache, v_cache, tables, lens, window, scale, out);
      case 64: return decode_kernel<scalar_t, 64>(qc, k_cache, v_cache, tables, lens, window, scale, out);
      case 128: return decode_kernel<scalar_t, 128>(qc, k_cache, v_cache, tables, lens, window, scale, out);
      default: return decode_kernel<scalar_t, 0>(qc, k_cache, v_cache, tables, lens, window, scale, out);
    }
  });
  return out;
}

}  // namespace kvledger
