// The torch face of the rows16 layout (rows16.h): the operators
//
//   kvledger_quant::pack_rows16(blocks, ggml_type, in_features) -> tiles [out / 16, ...]
//   kvledger_quant::unpack_rows16(tiles, ggml_type, in_features) -> GGUF rows [out, ...]
//   kvledger_quant::linear_rows16(x, tiles, ggml_type, in_features) -> y   (exact, AVX-512F)
//   kvledger_quant::linear_int8_rows16(x, tiles, ggml_type, in_features) -> y   (AVX-512 VNNI)
//   kvledger_quant::dequantize_rows16_t(tiles, ggml_type, in_features) -> W^T [in, out] float32
//   kvledger_quant::dequantize_rows16(tiles, ggml_type, in_features, ids) -> float32 rows
//
// with the same contracts as linear.cpp's `linear`, `linear_int8` and `dequantize` over GGUF
// rows. All three types run both kernels (Q8_0's int8 one where the CPU has AVX512-VBMI).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>

#include "ops.h"
#include "rows16.h"

namespace kvledger::quant {
namespace {

// The rows16 layout (rows16.h): GGUF rows -> tiles, and back (for dequantizing, and tests).
at::Tensor pack_rows16(const at::Tensor& blocks, int64_t type, int64_t in) {
  check_blocks(blocks, type, in);
  TORCH_CHECK(rows16_type(static_cast<int>(type)), "rows16: ggml type ", type,
              " is not Q4_0, Q4_1 or Q8_0");
  TORCH_CHECK(blocks.size(0) % kGroupRows == 0, "rows16: ", blocks.size(0),
              " rows are not a multiple of ", kGroupRows);
  at::Tensor out = at::empty({blocks.size(0) / kGroupRows, blocks.size(1) * kGroupRows}, blocks.options());
  rows16_pack(blocks.data_ptr<uint8_t>(), static_cast<int>(type), blocks.size(0), in,
              out.data_ptr<uint8_t>());
  return out;
}

void check_rows16(const at::Tensor& packed, int64_t type, int64_t in) {
  TORCH_CHECK(rows16_type(static_cast<int>(type)), "rows16: ggml type ", type,
              " is not Q4_0, Q4_1 or Q8_0");
  TORCH_CHECK(in > 0 && in % kBlock == 0, "rows16: in_features ", in, " is not a positive multiple of ",
              kBlock);
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                  packed.is_contiguous() &&
                  packed.size(1) == in / kBlock * rows16_tile_bytes(static_cast<int>(type)),
              "rows16: tiles must be a contiguous CPU uint8 tensor [out / 16, in / 32 * tile bytes]");
}

at::Tensor unpack_rows16(const at::Tensor& packed, int64_t type, int64_t in) {
  check_rows16(packed, type, in);
  at::Tensor out = at::empty({packed.size(0) * kGroupRows, packed.size(1) / kGroupRows}, packed.options());
  rows16_unpack(packed.data_ptr<uint8_t>(), static_cast<int>(type), out.size(0), in,
                out.data_ptr<uint8_t>());
  return out;
}

// linear_int8 over rows16 tiles: the same quantized activations and terms, every row count
// through one kernel, whose unpacking of a tile serves up to 4 activation rows (Q4: at a
// prefill's row counts it outruns linear_int8's float fallback; docs/performance.md, "Quantized
// kernels"). Q8_0 tiles (a tied head's) on a
// CPU without VBMI: the activations dequantized through the exact kernel, as linear_int8 does
// from 4 rows, equal to the integer sums up to rounding. AVX-512 VNNI only.
at::Tensor linear_int8_rows16(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t in) {
  check_rows16(packed, type, in);
  TORCH_CHECK(x.device().is_cpu() && x.size(-1) == in, "quantized linear: x must be CPU [..., ",
              in, "]");
  TORCH_CHECK(cpu_has(kInt8 + kAvx512), "rows16: this CPU has no AVX-512 VNNI");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t groups = packed.size(0), out = groups * kGroupRows, rows = xf.numel() / in;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, xf.options());
  if (rows == 0 || out == 0) return y.to(x.scalar_type());
#if defined(__x86_64__)
  const Int8Acts acts = quantized(xf, rows, in, kAvx512, false);
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / (in * rows * kGroupRows));
  if (type == kQ8_0 && !q8_vnni_runs()) {
    thread_local std::vector<float> xdq;
    xdq.resize(rows * in);
    for (int64_t i = 0; i < rows * in; ++i) xdq[i] = static_cast<float>(acts.q[i]) * acts.d[i / kBlock];
    const Rows16FloatArgs args{static_cast<int>(type), packed.data_ptr<uint8_t>(), in, xdq.data(),
                               in, rows, y.data_ptr<float>(), out};
    at::parallel_for(0, groups, grain, [&](int64_t b, int64_t e) { rows16_avx512(args, b, e); });
    return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
  }
  thread_local std::vector<int32_t> qsum;
  if (type == kQ8_0) {
    qsum.resize(rows * in / kBlock);
    for (int64_t i = 0; i < rows * in / kBlock; ++i) {
      int32_t sum = 0;
      for (int k = 0; k < kBlock; ++k) sum += acts.q[i * kBlock + k];
      qsum[i] = sum;
    }
  }
  const Rows16Args args{static_cast<int>(type), packed.data_ptr<uint8_t>(), in, acts, rows,
                        y.data_ptr<float>(), out, qsum.data()};
  auto kernel = type == kQ8_0 ? &rows16_vnni512_q8 : &rows16_vnni512;
  at::parallel_for(0, groups, grain, [&](int64_t b, int64_t e) { kernel(args, b, e); });
