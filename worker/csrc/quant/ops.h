// What the torch-facing files of the quantized kernels share (linear.cpp, rows16_ops.cpp): the
// instruction-set codes, the CPU check, the blocks' check and the activation quantizer.
#pragma once

#include "../aten_lite.h"

#include "blocks.h"

namespace kvledger::quant {

enum Isa : int64_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };
constexpr int64_t kInt8 = 16;  // added to an isa: the int8-activation kernels' requirements

// A thread's share must hold at least this many multiply-adds: waking the pool for less costs
// more than it saves (a 256x256 product at one row stays on the calling thread).
constexpr int64_t kMinWorkPerTask = 1 << 16;

// The decode path's operators as plain functions, for the module's own (pybind) entry points:
// from Python, a call through `torch.ops` spends more than one through pybind (boxing and
// schema matching: a visible share of a small layer's call at one row; docs/performance.md,
// "Python around the kernels"), and a decode step makes a call per linear layer.
// The same functions as the registered operators (rows16_ops.cpp, rows16_f32.cpp).
at::Tensor direct_linear_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t type, int64_t in);
at::Tensor direct_linear_int8_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t type, int64_t in);
at::Tensor direct_linear_f32_rows16(const at::Tensor& x, const at::Tensor& tiles, int64_t out);

// Whether this CPU runs `isa` (kInt8 + isa: the int8-activation path of that isa).
bool cpu_has(int64_t isa);
// The isa the float operators run given kAuto, and linear_int8's (linear.cpp).
int64_t best_isa();
int64_t best_int8_isa();
// The isa of the float kernel `linear` runs for `type` asked `isa` (kAuto: the best here): the
// best at or below it that has a kernel for the type (linear.cpp's table).
int64_t kernel_isa(int64_t type, int64_t isa);
// Whether int8 activations on Q8_0 tiles run their VNNI kernel here (AVX512-VBMI as well).
bool q8_vnni_runs();

// blocks: a contiguous CPU uint8 [out, in / 32 * block bytes] of a known type, or an error.
void check_blocks(const at::Tensor& blocks, int64_t type, int64_t in);

// A lookup of rows `ids` among `total`: the ids as contiguous int64, each checked to lie in
// [0, total), and the float32 output [*ids.shape, in] (dequantize, dequantize_rows16).
std::pair<at::Tensor, at::Tensor> lookup(const at::Tensor& ids, int64_t total, int64_t in,
                                         const at::TensorOptions& options);

// From this many activation rows (a prefill's) the exact path dequantizes the layer into a
// float32 scratch and multiplies with a float GEMM (`float_gemm`): the GEMM outruns the tiles,
// whose unpacking bounds them, and from about this many rows that pays for the layer's one
// dequantization (docs/performance.md, "Quantized kernels"). The same products, summed in
// another order: within the exact path's contract, as the tiles are. Decode steps keep the
// tiles.
constexpr int64_t kGemmRows = 128;
// The scratch holds at most this many floats (8 MiB): a larger layer is multiplied in slabs of
// output columns, so a big model's prefill does not keep a whole float32 layer per thread.
constexpr int64_t kScratchFloats = int64_t{1} << 21;

// y = x2 @ wt (wt [in, n]) through oneDNN's matmul, else at::mm (rows16_ops.cpp).
at::Tensor float_gemm(const at::Tensor& x2, const at::Tensor& wt);

// xf's rows quantized per block (blocks.h, `Int8Acts`) into the calling thread's scratch.
Int8Acts quantized(const at::Tensor& xf, int64_t rows, int64_t in, int64_t isa, bool vectors);

}  // namespace kvledger::quant
