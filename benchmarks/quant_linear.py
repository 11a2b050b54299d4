"""Quantized (GGUF blocks, `worker/quant/`) against float32 linear layers, on this machine.

    .venv/bin/python benchmarks/quant_linear.py [--rows 1,16] [--types Q8_0,Q4_0,Q4_1]
        [--isa auto] [--activations float|int8] [--threads N] [--repeats 30]

For each weight shape of SmolLM2-135M ([out, in]: q/o 576x576, gate/up 1536x576, down
576x1536, k/v 192x576, LM head 49152x576) and each row count (1 = a batch-1 decode step), the
median ms of `y = x @ W.T` as the worker runs it in float32 (`CpuMatmul`: oneDNN's prepacked
weight, and the float32 tiles a small model keeps for decode-sized batches, or the input-major
copy for one row where the CPU has no AVX-512) and as `QuantizedLinear` over
the same weights quantized by `gguf.quants.quantize`, with the bytes each holds and the
quantized output's largest error relative to the float32 product of the dequantized weight.
Where the layer takes sixteen-row tiles (AVX-512), the same layer on its GGUF rows (the
per-row kernels, `rows16=False`) is timed beside it ("rows").
--activations int8 times the int8-activation kernels (`--quantization gguf-int8`) instead.
Timings take turns (A/B interleaved, `linear_layouts.median_ms`) so drifts hit both alike; on a
shared machine read them as rough ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.linear_layouts import median_ms  # noqa: E402
from worker.layers.linear import CpuMatmul  # noqa: E402
from worker.quant.layers import QuantizedLinear  # noqa: E402

SHAPES = {
    "q_proj/o_proj": (576, 576),
    "gate/up": (1536, 576),
    "down": (576, 1536),
    "k/v": (192, 576),
    "lm_head": (49152, 576),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1")
    ap.add_argument("--isa", default="auto", choices=["auto", "scalar", "avx2", "avx512"])
    ap.add_argument("--activations", default="float", choices=["float", "int8"])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(
        f"torch {torch.__version__}, {args.threads} threads, isa {args.isa}, "
        f"{args.activations} activations; median ms"
    )
    print(
        "| weight | [out, in] | type | rows | float32 | quantized | f32 / quant | GGUF rows "
        "| MiB f32 -> q |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, (out_f, in_f) in SHAPES.items():
        w = rng.standard_normal((out_f, in_f), dtype=np.float32) / in_f**0.5
        for type_name in args.types.split(","):
            qtype = GGMLQuantizationType[type_name]
            blocks = quantize(w, qtype)
            dq = torch.from_numpy(dequantize(blocks, qtype).copy())
            dense = CpuMatmul(dq, both_layouts=True)
            layers = {
                kind: QuantizedLinear(
                    in_f,
                    torch.from_numpy(blocks.copy()),
                    int(qtype),
                    isa=args.isa,
                    activations=args.activations,
                    rows16=kind == "q",
                )
                for kind in ("q", "rows")
            }
            quant = layers["q"]
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, in_f)
                fns = {"f32": lambda x=x, d=dense: d(x), "q": lambda x=x, q=quant: q(x)}
                if quant.rows16:
                    fns["rows"] = lambda x=x, q=layers["rows"]: q(x)
                with torch.inference_mode():
                    ms = median_ms(fns, args.repeats)
                    ref = dense(x)
                    err = ((quant(x) - ref).abs().max() / ref.abs().max()).item()
                mib = f"{dq.numel() * 4 / 2**20:.1f} -> {blocks.nbytes / 2**20:.1f}"
                rows_ms = f"{ms['rows']:.3f}" if "rows" in ms else "-"
                print(
                    f"| {name} | [{out_f}, {in_f}] | {type_name} | {rows} | {ms['f32']:.3f} | "
                    f"{ms['q']:.3f} ({err:.0e}) | {ms['f32'] / ms['q']:.2f}x | {rows_ms} | {mib} |"
                )


if __name__ == "__main__":
    main()
