// The torch face of the quantized kernels over GGUF rows (the rows16 tiles: rows16_ops.cpp):
// the `kvledger_quant` operators, the choice of instruction set at run time, and the split of
// output rows across torch's threads.
//
//   kvledger_quant::linear(x [..., in] float, blocks uint8 [out, in / 32 * block bytes],
//                          ggml_type, in_features, isa) -> y [..., out] in x's dtype
//   kvledger_quant::dequantize(blocks, ggml_type, in_features, ids?) -> float32 rows
//
// isa: 0 = the best this CPU runs (AVX-512, else AVX2, else scalar), 1 = scalar, 2 = AVX2,
// 3 = AVX-512; naming one the CPU lacks is an error (the tests force each path this way). A type
// with no kernel of that set would run the best one below it (`kTable`; today every type has
// one at each set).
// Activations are float32 and every product is a float FMA of the exactly dequantized weight:
// the result equals `x @ dequantize(blocks).T` up to the order of the sums.
//
//   kvledger_quant::linear_int8(x, blocks, ggml_type, in_features, isa) -> y
// quantizes each row of x per block of 32 to int8 first (as llama.cpp's Q8 activations;
// blocks.h, `Int8Acts`) and multiplies with integer dot products: faster, and not exact (the
// activations are rounded). isa: 0 = the best here (AVX-512 VNNI, else AVX2, else scalar),
// 1 = scalar, 2 = AVX2, 3 = AVX-512 VNNI.
#include <ATen/Parallel.h>

#include "blocks.h"
#include "ops.h"

namespace kvledger::quant {

// From this many rows on, linear_int8 multiplies its quantized activations in float (see there):
// the integer kernel pays a scale per block and row, the float one dequantizes a block once
// for 8 rows: the two break even at about this many rows, the float one ahead above it and
// the integer one below (docs/performance.md, "Quantized kernels").
constexpr int64_t kInt8FloatRows = 4;

bool cpu_has(int64_t isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == kInt8 + kAvx512) return cpu_has(kAvx512) && __builtin_cpu_supports("avx512vnni");
  if (isa > kInt8) return cpu_has(isa - kInt8);
  switch (isa) {
    case kScalar: return true;
    case kAvx2: return avx2;
    case kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    default: return false;
  }
#else
  return isa == kScalar || isa == kInt8 + kScalar;
#endif
}

// x's rows quantized per block (blocks.h, `Int8Acts`) into the calling thread's scratch, kept
// between calls (a decode step makes ~100 of them); `vectors`: fill dv and sv too (the per-row
// kernels read them, the float fallback and rows16 do not).
Int8Acts quantized(const at::Tensor& xf, int64_t rows, int64_t in, int64_t isa, bool vectors) {
  const int64_t nb = in / kBlock;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scales;
  q.resize(rows * in);
  scales.resize(18 * rows * nb);  // d, sd, then dv and sv (8 floats a block each)
  float *d = scales.data(), *sd = d + rows * nb, *dv = sd + rows * nb, *sv = dv + 8 * rows * nb;
  auto quantize = &quantize_acts;
#if defined(__x86_64__)
  if (isa != kScalar) quantize = &quantize_acts_avx2;
#endif
  quantize(xf.data_ptr<float>(), rows, in, q.data(), d, sd);
  for (int64_t i = 0; vectors && i < rows * nb; ++i) {
    for (int k = 0; k < 8; ++k) {
      dv[8 * i + k] = d[i];
      sv[8 * i + k] = sd[i] * 0.125f;
    }
  }
  return Int8Acts{q.data(), d, sd, dv, sv};
}

void check_blocks(const at::Tensor& blocks, int64_t type, int64_t in) {
  const Format f = format_of(static_cast<int>(type));
  TORCH_CHECK(f.bytes > 0, "quantized linear: ggml type ", type,
              " is not Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K");
  TORCH_CHECK(in > 0 && in % f.values == 0, "quantized linear: in_features ", in,
              " is not a positive multiple of ", f.values);
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                  blocks.is_contiguous(),
              "quantized linear: blocks must be a contiguous CPU uint8 tensor [out, bytes]");
  TORCH_CHECK(blocks.size(1) == in / f.values * f.bytes, "quantized linear: rows of ",
              blocks.size(1), " bytes do not hold ", in, " values of type ", type);
}

