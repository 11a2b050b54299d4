// Float32 linear layers at decode sizes on sixteen-row tiles (AVX-512F):
//
//   kvledger_quant::linear_f32_rows16(x [..., in] float32, tiles [ceil(out / 16), in, 16]
//                                     float32, out_features) -> y [..., out] float32
//
// tiles[g][k][j] is weight row 16 g + j's value k (rows past `out` are zeros): one 64-byte
// load holds value k of sixteen output rows, and each activation row multiplies it with one
// FMA on a broadcast, as the quantized exact kernel does after its dequantization
// (rows16_avx512.cpp). Why a kernel of our own for plain float32: at one to a few rows a layer
// is a stream of its weights, and what decides its speed is how close that stream comes to the
// memory's rate. The kernel prefetches 2 KiB ahead of the tile it reads (the hardware
// prefetcher stops at each 4 KiB page, as the quantized kernels found) and has no per-call
// packing or dispatch of its own beyond torch's thread pool. The same products as `x @ W^T`,
// summed in another order (four chains a row below four rows, then added: an FMA's latency is
// four of its issue slots). Unlike the quantized kernels' rule (rows16.h), a row's sums here
// may differ in the last bits with the size of its batch: the float32 layers already change
// library with it (oneDNN or MKL from 17 rows), so batches never gave a row the same bits.
#include <ATen/Parallel.h>

#include "ops.h"
#include "rows16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvledger::quant {
namespace {

struct F32Args {
  const float* w;  // group g's tile at w + g * in * 16
  int64_t in;
  const float* x;  // row r at x + r * in
  int64_t rows;
  float* y;  // row r at y + r * out
  int64_t out;
};

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")

constexpr int64_t kPrefetchFloats = 2048 / 4;  // 2 KiB ahead of the tile being read

// Rows r0 .. r0 + R - 1 of group g. C chains a row keep at least four FMAs in flight.
template <int R>
void f32_group(const F32Args& a, int64_t r0, int64_t g) {
  constexpr int C = R >= 4 ? 1 : 4 / R;
  const float* t = a.w + g * a.in * kGroupRows;
  const float* x = a.x + r0 * a.in;
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + C <= a.in; k += C) {
    for (int c = 0; c < C; ++c) {
      const float* wk = t + (k + c) * kGroupRows;
      _mm_prefetch(reinterpret_cast<const char*>(wk + kPrefetchFloats), _MM_HINT_T0);
      const __m512 w = _mm512_loadu_ps(wk);
      for (int r = 0; r < R; ++r)
        acc[c][r] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * a.in + k + c]), acc[c][r]);
    }
  }
  for (; k < a.in; ++k) {
    const __m512 w = _mm512_loadu_ps(t + k * kGroupRows);
    for (int r = 0; r < R; ++r)
      acc[0][r] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * a.in + k]), acc[0][r]);
  }
  const int64_t o = g * kGroupRows, n = a.out - o < kGroupRows ? a.out - o : kGroupRows;
  const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
  for (int r = 0; r < R; ++r) {
    __m512 s = acc[0][r];
    for (int c = 1; c < C; ++c) s = _mm512_add_ps(s, acc[c][r]);
    _mm512_mask_storeu_ps(a.y + (r0 + r) * a.out + o, mask, s);
  }
}

void f32_groups(const F32Args& a, int64_t g_begin, int64_t g_end) {
  rows16_drive<kGroupRows>(a.rows, g_begin, g_end, [&a](auto rows, int64_t r0, int64_t g) {
    f32_group<decltype(rows)::value>(a, r0, g);
  });
}

#pragma GCC pop_options
#endif  // __x86_64__

at::Tensor linear_f32_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t out) {
  TORCH_CHECK(tiles.device().is_cpu() && tiles.scalar_type() == at::kFloat && tiles.dim() == 3 &&
                  tiles.is_contiguous() && tiles.size(2) == kGroupRows &&
                  tiles.size(0) == (out + kGroupRows - 1) / kGroupRows,
              "linear_f32_rows16: tiles must be a contiguous CPU float32 [ceil(", out,
              " / 16), in, 16]");
  const int64_t in = tiles.size(1);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 &&
                  x.size(-1) == in,
              "linear_f32_rows16: x must be CPU float32 [..., ", in, "]");
  TORCH_CHECK(cpu_has(kAvx512), "linear_f32_rows16: this CPU has no AVX-512");
  const at::Tensor xf = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, xf.options());
  if (in == 0) return y.zero_();  // empty sums
  const int64_t rows = xf.numel() / in, groups = tiles.size(0);
  if (rows == 0 || out == 0) return y;
#if defined(__x86_64__)
  const F32Args args{tiles.data_ptr<float>(), in, xf.data_ptr<float>(), rows, y.data_ptr<float>(), out};
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / std::max<int64_t>(1, in * rows * kGroupRows));
  at::parallel_for(0, groups, grain, [&](int64_t b, int64_t e) { f32_groups(args, b, e); });
#endif
  return y;
}

}  // namespace

at::Tensor direct_linear_f32_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t out) {
  return linear_f32_rows16(x, tiles, out);
}

TORCH_LIBRARY_FRAGMENT(kvledger_quant, m) {
  m.def("linear_f32_rows16(Tensor x, Tensor tiles, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) { m.impl("linear_f32_rows16", &linear_f32_rows16); }

}  // namespace kvledger::quant
