"""Builds and loads the quantized linear kernels (`worker/csrc/quant/`), once per machine.

They form their own extension, built without `-march=native`: each instruction-set path
(AVX-512, AVX2, scalar) is compiled with a function-level target and chosen at run time from
the CPU's flags, so one build serves every x86-64 CPU. Loading it registers the operators
`torch.ops.kvledger_quant.linear` and `.dequantize` (the module's docstring in
`worker/csrc/quant/linear.cpp` states their contract).

`KVLEDGER_QUANT_ISA` (auto, scalar, avx2, avx512) forces a path; the tests use the `isa`
argument to cover each path the CPU can run.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from types import ModuleType

import torch

from worker import native

CSRC = Path(__file__).parent.parent / "csrc" / "quant"
SOURCES = [
    CSRC / name
    for name in (
        "module.cpp",
        "linear.cpp",
        "rows16_ops.cpp",
        "scalar.cpp",
        "avx2.cpp",
        "avx512.cpp",
        "kquant_avx2.cpp",
        "kquant_avx512.cpp",
        "kquant_int8_avx2.cpp",
        "kquant_int8_vnni.cpp",
        "int8_scalar.cpp",
        "int8_avx2.cpp",
        "int8_vnni.cpp",
        "rows16.cpp",
        "rows16_vnni.cpp",
        "rows16_vnni_q8.cpp",
        "rows16_avx512.cpp",
        "rows16_f32.cpp",
        "screen.cpp",
        "screen_groups.cpp",
    )
]
HEADERS = [
    CSRC.parent / "aten_lite.h",
    CSRC / "blocks.h",
    CSRC / "kquants.h",
    CSRC / "kquants_avx2.h",
    CSRC / "int8_tile.h",
    CSRC / "kquant_int8_tile.h",
    CSRC / "rows16.h",
    CSRC / "ops.h",
]
ISAS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}
ISA_ENV = "KVLEDGER_QUANT_ISA"
_lock = threading.Lock()
_loaded: dict[str, native.Built] = {}


FLAGS = ("-O3", "-ffast-math", "-fno-finite-math-only")


def build_name(flags: tuple[str, ...] = FLAGS) -> str:
    """A digest of the sources, their directory and compiler flags (as in `native.build_name`)
    and torch's version: not of the CPU, the build is portable."""
    digest = hashlib.sha256(torch.__version__.encode() + str(CSRC).encode())
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(" ".join(flags).encode())
    return f"kvledger_quant_ops_{digest.hexdigest()[:12]}"


def load() -> native.Built:
    """The compiled module (its operators registered), or why it could not be built."""
    with _lock:
        if "module" not in _loaded:
            built = native.build_extension(build_name(), SOURCES, list(FLAGS))
            if built.ok:
                _register_fakes()
            _loaded["module"] = built
        return _loaded["module"]


def require() -> ModuleType:
    """The module, or a RuntimeError saying why there is none (quantized weights need it)."""
    return load().require("quantized weights")


# Q4_0, Q4_1, Q8_0 (worker/csrc/quant/rows16.h; with int8 activations Q8_0 tiles need
# AVX512-VBMI for their VNNI kernel, else take the exact kernel on the activations dequantized)
ROWS16_TYPES = (2, 3, 8)


def rows16_runs(ggml_type: int, out_features: int, activations: str, isa: int) -> bool:
    """Whether a layer of this type and size runs on rows16 tiles here: whole groups of 16
    rows, the isa left to the CPU (or naming AVX-512), and an AVX-512 CPU (with VNNI for
    int8 activations)."""
    if ggml_type not in ROWS16_TYPES or out_features % 16 or isa not in (0, ISAS["avx512"]):
        return False
    module = require()
    if activations == "int8":
        return bool(module.cpu_has_int8(ISAS["avx512"]))
    return bool(module.cpu_has(ISAS["avx512"]))


def isa_from_env() -> int:
    name = os.environ.get(ISA_ENV, "auto").strip().lower() or "auto"
    if name not in ISAS:
        raise ValueError(f"{ISA_ENV}={name!r}: expected one of {', '.join(ISAS)}")
    return ISAS[name]


def _register_fakes() -> None:
    """Shapes without computing, for torch.compile and meta tensors."""

    def linear(
        x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, in_features: int, isa: int = 0
    ) -> torch.Tensor:
        return x.new_empty(*x.shape[:-1], blocks.shape[0])

    def dequantize(
        blocks: torch.Tensor, ggml_type: int, in_features: int, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        rows = (blocks.shape[0],) if ids is None else tuple(ids.shape)
        return blocks.new_empty(*rows, in_features, dtype=torch.float32)

    torch.library.register_fake("kvledger_quant::linear", linear)
    torch.library.register_fake("kvledger_quant::linear_int8", linear)
    torch.library.register_fake("kvledger_quant::dequantize", dequantize)

    def linear_rows16(
        x: torch.Tensor, tiles: torch.Tensor, ggml_type: int, in_features: int
    ) -> torch.Tensor:
        return x.new_empty(*x.shape[:-1], tiles.shape[0] * 16)

    def dequantize_rows16(
        tiles: torch.Tensor, ggml_type: int, in_features: int, ids: torch.Tensor
    ) -> torch.Tensor:
        return tiles.new_empty(*ids.shape, in_features, dtype=torch.float32)

    torch.library.register_fake("kvledger_quant::linear_rows16", linear_rows16)
    torch.library.register_fake("kvledger_quant::linear_int8_rows16", linear_rows16)
    torch.library.register_fake("kvledger_quant::dequantize_rows16", dequantize_rows16)

    def linear_f32_rows16(x: torch.Tensor, tiles: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(*x.shape[:-1], out_features)

    torch.library.register_fake("kvledger_quant::linear_f32_rows16", linear_f32_rows16)
