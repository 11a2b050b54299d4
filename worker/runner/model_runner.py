"""ModelRunner: a model, its paged KV memory and a sampler; one batched forward per step."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import torch

from kvledger.structured import StructuredSpec
from worker.attention import get_backend
from worker.attention.dense import dense_plan, seq_positions
from worker.config import ModelConfig
from worker.layers.head_screens import screen_for
from worker.layers.linear import prepare_for_device
from worker.models import build_model
from worker.models.loader import load_weights
from worker.parallel.distributed import TPGroup, check_tensor_parallel, split_heads
from worker.quant.select import activations_for, check_quantization, keep_gguf_blocks
from worker.runner.batch import BatchLimits, SeqChunk, prepare_batch
from worker.runner.config import RunnerConfig
from worker.runner.cuda_graphs import DecodeGraphs
from worker.runner.kv_cache import KVCache, KVShape, gpu_kv_budget, kv_dtype, num_blocks_for
from worker.runner.pooling import EmbedItem, PoolingConfig, finish, flat_inputs, pool
from worker.runner.setup import (
    context_length,
    default_threads,
    gguf_metadata,
    graphs_wanted,
    native_ops,
    resolve_dtype,
)
from worker.sample import sampler as sampling_rules
from worker.sample.constraints import Constraint, Grammars
from worker.sample.sampler import NONFINITE_LOGITS, PromptLogprobs, Sample, Sampler, score_tokens
from worker.sample.verify import draft_views, verdicts, view_rows

log = logging.getLogger(__name__)

# Rows of full-vocabulary logits held at once when scoring a prompt: a long prefill chunk would
# otherwise hold chunk x vocab floats (GBs for a large vocabulary).
PROMPT_SCORE_ROWS = 256


class ModelRunner:
    """A decoder: generates on paged KV memory; also embeds (last-token pooling by default)."""

    kind = "generate"
    num_labels = 0  # not a cross-encoder (EmbeddingRunner's)

    def __init__(self, config: RunnerConfig, tp: TPGroup | None = None) -> None:
        """The steps in order; everything that can be refused is checked before any memory
        is taken."""
        self.settings = config
        self.tp = tp = tp or TPGroup()
        self.device = torch.device(config.device)
        default_threads(tp.size if self.device.type == "cpu" else 1)
        self.config = cfg = self._check(config)
        shape = self._kv_shape(cfg)
        asked = self._asked_blocks(config, shape)  # None: sized from the GPU after the weights
        self.backend = get_backend(
            config.attention_backend,
            dtype=self.dtype,
            block_size=self.block_size,
            device=self.device,
        )
        ops = self._load_model(config, cfg)
        # greedy rows' tokens from a screen and a few exact logits (the same tokens)
        self.greedy_head = screen_for(
            self.model.lm_head, self.vocab_size, config.screened_greedy_head
        )
        self.num_blocks = self._pool_blocks(config, shape, asked)
        graphs = graphs_wanted(config.cuda_graph_max_batch, self.device, self.backend, tp)
        self._allocate_kv(shape, graphs)
        self.limits = BatchLimits(
            self.block_size, self.num_blocks, self.vocab_size, self.max_model_len
        )
        self.sampler = Sampler(config.seed, ops)
        self.grammars = self._grammars(config)
        self.graphs = self._capture_graphs(config, graphs)
        self.grammars.prepare()  # at start, beside the scheduler link: no request builds it
        log.info(
            "model %s: %s, %d layers, %s, %d KV blocks of %d tokens in %s (%.1f MiB)",
            config.model_path,
            cfg.architecture,
            cfg.num_layers,
            self.dtype,
            self.num_blocks,
            self.block_size,
            self.kv_dtype,
            self.num_blocks * shape.bytes_per_block() / 2**20,
        )

    def _check(self, config: RunnerConfig) -> ModelConfig:
        """The model's config, and every refusal that needs no memory: the group's split, the
        quantization, the dtypes, the context length."""
        cfg = ModelConfig.from_dir(config.model_path)
        check_tensor_parallel(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, self.tp.size)
        # whether a GGUF file's blocks stay quantized in memory (worker/quant/select.py)
        self.quantized = check_quantization(
            config.quantization, config.model_path, config.device, self.tp.size
        )
        self.dtype = resolve_dtype(config.dtype, cfg)
        self.kv_dtype = kv_dtype(config.kv_cache_dtype, self.dtype, self.device)
        self.block_size = config.block_size
        self.max_model_len = context_length(config.max_model_len, cfg.max_position_embeddings)
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = list(cfg.eos_token_ids)
        self.embedding_size = cfg.hidden_size
        self.pooling = PoolingConfig.from_dir(config.model_path, PoolingConfig("last", True))
        return cfg

    def _kv_shape(self, cfg: ModelConfig) -> KVShape:
        """One block's shape: each rank's cache holds its own KV heads, for the same block ids
        as every other rank."""
        kv_heads = split_heads(cfg.num_heads, cfg.num_kv_heads, self.tp.rank, self.tp.size).kv_heads
        return KVShape(cfg.num_layers, self.block_size, kv_heads, cfg.head_dim, self.kv_dtype)

    def _load_model(self, config: RunnerConfig, cfg: ModelConfig) -> ModuleType | None:
        """The network with its weights (a GGUF file's blocks kept as they are where they
        stay quantized), prepared for the device; the fused CPU ops it runs with, if any."""
        self.model = build_model(
            cfg, self.backend, self.max_model_len, self.dtype, self.device, self.tp
        )
        held = set()
        if self.quantized:
            activations = activations_for(config.quantization)
            held = keep_gguf_blocks(self.model, config.model_path, activations)
        load_weights(self.model, config.model_path, progress=config.progress, skip=held)
        ops = native_ops(config.fused_cpu_ops, self.device)
        prepare_for_device(self.model, self.device, ops)
        return ops

    def _asked_blocks(self, config: RunnerConfig, shape: KVShape) -> int | None:
        """The pool's blocks as asked (a count or bytes), refused before the weights load;
        None on CUDA when neither is given: the utilization budget sizes it then."""
        unsized = config.num_blocks is None and config.kv_cache_memory_bytes is None
        if unsized and self.device.type == "cuda":
            return None
        return num_blocks_for(config.num_blocks, config.kv_cache_memory_bytes, shape)

    def _pool_blocks(self, config: RunnerConfig, shape: KVShape, asked: int | None) -> int:
        """The pool's blocks: as asked, else what the weights left of the GPU's utilization
        budget; a group takes the smallest any rank can hold."""
        blocks = asked
        if blocks is None:
            free, total = torch.cuda.mem_get_info(self.device)
            budget = gpu_kv_budget(total, free, config.gpu_memory_utilization)
            blocks = shape.blocks_for_budget(budget)
        return self.tp.min_int(blocks) if self.tp.size > 1 else blocks

    def _allocate_kv(self, shape: KVShape, graphs: str | None) -> None:
        """The pool, each attention layer given its K and V; a graphed worker keeps one block
        more, past the pool: its padded rows' scratch."""
        self.kv_cache = KVCache.allocate(shape, self.num_blocks + bool(graphs), self.device)
        for layer, k, v in zip(
            self.model.attention_layers(), self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            layer.k_cache, layer.v_cache = k, v

    def _grammars(self, config: RunnerConfig) -> Grammars:
        """Structured outputs' grammars over the model's tokenizer (--tokenizer's, if given)."""
        source = (
            Path(config.tokenizer).expanduser().resolve() if config.tokenizer else config.model_path
        )
        shape_of_vocab = (self.vocab_size, self.eos_token_ids, gguf_metadata(source))
        return Grammars(str(source), *shape_of_vocab, config.grammar_limits)

    def _capture_graphs(self, config: RunnerConfig, graphs: str | None) -> DecodeGraphs | None:
        log.info(
            "attention %s on %s, %s, KV blocks of %d tokens; CUDA graphs %s",
            self.backend.name,
            self.device,
            self.dtype,
            self.block_size,
            graphs or "off",
        )
        if not graphs:
            return None
        captured = DecodeGraphs(
            self.model,
            max_batch=config.cuda_graph_max_batch,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            scratch_block=self.num_blocks,
            sliding_window=self.config.sliding_window,
            device=self.device,
        )
        captured.capture()
        return captured

    @torch.inference_mode()
    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        """One forward pass for the whole batch; a Sample for each chunk with sample=True, and
        for each chunk that scores prompt tokens (`SamplingParams.prompt_logprobs`). The
        chunks must be valid (`batch.check_chunk`); the executor drops bad ones first."""
        if not chunks:
            return []
        sampling = [i for i, c in enumerate(chunks) if c.sample]
        # every position to sample: a chunk's last, or each from a drafted chunk's last known
        views = draft_views(chunks, sampling)
        # The grammar masks of the structured rows, computed while the forward runs.
        constrained = [
            (row, c.constraint, c.all_token_ids[c.num_prompt_tokens :])
            for row, (_, c) in enumerate(views)
            if c.constraint is not None
        ]
        masks = self.grammars.start(constrained) if constrained else None
        last_rows, hidden = self.forward(chunks)
        out: list[Sample | None] = [None] * len(chunks)
        if sampling:
            flat = view_rows(views, sampling, chunks, last_rows)
            rows = torch.tensor(flat, device=self.device)
            picked, last = [view for _, view in views], hidden[rows]
            samples = self._screened(last, picked)
            if samples is None:
                logits = self.model.compute_logits(last)
                samples = self.sampler(logits, picked, masks.result() if masks else None)
            for i, sample in zip(sampling, verdicts(chunks, sampling, views, samples), strict=True):
                out[i] = sample
        for i, chunk in enumerate(chunks):
            if chunk.num_prompt_scored:
                first_row = last_rows[i] - len(chunk.token_ids) + 1
                out[i] = _with_prompt(out[i], self._score_prompt(hidden, first_row, chunk))
        return out

    def _screened(self, last: torch.Tensor, chunks: list[SeqChunk]) -> list[Sample] | None:
        """Plain greedy rows' samples through the screened head (worker/layers/greedy_head.py),
        or None: the full logits and the sampler decide (a row with a grammar is not plain, so
        no mask is ever skipped)."""
        if self.greedy_head is None or not all(map(sampling_rules.plain_greedy, chunks)):
            return None
        tokens = self.greedy_head(last)
        return None if tokens is None else [Sample(token) for token in tokens]

    def constraint(self, spec: StructuredSpec) -> Constraint:
        return self.grammars.constraint(spec)

    @torch.inference_mode()
    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        """Whole prompts in one causal pass that keeps nothing in the KV cache."""
        if not items:
            return []
        lens, ids = flat_inputs(
            items, self.vocab_size, self.max_model_len, self.embedding_size, self.device
        )
        plan = dense_plan(lens, True, self.device, self.config.sliding_window)
        hidden = self.model(ids, seq_positions(lens, self.device), plan)
        return finish(pool(hidden, lens, self.pooling.mode), items, self.pooling.normalize)

    def _score_prompt(self, hidden: torch.Tensor, first_row: int, chunk: SeqChunk) -> Sample:
        """Row i of the chunk (position start_pos + i) predicts prompt token start_pos + i + 1."""
        count, start = chunk.num_prompt_scored, chunk.start_pos + 1
        targets = list(chunk.all_token_ids[start : start + count])
        entries = []
        for lo in range(0, count, PROMPT_SCORE_ROWS):
            hi = min(lo + PROMPT_SCORE_ROWS, count)
            logits = self.model.compute_logits(hidden[first_row + lo : first_row + hi])
            scored = score_tokens(logits, targets[lo:hi], chunk.sampling.prompt_logprobs)
            if scored is None:
                return Sample(error=NONFINITE_LOGITS)
            entries += scored
        return Sample(prompt_logprobs=PromptLogprobs(start, targets, entries))

    def forward(self, chunks: list[SeqChunk]) -> tuple[list[int], torch.Tensor]:
        """(each chunk's last row, the hidden states): a graph replay for a decode step that
        fits one, else the eager forward. The chunks' K/V are written to the cache."""
        if self.graphs is not None and self.graphs.fits(chunks):
            return list(range(len(chunks))), self.graphs.run(chunks, self.limits)
        batch = prepare_batch(chunks, self.limits, self.device, self.config.sliding_window)
        plan = self.backend.plan(batch.attn)
        return batch.last_rows, self.model(batch.input_ids, batch.positions, plan)


def _with_prompt(sample: Sample | None, scored: Sample) -> Sample:
    """A chunk's sample with its prompt logprobs; an error on either side fails the chunk."""
    if sample is None or scored.error is not None:
        return scored
    if sample.error is None:
        sample.prompt_logprobs = scored.prompt_logprobs
    return sample