std::pair<at::Tensor, at::Tensor> lookup(const at::Tensor& ids, int64_t total, int64_t in,
                                         const at::TensorOptions& options) {
  at::Tensor idx = ids.to(at::kLong).contiguous();
  const int64_t* id = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < total, "dequantize: row ", id[i], " out of range");
  std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end());
  shape.push_back(in);
  return {idx, at::empty(shape, options.dtype(at::kFloat))};
}

int64_t best_isa() {
  static const int64_t best = cpu_has(kAvx512) ? kAvx512 : cpu_has(kAvx2) ? kAvx2 : kScalar;
  return best;
}

// The float kernels by weight type and instruction set (index: the isa; nullptr: none there).
struct TypeKernels {
  int type;
  LinearKernel by_isa[kAvx512 + 1];
};

#if defined(__x86_64__)
constexpr TypeKernels kTable[] = {
    {kQ8_0, {nullptr, &linear_scalar, &linear_avx2, &linear_avx512}},
    {kQ4_0, {nullptr, &linear_scalar, &linear_avx2, &linear_avx512}},
    {kQ4_1, {nullptr, &linear_scalar, &linear_avx2, &linear_avx512}},
    {kQ5_0, {nullptr, &linear_scalar, &linear_avx2_k, &linear_avx512_k}},
    {kQ5_1, {nullptr, &linear_scalar, &linear_avx2_k, &linear_avx512_k}},
    {kQ4_K, {nullptr, &linear_scalar, &linear_avx2_k, &linear_avx512_k}},
    {kQ5_K, {nullptr, &linear_scalar, &linear_avx2_k, &linear_avx512_k}},
    {kQ6_K, {nullptr, &linear_scalar, &linear_avx2_k, &linear_avx512_k}},
};
#endif

// The kernel for `type` at `isa` (0: the best here), or the best below it that has one.
LinearKernel kernel_for(int64_t type, int64_t isa) {
  if (isa == kAuto) isa = best_isa();
  TORCH_CHECK(isa >= kScalar && isa <= kAvx512, "quantized linear: unknown isa ", isa);
  TORCH_CHECK(cpu_has(isa), "quantized linear: this CPU cannot run isa ", isa);
#if defined(__x86_64__)
  for (const TypeKernels& k : kTable) {
    if (k.type != type) continue;
    for (int64_t i = isa; i >= kScalar; --i)
      if (k.by_isa[i] != nullptr) return k.by_isa[i];
  }
#endif
  return &linear_scalar;
}

// The isa whose kernel `linear` runs for `type` given `isa` (0: the best here).
int64_t kernel_isa(int64_t type, int64_t isa) {
  const LinearKernel k = kernel_for(type, isa);
  if (k == &linear_scalar) return kScalar;
#if defined(__x86_64__)
  if (k == &linear_avx512 || k == &linear_avx512_k) return kAvx512;
#endif
  return kAvx2;
}

// The int8-activation kernels, the same way (a type not listed has none: refused by name).
struct Int8TypeKernels {
  int type;
  Int8Kernel by_isa[kAvx512 + 1];
};

