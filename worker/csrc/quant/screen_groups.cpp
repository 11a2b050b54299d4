// The candidate groups of the int8 screen (worker/layers/int8_screen.py), from its approximate
// logits, in two passes over them instead of a handful of [rows, vocab] tensors in Python:
//
//   kvledger_quant::candidate_groups(approx [R, P] float32, scale [R] float32,
//                                    norms [P] float32, x_norm [R] float32,
//                                    residuals [P] float32 or [0], slack float, vocab int)
//       -> groups [n] int64
//
// With e_rj = scale[r] norms[j] + slack (+ x_norm[r] residuals[j] where residuals are given),
// row r's floor is max over tokens j < vocab of (a_rj - e_rj), and the groups returned,
// ascending, are those of sixteen tokens where some row's a_rj + e_rj reaches its floor: the
// groups of every candidate (P is a whole number of groups; tokens past vocab are padding).
// The float32 arithmetic is the Python reference's (`Int8ScreenedArgmax.bounds`), up to a
// contraction into one rounding, which the bound's slack covers either way.


#include <algorithm>
#include <limits>
#include <vector>

#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvledger::quant {
namespace {

constexpr int64_t kGroup = 16;
constexpr float kLowest = -std::numeric_limits<float>::infinity();

struct Rows {
  const float* approx;
  const float* scale;
  const float* norms;
  const float* x_norm;
  const float* residuals;  // nullptr: none
  float slack;
  int64_t padded;
  int64_t vocab;
};

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")

// e of sixteen tokens from `at`, the residual term only where there is one.
inline __m512 err16(const Rows& in, int64_t at, __m512 s, __m512 xn, __m512 slack) {
  __m512 e = _mm512_fmadd_ps(s, _mm512_loadu_ps(in.norms + at), slack);
  if (in.residuals != nullptr) e = _mm512_fmadd_ps(xn, _mm512_loadu_ps(in.residuals + at), e);
  return e;
}

// Row r's floor, then the groups where its a + e reaches it, marked in `picked`. Padding tokens
// (from vocab on) are masked out of both passes; P is whole groups, so every load is in bounds.
void row_groups(const Rows& in, int64_t r, char* picked) {
  const float* a = in.approx + r * in.padded;
  const __m512 s = _mm512_set1_ps(in.scale[r]), xn = _mm512_set1_ps(in.x_norm[r]);
  const __m512 slack = _mm512_set1_ps(in.slack);
  const int64_t groups = in.padded / kGroup;
  auto live = [&](int64_t g) -> __mmask16 {
    const int64_t left = in.vocab - g * kGroup;
    return left >= kGroup ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
  };
  __m512 lo = _mm512_set1_ps(kLowest);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = g * kGroup;
    const __m512 low = _mm512_sub_ps(_mm512_loadu_ps(a + at), err16(in, at, s, xn, slack));
    lo = _mm512_mask_max_ps(lo, live(g), lo, low);
  }
  const __m512 floor = _mm512_set1_ps(_mm512_reduce_max_ps(lo));
  for (int64_t g = 0; g < groups; ++g) {
    if (picked[g]) continue;
    const int64_t at = g * kGroup;
    const __m512 high = _mm512_add_ps(_mm512_loadu_ps(a + at), err16(in, at, s, xn, slack));
    picked[g] = _mm512_mask_cmp_ps_mask(live(g), high, floor, _CMP_GE_OQ) != 0;
  }
}

#pragma GCC pop_options
#endif  // __x86_64__

void check(const at::Tensor& t, int64_t numel, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                  t.numel() == numel,
              "candidate_groups: ", name, " must be contiguous CPU float32 of ", numel, " values");
}

at::Tensor candidate_groups(const at::Tensor& approx, const at::Tensor& scale,
                            const at::Tensor& norms, const at::Tensor& x_norm,
                            const at::Tensor& residuals, double slack, int64_t vocab) {
  TORCH_CHECK(approx.dim() == 2 && approx.size(0) > 0, "candidate_groups: approx must be [rows, P]");
  const int64_t rows = approx.size(0), padded = approx.size(1);
  TORCH_CHECK(padded % kGroup == 0 && vocab > padded - kGroup && vocab <= padded,
              "candidate_groups: ", padded, " logits are not the groups of ", vocab, " tokens");
  check(approx, rows * padded, "approx");
  check(scale, rows, "scale");
  check(norms, padded, "norms");
  check(x_norm, rows, "x_norm");
  TORCH_CHECK(residuals.numel() == 0 || residuals.numel() == padded,
              "candidate_groups: residuals must be empty or [", padded, "]");
  if (residuals.numel() != 0) check(residuals, padded, "residuals");
  const Rows in{approx.data_ptr<float>(),
                scale.data_ptr<float>(),
                norms.data_ptr<float>(),
                x_norm.data_ptr<float>(),
                residuals.numel() != 0 ? residuals.data_ptr<float>() : nullptr,
                static_cast<float>(slack),
                padded,
                vocab};
  TORCH_CHECK(cpu_has(kAvx512), "candidate_groups: this CPU has no AVX-512");
  const int64_t groups = padded / kGroup;
  std::vector<char> picked(static_cast<size_t>(groups), 0);
#if defined(__x86_64__)
  // rows one after another: a row's marks let the next skip the groups already picked
  for (int64_t r = 0; r < rows; ++r) row_groups(in, r, picked.data());
#endif
  const int64_t n = std::count(picked.begin(), picked.end(), 1);
  at::Tensor out = at::empty({n}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (int64_t g = 0; g < groups; ++g)
    if (picked[g]) *dst++ = g;
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvledger_quant, m) {
  m.def(
      "candidate_groups(Tensor approx, Tensor scale, Tensor norms, Tensor x_norm, "
      "Tensor residuals, float slack, int vocab) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) { m.impl("candidate_groups", &candidate_groups); }

}  // namespace kvledger::quant
