"""`--quantization`: which of a GGUF file's weights stay quantized in memory.

- `gguf`: every linear layer, the token embedding and the LM head whose tensors are Q8_0,
  Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K keep the file's blocks and run the compiled
  kernels (`keep.py`); refused where they cannot run (not CPU, a tensor-parallel group, no
  compiler), naming why.
- `gguf-int8`: as `gguf`, and the Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K linear layers quantize their
  activations to int8 per block of 32 (`QuantizedLinear`'s `activations`): integer dot
  products, faster, not exact. Q5_0/Q5_1 layers multiply float activations.
- `none`: every tensor is dequantized to --dtype at load time (the float path).
- `auto` (the default): `gguf` for a GGUF file where it can run, else `none` with a warning.

A Hugging Face (safetensors) checkpoint always loads as before; `gguf` with one is refused.
The kernels' output equals the float path's up to the order of the sums (tests/worker/
test_quant_model.py holds logits within 1e-3 of the dequantized model), so `auto` changes
memory and speed, not what the model computes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from torch import nn

from kvledger.config.worker import QUANTIZATIONS
from kvledger.gguf_file import is_gguf

log = logging.getLogger(__name__)


def check_quantization(mode: str, model_path: Path, device: str, tp_size: int) -> bool:
    """Whether the weights will be kept quantized; ValueError for a request that cannot be
    met. Cheap (no build, no file read beyond its name) except where it must build."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"--quantization {mode!r}: expected one of {', '.join(QUANTIZATIONS)}")
    if mode == "none":
        return False
    if not is_gguf(model_path):
        if mode != "auto":
            raise ValueError(f"--quantization {mode} needs a GGUF file; {model_path} is not one")
        return False
    if mode == "auto" and not _has_blocks(model_path):
        return False  # nothing to keep (an F32/F16 file): no kernels to build
    reason = _why_not(device, tp_size)
    if reason is None:
        return True
    if mode != "auto":
        raise ValueError(f"--quantization {mode}: {reason}")
    log.warning("GGUF weights are dequantized to float: %s", reason)
    return False


def _why_not(device: str, tp_size: int) -> str | None:
    if not device.startswith("cpu"):
        return f"quantized kernels run on CPU only, not on {device}"
    if tp_size > 1:
        return "quantized weights are not sharded across a tensor-parallel group (use -tp 1)"
    from worker.quant import kernels

    built = kernels.load()
    return None if built.ok else built.reason


def _has_blocks(model_path: Path) -> bool:
    from worker.gguf import open_checkpoint  # cached: the config was read from it already
    from worker.quant.formats import FORMATS

    return any(int(t.ggml_type) in FORMATS for t in open_checkpoint(model_path).tensors())


def activations_for(mode: str) -> str:
    """What the kept layers multiply: "int8" for gguf-int8, else "float" (the exact path)."""
    return "int8" if mode == "gguf-int8" else "float"


def keep_gguf_blocks(model: nn.Module, model_path: Path, activations: str = "float") -> set[str]:
    """Swap the model's quantizable layers for blocks of the file; the names taken."""
    from worker.gguf import open_checkpoint
    from worker.quant.keep import keep_quantized

    checkpoint = open_checkpoint(model_path)
    return keep_quantized(model, checkpoint.tensors(), checkpoint.release, activations)
