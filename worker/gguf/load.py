"""A GGUF file's tensors for `worker/models/loader.py`: dequantized to float32 one at a time, each
tensor's file pages released once read, so the load peaks at the model plus one tensor."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from worker.gguf.checkpoint import GGUFCheckpoint, open_checkpoint
from worker.gguf.tensors import GGUFTensor
from worker.models.stored import StoredTensor


def gguf_tensors(path: Path) -> list[StoredTensor]:
    checkpoint = open_checkpoint(path)
    return [StoredTensor(t.name, partial(_read, checkpoint, t)) for t in checkpoint.tensors()]


def _read(checkpoint: GGUFCheckpoint, tensor: GGUFTensor, source: Any) -> torch.Tensor:
    # A tensor-parallel rank's slice is cut from the whole dequantized tensor: blocks run along
    # rows, and llama.cpp's Q/K order has to be undone on whole heads first.
    values = tensor.dequantize()
    checkpoint.release(tensor)
    return values if source is None else values[source].contiguous()
