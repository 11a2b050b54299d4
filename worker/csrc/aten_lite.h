// The parts of torch the kernels' files use, without <torch/extension.h>: that header brings
// pybind11 and torch's whole C++ frontend, and a file including it takes several times as long
// to compile as one with these (docs/performance.md, "Building the kernels"). Only the file
// that defines a module's Python bindings (module.cpp, quant/module.cpp) includes pybind11,
// through torch's casters alone (<torch/csrc/utils/pybind.h>, about half the full header's
// time).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>
