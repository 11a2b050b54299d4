"""One checkpoint tensor, read on demand: the common shape of a safetensors file's tensors
(worker/models/loader.py) and a GGUF file's (worker/gguf/load.py), a leaf both import."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StoredTensor:
    """`read(None)` is all of the tensor, `read(source)` the slice a tensor-parallel rank
    takes (`Piece.source`)."""

    name: str
    read: Callable[[Any], torch.Tensor]
