"""EmbeddingRunner: a BERT-family encoder, its pooling and any sentence-transformers Dense
projections; no KV memory, no sampler. A cross-encoder (a sequence classifier) is served by the
same runner: its "embedding" of a text pair is the pair's scores (`worker/runner/score_head.py`).

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
from worker.models.bert import BertForSequenceClassification
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
    token_types,
)
from worker.runner.score_head import ScoreHead, max_length_default
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
        self.num_labels = cfg.num_labels  # 0: not a cross-encoder
        self.score_head = ScoreHead.from_dir(model_path, cfg.num_labels) if cfg.num_labels else None
        self.pooling = (
            PoolingConfig("cls", False)  # the classifier reads the first token
            if self.score_head
            else PoolingConfig.from_dir(model_path, DEFAULT_POOLING, allow_dense=True)
        )
        self.dtype = resolve_dtype(config.dtype, cfg)
        self.device = torch.device(config.device)
        self.block_size = config.block_size  # only reported: the scheduler's no-KV ledger needs one
        self.num_blocks = 0
        default_len = cfg.max_seq_length or (
            max_length_default(model_path) if self.score_head else None
        )
        self.max_model_len = context_length(
            config.max_model_len, cfg.max_position_embeddings, default_len
        )
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids: list[int] = []
        # Dense projections (sentence-transformers) map the pooled vector to the last one's size
        self.dense = load_dense_heads(model_path, self.pooling.dense, cfg.hidden_size, self.device)
        self.embedding_size = cfg.num_labels or (
            self.pooling.dense[-1].out_features if self.pooling.dense else cfg.hidden_size
        )
        self.limits = BatchLimits(
            self.block_size, 0, self.vocab_size, self.max_model_len, pairs=bool(self.score_head)
        )
        self.model = build_encoder(cfg, self.dtype, self.device)
        load_weights(self.model, model_path, progress=config.progress)
        prepare_for_device(self.model, self.device)
        log.info(
            "model %s: %s, %d layers, %s, %s%s%s, max %d tokens",
            model_path,
            cfg.architecture,
            cfg.num_layers,
            self.dtype,
            f"{cfg.num_labels} scores, {self.score_head.activation}"
            if self.score_head
            else f"{self.pooling.mode} pooling",
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
        """One bidirectional pass over the whole batch; a vector per item (a cross-encoder's:
        the scores of the pair the item holds)."""
        if not items:
            return []
        lens, ids = flat_inputs(
            items,
            self.vocab_size,
            self.max_model_len,
            self.embedding_size,
            self.device,
            pairs=self.limits.pairs,
        )
        positions, plan = seq_positions(lens, self.device), dense_plan(lens, False, self.device)
        hidden = self.model(ids, positions, plan, token_types(items, self.device))
        if self.score_head is not None:
            return self._scores(hidden, lens, self.score_head)
        pooled = pool(hidden, lens, self.pooling.mode)
        if self.dense is not None:
            pooled = self.dense(pooled)
        return finish(pooled, items, self.pooling.normalize)

    def _scores(self, hidden: torch.Tensor, lens: list[int], head: ScoreHead) -> list[list[float]]:
        """Each pair's first-token state through the pooler and classifier (in the model's
        dtype), then the activation `CrossEncoder.predict` applies (in float32)."""
        model = self.model
        assert isinstance(model, BertForSequenceClassification)
        first = pool(hidden, lens, "cls").to(hidden.dtype)
        return head.scores(model.classify(first)).cpu().tolist()
