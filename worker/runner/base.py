"""What the executor asks of a model (`Runner`), and the runner a model directory needs: an
encoder embeds (`EmbeddingRunner`), a decoder generates (`ModelRunner`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvledger.groups import GrammarLimits
from kvledger.structured import StructuredSpec
from worker.config import is_encoder
from worker.parallel.distributed import TPGroup
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.embedding_runner import EmbeddingRunner
from worker.runner.model_runner import ModelRunner
from worker.runner.pooling import EmbedItem
from worker.sample.constraints import Constraint
from worker.sample.sampler import Sample


class Runner(Protocol):
    """Everything the executor uses of a model; test stand-ins implement all of it too.

    - `kind`: "generate" runs chunks; "embed" only embeds (the executor fails a generating
      request on such a runner without calling `execute`).
    - `limits`: what a chunk or an embedding input must fit (block size, pool, vocabulary,
      context); the executor checks every request against them, so one bad request fails alone
      instead of the whole step.
    - `embedding_size`: the width of the vectors `embed` returns; 0 for a runner that computes
      no embeddings (the executor fails embedding requests on it without calling `embed`).
    """

    kind: str
    limits: BatchLimits
    embedding_size: int

    def execute(self, chunks: list[SeqChunk]) -> Sequence[Sample | None]:
        """One forward pass over valid chunks: per chunk, a Sample when it samples (`sample`)
        or scores prompt tokens, else None; `Sample.error` fails that request alone."""
        ...

    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        """One pass over whole, valid inputs that keeps nothing in the KV cache: a vector each."""
        ...

    def constraint(self, spec: StructuredSpec) -> Constraint:
        """A fresh grammar matcher for a structured request (asked only of a "generate"
        runner); StructuredError when the spec cannot be served here."""
        ...


def load_runner(
    model_path: Path,
    *,
    block_size: int,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    dtype: str = "float32",
    kv_cache_dtype: str = "auto",
    device: str = "cpu",
    max_model_len: int | None = None,
    seed: int = 0,
    attention_backend: str = "torch",
    fused_cpu_ops: bool = True,
    screened_greedy_head: bool = True,
    quantization: str = "auto",
    cuda_graph_max_batch: int = 0,
    progress: bool = True,
    tp: TPGroup | None = None,
    tokenizer: str | None = None,
    grammar_limits: GrammarLimits | None = None,
) -> ModelRunner | EmbeddingRunner:
    """The worker's flags, whichever the model: an encoder keeps no KV cache and samples
    nothing, so the KV sizing, the seed, the attention backend, the decoder's fused CPU ops
    and the tokenizer (structured outputs' grammars) do not reach it."""
    model_path = Path(model_path)
    if is_encoder(model_path):
        if tp is not None and tp.size > 1:
            raise ValueError("embedding models are served by single-rank workers")
        return EmbeddingRunner(
            model_path,
            block_size=block_size,
            dtype=dtype,
            device=device,
            max_model_len=max_model_len,
            progress=progress,
        )
    return ModelRunner(
        model_path,
        block_size=block_size,
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        device=device,
        max_model_len=max_model_len,
        seed=seed,
        attention_backend=attention_backend,
        fused_cpu_ops=fused_cpu_ops,
        screened_greedy_head=screened_greedy_head,
        quantization=quantization,
        cuda_graph_max_batch=cuda_graph_max_batch,
        progress=progress,
        tp=tp,
        tokenizer=tokenizer,
        grammar_limits=grammar_limits,
    )
