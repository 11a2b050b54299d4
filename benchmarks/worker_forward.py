"""Step latency of the worker's forward pass (tiny-llama or --model DIR), next to transformers.

    .venv/bin/python benchmarks/worker_forward.py [--batch-sizes 1,8,32] [--prompt-len 128]
        [--llama-server PATH]

kvledger runs through `ModelRunner.execute` over paged KV memory (`--attention-backend auto`
by default, as the worker serves: the CPU decode kernel; greedy sampling included);
transformers (the reference implementation, a test dependency) runs
`AutoModelForCausalLM` from the same model directory in the same dtype, in the same process and
on the same torch threads, with its default attention implementation.

Prefill: B fresh prompts of --prompt-len tokens in one step. kvledger: one `execute` of B
chunks; transformers: one forward of the [B, L] batch with use_cache=True and
logits_to_keep=1 (as `generate` does), then the argmax of the last position.

Decode: B sequences with --context-len tokens already cached, one new token each per step.
The cache is filled outside the timed region, and every timed step computes the same position
(--context-len), so each sees the same context: kvledger rewrites that slot of its paged cache;
transformers runs a [B, 1] forward with its DynamicCache, then `crop(-1)`s it (untimed) back
to --context-len tokens.

Each figure is the median of --repeats timed steps after one warm-up, the two engines taking
turns (see `race`, benchmarks/forward_steps.py), under torch.inference_mode(), for float32 and
bfloat16 (see --dtypes). The last line counts the sequences whose greedy next token the two
engines agree on: a check that both computed the same thing. With --llama-server (or
$LLAMA_SERVER), a line more gives llama.cpp's own per-token timings on an F32 GGUF of the same
weights, same threads, one sequence, beside kvledger's batch-1 float32 figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
import transformers.utils.logging
from transformers import AutoModelForCausalLM

from kvledger.models import ensure_tiny_llama
from worker.runner.config import RunnerConfig
from worker.runner.model_runner import ModelRunner
from worker.runner.setup import DTYPES as TORCH_DTYPES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.forward_steps import (  # noqa: E402
    hf_decode,
    hf_prefill,
    kvl_decode,
    kvl_prefill,
    prompts,
    race,
)

BLOCK_SIZE = 16  # the default; flash-attn (CUDA) needs 256
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass
class Row:
    phase: str
    batch: int
    tokens: int  # tokens computed per step
    ms: dict[tuple[str, str], float]  # (engine, dtype) -> median ms
    agree: dict[str, int]  # dtype -> sequences whose greedy next token both engines agree on


def run(args: argparse.Namespace) -> tuple[list[Row], str]:
    model_dir = ensure_tiny_llama() if args.model == "tiny-llama" else Path(args.model)
    longest = max(args.prompt_len, args.context_len + 1)
    num_blocks = max(args.batch_sizes) * -(-longest // args.block_size)
    rows = {
        (phase, b): Row(phase, b, b * (args.prompt_len if phase == "prefill" else 1), {}, {})
        for phase in ("prefill", "decode")
        for b in args.batch_sizes
    }
    attn = ""
    for dtype in args.dtypes:
        runner = ModelRunner(
            RunnerConfig(
                model_dir,
                block_size=args.block_size,
                num_blocks=num_blocks,
                dtype=dtype,
                device=args.device,
                progress=False,
                attention_backend=args.attention_backend,
                cuda_graph_max_batch=args.cuda_graph_max_batch,
            )
        )
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=TORCH_DTYPES[dtype])
        hf = hf.to(args.device).eval()
        attn = hf.config._attn_implementation
        if args.threads:  # after ModelRunner, which sets its default; one setting for both
            torch.set_num_threads(args.threads)
        for b in args.batch_sizes:
            for phase in ("prefill", "decode"):
                if phase == "prefill":
                    kvl, tf = (
                        kvl_prefill(runner, b, args.prompt_len),
                        hf_prefill(hf, b, args.prompt_len),
                    )
                else:
                    kvl, tf = (
                        kvl_decode(runner, b, args.context_len),
                        hf_decode(hf, b, args.context_len),
                    )
                ms, tokens = race({"kvledger": kvl, "transformers": tf}, args.repeats)
                row = rows[phase, b]
                row.ms["kvledger", dtype] = ms["kvledger"]
                row.ms["transformers", dtype] = ms["transformers"]
                pairs = zip(tokens["kvledger"], tokens["transformers"], strict=True)
                row.agree[dtype] = sum(x == y for x, y in pairs)
        del runner, hf
    return list(rows.values()), attn


def table(rows: list[Row], dtypes: list[str]) -> str:
    """Per dtype: kvledger ms, transformers ms, transformers / kvledger (> 1: kvledger faster);
    then kvledger's bf16 speed-up over fp32 when both ran."""
    head = ["phase", "batch", "tokens/step"]
    for d in dtypes:
        head += [f"kvledger {SHORT[d]} ms", f"transformers {SHORT[d]} ms", f"tf / kvl {SHORT[d]}"]
    both = "float32" in dtypes and "bfloat16" in dtypes
    if both:
        head.append("kvledger bf16 speed-up")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [r.phase, str(r.batch), str(r.tokens)]
        for d in dtypes:
            kvl, tf = r.ms["kvledger", d], r.ms["transformers", d]
            cells += [f"{kvl:.1f}", f"{tf:.1f}", f"{tf / kvl:.2f}x"]
        if both:
            cells.append(f"{r.ms['kvledger', 'float32'] / r.ms['kvledger', 'bfloat16']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-sizes", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--context-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtypes", default="float32,bfloat16", type=lambda s: s.split(","))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu", help="torch device of both engines (cuda)")
    parser.add_argument(
        "--llama-server",
        default=os.environ.get("LLAMA_SERVER"),
        help="llama.cpp's llama-server binary: adds its per-token timings on the same weights",
    )
    parser.add_argument(
        "--block-size", type=int, default=BLOCK_SIZE, help="kvledger's KV block (flash-attn: 256)"
    )
    parser.add_argument(
        "--attention-backend",
        default="auto",
        help="kvledger's backend (auto, what the worker serves with: the CPU kernel, or on "
        "CUDA flash-attn where it runs; torch; flash_attn)",
    )
    parser.add_argument("--model", default="tiny-llama", help="tiny-llama, or a model directory")
    parser.add_argument(
        "--cuda-graph-max-batch",
        type=int,
        default=64,
        help="on CUDA with flash-attn, decode steps up to this batch run as CUDA graphs (0: off)",
    )
    args = parser.parse_args()
    for d in args.dtypes:
        if d not in SHORT:
            parser.error(f"unknown dtype {d!r} ({', '.join(SHORT)})")
    transformers.utils.logging.disable_progress_bar()
    rows, attn = run(args)
    print(
        f"{Path(args.model).name} on {args.device}"
        + (f" ({torch.cuda.get_device_name(args.device)})" if args.device != "cpu" else "")
        + f", block size {args.block_size}, "
        f"CUDA graphs up to batch {args.cuda_graph_max_batch}, "
        f"prompt {args.prompt_len} tokens, decode context {args.context_len}, "
        f"median of {args.repeats}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"transformers {transformers.__version__} (attention: {attn})"
    )
    print(table(rows, args.dtypes))
    agreement = ", ".join(
        f"{SHORT[d]} {sum(r.agree[d] for r in rows)}/{sum(r.batch for r in rows)}"
        for d in args.dtypes
    )
    print(f"greedy next tokens equal in kvledger and transformers: {agreement}")
    if args.llama_server and args.device == "cpu":
        print(llama_cpp_line(args, rows))


