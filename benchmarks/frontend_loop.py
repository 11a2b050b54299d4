"""How long the frontend's event loop stalls while a long prompt is tokenized, inline vs in a
thread (what the routes in `server/routes/` do), side by side in one run.

    .venv/bin/python benchmarks/frontend_loop.py [--tokens 2000,8000,30000] [--repeats 5]

The frontend's one event loop streams every request's tokens; a prompt tokenized on it holds
all of them for as long as tokenizing takes. A ticker task wakes every millisecond and records
how late it woke; the worst lateness while prompts are tokenized is the stall other streams
see. Tokenizer: tiny-llama's (the packaged all-MiniLM-L6-v2 WordPiece tokenizer).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kvledger.models import resolve_model  # noqa: E402

SENTENCE = "Every block in the pool is accounted for by the ledger. "  # 12 tokens


async def worst_stall(tokenize: Callable[[], Awaitable[object]], repeats: int) -> float:
    """Worst lateness (s) of a 1 ms ticker while `tokenize` runs `repeats` times, apart."""
    lateness: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lateness.append(time.perf_counter() - start - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    for _ in range(repeats):
        await tokenize()
        await asyncio.sleep(0.005)  # one prompt at a time: the stall of one, not of a burst
    done.set()
    await task
    return max(lateness)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2000,8000,30000", type=lambda s: s.split(","))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(resolve_model("tiny-llama") / "tokenizer.json"))
    print(f"worst event-loop stall while tokenizing a prompt, {args.repeats} prompts each")
    print("| prompt tokens | tokenize ms | inline stall ms | in a thread stall ms | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in map(int, args.tokens):
        text = SENTENCE * (n // 12)

        async def inline(text: str = text) -> object:
            return tokenizer.encode_batch([text])

        async def threaded(text: str = text) -> object:
            return await asyncio.to_thread(tokenizer.encode_batch, [text])

        start = time.perf_counter()
        count = len(tokenizer.encode_batch([text])[0].ids)
        took = time.perf_counter() - start
        stalls = {"inline": [], "thread": []}
        for _ in range(3):  # in turns, so both see the same machine
            stalls["inline"].append(asyncio.run(worst_stall(inline, args.repeats)))
            stalls["thread"].append(asyncio.run(worst_stall(threaded, args.repeats)))
        a, b = (1000 * statistics.median(stalls[k]) for k in ("inline", "thread"))
        print(f"| {count} | {1000 * took:.1f} | {a:.1f} | {b:.1f} | {a / b:.0f}x |")


if __name__ == "__main__":
    main()
