"""GGUF checkpoints (llama.cpp's file format), read with the `gguf` package llama.cpp ships.

The interface, for the loader and for anything that keeps weights quantized in memory:

- `open_checkpoint(path) -> GGUFCheckpoint`: the file's metadata (`metadata`, a dict of plain
  Python values), its Hugging Face-style `config.json` dict (`hf_config`) and its tensors.
- `GGUFCheckpoint.tensors()` yields one `GGUFTensor` per tensor, in file order, each with:
  - `name`: the model-side (Hugging Face) parameter name, e.g.
    `model.layers.0.self_attn.q_proj.weight`; `gguf_name` keeps llama.cpp's (`blk.0.attn_q.weight`);
  - `ggml_type`: a `gguf.GGMLQuantizationType` (F32, Q8_0, Q4_1, ...);
  - `shape`: the logical shape in PyTorch order, `(out_features, in_features)` for a linear
    weight (GGUF lists dimensions innermost first; this is that list reversed);
  - `blocks()`: the raw data as a numpy uint8 array of shape `(rows, bytes_per_row)`, rows in
    the model's order (llama.cpp's Q/K row permutation already undone: it moves whole rows, and a
    quantization block never spans two rows), a view into the file where no rows move;
  - `dequantize()`: the tensor as float32 torch, model's layout, through
    `gguf.quants.dequantize` (`worker/gguf/tensors.py`).
  Dequantization is a separate step, so a caller may keep `blocks()` as they are.
- `GGUFCheckpoint.release(tensor)`: drops the tensor's file pages from the process's resident
  memory once it is copied, so loading peaks at the loaded model plus one tensor.
- Each checkpoint maps the file itself; only the parsed header is cached between calls, so
  the mapping ends when the checkpoint and its tensors are dropped (after loading).

Refusals raise `GGUFError` (a ValueError) with one line naming the cause: an architecture or
tensor type this worker does not run, a truncated or malformed file.
"""

from worker.gguf.checkpoint import (
    GGUFCheckpoint,
    GGUFError,
    find_gguf,
    is_gguf,
    open_checkpoint,
)
from worker.gguf.tensors import SUPPORTED_TYPES, GGUFTensor

__all__ = [
    "SUPPORTED_TYPES",
    "GGUFCheckpoint",
    "GGUFError",
    "GGUFTensor",
    "find_gguf",
    "is_gguf",
    "open_checkpoint",
]