def llama_cpp_line(args: argparse.Namespace, rows: list[Row]) -> str:
    """llama.cpp's own per-token timings (its `/completion` reply's `timings`) on an F32 GGUF
    of the same weights, on the same threads, one sequence: a prompt of --prompt-len tokens,
    and --repeats tokens decoded after --context-len; next to kvledger's batch-1 float32 rows."""
    from benchmarks.peers.llama_cpp import complete, gguf_of, llama_server

    model = ensure_tiny_llama()
    threads = torch.get_num_threads()
    ctx = max(args.prompt_len, args.context_len) + args.repeats + 64
    with llama_server(args.llama_server, gguf_of(model, "tiny"), threads, 1, ctx) as (url, _):
        vocab = 30000
        complete(url, prompts(1, 8, vocab, 0)[0], 2)  # warm-up
        prefill = [
            complete(url, prompts(1, args.prompt_len, vocab, 1 + i)[0], 1)["timings"]
            for i in range(3)
        ]
        decode = complete(url, prompts(1, args.context_len, vocab, 2)[0], args.repeats)["timings"]
    prompt_ms = statistics.median(t["prompt_ms"] for t in prefill)
    line = (
        f"llama.cpp (F32 GGUF, {threads} threads, one sequence): prompt of {args.prompt_len} "
        f"tokens {prompt_ms:.1f} ms ({args.prompt_len / prompt_ms * 1000:.0f} tokens/s), "
        f"decode {decode['predicted_per_token_ms']:.2f} ms a token after {args.context_len}"
    )
    ours = {r.phase: r.ms.get(("kvledger", "float32")) for r in rows if r.batch == 1}
    if ours.get("prefill") and ours.get("decode"):
        line += (
            f"; kvledger fp32 batch 1: prefill {ours['prefill']:.1f} ms "
            f"({args.prompt_len / ours['prefill'] * 1000:.0f} tokens/s), "
            f"decode {ours['decode']:.2f} ms"
        )
    return line


if __name__ == "__main__":
    main()
