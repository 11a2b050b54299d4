// The Python module: one binding per kernel of ops.h.
#include <torch/csrc/utils/pybind.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &kvledger::paged_decode,
        "paged decode attention over the KV cache in place");
  m.def("paged_decode_shared", &kvledger::paged_decode_shared,
        "paged decode attention; groups of sequences attend over their shared prefix together");
  m.def("rms_norm", &kvledger::rms_norm, "RMSNorm as Llama computes it");
  m.def("add_rms_norm", &kvledger::add_rms_norm,
        "(RMSNorm(x + residual), x + residual): a residual add and the next norm in one pass");
  m.def("silu_and_mul", &kvledger::silu_and_mul, "SiLU(gate) * up of a packed [gate | up]");
  m.def("split_rope", &kvledger::split_rope,
        "packed qkv -> q, k rotated (rotate-half RoPE) and v, each contiguous");
  m.def("argmax_rows", &kvledger::argmax_rows,
        "each row's first largest value's index (finite rows)");
  m.def("write_kv", &kvledger::write_kv,
        "k and v rows into their KV caches' slots (as two index_copy_ calls, in one)");
  m.def("mask_logits", &kvledger::mask_logits,
        "logits[rows[i]] at -inf where bitmask[i] forbids the token, in place (portable: no "
        "AVX-512 path)");
}
