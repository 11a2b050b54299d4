"""Helpers shared by the worker tests (imported by name; conftest holds only fixtures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from protos import worker_pb2
from worker.attention.base import AttentionBackend
from worker.executor import Executor
from worker.link.wire import plan_from_wire, result_to_wire
from worker.runner.batch import SeqChunk
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner

SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

# name -> (transformers model family, config overrides on top of SMALL)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama_long": ("llama", dict(max_position_embeddings=2048)),  # for 256-token blocks
    "llama_tied_bias": (
        "llama",
        dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True, head_dim=32),
    ),
    "llama3_rope": (
        "llama",
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            rope_theta=500000.0,
        ),
    ),
    "llama_yarn": (
        "llama",
        dict(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "llama_linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral_window": ("mistral", dict(sliding_window=12)),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),
}


def _hf_classes(kind: str) -> tuple[Any, Any]:
    import transformers

    names = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    }[kind]
    return getattr(transformers, names[0]), getattr(transformers, names[1])


def save_hf_checkpoint(out: Path, name: str, seed: int = 0) -> Path:
    """A random-weight checkpoint that transformers itself writes (save_pretrained)."""
    kind, overrides = CONFIGS[name]
    return save_hf_model(out, kind, overrides, seed)


def save_hf_model(out: Path, kind: str, overrides: dict[str, Any], seed: int = 0) -> Path:
    """`save_hf_checkpoint` for a config not in CONFIGS: SMALL with `overrides`."""
    config_cls, model_cls = _hf_classes(kind)
    config = config_cls(**{**SMALL, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        # HF initializes biases at 0 and norms at 1; random ones make the test see them.
        for pname, param in model.named_parameters():
            if pname.endswith("bias"):
                param.normal_(0.0, 0.05)
            elif "norm" in pname:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
    model.save_pretrained(out)
    return out


def make_runner(path: Path, num_blocks: int = 64, block_size: int = 16, **kw: Any) -> ModelRunner:
    """A runner of `path` with a fixed pool; `kw` are RunnerConfig's fields."""
    config = RunnerConfig(path, block_size=block_size, num_blocks=num_blocks, progress=False, **kw)
    return ModelRunner(config)


def wire_step(ex: Executor, plan: worker_pb2.Plan) -> worker_pb2.StepResult:
    """One step as the worker's link runs it: the plan off the wire, the result onto it."""
    return result_to_wire(ex.step(plan_from_wire(plan)))