#endif
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// W^T of groups [g_begin, g_end) in float32 into wt (leading dimension ldw): each value
// dequantized as the GGUF rows' dequantize does (one FMA rounding for Q4_1's d q + m).
void dequantize_t_into(const at::Tensor& packed, int64_t type, int64_t in, int64_t g_begin,
                       int64_t g_end, float* wt, int64_t ldw) {
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / (in * kGroupRows));
#if defined(__x86_64__)
  at::parallel_for(g_begin, g_end, grain, [&](int64_t b, int64_t e) {
    rows16_dequantize_t(static_cast<int>(type), w, in, wt + (b - g_begin) * kGroupRows, ldw, b, e);
  });
#endif
}

// The tiles' W^T [in, out] (for tests: the GEMM path's operand).
at::Tensor dequantize_rows16_t(const at::Tensor& packed, int64_t type, int64_t in) {
  check_rows16(packed, type, in);
  TORCH_CHECK(cpu_has(kAvx512), "rows16: this CPU has no AVX-512");
  const int64_t out = packed.size(0) * kGroupRows;
  at::Tensor wt = at::empty({in, out}, packed.options().dtype(at::kFloat));
  dequantize_t_into(packed, type, in, 0, packed.size(0), wt.data_ptr<float>(), out);
  return wt;
}

// xf [rows, in] @ W^T [rows, out] through the float GEMM, a slab of output columns at a time
// (one slab, the whole layer, for the models served here: its result is the output).
at::Tensor gemm_rows16(const at::Tensor& xf, const at::Tensor& packed, int64_t type, int64_t in) {
  const int64_t groups = packed.size(0), rows = xf.numel() / in;
  const int64_t slab = std::max<int64_t>(1, kScratchFloats / (in * kGroupRows));  // groups
  thread_local std::vector<float> wt;  // kept for the next call: no page faults per layer
  wt.resize(std::min(slab, groups) * kGroupRows * in);
  const at::Tensor x2 = xf.view({rows, in});
  auto slab_product = [&](int64_t g, int64_t n) {
    dequantize_t_into(packed, type, in, g, g + n / kGroupRows, wt.data(), n);
    return float_gemm(x2, at::from_blob(wt.data(), {in, n}, xf.options()));
  };
  if (groups <= slab) return slab_product(0, groups * kGroupRows);
  at::Tensor y = at::empty({rows, groups * kGroupRows}, xf.options());
  for (int64_t g = 0; g < groups; g += slab) {
    const int64_t n = std::min(slab, groups - g) * kGroupRows;
    y.narrow(1, g * kGroupRows, n).copy_(slab_product(g, n));
  }
  return y;
}

// linear over rows16 tiles: the exact path (float activations), AVX-512F.
at::Tensor linear_rows16(const at::Tensor& x, const at::Tensor& packed, int64_t type, int64_t in) {
  check_rows16(packed, type, in);
  TORCH_CHECK(x.device().is_cpu() && x.size(-1) == in, "quantized linear: x must be CPU [..., ",
              in, "]");
  TORCH_CHECK(cpu_has(kAvx512), "rows16: this CPU has no AVX-512");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t groups = packed.size(0), out = groups * kGroupRows, rows = xf.numel() / in;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  if (rows >= kGemmRows && out > 0) {
    const at::Tensor y = gemm_rows16(xf, packed, type, in).view(shape);
    return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
  }
  at::Tensor y = at::empty(shape, xf.options());
  if (rows == 0 || out == 0) return y.to(x.scalar_type());
  const float* xp = xf.data_ptr<float>();
#if defined(__x86_64__)
  const Rows16FloatArgs args{static_cast<int>(type), packed.data_ptr<uint8_t>(), in, xp, in,
                             rows, y.data_ptr<float>(), out};
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerTask / (in * rows * kGroupRows));
  at::parallel_for(0, groups, grain, [&](int64_t b, int64_t e) { rows16_avx512(args, b, e); });
