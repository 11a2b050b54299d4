// The candidate search of the screened greedy LM head (worker/layers/greedy_head.py):
//
//   kvledger_quant::screen_groups(approx [R, V] bfloat16, x_norm [R] float32, norms [V] float32,
//                                 bound float, slack float) -> (floor [R] float32, groups [G] int64)
//
// With e_rj = bound * x_norm[r] * norms[j] + slack, row r's floor is max_j (approx[r][j] - e_rj)
// and token j is one of its candidates when approx[r][j] + e_rj >= floor[r]; `groups` are the
// sixteen-token groups (j / 16) holding any row's candidate, ascending. Two passes over each
// row, in one call, sixteen tokens (a group) a vector on AVX-512, plain C++ elsewhere: as
// torch ops the same search allocated five [R, V] temporaries a step and cost more than the
// screen saves. The bound's float32 rounding (an FMA here, two operations in plain C++) is
// far inside the margin greedy_head.py leaves.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "ops.h"
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvledger::quant {
namespace {

float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row r: its floor, and a mark in `hit` for each group holding one of its candidates.
float screen_row(const uint16_t* a, float scale, const float* norms, float slack, int64_t v,
                 uint8_t* hit) {
  float floor = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < v; ++j) floor = std::max(floor, bf16_to_float(a[j]) - (scale * norms[j] + slack));
  for (int64_t j = 0; j < v; ++j)
    if (bf16_to_float(a[j]) + (scale * norms[j] + slack) >= floor) hit[j / kGroupRows] = 1;
  return floor;
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")

// screen_row on 16 tokens a step: one group per vector.
float screen_row_avx512(const uint16_t* a, float scale, const float* norms, float slack, int64_t v,
                        uint8_t* hit) {
  const __m512 s = _mm512_set1_ps(scale), c = _mm512_set1_ps(slack);
  auto load = [&](int64_t j, __mmask16 m, __m512* x, __m512* e) {
    const __m256i raw = _mm256_maskz_loadu_epi16(m, a + j);
    *x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    *e = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(m, norms + j), c);
  };
  const int64_t full = v / kGroupRows * kGroupRows;
  const __mmask16 tail = static_cast<__mmask16>((1u << (v - full)) - 1);
  __m512 lo = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), x, e;
  for (int64_t j = 0; j < full; j += kGroupRows) {
    load(j, 0xffff, &x, &e);
    lo = _mm512_max_ps(lo, _mm512_sub_ps(x, e));
  }
  if (tail) {
    load(full, tail, &x, &e);
    lo = _mm512_mask_max_ps(lo, tail, lo, _mm512_sub_ps(x, e));
  }
  const float floor = _mm512_reduce_max_ps(lo);
  const __m512 f = _mm512_set1_ps(floor);
  for (int64_t j = 0; j < v; j += kGroupRows) {
    const __mmask16 m = j < full ? static_cast<__mmask16>(0xffff) : tail;
    load(j, m, &x, &e);
    if (_mm512_mask_cmp_ps_mask(m, _mm512_add_ps(x, e), f, _CMP_GE_OQ)) hit[j / kGroupRows] = 1;
  }
  return floor;
}

#pragma GCC pop_options
#endif  // __x86_64__

std::tuple<at::Tensor, at::Tensor> screen_groups(const at::Tensor& approx, const at::Tensor& x_norm,
                                                 const at::Tensor& norms, double bound, double slack) {
  TORCH_CHECK(approx.device().is_cpu() && approx.scalar_type() == at::kBFloat16 && approx.dim() == 2,
              "screen_groups: approx must be a CPU bfloat16 [rows, vocab]");
  const int64_t rows = approx.size(0), v = approx.size(1);
  TORCH_CHECK(x_norm.scalar_type() == at::kFloat && x_norm.dim() == 1 && x_norm.size(0) == rows,
              "screen_groups: x_norm must be float32 [", rows, "]");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && norms.dim() == 1 && norms.size(0) == v,
              "screen_groups: norms must be float32 [", v, "]");
  const at::Tensor a = approx.contiguous(), xn = x_norm.contiguous(), wn = norms.contiguous();
  const int64_t num_groups = (v + kGroupRows - 1) / kGroupRows;
  at::Tensor floors = at::empty({rows}, xn.options());
  std::vector<uint8_t> hits(static_cast<size_t>(rows * num_groups), 0);
  const auto* ap = reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>());
  const float *xp = xn.data_ptr<float>(), *np = wn.data_ptr<float>();
  float* fp = floors.data_ptr<float>();
  auto row = screen_row;
#if defined(__x86_64__)
  if (cpu_has(kAvx512)) row = screen_row_avx512;
#endif
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      fp[r] = row(ap + r * v, static_cast<float>(bound) * xp[r], np, static_cast<float>(slack), v,
                  hits.data() + r * num_groups);
  });
  std::vector<int64_t> groups;
  for (int64_t g = 0; g < num_groups; ++g)
    for (int64_t r = 0; r < rows; ++r)
      if (hits[r * num_groups + g]) {
        groups.push_back(g);
        break;
      }
  at::Tensor out = at::empty({static_cast<int64_t>(groups.size())}, at::kLong);
  std::copy(groups.begin(), groups.end(), out.data_ptr<int64_t>());
  return {floors, out};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvledger_quant, m) {
  m.def("screen_groups(Tensor approx, Tensor x_norm, Tensor norms, float bound, float slack) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) { m.impl("screen_groups", &screen_groups); }

}  // namespace kvledger::quant
