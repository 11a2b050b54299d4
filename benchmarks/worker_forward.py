"""Step latency of the worker's forward pass on tiny-llama: float32 vs bfloat16, side by side.

    .venv/bin/python benchmarks/worker_forward.py [--batch-sizes 1,8,32] [--prompt-len 128]

Prefill: B fresh prompts of --prompt-len tokens in one step. Decode: B sequences with
--context-len tokens already cached, one new token each per step. Each figure is the median
of --repeats timed steps after a warm-up, through `ModelRunner.execute` (greedy sampling
included), on whatever threads torch uses here (see --threads).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from kvledger.models import ensure_tiny_llama
from worker.batch import SeqChunk
from worker.model_runner import ModelRunner

BLOCK_SIZE = 16
DTYPES = ("float32", "bfloat16")


@dataclass
class Row:
    phase: str
    batch: int
    tokens: int  # tokens computed per step
    ms: dict[str, float]


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab, (batch, length), generator=gen).tolist()


def tables(batch: int, tokens: int) -> list[list[int]]:
    per_seq = -(-tokens // BLOCK_SIZE)
    return [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def prefill_ms(runner: ModelRunner, batch: int, length: int, repeats: int) -> float:
    ids, blocks = prompts(batch, length, runner.vocab_size, 1), tables(batch, length)
    chunks = [SeqChunk(f"p{i}", ids[i], 0, blocks[i], True) for i in range(batch)]
    return timed(lambda: runner.execute(chunks), repeats)


def decode_ms(runner: ModelRunner, batch: int, context: int, repeats: int) -> float:
    steps = repeats + 1
    ids = prompts(batch, context + steps, runner.vocab_size, 2)
    blocks = tables(batch, context + steps)
    runner.execute([SeqChunk(f"d{i}", ids[i][:context], 0, blocks[i], False)
                    for i in range(batch)])
    position = context

    def step() -> None:
        nonlocal position
        runner.execute([SeqChunk(f"d{i}", [ids[i][position]], position, blocks[i], True)
                        for i in range(batch)])
        position += 1

    return timed(step, repeats)


def run(args: argparse.Namespace) -> list[Row]:
    model_dir = ensure_tiny_llama()
    longest = max(args.prompt_len, args.context_len + args.repeats + 1)
    num_blocks = max(args.batch_sizes) * -(-longest // BLOCK_SIZE)
    rows = {(phase, b): Row(phase, b, b * (args.prompt_len if phase == "prefill" else 1), {})
            for phase in ("prefill", "decode") for b in args.batch_sizes}
    for dtype in DTYPES:
        runner = ModelRunner(model_dir, block_size=BLOCK_SIZE, num_blocks=num_blocks,
                             dtype=dtype, progress=False)
        if args.threads:
            torch.set_num_threads(args.threads)
        for b in args.batch_sizes:
            rows["prefill", b].ms[dtype] = prefill_ms(runner, b, args.prompt_len, args.repeats)
            rows["decode", b].ms[dtype] = decode_ms(runner, b, args.context_len, args.repeats)
    return list(rows.values())


def table(rows: list[Row]) -> str:
    head = ("| phase | batch | tokens/step | fp32 ms | bf16 ms | bf16 speed-up "
            "| fp32 tok/s | bf16 tok/s |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        fp32, bf16 = r.ms["float32"], r.ms["bfloat16"]
        lines.append(f"| {r.phase} | {r.batch} | {r.tokens} | {fp32:.1f} | {bf16:.1f} "
                     f"| {fp32 / bf16:.2f}x | {r.tokens / fp32 * 1000:,.0f} "
                     f"| {r.tokens / bf16 * 1000:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--context-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    rows = run(args)
    print(f"tiny-llama, block size {BLOCK_SIZE}, prompt {args.prompt_len} tokens, decode "
          f"context {args.context_len}, median of {args.repeats}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(table(rows))


if __name__ == "__main__":
    main()