#if defined(__x86_64__)
constexpr Int8TypeKernels kInt8Table[] = {
    {kQ8_0, {nullptr, &int8_scalar, &int8_avx2, &int8_vnni512}},
    {kQ4_0, {nullptr, &int8_scalar, &int8_avx2, &int8_vnni512}},
    {kQ4_1, {nullptr, &int8_scalar, &int8_avx2, &int8_vnni512}},
    {kQ4_K, {nullptr, &int8_scalar, &int8_avx2_k, &int8_vnni512_k}},
    {kQ5_K, {nullptr, &int8_scalar, &int8_avx2_k, &int8_vnni512_k}},
    {kQ6_K, {nullptr, &int8_scalar, &int8_avx2_k, &int8_vnni512_k}},
};
#else
constexpr Int8TypeKernels kInt8Table[] = {
    {kQ8_0, {nullptr, &int8_scalar}}, {kQ4_0, {nullptr, &int8_scalar}},
    {kQ4_1, {nullptr, &int8_scalar}}, {kQ4_K, {nullptr, &int8_scalar}},
    {kQ5_K, {nullptr, &int8_scalar}}, {kQ6_K, {nullptr, &int8_scalar}},
};
#endif

// The int8 kernel for `type` at `isa` (a resolved one), or nullptr where the type has none.
Int8Kernel int8_kernel_for(int64_t type, int64_t isa) {
  for (const Int8TypeKernels& k : kInt8Table) {
    if (k.type != type) continue;
    for (int64_t i = isa; i >= kScalar; --i)
      if (k.by_isa[i] != nullptr) return k.by_isa[i];
  }
  return nullptr;
}

int64_t best_int8_isa() {
  static const int64_t best = cpu_has(kInt8 + kAvx512) ? kAvx512 : cpu_has(kAvx2) ? kAvx2 : kScalar;
  return best;
}