def blocks_for(num_tokens: int, block_size: int, first: int = 0) -> list[int]:
    return list(range(first, first + -(-num_tokens // block_size)))


@torch.inference_mode()
def logits_for(
    runner: ModelRunner, chunks: list[SeqChunk], all_tokens: bool = False
) -> torch.Tensor:
    """float32 logits at each chunk's last token [S, V], or at every token [T, V].

    A real step (`ModelRunner.forward`): the chunks' K/V are written to the cache as in
    `execute`."""
    last_rows, hidden = runner.forward(chunks)
    if not all_tokens:
        hidden = hidden[torch.tensor(last_rows, device=runner.device)]
    return runner.model.compute_logits(hidden).float()


@torch.inference_mode()
def greedy_decode(
    runner: ModelRunner, seqs: list[list[int]], tables: list[list[int]], steps: int
) -> torch.Tensor:
    """`steps` greedy decode steps of every sequence together, each recomputing its last
    token (all of seqs[i] is in the cache under tables[i]) and appending its argmax to
    seqs[i] in place: the logits of every step [steps, S, V]."""
    logits = []
    for _ in range(steps):
        chunks = [
            SeqChunk(f"s{i}", seq[-1:], len(seq) - 1, table, True)
            for i, (seq, table) in enumerate(zip(seqs, tables, strict=True))
        ]
        out = logits_for(runner, chunks)
        logits.append(out)
        for seq, token in zip(seqs, out.argmax(-1).tolist(), strict=True):
            seq.append(token)
    return torch.stack(logits)


def full_logits(runner: ModelRunner, tokens: list[int], first_block: int = 0) -> torch.Tensor:
    """All-position logits of one prefill from position 0 on fresh blocks."""
    table = blocks_for(len(tokens), runner.block_size, first_block)
    return logits_for(runner, [SeqChunk("full", tokens, 0, table, True)], all_tokens=True)


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def hf_logprobs(path: Path, tokens: list[int]) -> torch.Tensor:
    """log_softmax of transformers' own logits at every position [T, V]: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def use_backend(runner: ModelRunner, backend: AttentionBackend) -> ModelRunner:
    runner.backend = backend
    for layer in runner.model.attention_layers():
        layer.backend = backend
    return runner


def run_mixed(runner: ModelRunner, scale: int = 1) -> torch.Tensor:
    """A decode-only step, then one mixed step: a fresh prefill, a chunk over a cached prefix,
    two decodes of different lengths, and a request hitting a block written in this step.

    `scale` multiplies every length, for block sizes of 16 * scale (flash-attn's 256: 16); the
    decodes stay one token each."""
    bs, u = runner.block_size, scale
    lengths = [("p", 20 * u), ("c", 45 * u), ("d1", 28 * u + 2), ("d2", u + 2), ("s", 20 * u)]
    prompts = {name: random_tokens(n, 256, seed=60 + i) for i, (name, n) in enumerate(lengths)}
    prompts["s"] = prompts["p"][:bs] + prompts["s"]  # shares p's first block
    tables: dict[str, list[int]] = {}
    free = iter(range(runner.num_blocks))
    for name in ("p", "c", "d1", "d2", "s"):
        tables[name] = [next(free) for _ in range(-(-len(prompts[name]) // bs))]
    tables["s"][0] = tables["p"][0]
    prior = {"c": 29 * u, "d1": 28 * u, "d2": u}
    runner.execute([SeqChunk(n, prompts[n][:k], 0, tables[n], False) for n, k in prior.items()])
    decodes = logits_for(
        runner,
        [SeqChunk(n, [prompts[n][prior[n]]], prior[n], tables[n], True) for n in ("d1", "d2")],
    )
    d1, c, d2 = prior["d1"] + 1, prior["c"], prior["d2"] + 1
    mixed = [
        SeqChunk("d1", prompts["d1"][d1:], d1, tables["d1"], True),
        SeqChunk("p", prompts["p"], 0, tables["p"], True),
        SeqChunk("c", prompts["c"][c:], c, tables["c"], True),
        SeqChunk("d2", prompts["d2"][d2:], d2, tables["d2"], True),
        # same-step sharing: reads p's first block, which p writes in this very step
        SeqChunk("s", prompts["s"][bs:], bs, tables["s"], True),
    ]
    return torch.cat([decodes, logits_for(runner, mixed, all_tokens=True)])


ATOL = 1e-4


def hf_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def greedy(runner: ModelRunner, prompt: list[int], steps: int) -> list[int]:
    """Prefill, then one decode step at a time, the way the scheduler drives the worker."""
    bs = runner.block_size
    table = list(range(-(-(len(prompt) + steps) // bs)))
    tokens = list(prompt)
    out: list[int] = []
    chunk = SeqChunk("g", list(prompt), 0, table, True)
    for _ in range(steps):
        (sample,) = runner.execute([chunk])
        assert sample is not None and sample.error is None
        token = sample.token_id
        out.append(token)
        chunk = SeqChunk("g", [token], len(tokens), table, True)
        tokens.append(token)
    return out


def hf_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        # an explicit mask: generate would otherwise mask prompt tokens equal to pad_token_id
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def attention_steps(
    backend: AttentionBackend,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str = "cpu",
    window: int | None = None,
    block_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`backend` and the float32 torch backend on the same random paged cache, queries and new
    K/V: a decode-only step over contexts of one to four blocks in scattered tables, then a
    mixed step (a fresh prefill, a chunk over a cached prefix, decodes). One layer, no model
    around it, so a wrong block, slot or head shows at full size. Returns (got, float32 ref)."""
    from worker.attention.torch_backend import TorchAttention
    from worker.runner.batch import BatchLimits, prepare_batch

    bs, u = block_size, block_size // 16
    gen = torch.Generator().manual_seed(7)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    k_cache, v_cache = rand(24, bs, kv_heads, head_dim), rand(24, bs, kv_heads, head_dim)
    caches = {"got": (k_cache.to(dtype), v_cache.to(dtype)), "ref": (k_cache, v_cache)}
    limits = BatchLimits(bs, 24, 256, 64 * bs)
    steps = [
        [
            SeqChunk("a", [1], 18 * u + 11, [3, 7], True),
            SeqChunk("b", [1], 37 * u + 5, [0, 5, 9], True),
            SeqChunk("c", [1], u + 1, [11], True),
            SeqChunk("d", [1], 63 * u, [12, 2, 13, 14], True),
        ],
        [
            SeqChunk("a", [1], 18 * u + 12, [3, 7], True),
            SeqChunk("p", [1] * 20 * u, 0, [15, 16], True),
            SeqChunk("b", [1] * 6 * u, 37 * u + 6, [0, 5, 9], True),
            SeqChunk("c", [1], u + 2, [11], True),
        ],
    ]
    outs: dict[str, list[torch.Tensor]] = {"got": [], "ref": []}
    ref_backend = TorchAttention()
    for chunks in steps:
        meta = prepare_batch(chunks, limits, torch.device(device), window).attn
        tokens = int(meta.slot_mapping.numel())
        q = rand(tokens, heads, head_dim)
        k, v = rand(tokens, kv_heads, head_dim), rand(tokens, kv_heads, head_dim)
        for name, be, dt in (("got", backend, dtype), ("ref", ref_backend, torch.float32)):
            kc, vc = caches[name]
            plan = be.plan(meta)
            out = be.forward(q.to(dt), k.to(dt), v.to(dt), kc, vc, plan, head_dim**-0.5)
            outs[name].append(out.float().reshape(tokens, -1))
    return torch.cat(outs["got"]), torch.cat(outs["ref"])
