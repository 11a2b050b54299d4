"""Time the routing probe (how many prompt tokens a worker already caches) against a full walk.

The probe hashes a block only when the cache walk reaches it; the full walk hashes the whole
prompt first, as a request's own lookup does. Both run on the same scheduler in one run, for a
prompt whose first H tokens are cached, at several prompt lengths.

    .venv/bin/python benchmarks/routing_probe.py [--lengths 1024 8192 32768] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

from scheduler_svc.core import ModelResult, Request, Scheduler, SchedulerConfig
from scheduler_svc.core.block_hash import extend_chain, request_extra_keys

BLOCK_SIZE = 16


def warmed_scheduler(num_tokens: int) -> Scheduler:
    """One request of num_tokens run to completion, so its full blocks stay cached."""
    config = SchedulerConfig(
        num_blocks=num_tokens // BLOCK_SIZE + 8,
        block_size=BLOCK_SIZE,
        max_num_seqs=1,
        max_num_batched_tokens=num_tokens + BLOCK_SIZE,
        max_model_len=num_tokens + 4 * BLOCK_SIZE,
    )
    scheduler = Scheduler(config)
    scheduler.add_request(Request("warm", list(range(num_tokens)), max_tokens=1))
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelResult(sampled={"warm": 1}))
    assert scheduler.snapshot().blocks_cached == num_tokens // BLOCK_SIZE
    return scheduler


def full_walk(scheduler: Scheduler, tokens: list[int]) -> int:
    max_blocks = (len(tokens) - 1) // BLOCK_SIZE
    chain = extend_chain([], tokens, BLOCK_SIZE, max_blocks, request_extra_keys(None))
    return scheduler.kv.find_cached_prefix(tokens, chain, max_blocks).num_tokens


def median_us(fn: Callable[[], int], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        timings.append(time.perf_counter_ns() - start)
    return statistics.median(timings) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    header = f"{'prompt':>7} {'case':>5} {'probe us':>10} {'full walk us':>13} {'walk/probe':>11}"
    print(f"routing probe vs full walk, {BLOCK_SIZE}-token blocks, median of {args.repeat}")
    print(header)
    print("-" * len(header))
    for n in args.lengths:
        scheduler = warmed_scheduler(n)
        cases = {"hit": list(range(n)) + [1], "cold": [-1] + list(range(n))}
        for case, tokens in cases.items():
            assert scheduler.cached_prefix_tokens(tokens, None) == full_walk(scheduler, tokens)
            probe = median_us(partial(scheduler.cached_prefix_tokens, tokens, None), args.repeat)
            walk = median_us(partial(full_walk, scheduler, tokens), args.repeat)
            print(f"{n:>7} {case:>5} {probe:>10.1f} {walk:>13.1f} {walk / probe:>10.1f}x")


if __name__ == "__main__":
    main()
