"""The steps of building a runner that are not the runner's own state: the dtype a name means,
the threads to use, the context length, whether the fused CPU ops and CUDA graphs run, the
GGUF metadata the grammars read. Both runners (`ModelRunner`, `EmbeddingRunner`) share them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kvledger.config.worker import DTYPES as DTYPE_NAMES
from kvledger.gguf_file import is_gguf
from worker import native
from worker.attention.base import AttentionBackend
from worker.attention.flash_attn_backend import FlashAttention
from worker.config import EncoderConfig, ModelConfig
from worker.parallel.distributed import TPGroup

log = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if name != "auto"}


def resolve_dtype(name: str, cfg: ModelConfig | EncoderConfig) -> torch.dtype:
    """`auto` takes the checkpoint's dtype when it is a half type, else float32."""
    if name == "auto":
        name = cfg.torch_dtype if cfg.torch_dtype in ("bfloat16", "float16") else "float32"
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (auto, {', '.join(DTYPES)})")
    return DTYPES[name]


def default_threads(share: int = 1) -> None:
    """Use the cores this process may run on, unless the operator chose (OMP_NUM_THREADS);
    `share` ranks of a tensor-parallel group on one CPU split them (OpenMP threads of two
    ranks competing for a core make each rank's barriers wait on the other's)."""
    if "OMP_NUM_THREADS" not in os.environ and hasattr(os, "sched_getaffinity"):
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // share))


def context_length(requested: int | None, positions: int, default: int | None = None) -> int:
    """--max-model-len within the model's positions; unset, `default` or all of them."""
    if requested is None:
        return min(positions, default or positions)
    if not 0 < requested <= positions:
        raise ValueError(
            f"max_model_len {requested} must be in [1, "
            f"{positions}] (the model's max_position_embeddings)"
        )
    return requested


def graphs_wanted(
    max_batch: int, device: torch.device, backend: AttentionBackend, tp: TPGroup
) -> str | None:
    """The CUDA-graph buckets to capture ("up to N sequences"), or None, saying why not."""
    if max_batch <= 0 or device.type != "cuda":
        return None
    why = None
    if not isinstance(backend, FlashAttention):
        why = f"they need the flash_attn backend, and this worker runs {backend.name}"
    elif tp.size > 1:
        why = "not with tensor parallelism"
    if why:
        log.warning("CUDA graphs off: %s", why)
        return None
    return f"for decode steps of up to {max_batch} sequences"


def native_ops(wanted: bool, device: torch.device) -> ModuleType | None:
    """The compiled CPU kernels for the decoder's fused steps; None off CPU, when turned off
    (--no-fused-cpu-ops), or when they do not build here (the torch ops then run, saying so)."""
    if not wanted or device.type != "cpu":
        return None
    built = native.load()
    if not built.ok:
        log.warning("fused CPU ops: %s; using torch ops", built.reason)
    return built.module


def gguf_metadata(source: Path) -> dict[str, Any] | None:
    """The metadata of the GGUF file the weights were read from, vocabulary included, as the
    worker parsed it once (worker/gguf/checkpoint.py), for the grammar engine's tokenizer; None
    for a tokenizer.json directory."""
    if not is_gguf(source):
        return None
    from worker.gguf import open_checkpoint

    return open_checkpoint(source).tokenizer_metadata()
