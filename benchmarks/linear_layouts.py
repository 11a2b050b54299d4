"""CPU matmul layouts for the worker's linear layers, side by side, on this machine.

    .venv/bin/python benchmarks/linear_layouts.py [--rows 1,4,16,128,548] [--threads N]

For each weight shape of tiny-llama (hidden 256, FF 688, vocab 30522) and of a ~300M Llama
(hidden 1024, FF 2816), and each row count (1 = a batch-1 decode step, 548 = a prefill), the
median ms of `y = x @ W.T` computed as:

- `F.linear` over the checkpoint's [out, in] weight (what the worker did before),
- `x @ w_t` with the weight stored input-major ([in, out], contiguous),
- oneDNN with a prepacked weight (`mkldnn._linear_pointwise`, `worker.layers.linear.CpuMatmul`),

and the largest difference of each from a float64 reference (the layouts compute the same
products in different orders). Timings take turns per shape so drifts hit all alike.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

SHAPES = {
    "tiny qkv": (512, 256),
    "tiny o_proj": (256, 256),
    "tiny gate_up": (1376, 256),
    "tiny down": (256, 688),
    "tiny lm_head": (30522, 256),
    "300m qkv": (1536, 1024),
    "300m gate_up": (5632, 1024),
    "300m down": (1024, 2816),
    "300m lm_head": (30522, 1024),
}


def median_ms(fns: dict[str, Callable[[], torch.Tensor]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for r in range(repeats):
        order = list(fns.items())
        for name, fn in order if r % 2 else reversed(order):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: sorted(ts)[len(ts) // 2] * 1e3 for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,128,548")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, float32; median ms (max error)")
    print("| weight | [out, in] | rows | F.linear | x @ w_t | oneDNN | F.linear / oneDNN |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (out_f, in_f) in SHAPES.items():
        w = torch.randn(out_f, in_f) / in_f**0.5
        w_t = w.t().contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, in_f)
            ref = F.linear(x.double(), w.double())
            fns = {
                "linear": lambda x=x, w=w: F.linear(x, w),
                "w_t": lambda x=x, w_t=w_t: x @ w_t,
                "onednn": lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(
                    x, p, None, "none", [], ""
                ),
            }
            ms = median_ms(fns, args.repeats)
            err = {k: (fn().double() - ref).abs().max().item() for k, fn in fns.items()}
            cells = " | ".join(f"{ms[k]:.3f} ({err[k]:.0e})" for k in fns)
            print(
                f"| {name} | [{out_f}, {in_f}] | {rows} | {cells} | "
                f"{ms['linear'] / ms['onednn']:.1f}x |"
            )


if __name__ == "__main__":
    main()
