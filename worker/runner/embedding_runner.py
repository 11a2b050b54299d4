"""EmbeddingRunner: a BERT-family encoder, its pooling and any sentence-transformers Dense
projections; no KV memory, no sampler.

It reads only the settings an encoder uses (its constructor says which);
`worker.runner.base.load_runner` chooses the runner a model needs.
"""

from __future__ import annotations

import logging

import torch

from worker.attention.dense import dense_plan, seq_positions
from worker.config import EncoderConfig
from worker.layers.linear import prepare_for_device
from worker.models import build_encoder
from worker.models.loader import load_weights
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.config import RunnerConfig
from worker.runner.pooling import (
    EmbedItem,
    PoolingConfig,
    finish,
    flat_inputs,
    load_dense_heads,
    pool,
)
from worker.runner.setup import context_length, default_threads, resolve_dtype
from worker.sample.sampler import Sample

log = logging.getLogger(__name__)

# vLLM's default for BERT-family models without a sentence-transformers pipeline.
DEFAULT_POOLING = PoolingConfig("cls", True)
EMBED_ONLY = "this worker only computes embeddings"


class EmbeddingRunner:
    kind = "embed"

    def __init__(self, config: RunnerConfig) -> None:
        """Of the runner's settings an encoder reads its model, block size, dtype, device,
        context length and progress bar: nothing is cached (no KV sizing), nothing sampled
        (no seed), attention is dense (no paged backend)."""
        default_threads()
        model_path = config.model_path
        self.settings = config
        self.config = cfg = EncoderConfig.from_dir(model_path)
        self.pooling = PoolingConfig.from_dir(model_path, DEFAULT_POOLING, allow_dense=True)
        self.dtype = resolve_dtype(config.dtype, cfg)
        self.device = torch.device(config.device)
        self.block_size = config.block_size  # only reported: the scheduler's no-KV ledger needs one
        self.num_blocks = 0
        self.max_model_len = context_length(
            config.max_model_len, cfg.max_position_embeddings, cfg.max_seq_length
        )
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids: list[int] = []
        # Dense projections (sentence-transformers) map the pooled vector to the last one's size
        self.dense = load_dense_heads(model_path, self.pooling.dense, cfg.hidden_size, self.device)
        self.embedding_size = (
            self.pooling.dense[-1].out_features if self.pooling.dense else cfg.hidden_size
        )
        self.limits = BatchLimits(self.block_size, 0, self.vocab_size, self.max_model_len)
        self.model = build_encoder(cfg, self.dtype, self.device)
        load_weights(self.model, model_path, progress=config.progress)
        prepare_for_device(self.model, self.device)
        log.info(
            "model %s: %s, %d layers, %s, %s pooling%s%s, max %d tokens",
            model_path,
            cfg.architecture,
            cfg.num_layers,
            self.dtype,
            self.pooling.mode,
            "".join(
                f" + dense {d.in_features}->{d.out_features} {d.activation}"
                for d in self.pooling.dense
            ),
            " + normalize" if self.pooling.normalize else "",
            self.max_model_len,
        )

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        """An encoder generates nothing: every chunk fails (the executor never sends one)."""
        return [Sample(error=EMBED_ONLY) for _ in chunks]

    @torch.inference_mode()
    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        """One bidirectional pass over the whole batch; a vector per item."""
        if not items:
            return []
        lens, ids = flat_inputs(
            items, self.vocab_size, self.max_model_len, self.embedding_size, self.device
        )
        hidden = self.model(
            ids, seq_positions(lens, self.device), dense_plan(lens, False, self.device)
        )
        pooled = pool(hidden, lens, self.pooling.mode)
        if self.dense is not None:
            pooled = self.dense(pooled)
        return finish(pooled, items, self.pooling.normalize)
