// The decoder's elementwise steps as single passes: RMSNorm (with the residual add before it),
// SiLU-and-mul, and the split of the packed qkv projection with RoPE applied to q and k; and
// the greedy sampler's argmax; and the KV cache write of a step's keys and values.
//
// In torch each of these is 3-10 ops, and at decode sizes (one to a few dozen rows of a few
// hundred values) every op costs more in dispatch and allocation than in arithmetic: a batch-1
// decode step of tiny-llama spent most of each layer's time there (docs/performance.md,
// "Sampler and elementwise kernels").
//
// Every kernel computes what the torch code it replaces computes (worker/layers/), rounding
// to the tensor's dtype at the same points, so bfloat16 and float16 agree with transformers as
// the torch ops do; in float32 only the order of the RMSNorm sum differs (~1e-7 relative).
// Rows are split across torch's intra-op threads only when there are enough of them to pay
// for it (a prefill, not a decode step).
#include "ops.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

namespace kvledger {
namespace {

// Rows below this many are computed on the calling thread: waking the pool costs more.
constexpr int64_t kRowsPerTask = 16;

template <typename T>
inline T round_to(float v) {
  return static_cast<T>(v);
}

// out = weight * (s / sqrt(mean(s^2) + eps)) where s is x (+ residual, written to sum).
// As transformers' LlamaRMSNorm: the norm in float32, cast to T, then scaled by the weight in T.
template <typename T>
void rms_norm_rows(const T* x, const T* residual, const T* weight, T* out, T* sum, int64_t rows,
                   int64_t n, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      float* f = buf.data();
      if (residual != nullptr) {
        const T* rr = residual + r * n;
        T* sr = sum + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const T s = round_to<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
          sr[i] = s;
          f[i] = static_cast<float>(s);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(xr[i]);
      }
      float squares = 0.f;
      for (int64_t i = 0; i < n; ++i) squares += f[i] * f[i];
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
      T* o = out + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const T normed = round_to<T>(f[i] * inv);
        o[i] = round_to<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
      }
    }
  });
}

void check_norm(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: the weight must match the last dimension");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x and weight dtypes differ");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.size(-1), rows = n ? xc.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(xc.data_ptr<scalar_t>(), nullptr, wc.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), nullptr, rows, n, static_cast<float>(eps));
  });
  return out;
}

std::vector<at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                     const at::Tensor& weight, double eps) {
  check_norm(x, weight);
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(),
              "add_rms_norm: x and residual differ in shape or dtype");
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc), sum = at::empty_like(xc);
  const int64_t n = xc.size(-1), rows = n ? xc.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    rms_norm_rows<scalar_t>(xc.data_ptr<scalar_t>(), rc.data_ptr<scalar_t>(),
                            wc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                            sum.data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
  });
  return {out, sum};
}

// [..., 2N] = [gate | up] -> [..., N]: silu(gate) rounded to the dtype, times up (as torch's
// F.silu(gate) * up).
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
              "silu_and_mul: the last dimension must be even");
  const at::Tensor xc = gate_up.contiguous();
  const int64_t n2 = xc.size(-1), n = n2 / 2, rows = n2 ? xc.numel() / n2 : 0;
  std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, xc.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* src = xc.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gate = src + r * n2;
        const scalar_t* up = gate + n;
        scalar_t* o = dst + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const float g = static_cast<float>(gate[i]);
          const scalar_t silu = round_to<scalar_t>(g / (1.f + std::exp(-g)));
          o[i] = round_to<scalar_t>(static_cast<float>(silu) * static_cast<float>(up[i]));
        }
      }
    });
  });
  return out;
}

// qkv [T, (H + 2 Hkv) * D] (rows may be strided); cos, sin [T, ..., D/2] in qkv's dtype.
// Returns q [T, H, D] and k [T, Hkv, D] rotated in Llama's rotate-half layout (the first half
// of each head pairs with the second), and v [T, Hkv, D], each contiguous. Each product is
// rounded to the dtype before the sum, as torch's `x1 * cos - x2 * sin` does.
std::vector<at::Tensor> split_rope(const at::Tensor& qkv, const at::Tensor& cos,
                                   const at::Tensor& sin, int64_t num_heads,
                                   int64_t num_kv_heads, int64_t head_dim) {
  const int64_t T = qkv.size(0), H = num_heads, Hkv = num_kv_heads, D = head_dim, half = D / 2;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (H + 2 * Hkv) * D && D % 2 == 0,
              "split_rope: qkv must be [T, (H + 2 Hkv) * D] with an even D");
  TORCH_CHECK(qkv.stride(1) == 1, "split_rope: qkv rows must be contiguous");
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(c.numel() == T * half && s.numel() == T * half &&
                  c.scalar_type() == qkv.scalar_type() && s.scalar_type() == qkv.scalar_type(),
              "split_rope: cos and sin must hold D/2 values per token, in qkv's dtype");
  at::Tensor q = at::empty({T, H, D}, qkv.options());
  at::Tensor k = at::empty({T, Hkv, D}, qkv.options());
  at::Tensor v = at::empty({T, Hkv, D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "split_rope", [&] {
    using T_ = scalar_t;
    const T_* src = qkv.data_ptr<T_>();
    const T_* cp = c.data_ptr<T_>();
    const T_* sp = s.data_ptr<T_>();
    T_* qp = q.data_ptr<T_>();
    T_* kp = k.data_ptr<T_>();
    T_* vp = v.data_ptr<T_>();
    const int64_t stride = qkv.stride(0);
    auto rotate = [&](const T_* in, T_* out, int64_t heads, const T_* ct, const T_* st) {
      for (int64_t h = 0; h < heads; ++h) {
        const T_* x = in + h * D;
        T_* o = out + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half], cc = ct[i], ss = st[i];
          const float a = static_cast<float>(round_to<T_>(x1 * cc));
          const float b = static_cast<float>(round_to<T_>(x2 * ss));
          const float e = static_cast<float>(round_to<T_>(x2 * cc));
          const float f = static_cast<float>(round_to<T_>(x1 * ss));
          o[i] = round_to<T_>(a - b);
          o[i + half] = round_to<T_>(e + f);
        }
      }
    };
    at::parallel_for(0, T, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T_* row = src + t * stride;
        const T_* ct = cp + t * half;
        const T_* st = sp + t * half;
        rotate(row, qp + t * H * D, H, ct, st);
        rotate(row + H * D, kp + t * Hkv * D, Hkv, ct, st);
        std::memcpy(vp + t * Hkv * D, row + (H + Hkv) * D, sizeof(T_) * Hkv * D);
      }
    });
  });
  return {q, k, v};
}

