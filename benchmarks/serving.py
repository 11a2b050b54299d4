"""Serving benchmark: streaming completions against any OpenAI-compatible server.

    # a running server (kvledger, llama.cpp's llama-server, vLLM, ...)
    .venv/bin/python benchmarks/serving.py --url http://127.0.0.1:8000 --concurrency 16
    # kvledger started by the script, prefix caching on and then off, side by side
    .venv/bin/python benchmarks/serving.py --compare-prefix-caching

Datasets (token-id prompts: every engine sees the same tokens): `shared-prefix` (--prefix-len
tokens shared by every prompt, then --suffix-len of its own; a system prompt or a multi-turn
chat, as in real serving) and `random` (--suffix-len random tokens). Requests go out at
--concurrency (closed loop) or at --request-rate per second (Poisson arrivals). Reports output
tokens/s, requests/s, TTFT and inter-token latency p50/p90/p99 (between streamed events), time
per output token (per request, after the first; the same however many tokens an event holds),
and the share of prompt tokens
the server says it served from its prefix cache; --json writes every figure.

--compare-json-schema runs the same workload twice on one kvledger, free and then constrained
to a JSON schema (an array of at least --max-tokens integers, so both runs generate exactly
--max-tokens tokens a request): the cost of the grammar masks (docs/structured-outputs.md).
It needs a model with a byte-level tokenizer: --model smollm2-135m-instruct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.load import Summary, Workload, drive  # noqa: E402
from tests.serving import start_serve  # noqa: E402


def kvledger(caching: bool, wl: Workload, args: argparse.Namespace) -> Summary:
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    with tempfile.TemporaryDirectory() as tmp:
        extra = shlex.split(args.serve_args)
        served = start_serve(Path(tmp), flag, *extra, debug_invariants=False)
        try:
            name = f"kvledger cache {'on' if caching else 'off'}"
            return asyncio.run(
                drive(served.url, args.model, wl, args.concurrency, args.request_rate, name)
            )
        finally:
            served.stop()


def json_schema_body(max_tokens: int) -> str:
    """A constraint that never ends before max_tokens (no EOS while the grammar is open)."""
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": max_tokens}
    fmt = {"type": "json_schema", "json_schema": {"name": "ints", "schema": schema}}
    return json.dumps({"response_format": fmt, "ignore_eos": False})


def compare_json_schema(wl: Workload, args: argparse.Namespace) -> list[Summary]:
    constrained = replace(wl, extra_body=json_schema_body(wl.max_tokens))
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--model", args.model, *shlex.split(args.serve_args)]
        served = start_serve(Path(tmp), *extra, debug_invariants=False, timeout=900)
        try:
            return [
                asyncio.run(drive(served.url, args.model, w, args.concurrency, None, name))
                for w, name in ((wl, "free"), (constrained, "json_schema"))
            ]
        finally:
            served.stop()


def table(summaries: list[Summary]) -> None:
    rows = [
        ("output tokens/s", lambda s: s.output_tok_s),
        ("requests/s", lambda s: s.requests_s),
        *[(f"TTFT {p} (ms)", lambda s, p=p: s.ttft_ms[p]) for p in ("p50", "p90", "p99")],
        *[(f"inter-token {p} (ms)", lambda s, p=p: s.itl_ms[p]) for p in ("p50", "p90", "p99")],
        *[(f"time per token {p} (ms)", lambda s, p=p: s.tpot_ms[p]) for p in ("p50", "p90")],
        ("prompt tokens cached (%)", lambda s: 100 * (s.cached_share or 0.0)),
    ]
    head = " | ".join(s.engine for s in summaries)
    ratio = " | first / second" if len(summaries) == 2 else ""
    print(f"| metric | {head}{ratio} |\n|---|" + "---:|" * (len(summaries) + bool(ratio)))
    for name, fn in rows:
        values = [fn(s) for s in summaries]
        cells = " | ".join(f"{v:.1f}" for v in values)
        if ratio:
            cells += f" | {values[0] / values[1]:.2f}x" if values[1] else " | -"
        print(f"| {name} | {cells} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server; without it, kvledger is started")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--dataset", choices=("shared-prefix", "random"), default="shared-prefix")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--suffix-len", type=int, default=36)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--request-rate", type=float, help="Poisson arrivals per second")
    ap.add_argument("--compare-prefix-caching", action="store_true")
    ap.add_argument(
        "--compare-json-schema",
        action="store_true",
        help="free vs constrained to a JSON schema, on one kvledger (needs a byte-level "
        "tokenizer: --model smollm2-135m-instruct)",
    )
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument(
        "--serve-args",
        default="",
        help="more flags for the kvledger it starts, e.g. '--device cuda --dtype bfloat16 "
        "--block-size 256'",
    )
    args = ap.parse_args()
    wl = Workload(args.dataset, args.requests, args.prefix_len, args.suffix_len, args.max_tokens)
    if args.url:
        summaries = [
            asyncio.run(
                drive(args.url, args.model, wl, args.concurrency, args.request_rate, args.url)
            )
        ]
    elif args.compare_json_schema:
        summaries = compare_json_schema(wl, args)
    elif args.compare_prefix_caching:
        summaries = [kvledger(True, wl, args), kvledger(False, wl, args)]
    else:
        summaries = [kvledger(True, wl, args)]
    print(
        f"{wl.num_requests} streaming requests, dataset {wl.dataset} ({wl.prefix_len}+"
        f"{wl.suffix_len} tokens), {wl.max_tokens} output tokens, "
        + (
            f"rate {args.request_rate}/s"
            if args.request_rate
            else f"concurrency {args.concurrency}"
        )
    )
    table(summaries)
    if args.json:
        Path(args.json).write_text(json.dumps([s.row() for s in summaries], indent=2))


if __name__ == "__main__":
    main()
