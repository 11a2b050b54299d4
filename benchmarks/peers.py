"""kvledger against what users would run instead, on the same weights and workload, in one run.

    .venv/bin/python benchmarks/peers.py [--size tiny|300m] [--llama-server PATH] [--json F]

Engines, each on the same float32 random Llama and the same token-id prompts (48 requests of a
512-token shared prefix + 36 own tokens, 128 greedy output tokens each, `ignore_eos`):

- kvledger: `kvledger serve` (real processes, prefix caching on, invariant checks off), driven
  over HTTP at concurrency 16 and 1 by benchmarks/load.py;
- llama.cpp's `llama-server` (`-np 16 -t THREADS --cont-batching`, the same weights written as
  an F32 GGUF by benchmarks/gguf_export.py), driven the same way; skipped, saying so, without
  `--llama-server` or $LLAMA_SERVER (docs/benchmarks.md: how to build it from the
  llama-cpp-python sdist);
- Hugging Face transformers `generate` on static batches of 16 and of 1 (its fair best case: no
  server, no queueing, every batch starts together), in a child process.

Prints output tokens/s per engine and concurrency with ratios, and the peak resident memory
(VmHWM) of every process. vLLM's CPU build needs AVX-512 and is not installable offline here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.llama_cpp import complete, gguf_of, llama_server  # noqa: E402
from benchmarks.load import Workload, drive  # noqa: E402
from kvledger.models import TinyLlamaRecipe, cache_dir, ensure_tiny_llama, write_tiny_llama  # noqa: E402
from tests.serving import descendants, start_serve  # noqa: E402

SIZES = {
    "tiny": None,  # kvledger's default tiny-llama
    "300m": TinyLlamaRecipe(
        hidden_size=1024, intermediate_size=2816, num_layers=16, num_heads=16, num_kv_heads=4
    ),
    # SmolLM2-135M's shape (random weights, head untied): 30 layers, 9/3 heads of 64
    "smol": TinyLlamaRecipe(
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        vocab_size=49152,
    ),
}


def model_dir(size: str) -> Path:
    recipe = SIZES[size]
    if recipe is None:
        return ensure_tiny_llama()
    out = cache_dir() / f"bench-llama-{size}"
    if not (out / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(out, recipe)
    return out


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return argv[2] if len(argv) > 2 and argv[1] == "-m" else Path(argv[0]).name


def run_kvledger(
    model: Path, size: str, runs: list[tuple[int, Workload]], threads: int, serve_args: str = ""
) -> dict:
    extra = [] if size == "tiny" else ["--model", str(model), "--served-model-name", "tiny-llama"]
    extra += shlex.split(serve_args)
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            served = start_serve(Path(tmp), *extra, debug_invariants=False)
            try:
                out = {
                    c: asyncio.run(drive(served.url, "tiny-llama", wl, c, engine=f"kvledger c={c}"))
                    for c, wl in runs
                }
                memory = {process_name(p): peak_rss_mib(p) for p in descendants(served.process.pid)}
            finally:
                served.stop()
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    return {"summaries": out, "memory_mib": memory}


def run_llama_cpp(binary: str, gguf: Path, runs, threads: int, wl: Workload) -> dict:  # noqa: ANN001
    ctx = 16 * (wl.prefix_len + wl.suffix_len + wl.max_tokens + 16)
    with llama_server(binary, gguf, threads, 16, ctx) as (url, proc):
        out = {c: asyncio.run(drive(url, "m", w, c, engine=f"llama.cpp c={c}")) for c, w in runs}
        agree = _llama_cpp_greedy(url, wl)
        memory = {"llama-server": peak_rss_mib(proc.pid)}
    return {"summaries": out, "memory_mib": memory, "greedy_tokens": agree}


def _llama_cpp_greedy(url: str, wl: Workload, n: int = 16) -> list[list[int]]:
    """llama.cpp's greedy tokens for the first two prompts (its synthetic pieces are <tID>)."""
    out = []
    for prompt in wl.prompts()[:2]:
        text = complete(url, prompt, n)["content"]
        out.append([int(piece) for piece in text.replace(">", "").split("<t")[1:]])
    return out


