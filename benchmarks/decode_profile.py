"""Where one decode step's time goes in the worker (tiny-llama or a GGUF/HF model).

    .venv/bin/python benchmarks/decode_profile.py [--model tiny-llama|smollm2|PATH]
        [--context-len 128] [--batch 1] [--shared-prefix 0] [--repeats 200] [--threads 0]
        [--trace]

--batch sequences with --context-len tokens cached each compute position --context-len again
and again (`ModelRunner.execute`, the worker's step, greedy sampling included); the first
--shared-prefix tokens (whole blocks) are one set of blocks in every sequence's table, as a
shared system prompt is when the prefix cache serves it. The step is cut into its
parts, each timed on its own over the same inputs, the parts taking turns round by round so a
drift in machine load falls on all alike:

- `batch`: `prepare_batch` and the attention plan (Python and small tensors);
- `forward`: the decoder layers and the final norm;
- `head`: the LM head over the last row;
- `sample`: the sampler (greedy);
- `step`: the whole `execute`, for the parts' sum to be checked against;
- `alone`: with the CPU attention kernel, the same step with every sequence attending alone
  (no shared-prefix groups, `worker/attention/shared_prefix.py`): with --shared-prefix, what
  attending over the shared blocks once per group saves. Not part of the sum.

With --threads 1 each part is timed by the calling thread's CPU clock (`time.thread_time`), not
the wall clock: on a machine shared with other busy processes that leaves out the time they held
the core (with more threads, OpenMP's barriers make any part wait for a descheduled thread).

Then torch.profiler's self CPU time of one forward+head by operator (a share of the profiled
total: the profiler adds a few microseconds an operator, so small ops weigh more there than in
a real step), and the count of operators a step dispatches. --trace writes a Chrome trace.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kvledger.models import ensure_tiny_llama, smollm2_path
from worker.attention.cpu_backend import CpuPagedAttention
from worker.runner.batch import SeqChunk, prepare_batch
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner


def model_path(name: str) -> Path:
    if name == "tiny-llama":
        return ensure_tiny_llama()
    if name == "smollm2":
        return smollm2_path()
    return Path(name)


def blocks_needed(batch: int, context: int, shared: int, block_size: int) -> int:
    shared_blocks = shared // block_size
    return shared_blocks + batch * (-(-(context + 1) // block_size) - shared_blocks)


def decode_chunks(runner: ModelRunner, batch: int, context: int, shared: int) -> list[SeqChunk]:
    """Prefills `batch` sequences (the first writes the shared blocks, the others their own
    tails after them) and returns each one's decode chunk at position `context`."""
    size = runner.block_size
    num_shared = shared // size
    shared_ids = list(range(num_shared))
    per_seq = -(-(context + 1) // size) - num_shared
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(1000, runner.vocab_size, (num_shared * size,), generator=gen).tolist()
    chunks = []
    for i in range(batch):
        tail = torch.randint(1000, runner.vocab_size, (context + 1 - len(prefix),), generator=gen)
        ids = prefix + tail.tolist()
        own = [num_shared + i * per_seq + j for j in range(per_seq)]
        start = 0 if i == 0 else len(prefix)
        blocks = shared_ids + own
        runner.execute([SeqChunk(f"d{i}", ids[start:context], start, blocks, False)])
        chunks.append(SeqChunk(f"d{i}", [ids[context]], context, blocks, True))
    return chunks


def parts(runner: ModelRunner, chunks: list[SeqChunk]) -> dict[str, Callable[[], object]]:
    model, limits = runner.model, runner.limits
    batch = prepare_batch(chunks, limits, runner.device, runner.config.sliding_window)
    plan = runner.backend.plan(batch.attn)
    hidden = model(batch.input_ids, batch.positions, plan)
    last = hidden[batch.last_rows]
    logits = model.compute_logits(last)

    def prep() -> object:
        b = prepare_batch(chunks, limits, runner.device, runner.config.sliding_window)
        return runner.backend.plan(b.attn)

    fns = {
        "batch": prep,
        "forward": lambda: model(batch.input_ids, batch.positions, plan),
        "head": lambda: model.compute_logits(last),
        "sample": lambda: runner.sampler(logits, chunks),
        "step": lambda: runner.execute(chunks),
    }
    backend = runner.backend
    if isinstance(backend, CpuPagedAttention) and len(chunks) > 1:

        def alone() -> object:
            was, backend.share_prefixes = backend.share_prefixes, False
            try:
                return runner.execute(chunks)
            finally:
                backend.share_prefixes = was

        fns["alone"] = alone
    return fns


def race(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median microseconds of each part, the parts taking turns (order reversed every round)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    with torch.inference_mode():
        for fn in fns.values():
            fn()
        for i in range(repeats):
            for name in names if i % 2 == 0 else names[::-1]:
                started = clock()
                fns[name]()
                samples[name].append(clock() - started)
    return {name: statistics.median(s) * 1e6 for name, s in samples.items()}


def op_profile(fns: dict[str, Callable[[], object]], trace: str | None) -> None:
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for _ in range(5):
            fns["step"]()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                fns["step"]()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    calls = sum(e.count for e in events if e.key.startswith(("aten::", "kvledger", "mkldnn")))
    print(f"\noperators by self CPU time (profiled; {calls / 20:.0f} aten/custom calls a step)")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]:
        share = e.self_cpu_time_total / total
        print(f"  {e.key:48s} {share:6.1%}  {e.count / 20:6.0f} calls/step")
    if trace:
        prof.export_chrome_trace(trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--context-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens (whole blocks)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--trace", default=None, help="write a Chrome trace here")
    args = parser.parse_args()
    if not 0 <= args.shared_prefix <= args.context_len or args.batch < 1:
        parser.error("--shared-prefix must be within --context-len, and --batch at least 1")
    runner = ModelRunner(
        RunnerConfig(
            model_path(args.model),
            block_size=16,
            num_blocks=blocks_needed(args.batch, args.context_len, args.shared_prefix, 16) + 1,
            attention_backend="auto",
            progress=False,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    chunks = decode_chunks(runner, args.batch, args.context_len, args.shared_prefix)
    fns = parts(runner, chunks)
    us = race(fns, args.repeats)
    print(
        f"{args.model}, quantized {runner.quantized}, batch {args.batch}, context "
        f"{args.context_len}, shared prefix {args.shared_prefix // 16 * 16}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
        + (" (CPU time)" if torch.get_num_threads() == 1 else " (wall time)")
    )
    summed = sum(v for k, v in us.items() if k not in ("step", "alone"))
    for name, value in us.items():
        print(f"  {name:8s} {value:8.0f} us  {value / us['step']:6.1%} of the step")
    print(f"  parts' sum {summed:.0f} us ({summed / us['step']:.1%} of the step)")
    op_profile(fns, args.trace)


if __name__ == "__main__":
    main()
