"""Speculative decoding, measured: output tok/s with drafts off and on, for kvledger and
llama.cpp's server, on answers that quote their prompts and on chats that quote nothing.

    python -m benchmarks.speculative [--size smollm2] [--llama-server PATH] [--concurrency 1,16]

Two workloads, as token ids of the file's chat template (the same ids to every engine):

- `quoting`: each prompt asks for text that repeats the prompt: a function repeated with one
  change, a JSON document rewritten, a passage quoted in a summary, fields extracted as JSON;
- `chat`: the support questions of benchmarks/peers (chat_workload.py), whose answers quote
  nothing: the cost of speculation where it cannot help.

Every row is one server started for it, every workload driven greedily (temperature 0, EOS
ignored on the chats, `--max-tokens` at most) at each concurrency in turn. kvledger's rows also
give the share of drafted tokens kept, read from the scheduler's spec_decode counters. Results:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import Workload, drive  # noqa: E402
from benchmarks.peers.chat_workload import chat_prompts  # noqa: E402
from benchmarks.peers.llama_cpp import llama_server  # noqa: E402
from benchmarks.peers.models import model_dir  # noqa: E402
from benchmarks.peers.runs import REAL  # noqa: E402
from kvledger.models import SMOLLM2  # noqa: E402
from tests.serving import metric_sum, scrape, start_serve  # noqa: E402

FUNCTION = """def order_total(items, shipping):
    total = 0
    for item in items:
        if item.quantity <= 0:
            raise ValueError(f"bad quantity for {item.sku}")
        total += item.price * item.quantity
    if total < 50:
        total += shipping
    return round(total, 2)"""
DOCUMENT = (
    '{"order": 1042, "customer": {"name": "Ana Ruiz", "city": "Lyon"}, "items": ['
    '{"sku": "TENT-2P", "price": 189.0, "quantity": 1}, {"sku": "MAT-XL", "price": 39.5, '
    '"quantity": 2}, {"sku": "LAMP-USB", "price": 24.0, "quantity": 1}], "status": "packed"}'
)
PASSAGE = (
    "Unused items may be returned within 30 days of delivery for a full refund. Bicycles must "
    "be returned in their original box. Worn clothing, opened food, gas canisters and custom-"
    "made items cannot be returned unless they are faulty. Refunds reach the original payment "
    "method within ten working days of the parcel's arrival at our warehouse."
)
MESSAGE = (
    "Hello, this is Marta Lindqvist from Uppsala. My order 88231 arrived yesterday but the "
    "rear wheel is bent. You can reach me at marta.lindqvist@example.org or on 070 555 0142."
)
TASKS = [
    f"Repeat this function exactly, but rename the variable total to subtotal:\n\n{FUNCTION}",
    f"Rewrite this JSON with the status set to shipped, the rest unchanged:\n\n{DOCUMENT}",
    f"Summarise this policy, quoting each of its sentences word for word:\n\n{PASSAGE}",
    f"Copy this message, then extract name, city, order number and email as JSON:\n\n{MESSAGE}",
    f"Add a docstring to this function and repeat the rest unchanged:\n\n{FUNCTION}",
    f'Repeat this JSON, adding the field "carrier": "DHL" at the end:\n\n{DOCUMENT}',
    f"Quote the sentence about bicycles, then the one about refunds, from:\n\n{PASSAGE}",
    f"Write this message again with the phone number removed:\n\n{MESSAGE}",
]
KVLEDGER_ROWS = {
    "off": "",
    "ngram k=8": '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2}',
    "suffix k=8": '{"method": "suffix", "num_speculative_tokens": 8, "prompt_lookup_min": 2}',
}
LLAMA_CPP_ROWS = {
    "off": [],
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"],
}


def quoting_prompts(gguf: Path, count: int) -> list[list[int]]:
    from kvledger.gguf_tokenizer import load_gguf_tokenizer
    from server.chat_template import load_chat_template

    template, tokenizer = load_chat_template(gguf), load_gguf_tokenizer(gguf).tokenizer
    assert template is not None, f"{gguf}: no chat template"
    out = []
    for i in range(count):
        messages = [{"role": "user", "content": f"(task {i}) {TASKS[i % len(TASKS)]}"}]
        text = template.render(messages, add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False).ids)
    return out


def workloads(gguf: Path, requests: int, max_tokens: int) -> dict[str, Workload]:
    """Each with one prompt more than it measures, for the warm-up request. A quoting answer
    ends where the model ends it (past its end the model writes a new, unrelated turn); a chat
    answer runs to max_tokens, as benchmarks/peers' do."""
    made = {
        "quoting": (quoting_prompts(gguf, requests + 1), '{"ignore_eos": false}'),
        "chat": (chat_prompts(gguf, requests + 1), ""),
    }
    return {
        name: Workload(
            "given", requests, max_tokens=max_tokens, given=tuple(map(tuple, p)), extra_body=extra
        )
        for name, (p, extra) in made.items()
    }