#endif
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// Rows `ids` of the tiles in float32 [*ids.shape, in] (an embedding's lookups): each row back
// to its GGUF bytes, then the GGUF rows' own dequantize, so the values are theirs exactly.
at::Tensor dequantize_rows16(const at::Tensor& packed, int64_t type, int64_t in, const at::Tensor& ids) {
  check_rows16(packed, type, in);
  const auto [idx, out] = lookup(ids, packed.size(0) * kGroupRows, in, packed.options());
  const int64_t n = idx.numel();
  const int64_t* id = idx.data_ptr<int64_t>();
  const uint8_t* src = packed.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int64_t row_bytes = in / kBlock * block_bytes(static_cast<int>(type));
  at::parallel_for(0, n, std::max<int64_t>(1, kMinWorkPerTask / in), [&](int64_t b, int64_t e) {
    std::vector<uint8_t> row(row_bytes);
    for (int64_t i = b; i < e; ++i) {
      rows16_unpack_row(src, static_cast<int>(type), in, id[i], row.data());
      dequantize_row(static_cast<int>(type), row.data(), in, dst + i * in);
    }
  });
  return out;
}

}  // namespace

// y = x @ wt (wt [in, n], a column slab's W^T) through oneDNN's matmul on the plain layout, as
// `torch.ops.mkldnn._linear_pointwise` (called boxed: no private header), else through at::mm
// (MKL). Why oneDNN: on AMD's Zen CPUs MKL's sgemm takes code paths below AVX-512 and ran
// SmolLM2's prefill layers at half oneDNN's speed (docs/performance.md, "Quantized kernels").
// If oneDNN ever refuses (a torch whose op takes other arguments), at::mm from then on.
at::Tensor float_gemm(const at::Tensor& x2, const at::Tensor& wt) {
  static const std::optional<c10::OperatorHandle> onednn =
      at::hasMKLDNN() ? c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""})
                      : std::nullopt;
  static std::atomic<bool> refused{false};
  if (!onednn || refused.load(std::memory_order_relaxed)) return at::mm(x2, wt);
  torch::jit::Stack stack{x2, wt.t(), c10::IValue(), std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), c10::IValue()};
  try {
    onednn->callBoxed(stack);
  } catch (const c10::Error& err) {
    TORCH_WARN_ONCE("kvledger_quant: oneDNN's linear refused the prefill GEMM (", err.what_without_backtrace(),
                    "); using at::mm");
    refused.store(true, std::memory_order_relaxed);
    return at::mm(x2, wt);
  }
  return stack[0].toTensor();
}

// Whether this CPU runs the VNNI kernel on Q8_0 tiles (rows16_vnni_q8.cpp): VBMI as well.
bool q8_vnni_runs() {
#if defined(__x86_64__)
  static const bool runs = cpu_has(kInt8 + kAvx512) && __builtin_cpu_supports("avx512vbmi");
  return runs;
#else
  return false;
#endif
}

at::Tensor direct_linear_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t type, int64_t in) {
  return linear_rows16(x, tiles, type, in);
}

at::Tensor direct_linear_int8_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t type, int64_t in) {
  return linear_int8_rows16(x, tiles, type, in);
}

TORCH_LIBRARY_FRAGMENT(kvledger_quant, m) {
  m.def("pack_rows16(Tensor blocks, int ggml_type, int in_features) -> Tensor");
  m.def("unpack_rows16(Tensor tiles, int ggml_type, int in_features) -> Tensor");
  m.def("linear_rows16(Tensor x, Tensor tiles, int ggml_type, int in_features) -> Tensor");
  m.def("linear_int8_rows16(Tensor x, Tensor tiles, int ggml_type, int in_features) -> Tensor");
  m.def("dequantize_rows16_t(Tensor tiles, int ggml_type, int in_features) -> Tensor");
  m.def("dequantize_rows16(Tensor tiles, int ggml_type, int in_features, Tensor ids) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvledger_quant, CPU, m) {
  m.impl("pack_rows16", &pack_rows16);
  m.impl("unpack_rows16", &unpack_rows16);
  m.impl("linear_rows16", &linear_rows16);
  m.impl("linear_int8_rows16", &linear_int8_rows16);
  m.impl("dequantize_rows16_t", &dequantize_rows16_t);
  m.impl("dequantize_rows16", &dequantize_rows16);
}

}  // namespace kvledger::quant
