"""Time one scheduling step of the pure core: schedule() + update_from_output().

N running requests decode together; they share a 1024-token prefix (64 blocks of 16 tokens),
each with 8 tokens of its own. The worker's answer (one sampled token per request) is built
outside the timed region, since producing it is the worker's job, not the scheduler's.

    .venv/bin/python benchmarks/scheduler_step.py [--steps 200] [--sizes 64 256 1024]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from scheduler_svc.core import ModelResult, Request, Scheduler, SchedulerConfig, SchedulerOutput

BLOCK_SIZE = 16
PREFIX_TOKENS = 1024
OWN_TOKENS = 8
VLLM_V1_MS = {64: 2.1, 256: 7.8, 1024: 27.6}  # from the issue, same measure, similar machine


def build(num_requests: int, steps: int) -> Scheduler:
    per_request_tokens = PREFIX_TOKENS + OWN_TOKENS + steps + 64
    own_blocks = -(-per_request_tokens // BLOCK_SIZE) - PREFIX_TOKENS // BLOCK_SIZE
    config = SchedulerConfig(
        num_blocks=PREFIX_TOKENS // BLOCK_SIZE + num_requests * own_blocks + 16,
        block_size=BLOCK_SIZE,
        max_num_seqs=num_requests,
        max_num_batched_tokens=PREFIX_TOKENS + num_requests * (OWN_TOKENS + 1),
        max_model_len=8192,
    )
    scheduler = Scheduler(config)
    prefix = list(range(PREFIX_TOKENS))
    for i in range(num_requests):
        own = [50_000 + i * OWN_TOKENS + j for j in range(OWN_TOKENS)]
        scheduler.add_request(Request(f"req-{i}", prefix + own, max_tokens=1_000_000))
    return scheduler


def answer(scheduler: Scheduler, output: SchedulerOutput) -> ModelResult:
    """One token for every request whose chunk reached the end of its known tokens."""
    sampled = {}
    for item in (*output.new, *output.cont):
        request = scheduler.requests[item.request_id]
        if request.num_computed_tokens == request.num_tokens:
            sampled[item.request_id] = 7 + request.num_tokens % 1000
    return ModelResult(sampled=sampled)


def one_step(scheduler: Scheduler) -> int:
    start = time.perf_counter_ns()
    output = scheduler.schedule()
    planned = time.perf_counter_ns()
    result = answer(scheduler, output)
    resumed = time.perf_counter_ns()
    scheduler.update_from_output(output, result)
    end = time.perf_counter_ns()
    return (planned - start) + (end - resumed)


def measure(num_requests: int, steps: int, freeze_gc: bool, warmup: int = 20) -> list[int]:
    scheduler = build(num_requests, steps + warmup)
    while scheduler.num_waiting:  # prefill: everyone admitted, sharing the prefix
        one_step(scheduler)
    for _ in range(warmup):
        one_step(scheduler)
    if freeze_gc:  # what a service may do once its pool and requests are built
        gc.collect()
        gc.freeze()
    assert scheduler.num_running == num_requests
    timings = [one_step(scheduler) for _ in range(steps)]
    snap = scheduler.snapshot()
    assert snap.num_running == num_requests and snap.preemptions == 0
    assert snap.prefix_cache_hits >= (num_requests - 1) * PREFIX_TOKENS
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="gc.freeze() after warm-up, so full collections skip the long-lived ledger",
    )
    args = parser.parse_args()
    header = (
        f"{'running':>8} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8} {'us/req median':>14} "
        f"{'us/req p90':>11} {'vLLM v1 ms*':>12}"
    )
    print(
        f"schedule() + update_from_output(), decode, {PREFIX_TOKENS}-token shared prefix, "
        f"{BLOCK_SIZE}-token blocks, {args.steps} steps, gc "
        f"{'frozen after warm-up' if args.freeze_gc else 'on (default)'}"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        timings = measure(n, args.steps, args.freeze_gc)
        gc.unfreeze()
        median = statistics.median(timings) / 1e6
        percentiles = statistics.quantiles(timings, n=100)
        p90, p99 = percentiles[89] / 1e6, percentiles[98] / 1e6
        reference = VLLM_V1_MS.get(n)
        print(
            f"{n:>8} {median:>10.3f} {p90:>8.3f} {p99:>8.3f} {median * 1e3 / n:>14.2f} "
            f"{p90 * 1e3 / n:>11.2f} {reference if reference is not None else '-':>12}"
        )
    print(
        "* vLLM v1's figures are quoted from issue 3 (same measure, a similar machine); "
        "they were not measured in this run."
    )


if __name__ == "__main__":
    main()
