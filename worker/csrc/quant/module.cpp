// The quantized kernels' Python module: the CPU checks and the decode step's direct entry points
// (ops.h). The only file of the module that includes pybind11 and torch's tensor casters: every
// other one builds on ../aten_lite.h, in a fraction of the time.
#include <torch/csrc/utils/pybind.h>

#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("best_isa", &kvledger::quant::best_isa, "the isa the operators use when given 0");
  m.def("kernel_isa", &kvledger::quant::kernel_isa,
        "the isa of the float kernel linear runs for (ggml type, isa)");
  m.def("cpu_has", &kvledger::quant::cpu_has, "whether this CPU runs the given isa");
  m.def("best_int8_isa", &kvledger::quant::best_int8_isa, "the isa linear_int8 uses given 0");
  m.def("cpu_has_int8", [](int64_t isa) { return kvledger::quant::cpu_has(kvledger::quant::kInt8 + isa); },
        "whether this CPU runs linear_int8 with the given isa");
  m.def("q8_vnni_runs", &kvledger::quant::q8_vnni_runs,
        "whether int8 activations on Q8_0 tiles run their VNNI kernel (AVX512-VBMI too)");
  // the operators a decode step calls per layer, without torch.ops' dispatch (ops.h)
  m.def("linear_rows16", &kvledger::quant::direct_linear_rows16, "as kvledger_quant::linear_rows16");
  m.def("linear_int8_rows16", &kvledger::quant::direct_linear_int8_rows16,
        "as kvledger_quant::linear_int8_rows16");
  m.def("linear_f32_rows16", &kvledger::quant::direct_linear_f32_rows16,
        "as kvledger_quant::linear_f32_rows16");
}
