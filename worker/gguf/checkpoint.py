"""`open_checkpoint`: a GGUF file's config and tensors under the model's names, checked whole
before any weight is read (see `worker/gguf/__init__.py` for the interface)."""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from kvledger.gguf_file import (
    GGUFError,
    find_gguf,
    is_gguf,
    metadata,
    open_reader,
    vocabulary_size,
)
from worker.gguf.config import hf_config
from worker.gguf.names import UnknownTensorError, hf_name, permutation
from worker.gguf.tensors import SUPPORTED_TYPES, GGUFTensor, raw_bytes

__all__ = ["GGUFCheckpoint", "GGUFError", "find_gguf", "is_gguf", "open_checkpoint"]


@dataclass
class GGUFCheckpoint:
    path: Path
    reader: GGUFReader
    metadata: dict[str, Any]  # without the vocabulary lists (kvledger/gguf_file.py)
    hf_config: dict[str, Any]
    _tensors: list[GGUFTensor] = field(default_factory=list)

    def tensors(self) -> Iterator[GGUFTensor]:
        """Every tensor, in file order (the order its bytes lie in)."""
        yield from self._tensors

    def release(self, tensor: GGUFTensor) -> None:
        """Drop the tensor's pages from this process's resident memory (they stay in the page
        cache): mapped for the whole load, pages read stayed resident beside the copies."""
        mapped = getattr(self.reader.data, "_mmap", None)
        if mapped is None:
            return
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(mmap.MADV_DONTNEED, start, tensor.offset + tensor.nbytes - start)


def open_checkpoint(path: str | Path) -> GGUFCheckpoint:
    """Parse the file and check that every tensor has a model name and a supported type.

    The last file opened is kept: the worker reads its config several times before loading
    (runner choice, config, weights), and parsing the header of a 49k-token vocabulary takes
    seconds. A file rewritten since (size or modification time) is parsed again.
    """
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError:
        stat = None
    key = (str(path), stat.st_size, stat.st_mtime_ns) if stat else (str(path), -1, -1)
    return _open_cached(*key)


@functools.lru_cache(maxsize=1)
def _open_cached(path_text: str, _size: int, _mtime: int) -> GGUFCheckpoint:
    path = Path(path_text)
    reader = open_reader(path)
    meta = metadata(reader, vocabulary=False)
    names = [t.name for t in reader.tensors]
    config = hf_config(meta, names, vocabulary_size(reader), str(path))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = []
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{path}: tensor {t.name} has type {t.tensor_type.name}, which this worker does "
                f"not dequantize (it reads {', '.join(q.name for q in SUPPORTED_TYPES)}); "
                "requantize the file to one of them with llama-quantize"
            )
        try:
            tensors.append(
                GGUFTensor(
                    name=hf_name(t.name),
                    gguf_name=t.name,
                    ggml_type=t.tensor_type,
                    shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                    offset=int(t.data_offset),
                    raw=raw_bytes(t.data, t.tensor_type, int(t.n_elements)),
                    permute=permutation(t.name, config["model_type"], heads, kv_heads),
                )
            )
        except (UnknownTensorError, ValueError) as err:
            raise GGUFError(f"{path}: tensor {t.name}: {err}") from None
    return GGUFCheckpoint(path, reader, meta, config, tensors)
