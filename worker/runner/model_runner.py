"""ModelRunner: a model, its paged KV memory and a sampler; one batched forward per step."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kvledger.config.worker import DTYPES as DTYPE_NAMES
from kvledger.gguf_file import is_gguf
from kvledger.groups import GrammarLimits
from kvledger.structured import StructuredSpec
from worker import native
from worker.attention import get_backend
from worker.attention.base import AttentionBackend
from worker.attention.dense import dense_plan, seq_positions
from worker.attention.flash_attn_backend import FlashAttention
from worker.config import EncoderConfig, ModelConfig
from worker.layers.head_screens import screen_for
from worker.layers.linear import prepare_for_device
from worker.models import build_model
from worker.models.loader import load_weights
from worker.parallel.distributed import TPGroup, check_tensor_parallel, split_heads
from worker.quant.select import activations_for, check_quantization, keep_gguf_blocks
from worker.runner.batch import BatchLimits, SeqChunk, prepare_batch
from worker.runner.cuda_graphs import DecodeGraphs
from worker.runner.kv_cache import KVCache, KVShape, gpu_kv_budget, kv_dtype, num_blocks_for
from worker.runner.pooling import EmbedItem, PoolingConfig, finish, flat_inputs, pool
from worker.sample import sampler as sampling_rules
from worker.sample.constraints import Constraint, Grammars
from worker.sample.sampler import NONFINITE_LOGITS, PromptLogprobs, Sample, Sampler, score_tokens

log = logging.getLogger(__name__)

# Rows of full-vocabulary logits held at once when scoring a prompt: a long prefill chunk would
# otherwise hold chunk x vocab floats (GBs for a large vocabulary).
PROMPT_SCORE_ROWS = 256

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


class ModelRunner:
    """A decoder: generates on paged KV memory; also embeds (last-token pooling by default)."""

    kind = "generate"

    def __init__(
        self,
        model_path: Path,
        *,
        block_size: int,
        num_blocks: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        dtype: str = "float32",
        kv_cache_dtype: str = "auto",
        device: str = "cpu",
        max_model_len: int | None = None,
        seed: int = 0,
        attention_backend: str = "torch",
        progress: bool = True,
        gpu_memory_utilization: float = 0.9,
        tp: TPGroup | None = None,
        fused_cpu_ops: bool = True,
        screened_greedy_head: bool = True,
        quantization: str = "auto",
        cuda_graph_max_batch: int = 0,
        tokenizer: str | None = None,
        grammar_limits: GrammarLimits | None = None,
    ) -> None:
        self.tp = tp = tp or TPGroup()
        default_threads(tp.size if torch.device(device).type == "cpu" else 1)
        # Everything that can be refused is checked before any memory is taken.
        self.config = cfg = ModelConfig.from_dir(Path(model_path))
        check_tensor_parallel(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, tp.size)
        # whether a GGUF file's blocks stay quantized in memory (worker/quant/select.py)
        self.quantized = check_quantization(quantization, Path(model_path), device, tp.size)
        self.dtype = resolve_dtype(dtype, cfg)
        self.device = torch.device(device)
        self.kv_dtype = kv_dtype(kv_cache_dtype, self.dtype, self.device)
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.max_model_len = _max_model_len(max_model_len, cfg)
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = list(cfg.eos_token_ids)
        self.embedding_size = cfg.hidden_size
        self.pooling = PoolingConfig.from_dir(Path(model_path), PoolingConfig("last", True))
        # each rank's cache holds its own KV heads, for the same block ids as every other rank
        kv_heads = split_heads(cfg.num_heads, cfg.num_kv_heads, tp.rank, tp.size).kv_heads
        shape = KVShape(cfg.num_layers, block_size, kv_heads, cfg.head_dim, self.kv_dtype)
        size_from_gpu = (
            self.device.type == "cuda" and num_blocks is None and kv_cache_memory_bytes is None
        )
        if not size_from_gpu:
            self.num_blocks = num_blocks_for(num_blocks, kv_cache_memory_bytes, shape)
        self.backend = get_backend(
            attention_backend, dtype=self.dtype, block_size=block_size, device=self.device
        )

        self.model = build_model(cfg, self.backend, self.max_model_len, self.dtype, self.device, tp)
        held = set()
        if self.quantized:
            held = keep_gguf_blocks(self.model, Path(model_path), activations_for(quantization))
        load_weights(self.model, Path(model_path), progress=progress, skip=held)
        ops = _native_ops(fused_cpu_ops, self.device)
        prepare_for_device(self.model, self.device, ops)
        # greedy rows' tokens from a bfloat16 screen and a few float32 logits (same tokens)
        self.greedy_head = screen_for(self.model.lm_head, self.vocab_size, screened_greedy_head)
        if size_from_gpu:  # what the weights left of the utilization budget goes to KV
            free, total = torch.cuda.mem_get_info(self.device)
            budget = gpu_kv_budget(total, free, gpu_memory_utilization)
            self.num_blocks = shape.blocks_for_budget(budget)
        if tp.size > 1:  # one pool for the group: the smallest any rank can hold
            self.num_blocks = tp.min_int(self.num_blocks)
        graphs = _graphs_wanted(cuda_graph_max_batch, self.device, self.backend, tp)
        # a graphed worker keeps one block more, past the pool: its padded rows' scratch
        self.kv_cache = KVCache.allocate(shape, self.num_blocks + bool(graphs), self.device)
        for layer, k, v in zip(
            self.model.attention_layers(), self.kv_cache.k, self.kv_cache.v, strict=True
        ):
            layer.k_cache, layer.v_cache = k, v
        self.limits = BatchLimits(block_size, self.num_blocks, self.vocab_size, self.max_model_len)
        self.sampler = Sampler(seed, ops)
        # structured outputs: grammars over the model's tokenizer (--tokenizer's, if given)
        source = Path(tokenizer).expanduser().resolve() if tokenizer else Path(model_path)
        shape_of_vocab = (self.vocab_size, self.eos_token_ids, _gguf_metadata(source))
        self.grammars = Grammars(str(source), *shape_of_vocab, grammar_limits)
        self.graphs: DecodeGraphs | None = None
        if graphs:
            self.graphs = DecodeGraphs(
                self.model,
                max_batch=cuda_graph_max_batch,
                block_size=block_size,
                max_model_len=self.max_model_len,
                scratch_block=self.num_blocks,
                sliding_window=cfg.sliding_window,
                device=self.device,
            )
            self.graphs.capture()
        log.info(
            "attention %s on %s, %s, KV blocks of %d tokens; CUDA graphs %s",
            self.backend.name,
            self.device,
            self.dtype,
            block_size,
            graphs or "off",
        )
        self.grammars.prepare()  # at start, beside the scheduler link: no request builds it
        log.info(
            "model %s: %s, %d layers, %s, %d KV blocks of %d tokens in %s (%.1f MiB)",
            model_path,
            cfg.architecture,
            cfg.num_layers,
            self.dtype,
            self.num_blocks,
            block_size,
            self.kv_dtype,
            self.num_blocks * shape.bytes_per_block() / 2**20,
        )

    @torch.inference_mode()
    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        """One forward pass for the whole batch; a Sample for each chunk with sample=True, and
        for each chunk that scores prompt tokens (`SamplingParams.prompt_logprobs`). The
        chunks must be valid (`batch.check_chunk`); the executor drops bad ones first."""
        if not chunks:
            return []
        sampling = [i for i, c in enumerate(chunks) if c.sample]
        # The grammar masks of the structured rows, computed while the forward runs.
        constrained = [
            (row, c.constraint, c.all_token_ids[c.num_prompt_tokens :])
            for row, c in enumerate(chunks[i] for i in sampling)
            if c.constraint is not None
        ]
        masks = self.grammars.start(constrained) if constrained else None
        last_rows, hidden = self.forward(chunks)
        out: list[Sample | None] = [None] * len(chunks)
        if sampling:
            rows = torch.tensor([last_rows[i] for i in sampling], device=self.device)
            picked, last = [chunks[i] for i in sampling], hidden[rows]
            samples = self._screened(last, picked)
            if samples is None:
                logits = self.model.compute_logits(last)
                samples = self.sampler(logits, picked, masks.result() if masks else None)
            for i, sample in zip(sampling, samples, strict=True):
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


def _graphs_wanted(
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


def _native_ops(wanted: bool, device: torch.device) -> ModuleType | None:
    """The compiled CPU kernels for the decoder's fused steps; None off CPU, when turned off
    (--no-fused-cpu-ops), or when they do not build here (the torch ops then run, saying so)."""
    if not wanted or device.type != "cpu":
        return None
    built = native.load()
    if not built.ok:
        log.warning("fused CPU ops: %s; using torch ops", built.reason)
    return built.module


def _with_prompt(sample: Sample | None, scored: Sample) -> Sample:
    """A chunk's sample with its prompt logprobs; an error on either side fails the chunk."""
    if sample is None or scored.error is not None:
        return scored
    if sample.error is None:
        sample.prompt_logprobs = scored.prompt_logprobs
    return sample


def _max_model_len(requested: int | None, cfg: ModelConfig) -> int:
    if requested is None:
        return cfg.max_position_embeddings
    if not 0 < requested <= cfg.max_position_embeddings:
        raise ValueError(
            f"max_model_len {requested} must be in [1, "
            f"{cfg.max_position_embeddings}] (the model's max_position_embeddings)"
        )
    return requested


def _gguf_metadata(source: Path) -> dict[str, Any] | None:
    """The metadata of the GGUF file the weights were read from, vocabulary included, as the
    worker parsed it once (worker/gguf/checkpoint.py), for the grammar engine's tokenizer; None
    for a tokenizer.json directory."""
    if not is_gguf(source):
        return None
    from worker.gguf import open_checkpoint

    return open_checkpoint(source).tokenizer_metadata()