namespace {

// From this many activation rows the GGUF rows' paths multiply through the float GEMM: the
// per-row kernels' cost grows with the rows (a decode per 4), the GEMM's hardly (one decode).
// On a 2-core AVX2 EPYC (Zen 1) an 8192 x 2048 Q4_K layer broke even at ~30 rows (Q6_K ~15).
constexpr int64_t kGemmRowsGguf = 32;

// xf [rows, in] @ W^T for GGUF rows through the float GEMM (from kGemmRowsGguf rows),
// slabs of the weight's rows dequantized into a float32 scratch: the per-row kernels decode each
// weight again for every 4 activation rows, ~100 decodes per weight at a 1B model's 512-row
// prefill chunk, where the GEMM takes one. The same products summed in another order.
at::Tensor gemm_rows(const at::Tensor& xf, const at::Tensor& blocks, int64_t type, int64_t in) {
  const int64_t out = blocks.size(0), rows = xf.numel() / in, row_bytes = blocks.size(1);
  const int64_t slab = std::max<int64_t>(1, kScratchFloats / in);  // weight rows per slab
  thread_local std::vector<float> w;  // kept for the next call: no page faults per layer
  w.resize(std::min(slab, out) * in);
  float* wp = w.data();  // the calling thread's scratch (the pool's threads have their own)
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  const at::Tensor x2 = xf.view({rows, in});
  auto slab_product = [&](int64_t o, int64_t n) {
    at::parallel_for(o, o + n, std::max<int64_t>(1, kMinWorkPerTask / in), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        dequantize_row(static_cast<int>(type), src + i * row_bytes, in, wp + (i - o) * in);
    });
    return float_gemm(x2, at::from_blob(wp, {n, in}, xf.options()).t());
  };
  if (out <= slab) return slab_product(0, out);
  at::Tensor y = at::empty({rows, out}, xf.options());
  for (int64_t o = 0; o < out; o += slab) {
    const int64_t n = std::min(slab, out - o);
    y.narrow(1, o, n).copy_(slab_product(o, n));
  }
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t in,
                  int64_t isa) {
  check_blocks(blocks, type, in);
  TORCH_CHECK(x.device().is_cpu() && x.size(-1) == in, "quantized linear: x must be CPU [..., ",
              in, "]");
  const LinearKernel kernel = kernel_for(type, isa);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t out = blocks.size(0), rows = in ? xf.numel() / in : 0;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  if (rows >= kGemmRowsGguf && out > 0) {
    const at::Tensor y = gemm_rows(xf, blocks, type, in).view(shape);
    return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
  }
  at::Tensor y = at::empty(shape, xf.options());
  if (rows == 0 || out == 0) return y.to(x.scalar_type());
  const LinearArgs args{static_cast<int>(type), blocks.data_ptr<uint8_t>(), blocks.size(1), in,
                        xf.data_ptr<float>(), in, rows, y.data_ptr<float>(), out};
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / (in * rows));
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& blocks, int64_t type, int64_t in,
                       int64_t isa) {
  check_blocks(blocks, type, in);
  TORCH_CHECK(int8_kernel_for(type, kScalar) != nullptr, "int8 linear: ggml type ", type,
              " has no int8 kernel (only Q8_0, Q4_0, Q4_1 and the K-quants)");
  TORCH_CHECK(x.device().is_cpu() && x.size(-1) == in, "quantized linear: x must be CPU [..., ",
              in, "]");
  if (isa == kAuto) isa = best_int8_isa();
  TORCH_CHECK(isa >= kScalar && isa <= kAvx512, "int8 linear: unknown isa ", isa);
  TORCH_CHECK(cpu_has(kInt8 + isa), "int8 linear: this CPU cannot run isa ", isa);
  const Int8Kernel kernel = int8_kernel_for(type, isa);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t out = blocks.size(0), rows = xf.numel() / in;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, xf.options());
  if (rows == 0 || out == 0) return y.to(x.scalar_type());
  const Int8Acts acts = quantized(xf, rows, in, isa, rows < kInt8FloatRows);
  const int8_t* q = acts.q;
  const float* d = acts.d;
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / (in * rows));
  if (rows >= kInt8FloatRows) {
    // the same quantized activations, dequantized, through the float kernel (faster from here:
    // its dequantized weight block serves 8 rows); equal to the integer sums up to rounding
    thread_local std::vector<float> xdq;
    xdq.resize(rows * in);
    for (int64_t i = 0; i < rows * in; ++i) xdq[i] = static_cast<float>(q[i]) * d[i / kBlock];
    if (rows >= kGemmRowsGguf) {
      const at::Tensor xq = at::from_blob(xdq.data(), {rows, in}, xf.options());
      const at::Tensor yq = gemm_rows(xq, blocks, type, in).view(shape);
      return x.scalar_type() == at::kFloat ? yq : yq.to(x.scalar_type());
    }
    const LinearKernel fk = kernel_for(type, isa);
    const LinearArgs args{static_cast<int>(type), blocks.data_ptr<uint8_t>(), blocks.size(1), in,
                          xdq.data(), in, rows, y.data_ptr<float>(), out};
    at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { fk(args, begin, end); });
  } else {
    const Int8Args args{static_cast<int>(type), blocks.data_ptr<uint8_t>(), blocks.size(1), in,
                        acts, rows, y.data_ptr<float>(), out};
    at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor dequantize(const at::Tensor& blocks, int64_t type, int64_t in,
                      const std::optional<at::Tensor>& ids) {
  check_blocks(blocks, type, in);
  const int64_t total = blocks.size(0);
  const auto [idx, out] = lookup(
      ids.has_value() ? *ids : at::arange(total, blocks.options().dtype(at::kLong)), total, in,
      blocks.options());
  const int64_t n = idx.numel();
  const int64_t* id = idx.data_ptr<int64_t>();
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int64_t row_bytes = blocks.size(1);
  at::parallel_for(0, n, std::max<int64_t>(1, kMinWorkPerTask / in), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      dequantize_row(static_cast<int>(type), src + id[i] * row_bytes, in, dst + i * in);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(kvledger_quant, m) {
  m.def("linear(Tensor x, Tensor blocks, int ggml_type, int in_features, int isa=0) -> Tensor");
  m.def("dequantize(Tensor blocks, int ggml_type, int in_features, Tensor? ids=None) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor blocks, int ggml_type, int in_features, int isa=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) {
  m.impl("linear", &linear);
  m.impl("dequantize", &dequantize);
  m.impl("linear_int8", &linear_int8);
}

}  // namespace kvledger::quant
