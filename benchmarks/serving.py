"""End-to-end serving benchmark: prefix caching on vs off, side by side in one run.

Starts `kvledger serve` (real processes) twice on the default tiny-llama, sends the same
workload of concurrent streaming completions whose prompts share a long prefix (a system prompt
as in chat serving), and prints throughput and latency with the on/off ratios.

    .venv/bin/python benchmarks/serving.py [--requests 64] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serving import start_serve  # noqa: E402

SYSTEM = (
    "You are the ledger. Every block is accounted for, every entry is true now or "
    "known to be stale before anything reads it. "
) * 12


@dataclass
class Run:
    seconds: float
    ttft: list[float]
    itl: list[float]  # gaps between a stream's successive token chunks
    output_tokens: int
    cached_tokens: int
    prompt_tokens: int


async def one(
    client: openai.AsyncOpenAI, prompt: str, max_tokens: int
) -> tuple[float, list[float], int, int, int]:
    """(TTFT, inter-token gaps, output tokens, cached prompt tokens, prompt tokens) of one
    streamed request."""
    start = time.perf_counter()
    first = None
    last = 0.0
    gaps: list[float] = []
    stream = await client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    async for chunk in stream:
        if chunk.choices:
            now = time.perf_counter()
            if first is None:
                first = now - start
            else:
                gaps.append(now - last)
            last = now
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None, "the server sent no usage chunk"
    return (
        first or 0.0,
        gaps,
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens,
        usage.prompt_tokens,
    )


async def workload(url: str, n: int, concurrency: int, max_tokens: int) -> Run:
    gate = asyncio.Semaphore(concurrency)
    results = []
    # closed inside this event loop: each workload runs in its own asyncio.run
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600
    ) as client:

        async def guarded(i: int) -> None:
            async with gate:
                prompt = f"{SYSTEM} Question {i}: what is in block {i}?"
                results.append(await one(client, prompt, max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(guarded(i) for i in range(n)))
        seconds = time.perf_counter() - start
    return Run(
        seconds,
        [r[0] for r in results],
        [gap for r in results for gap in r[1]],
        sum(r[2] for r in results),
        sum(r[3] for r in results),
        sum(r[4] for r in results),
    )


def measure(caching: bool, args: argparse.Namespace) -> Run:
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    with tempfile.TemporaryDirectory() as tmp:
        served = start_serve(
            Path(tmp), flag, "--num-kv-blocks", str(args.kv_blocks), debug_invariants=False
        )
        try:
            asyncio.run(workload(served.url, 4, 4, 4))  # warm-up
            return asyncio.run(
                workload(served.url, args.requests, args.concurrency, args.max_tokens)
            )
        finally:
            served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-blocks", type=int, default=2048)
    args = parser.parse_args()
    on, off = measure(True, args), measure(False, args)
    rows = [
        ("requests/s", lambda r: args.requests / r.seconds),
        ("output tokens/s", lambda r: r.output_tokens / r.seconds),
        ("TTFT p50 (ms)", lambda r: 1000 * statistics.median(r.ttft)),
        ("TTFT p90 (ms)", lambda r: 1000 * statistics.quantiles(r.ttft, n=10)[-1]),
        ("inter-token p50 (ms)", lambda r: 1000 * statistics.median(r.itl)),
        ("inter-token p90 (ms)", lambda r: 1000 * statistics.quantiles(r.itl, n=10)[-1]),
        ("prompt tokens cached (%)", lambda r: 100 * r.cached_tokens / max(r.prompt_tokens, 1)),
    ]
    print(
        f"{args.requests} streaming requests, concurrency {args.concurrency}, "
        f"{args.max_tokens} output tokens, shared prefix of ~{len(SYSTEM.split())} words"
    )
    print("| metric | cache on | cache off | on / off |\n|---|---:|---:|---:|")
    for name, fn in rows:
        a, b = fn(on), fn(off)
        ratio = f"{a / b:.2f}x" if b else "-"
        print(f"| {name} | {a:.1f} | {b:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
