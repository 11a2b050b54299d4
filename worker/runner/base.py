"""What the executor asks of a model (`Runner`), and the runner a model directory needs: an
encoder embeds (`EmbeddingRunner`), a decoder generates (`ModelRunner`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvledger.structured import StructuredSpec
from worker.config import is_encoder
from worker.parallel.distributed import TPGroup
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.config import RunnerConfig
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


def load_runner(config: RunnerConfig, tp: TPGroup | None = None) -> ModelRunner | EmbeddingRunner:
    """The runner the model needs: an encoder embeds (single-rank only), a decoder generates."""
    if is_encoder(config.model_path):
        if tp is not None and tp.size > 1:
            raise ValueError("embedding models are served by single-rank workers")
        return EmbeddingRunner(config)
    return ModelRunner(config, tp)
