"""The runs benchmarks/peers drives every engine through, and what it reads of a process.

A run is a workload at one concurrency: c=16 and c=1 over prompts that share a prefix (the
random sizes' 512-token prefix, or the chat workload's system prompt), and the cold-prefill run
at c=1 over prompts that share no 16-token cache block with each other or the other runs, with
no warm-up request: the time to first token when no prefix cache can help.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from benchmarks.load import Workload, drive
from benchmarks.peers.chat_workload import chat_workload

REAL = "smollm2"  # --size of the real SmolLM2-135M-Instruct file, served as SMOLLM2
# --size of the Llama-3.2-1B-shaped random file (benchmarks/gguf_1b.py) in each llama.cpp type
ONE_B = {"1b-q4_k_m": "Q4_K_M", "1b-q4_0": "Q4_0", "1b-q8_0": "Q8_0"}
FILE_SIZES = (REAL, *ONE_B)  # GGUF files served as they are, on the chat workload
COLD_TOKENS = 8  # output tokens of a cold-prefill request: its TTFT is what it measures


@dataclass(frozen=True)
class Run:
    """One measured run against a server: `key` names it in the report (16, 1, "cold")."""

    key: int | str
    concurrency: int
    workload: Workload
    warm_up: bool = True  # false for "cold": its warm-up request would cache a measured prompt


def drive_all(url: str, model: str, runs: list[Run], engine: str) -> dict:
    out = {}
    for r in runs:
        run = drive(
            url, model, r.workload, r.concurrency, engine=f"{engine} {r.key}", warm_up=r.warm_up
        )
        out[r.key] = asyncio.run(run)
    return out


def workloads(
    model: Path, size: str, requests: int, c1_requests: int, cold_requests: int, max_tokens: int
) -> list[Run]:
    """The runs every engine serves: c=16, c=1 and (unless no requests) the cold prefill."""
    if size in FILE_SIZES:
        wl = chat_workload(model, requests, max_tokens)
        c1 = chat_workload(model, c1_requests, max_tokens)
        cold = chat_workload(model, cold_requests, COLD_TOKENS, cold=True)
    else:
        wl = Workload(num_requests=requests, max_tokens=max_tokens)
        c1 = Workload(num_requests=c1_requests, max_tokens=max_tokens)
        length = wl.prefix_len + wl.suffix_len  # as long as the shared-prefix prompts
        # seed 1: the shared-prefix prompts are seed 0's first draws, and a random prompt of
        # the same seed would repeat them (a prefix cache hit in a run meant to have none)
        cold = Workload("random", cold_requests, suffix_len=length, max_tokens=COLD_TOKENS, seed=1)
    runs = [Run(16, 16, wl), Run(1, 1, c1)]
    if cold_requests:
        runs.append(Run("cold", 1, cold, warm_up=False))
    return runs


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return argv[2] if len(argv) > 2 and argv[1] == "-m" else Path(argv[0]).name
