"""The peers benchmark's printout (benchmarks/peers): the CPU it ran on, one row per engine
(output tokens/s and TTFT p50 at concurrency 16 and 1, TTFT p50 of the cold-prefill run, peak
RSS of each of its processes), the ratios of each kvledger row to each peer, latency percentiles,
and whether llama.cpp's and vLLM's greedy tokens equal transformers' (the same weights give the
same first tokens; a quantized file may not).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_line() -> str:
    """The CPU's model name, core count and the flags that choose kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name, flags = "unknown CPU", set()
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    have = [f for f in CPU_FLAGS if f in flags]
    from os import sched_getaffinity

    return f"{name}, {len(sched_getaffinity(0))} cores; flags: {' '.join(have) or 'none of'}"


def print_table(report: dict, args: argparse.Namespace, model: Path) -> None:
    def summary(engine: str, c: int | str):  # noqa: ANN202 - benchmarks.load.Summary or None
        return report.get(engine, {}).get("summaries", {}).get(c)

    def tok_s(engine: str, c: int) -> float | None:
        return _tok_s(report, engine, c)

    def ttft(engine: str, c: int | str) -> str:
        s = summary(engine, c)
        return f"{s.ttft_ms['p50']:.0f}" if s else "-"

    where = f"{args.threads} threads" if args.device == "cpu" else args.device
    print(f"\n{cpu_line()}\n{model.name}, {args.dtype or 'default dtype'}, {where}")
    print(
        "| engine | c=16 tok/s | c=1 tok/s | c=16 TTFT p50 ms | c=1 TTFT p50 ms "
        "| cold TTFT p50 ms | peak RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for engine in report:
        mem = ", ".join(f"{k} {v:.0f}" for k, v in report[engine]["memory_mib"].items())
        cells = [f"{x:.0f}" if (x := tok_s(engine, c)) else "-" for c in (16, 1)]
        cells += [ttft(engine, c) for c in (16, 1, "cold")]
        print(f"| {engine} | " + " | ".join(cells) + f" | {mem} |")
    for pair, by in ratios(report).items():
        cells = [f"{k} {v:.2f}x" if v else f"{k} -" for k, v in by.items()]
        print(f"{pair}: " + ", ".join(cells))
    for engine in report:
        for c, s in report[engine].get("summaries", {}).items():
            print(
                f"{engine} {c if c == 'cold' else f'c={c}'}: TTFT p50/p90/p99 "
                + "/".join(f"{v:.0f}" for v in s.ttft_ms.values())
                + " ms, inter-token p50/p90/p99 "
                + "/".join(f"{v:.1f}" for v in s.itl_ms.values())
                + " ms, time per token p50/p90 "
                + "/".join(f"{v:.1f}" for v in list(s.tpot_ms.values())[:2])
                + " ms"
                + (f", cached {100 * s.cached_share:.0f}%" if s.cached_share is not None else "")
            )
    if "transformers" in report:
        ours = report["transformers"]["greedy_tokens"]
        for peer in (p for p in report if p != "transformers" and "greedy_tokens" in report[p]):
            theirs = report[peer]["greedy_tokens"]
            same = [_common_prefix(x, y) for x, y in zip(ours, theirs, strict=True)]
            print(f"{peer}'s first greedy tokens equal to transformers' (of 16, 2 prompts): {same}")


def _tok_s(report: dict, engine: str, c: int) -> float | None:
    """An engine's output tokens/s at concurrency c (None where it did not run)."""
    if engine == "transformers":
        return report[engine]["tok_s"].get(str(c))
    s = report[engine].get("summaries", {}).get(c)
    return s.output_tok_s if s else None


def ratios(report: dict) -> dict[str, dict[str, float | None]]:
    """Each kvledger row over each peer ("row / peer"): output tokens/s at c=16 and c=1, and
    the cold run's TTFT p50 (a time: below 1 is faster; only where both ran it)."""

    def cold(engine: str) -> float | None:
        s = report[engine].get("summaries", {}).get("cold")
        return s.ttft_ms["p50"] if s else None

    out: dict[str, dict[str, float | None]] = {}
    ours = [e for e in report if e.startswith("kvledger")]  # one row per kvledger setting
    for row in ours:
        for peer in (p for p in report if p not in ours):
            by: dict[str, float | None] = {}
            for c in (16, 1):
                a, b = _tok_s(report, row, c), _tok_s(report, peer, c)
                by[f"c={c}"] = a / b if a and b else None
            a, b = cold(row), cold(peer)
            if a and b:
                by["cold TTFT"] = a / b
            out[f"{row} / {peer}"] = by
    return out


def print_rounds(reports: list[dict]) -> None:
    """With --rounds N: every ratio of every round, and its median. A round runs every engine
    once (each round in another order), so a ratio pairs figures taken minutes apart, and the
    median of the rounds holds against the drift of a shared or virtual machine's speed."""
    each = [ratios(r) for r in reports]
    print(f"\nratios of {len(reports)} rounds (median first)")
    for pair, by in each[0].items():
        cells = []
        for key in by:
            got = [r[pair][key] for r in each if r.get(pair, {}).get(key)]
            if got:
                listed = " / ".join(f"{v:.2f}" for v in got)
                cells.append(f"{key} {statistics.median(got):.2f}x ({listed})")
        print(f"{pair}: " + ", ".join(cells))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def print_bound(report: dict, bandwidth: float, weights: int) -> None:
    """Each engine's c=1 rate as a fraction of the memory-bandwidth bound (benchmarks/
    bandwidth.py: a decode step at one stream reads every weight once)."""
    bound = bandwidth / weights
    print(
        f"c=1 bound: {bandwidth / 1e9:.1f} GB/s read / {weights / 2**20:.0f} MiB of weights "
        f"= {bound:.1f} tok/s"
    )
    for engine in report:
        rate = _tok_s(report, engine, 1)
        if rate:
            print(f"{engine} c=1: {rate:.1f} tok/s, {100 * rate / bound:.0f}% of the bound")