// [N, V] -> [N] int64: the index of each row's largest value, the first one where several tie
// (torch.argmax's rule). torch's CPU argmax over a vocabulary row runs many times slower than
// a sum over it: this takes the row's max, then finds its first occurrence. Both passes run in
// 16-wide chunks of independent lanes so that they vectorize: the max as 16 running maxima, the
// search as "does this chunk hold it" before a scalar look inside (a scalar search took most of
// the time; docs/performance.md, "Sampler and elementwise kernels").
// Rows must be finite: the sampler masks the rows that are not before it draws (with fast
// math, NaN compares are not kept).
template <typename T>
int64_t argmax_row(const T* row, int64_t V) {
  constexpr int64_t kLanes = 16;
  float best = static_cast<float>(row[0]);
  int64_t i = 0;
  if (V >= kLanes) {
    float lane[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = static_cast<float>(row[l]);
    for (i = kLanes; i + kLanes <= V; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], static_cast<float>(row[i + l]));
    for (int64_t l = 0; l < kLanes; ++l) best = std::max(best, lane[l]);
  }
  for (; i < V; ++i) best = std::max(best, static_cast<float>(row[i]));
  int64_t at = 0;
  for (; at + kLanes <= V; at += kLanes) {
    bool hit = false;
    for (int64_t l = 0; l < kLanes; ++l) hit |= static_cast<float>(row[at + l]) == best;
    if (hit) break;
  }
  while (at < V - 1 && static_cast<float>(row[at]) != best) ++at;
  return at;
}

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "argmax_rows: logits must be [N, V]");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), V = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "argmax_rows", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(src + r * V, V);
    });
  });
  return out;
}

// k and v [T, Hkv, D] into their caches' slots (a cache viewed as [slots, Hkv, D]): row i to
// slot slot_mapping[i], as two `index_copy_` calls do (tests/worker/test_fused_ops.py compares
// them), in one call. A decode step writes one row a sequence in every layer, and
// the two indexed copies through torch cost more there in per-op overhead than the bytes they
// move.
// float32 rows into a bfloat16 cache (--kv-cache-dtype bfloat16) round to nearest even, as
// torch's conversion does.
void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
              const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(k_cache.device().is_cpu() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.dim() >= 2 &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "write_kv: the caches must be contiguous CPU tensors of one shape and dtype");
  const int64_t heads = k_cache.size(-2), dim = k_cache.size(-1), row = heads * dim;
  const int64_t slots = k_cache.numel() / row;
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1,
              "write_kv: slot_mapping must be int64 [tokens]");
  const int64_t tokens = slot_mapping.size(0);
  const bool narrow = k.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kBFloat16;
  for (const at::Tensor* t : {&k, &v})
    TORCH_CHECK((t->scalar_type() == k_cache.scalar_type() ||
                 (narrow && t->scalar_type() == at::kFloat)) &&
                    t->numel() == tokens * row,
                "write_kv: k and v must be ", k_cache.scalar_type(),
                narrow ? " or float32" : "", " [", tokens, ", ", heads, ", ", dim, "]");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "write_kv: k and v must share a dtype");
  const at::Tensor kc = k.contiguous(), vc = v.contiguous(), sm = slot_mapping.contiguous();
  const int64_t* slot = sm.data_ptr<int64_t>();
  for (int64_t i = 0; i < tokens; ++i)
    TORCH_CHECK(slot[i] >= 0 && slot[i] < slots, "write_kv: slot ", slot[i], " is outside the ",
                slots, " slots of the cache");
  if (narrow) {
    auto* kd = k_cache.data_ptr<c10::BFloat16>();
    auto* vd = v_cache.data_ptr<c10::BFloat16>();
    const float* ks = kc.data_ptr<float>();
    const float* vs = vc.data_ptr<float>();
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t j = 0; j < row; ++j) {
        kd[slot[i] * row + j] = c10::BFloat16(ks[i * row + j]);
        vd[slot[i] * row + j] = c10::BFloat16(vs[i * row + j]);
      }
    return;
  }
  const size_t bytes = static_cast<size_t>(row) * k_cache.element_size();
  auto* kd = static_cast<char*>(k_cache.data_ptr());
  auto* vd = static_cast<char*>(v_cache.data_ptr());
  const auto* ks = static_cast<const char*>(kc.data_ptr());
  const auto* vs = static_cast<const char*>(vc.data_ptr());
  for (int64_t i = 0; i < tokens; ++i) {
    std::memcpy(kd + slot[i] * bytes, ks + i * bytes, bytes);
    std::memcpy(vd + slot[i] * bytes, vs + i * bytes, bytes);
  }
}

}  // namespace kvledger