def drive_rows(url: str, model: str, wls: dict[str, Workload], levels: list[int], read) -> dict:  # noqa: ANN001
    """tok/s (and, with `read`, the share of drafts kept) per workload and concurrency."""
    out = {}
    for name, wl in wls.items():
        for c in levels:
            before = read() if read else None
            summary = asyncio.run(drive(url, model, wl, c, engine=f"{name} c{c}"))
            cell = {"tok_s": summary.output_tok_s, "tpot_ms": summary.tpot_ms["p50"]}
            if read:
                (d0, a0), (d1, a1) = before, read()
                cell["kept"] = (a1 - a0) / (d1 - d0) if d1 > d0 else None
            out[f"{name} c{c}"] = cell
    return out


def run_kvledger(size: str, gguf: Path, flags: str, wls, levels, threads) -> dict:  # noqa: ANN001
    name = SMOLLM2 if size == REAL else "bench"
    extra = ["--model", SMOLLM2] if size == REAL else ["--model", str(gguf)]
    extra += ["--served-model-name", name] if size != REAL else []
    extra += ["--speculative-config", flags] if flags else []
    extra += shlex.split(os.environ.get("KVLEDGER_BENCH_ARGS", ""))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        served = start_serve(Path(tmp), *extra, debug_invariants=False)
        try:

            def read() -> tuple[float, float]:
                s = scrape(served.scheduler_metrics_url)
                return (
                    metric_sum(s, "kvledger_spec_decode_num_draft_tokens_total"),
                    metric_sum(s, "kvledger_spec_decode_num_accepted_tokens_total"),
                )

            return drive_rows(served.url, name, wls, levels, read)
        finally:
            served.stop()


def run_llama_cpp(binary: str, gguf: Path, flags: list[str], wls, levels, threads) -> dict:  # noqa: ANN001
    longest = max(len(p) for wl in wls.values() for p in wl.prompts())
    slots = max(levels)
    ctx = slots * (longest + next(iter(wls.values())).max_tokens + 16)
    with llama_server(binary, gguf, threads, slots, ctx, tuple(flags)) as (url, _):
        return drive_rows(url, "m", wls, levels, None)


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    lines = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line]
    return lines[0] if lines else platform.processor()


def print_table(rows: dict[str, dict], levels: list[int]) -> None:
    keys = [f"{w} c{c}" for w in ("quoting", "chat") for c in levels]
    print("| engine | " + " | ".join(f"{k} tok/s (kept)" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for engine, cells in rows.items():
        shown = []
        for k in keys:
            cell = cells[k]
            kept = cell.get("kept")
            shown.append(f"{cell['tok_s']:.1f}" + (f" ({kept:.0%})" if kept is not None else ""))
        print(f"| {engine} | " + " | ".join(shown) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default=REAL, help="smollm2, or a benchmarks/peers file size")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    gguf = model_dir(args.size, args.llama_quantize)
    wls = workloads(gguf, args.requests, args.max_tokens)
    rows: dict[str, dict] = {}
    for label, flags in KVLEDGER_ROWS.items():
        rows[f"kvledger {label}"] = run_kvledger(args.size, gguf, flags, wls, levels, args.threads)
    if args.llama_server:
        for label, extra in LLAMA_CPP_ROWS.items():
            rows[f"llama.cpp {label}"] = run_llama_cpp(
                args.llama_server, gguf, extra, wls, levels, args.threads
            )
    print(f"\n{cpu_model()}, {args.threads} threads, {args.size}, {args.requests} requests "
          f"x {args.max_tokens} tokens each\n")  # fmt: skip
    print_table(rows, levels)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
