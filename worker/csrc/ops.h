// The CPU kernels of the worker's compiled module (worker/native.py builds it once per machine).
#pragma once

#include "aten_lite.h"

#include <vector>

namespace kvledger {

// paged_decode.cpp: decode attention over the paged KV cache, read in place.
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens,
                        int64_t window, double scale);
// The same, sequences of a group attending over their shared leading blocks together.
at::Tensor paged_decode_shared(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& block_tables,
                               const at::Tensor& context_lens, int64_t window, double scale,
                               const at::Tensor& group_of, const at::Tensor& group_blocks);

// fused.cpp: the decoder's elementwise steps, one pass over memory and one call each.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::vector<at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                     const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
std::vector<at::Tensor> split_rope(const at::Tensor& qkv, const at::Tensor& cos,
                                   const at::Tensor& sin, int64_t num_heads,
                                   int64_t num_kv_heads, int64_t head_dim);
at::Tensor argmax_rows(const at::Tensor& logits);
void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
              const at::Tensor& v_cache, const at::Tensor& slot_mapping);

// masks.cpp: structured outputs' packed token bitmasks applied to float32 logits, in place.
void mask_logits(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& bitmask,
                 bool portable);

}  // namespace kvledger