def run_transformers(
    model: Path, wl: Workload, c1: Workload, threads: int, device: str, dtype: str
) -> dict:
    """In a child process, so its peak memory is its own."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "static_batches.py")]
    argv += [str(model), json.dumps(vars_of(wl)), json.dumps(vars_of(c1)), str(threads)]
    argv += [device, dtype]
    reply = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(reply.stdout.strip().splitlines()[-1])


def vars_of(wl: Workload) -> dict:
    return dict(wl.__dict__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--c1-requests", type=int, default=8, help="requests of the concurrency-1 runs")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--engines", default="kvledger,llama.cpp,transformers")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument(
        "--serve-args", default="", help="more flags for `kvledger serve` (its defaults without)"
    )
    ap.add_argument("--device", default="cpu", help="kvledger's and transformers' (cuda)")
    ap.add_argument(
        "--dtype",
        default="float32",
        help="transformers' dtype, and kvledger's unless --serve-args gives --dtype",
    )
    args = ap.parse_args()
    wl = Workload(num_requests=args.requests, max_tokens=args.max_tokens)
    c1 = Workload(num_requests=args.c1_requests, max_tokens=args.max_tokens)
    runs = [(16, wl), (1, c1)]
    model = model_dir(args.size)
    engines = args.engines.split(",")
    report: dict[str, dict] = {}
    if "kvledger" in engines:
        serve_args = f"--device {args.device} {args.serve_args}"
        if "--dtype" not in args.serve_args:
            serve_args += f" --dtype {args.dtype}"
        report["kvledger"] = run_kvledger(model, args.size, runs, args.threads, serve_args)
    if "llama.cpp" in engines:
        if args.llama_server and Path(args.llama_server).exists():
            gguf = gguf_of(model, args.size)
            report["llama.cpp"] = run_llama_cpp(args.llama_server, gguf, runs, args.threads, wl)
        else:
            print(
                "llama.cpp skipped: give --llama-server PATH (see docs/benchmarks.md)",
                file=sys.stderr,
            )
    if "transformers" in engines:
        report["transformers"] = run_transformers(
            model, wl, c1, args.threads, args.device, args.dtype
        )
    print_table(report, args, model)
    if args.json:
        Path(args.json).write_text(json.dumps(report, default=lambda o: o.row(), indent=2))


def print_table(report: dict, args: argparse.Namespace, model: Path) -> None:
    def tok_s(engine: str, c: int) -> float | None:
        if engine == "transformers":
            return report[engine]["tok_s"].get(str(c))
        summary = report.get(engine, {}).get("summaries", {}).get(c)
        return summary.output_tok_s if summary else None

    where = f"{args.threads} threads" if args.device == "cpu" else args.device
    print(f"\n{model.name}, {args.dtype}, {where}; output tokens/s")
    print("| engine | c=16 | c=1 | peak RSS MiB |\n|---|---:|---:|---|")
    for engine in report:
        mem = ", ".join(f"{k} {v:.0f}" for k, v in report[engine]["memory_mib"].items())
        cells = [tok_s(engine, c) for c in (16, 1)]
        print(
            f"| {engine} | " + " | ".join(f"{x:.0f}" if x else "-" for x in cells) + f" | {mem} |"
        )
    if "kvledger" in report:
        for peer in (p for p in report if p != "kvledger"):
            ratios = []
            for c in (16, 1):
                a, b = tok_s("kvledger", c), tok_s(peer, c)
                ratios.append(f"c={c} {a / b:.2f}x" if a and b else f"c={c} -")
            print(f"kvledger / {peer}: " + ", ".join(ratios))
    for engine in ("kvledger", "llama.cpp"):
        for c, s in report.get(engine, {}).get("summaries", {}).items():
            print(
                f"{engine} c={c}: TTFT p50/p90/p99 "
                + "/".join(f"{v:.0f}" for v in s.ttft_ms.values())
                + " ms, inter-token p50/p90/p99 "
                + "/".join(f"{v:.1f}" for v in s.itl_ms.values())
                + " ms, time per token p50/p90 "
                + "/".join(f"{v:.1f}" for v in list(s.tpot_ms.values())[:2])
                + " ms"
                + (f", cached {100 * s.cached_share:.0f}%" if s.cached_share is not None else "")
            )
    if "llama.cpp" in report and "transformers" in report:
        ours, theirs = report["transformers"]["greedy_tokens"], report["llama.cpp"]["greedy_tokens"]
        same = [_common_prefix(x, y) for x, y in zip(ours, theirs, strict=True)]
        print(
            f"llama.cpp's first greedy tokens equal to transformers' (of 16, two prompts): {same}"
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    main()
