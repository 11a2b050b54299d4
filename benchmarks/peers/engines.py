"""The other engines' rows of benchmarks/peers: llama.cpp's server, vLLM's CPU build and
transformers' static batches, each on the same runs (benchmarks/peers/runs.py)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from benchmarks.load import Workload
from benchmarks.peers.llama_cpp import complete, llama_server
from benchmarks.peers.runs import FILE_SIZES, Run, drive_all, peak_rss_mib, process_name
from benchmarks.peers.vllm_cpu import greedy_tokens, hf_checkpoint_of, vllm_server
from tests.serving import descendants


def run_llama_cpp(binary: str, gguf: Path, runs, threads: int, wl: Workload, extra: str) -> dict:  # noqa: ANN001
    ctx = 16 * (max(len(p) for p in wl.prompts()) + wl.max_tokens + 16)
    with llama_server(binary, gguf, threads, 16, ctx, tuple(shlex.split(extra))) as (url, proc):
        out = drive_all(url, "m", runs, "llama.cpp")
        agree = _llama_cpp_greedy(url, wl)
        memory = {"llama-server": peak_rss_mib(proc.pid)}
    return {"summaries": out, "memory_mib": memory, "greedy_tokens": agree}


def run_vllm(
    python: str, model: Path, size: str, runs: list[Run], threads: int, wl: Workload
) -> dict:
    """vLLM's CPU build from its own venv (benchmarks/peers/vllm_cpu.py): the HF checkpoint of the
    random sizes as it is, the real file's weights dequantized to float32."""
    checkpoint = hf_checkpoint_of(model) if size in FILE_SIZES else model
    with vllm_server(python, checkpoint, threads, max_len=2048) as (url, proc):
        out = drive_all(url, "m", runs, "vllm")
        agree = [greedy_tokens(url, p, 16) for p in wl.prompts()[:2]]
        memory = {}
        for pid in sorted({proc.pid} | descendants(proc.pid)):
            name = process_name(pid)
            memory[name if name not in memory else f"{name} {pid}"] = peak_rss_mib(pid)
    return {"summaries": out, "memory_mib": memory, "greedy_tokens": agree}


def _llama_cpp_greedy(url: str, wl: Workload, n: int = 16) -> list[list[int]]:
    """llama.cpp's greedy tokens for the first two prompts (its `tokens`, or read from the
    synthetic vocabulary's <tID> pieces)."""
    out = []
    for prompt in wl.prompts()[:2]:
        reply = complete(url, prompt, n)
        if reply.get("tokens"):
            out.append(list(reply["tokens"])[:n])
            continue
        text = reply["content"]
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
