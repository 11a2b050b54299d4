"""`open_checkpoint`: a GGUF file's config and tensors under the model's names, checked whole
before any weight is read (see `worker/gguf/__init__.py` for the interface).

What is cached between calls is the parsed header alone (metadata, config, each tensor's type,
shape and place in the file): `gguf.GGUFReader` builds a numpy view per vocabulary string
(many times the vocabulary's own size in Python objects; docs/performance.md, "Memory"), and
kept, it held them and the file's mapping for the worker's life. Each `open_checkpoint` maps
the file anew (no parse), and the mapping goes when the last of its tensors is dropped: after
loading, the worker holds neither.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from kvledger.gguf_file import (
    VOCABULARY_KEYS,
    GGUFError,
    find_gguf,
    is_gguf,
    metadata,
    open_reader,
    vocabulary_size,
)
from worker.gguf.config import hf_config
from worker.gguf.names import Permute, UnknownTensorError, hf_name, permutation
from worker.gguf.tensors import SUPPORTED_TYPES, GGUFTensor, raw_bytes

__all__ = ["GGUFCheckpoint", "GGUFError", "find_gguf", "is_gguf", "open_checkpoint"]


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lies in the file and what it is: a `GGUFTensor` without its bytes."""

    name: str
    gguf_name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    permute: Permute | None


@dataclass(frozen=True)
class Header:
    """The parsed file, without any array of it (what the cache keeps)."""

    metadata: dict[str, Any]  # without the vocabulary lists (kvledger/gguf_file.py)
    hf_config: dict[str, Any]
    specs: tuple[TensorSpec, ...]
    # the tokenizer's token, score, type and merge lists as plain Python lists (a small part
    # of what the reader's arrays of them take): the grammar engine's tokenizer is built from
    # them, so the file is parsed once per process
    vocabulary: dict[str, Any]


@dataclass
class GGUFCheckpoint:
    path: Path
    data: np.memmap  # the whole file, read-only; unmapped once this and its tensors are gone
    metadata: dict[str, Any]
    hf_config: dict[str, Any]
    _tensors: list[GGUFTensor]
    _vocabulary: dict[str, Any]

    def tokenizer_metadata(self) -> dict[str, Any]:
        """Every metadata field, the vocabulary lists included (kvledger/gguf_tokenizer.py)."""
        return {**self.metadata, **self._vocabulary}

    def tensors(self) -> Iterator[GGUFTensor]:
        """Every tensor, in file order (the order its bytes lie in)."""
        yield from self._tensors

    def release(self, tensor: GGUFTensor) -> None:
        """Drop the tensor's pages from this process's resident memory (they stay in the page
        cache): mapped for the whole load, pages read stayed resident beside the copies."""
        mapped = getattr(self.data, "_mmap", None)
        if mapped is None:
            return
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(mmap.MADV_DONTNEED, start, tensor.offset + tensor.nbytes - start)


def open_checkpoint(path: str | Path) -> GGUFCheckpoint:
    """Parse the file and check that every tensor has a model name and a supported type.

    The last file's header is kept: the worker reads its config several times before loading
    (runner choice, config, weights), and parsing the header of a 49k-token vocabulary takes
    seconds. A file rewritten since (size or modification time) is parsed again. The file
    itself is mapped anew for each checkpoint returned (cheap: nothing is parsed).
    """
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError:
        stat = None
    key = (str(path), stat.st_size, stat.st_mtime_ns) if stat else (str(path), -1, -1)
    return _open(path, _open_cached(*key))


@functools.lru_cache(maxsize=1)
def _open_cached(path_text: str, _size: int, _mtime: int) -> Header:
    return _header(Path(path_text))


def _open(path: Path, header: Header) -> GGUFCheckpoint:
    data = np.memmap(path, mode="r")
    tensors = [
        GGUFTensor(
            name=s.name,
            gguf_name=s.gguf_name,
            ggml_type=s.ggml_type,
            shape=s.shape,
            offset=s.offset,
            raw=data[s.offset : s.offset + s.nbytes],
            permute=s.permute,
        )
        for s in header.specs
    ]
    return GGUFCheckpoint(path, data, header.metadata, header.hf_config, tensors, header.vocabulary)


def _header(path: Path) -> Header:
    reader = open_reader(path)  # dropped on return: its fields are a great many small arrays
    meta = metadata(reader, vocabulary=False)
    names = [t.name for t in reader.tensors]
    config = hf_config(meta, names, vocabulary_size(reader), str(path))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    specs = []
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{path}: tensor {t.name} has type {t.tensor_type.name}, which this worker does "
                f"not dequantize (it reads {', '.join(q.name for q in SUPPORTED_TYPES)}); "
                "requantize the file to one of them with llama-quantize"
            )
        try:
            specs.append(
                TensorSpec(
                    name=hf_name(t.name),
                    gguf_name=t.name,
                    ggml_type=t.tensor_type,
                    shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                    offset=int(t.data_offset),
                    nbytes=int(raw_bytes(t.data, t.tensor_type, int(t.n_elements)).size),
                    permute=permutation(t.name, config["model_type"], heads, kv_heads),
                )
            )
        except (UnknownTensorError, ValueError) as err:
            raise GGUFError(f"{path}: tensor {t.name}: {err}") from None
    vocabulary = {k: found.contents() for k in VOCABULARY_KEYS if (found := reader.fields.get(k))}
    return Header(meta, config, tuple(specs), vocabulary)
