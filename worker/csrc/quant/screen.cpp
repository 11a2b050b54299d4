// The screen of the greedy LM head (worker/layers/greedy_head.py), in one pass over a bfloat16
// copy of the head:
//
//   kvledger_quant::screen_bf16(x [R, K2] int32: bfloat16 pairs, tiles [G, K2, 16, 2] bfloat16,
//                               scale [R] float32, norms [G * 16] float32, slack float,
//                               vocab int) -> groups [n] int64
//
// tiles[g][k][j] holds token 16 g + j's values 2k and 2k + 1, x[r][k] row r's (zeros pad an
// odd K), so one VDPBF16PS adds two products of sixteen tokens to their float32 sums. With
// a_rj the sum and e_rj = scale[r] norms[j] + slack, row r's floor is max_j (a_rj - e_rj); the
// groups returned, ascending, are those where some row's a_rj + e_rj reaches its floor: the
// groups of every candidate. Each group is checked as it is computed (the largest a + e of its
// sixteen tokens per row, kept in a [R, G] table), so the approximate logits are never
// written. Like the float32 tiles' kernel it prefetches 2 KiB ahead: at one row the screen is
// a stream of the weights, and the hardware prefetcher stops at each 4 KiB page.
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "ops.h"
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvledger::quant {
namespace {

bool cpu_has_bf16() {
#if defined(__x86_64__)
  static const bool has = cpu_has(kAvx512) && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

struct ScreenArgs {
  const uint16_t* w;  // group g's tile at w + g * k2 * 32
  int64_t k2;         // bfloat16 pairs a row
  const int32_t* x;   // row r's pairs at x + r * k2
  const float* scale;
  const float* norms;
  float slack;
  int64_t vocab;
  int64_t groups;
  float* hi;  // [R, G]: the largest a + e of each group's tokens, per row
  float* lo;  // [threads, R]: each thread's largest a - e, per row
};

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")

constexpr int64_t kPrefetchPairs = 2048 / 4;  // 2 KiB ahead of the tile being read

template <int R>
void screen_group(const ScreenArgs& a, int64_t r0, int64_t g, float* lo) {
  const uint16_t* t = a.w + g * a.k2 * 32;
  const int32_t* x = a.x + r0 * a.k2;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < a.k2; ++k) {
    const uint16_t* wk = t + k * 32;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 2 * kPrefetchPairs), _MM_HINT_T0);
    const __m512bh w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wk));
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_dpbf16_ps(acc[r], w, reinterpret_cast<__m512bh>(_mm512_set1_epi32(x[r * a.k2 + k])));
  }
  const int64_t o = g * kGroupRows, n = a.vocab - o < kGroupRows ? a.vocab - o : kGroupRows;
  const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);  // padding tokens take no part
  const __m512 norms = _mm512_loadu_ps(a.norms + o), inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int r = 0; r < R; ++r) {
    const __m512 e = _mm512_fmadd_ps(_mm512_set1_ps(a.scale[r0 + r]), norms, _mm512_set1_ps(a.slack));
    const __m512 low = _mm512_mask_sub_ps(-inf, live, acc[r], e);
    lo[r0 + r] = std::max(lo[r0 + r], _mm512_reduce_max_ps(low));
    a.hi[(r0 + r) * a.groups + g] = _mm512_reduce_max_ps(_mm512_mask_add_ps(-inf, live, acc[r], e));
  }
}

void screen_groups(const ScreenArgs& a, int64_t rows, int64_t g_begin, int64_t g_end) {
  float* lo = a.lo + at::get_thread_num() * rows;
  rows16_drive<kGroupRows>(rows, g_begin, g_end, [&](auto r, int64_t r0, int64_t g) {
    screen_group<decltype(r)::value>(a, r0, g, lo);
  });
}

#pragma GCC pop_options
#endif  // __x86_64__

at::Tensor screen_bf16(const at::Tensor& x, const at::Tensor& tiles, const at::Tensor& scale,
                       const at::Tensor& norms, double slack, int64_t vocab) {
  TORCH_CHECK(cpu_has_bf16(), "screen_bf16: this CPU has no AVX512-BF16");
  TORCH_CHECK(tiles.device().is_cpu() && tiles.scalar_type() == at::kBFloat16 && tiles.dim() == 4 &&
                  tiles.is_contiguous() && tiles.size(2) == kGroupRows && tiles.size(3) == 2,
              "screen_bf16: tiles must be a contiguous CPU bfloat16 [groups, K / 2, 16, 2]");
  const int64_t groups = tiles.size(0), k2 = tiles.size(1);
  TORCH_CHECK(vocab > (groups - 1) * kGroupRows && vocab <= groups * kGroupRows,
              "screen_bf16: ", groups, " groups do not hold ", vocab, " tokens");
  TORCH_CHECK(x.scalar_type() == at::kInt && x.dim() == 2 && x.size(1) == k2 && x.is_contiguous(),
              "screen_bf16: x must be contiguous int32 [rows, ", k2, "] (bfloat16 pairs)");
  const int64_t rows = x.size(0);
  TORCH_CHECK(rows > 0, "screen_bf16: no rows");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == rows && scale.is_contiguous(),
              "screen_bf16: scale must be float32 [", rows, "]");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && norms.numel() == groups * kGroupRows &&
                  norms.is_contiguous(),
              "screen_bf16: norms must be float32 [", groups * kGroupRows, "]");
  std::vector<float> hi(static_cast<size_t>(rows * groups));
  std::vector<float> lo(static_cast<size_t>(at::get_num_threads() * rows),
                        -std::numeric_limits<float>::infinity());
#if defined(__x86_64__)
  const ScreenArgs args{reinterpret_cast<const uint16_t*>(tiles.data_ptr<at::BFloat16>()),
                        k2,
                        x.data_ptr<int32_t>(),
                        scale.data_ptr<float>(),
                        norms.data_ptr<float>(),
                        static_cast<float>(slack),
                        vocab,
                        groups,
                        hi.data(),
                        lo.data()};
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / std::max<int64_t>(1, 2 * k2 * rows * kGroupRows));
  at::parallel_for(0, groups, grain, [&](int64_t b, int64_t e) { screen_groups(args, rows, b, e); });
#endif
  std::vector<float> floor(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < lo.size(); ++i) floor[i % rows] = std::max(floor[i % rows], lo[i]);
  std::vector<int64_t> picked;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows; ++r)
      if (hi[r * groups + g] >= floor[r]) {
        picked.push_back(g);
        break;
      }
  at::Tensor out = at::empty({static_cast<int64_t>(picked.size())}, at::kLong);
  std::copy(picked.begin(), picked.end(), out.data_ptr<int64_t>());
  return out;
}

}  // namespace

bool screen_bf16_runs() { return cpu_has_bf16(); }

TORCH_LIBRARY_FRAGMENT(kvledger_quant, m) {
  m.def("screen_bf16(Tensor x, Tensor tiles, Tensor scale, Tensor norms, float slack, int vocab) -> Tensor");
  m.def("screen_bf16_runs() -> bool", &screen_bf16_runs);
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) { m.impl("screen_bf16", &screen_bf16); }

}  // namespace kvledger::quant
