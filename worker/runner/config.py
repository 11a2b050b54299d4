"""What a runner is built from, as one value: `RunnerConfig`, made from the worker's flags once
(`runner_config`) and passed whole to the runner of every rank, as nano-vllm's `Config` is.

A new worker setting that a runner reads is a field here and a line in `runner_config`; no
keyword list is repeated between the entry point, the runner loader, the tensor-parallel ranks
and the runners. An encoder reads only the fields it uses (`EmbeddingRunner` says which).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from kvledger.config.worker import CPU_KV_CACHE_BYTES, WorkerSettings
from kvledger.groups import GrammarLimits
from worker.device_defaults import choose
from worker.parallel.distributed import rank_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerConfig:
    """A model and how to run it: paged KV memory, numerics, kernels, structured outputs."""

    model_path: Path
    block_size: int = 16
    # the KV pool: a block count, else bytes, else (CUDA) what the utilization budget leaves
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    device: str = "cpu"
    max_model_len: int | None = None
    seed: int = 0
    attention_backend: str = "torch"
    fused_cpu_ops: bool = True
    screened_greedy_head: bool = True
    quantization: str = "auto"
    cuda_graph_max_batch: int = 0  # 0: no CUDA graphs
    progress: bool = True  # a progress bar while the weights load
    tokenizer: str | None = None  # structured outputs' grammars read it (None: the model's)
    grammar_limits: GrammarLimits | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", Path(self.model_path))
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")

    def on(self, device: str) -> RunnerConfig:
        """The same settings for a rank on another device."""
        return dataclasses.replace(self, device=device)


def runner_config(settings: WorkerSettings, model_path: Path) -> RunnerConfig:
    """The runner's settings from the flags (every rank of a group takes the same; rank 0
    the first of its GPUs, a single worker --device as given)."""
    kv_bytes = settings.kv_cache_memory_bytes
    if kv_bytes is None and not settings.device.startswith("cuda"):
        kv_bytes = CPU_KV_CACHE_BYTES
    chosen = choose(
        settings.device, settings.dtype, settings.block_size, settings.attention_backend
    )
    if chosen.reason:
        log.info(
            "on %s: %s, KV blocks of %d tokens, attention %s expected (%s)",
            settings.device,
            chosen.dtype,
            chosen.block_size,
            chosen.attention,
            chosen.reason,
        )
    grouped = settings.tensor_parallel_size > 1
    return RunnerConfig(
        model_path=model_path,
        block_size=chosen.block_size,
        num_blocks=settings.num_kv_blocks,
        kv_cache_memory_bytes=kv_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        dtype=chosen.dtype,
        kv_cache_dtype=settings.kv_cache_dtype,
        device=rank_device(settings.device, 0) if grouped else settings.device,
        max_model_len=settings.max_model_len,
        seed=settings.seed,
        attention_backend=settings.attention_backend,
        fused_cpu_ops=settings.fused_cpu_ops,
        screened_greedy_head=settings.screened_greedy_head,
        quantization=settings.quantization,
        cuda_graph_max_batch=settings.cuda_graph_max_batch if settings.cuda_graphs else 0,
        progress=settings.log_format == "text",  # a progress bar is no JSON line
        tokenizer=settings.tokenizer,
        # what a grammar may cost: the frontend's bounds (--max-structured-depth, ...)
        grammar_limits=GrammarLimits(
            **{f.name: getattr(settings, f.name) for f in dataclasses.fields(GrammarLimits)}
        ),
    )
