"""CPU matmul layouts for the worker's linear layers, side by side, on this machine.

    .venv/bin/python benchmarks/linear_layouts.py [--rows 1,4,16,128,548] [--threads N]

For each weight shape of tiny-llama (hidden 256, FF 688, vocab 30522) and of a ~300M Llama
(hidden 1024, FF 2816), and each row count (1 = a batch-1 decode step, 548 = a prefill), the
median ms of `y = x @ W.T` computed as:

- `F.linear` over the checkpoint's [out, in] weight (what the worker did before),
- `x @ w_t` with the weight stored input-major ([in, out], contiguous),
- oneDNN with a prepacked weight (`mkldnn._linear_pointwise`, `worker.layers.linear.CpuMatmul`),
- kvledger's float32 sixteen-row tiles (`kvledger_quant::linear_f32_rows16`, AVX-512 only),

and the largest difference of each from a float64 reference (the layouts compute the same
products in different orders). Timings take turns per shape so drifts hit all alike.

`--streamed` keeps enough copies of each weight (64 MiB and more) to take a different one
each call: every call then reads its weight from memory, as a decode step does once the LM head
has pushed the layers out of the caches.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from worker.layers.linear import f32_tiles
from worker.quant import kernels

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


class Copies:
    """Copies of one weight in each layout, taken in turn (one copy unless streamed)."""

    def __init__(self, out_f: int, in_f: int, copies: int, tiles: bool) -> None:
        self.ws = [torch.randn(out_f, in_f) / in_f**0.5 for _ in range(copies)]
        self.w_ts = [w.t().contiguous() for w in self.ws]
        self.packs = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in self.ws]
        self.tiles = [f32_tiles(w) for w in self.ws] if tiles else []
        self.out_f, self.turn = out_f, 0

    def pick(self, seq: list) -> torch.Tensor:
        self.turn = (self.turn + 1) % len(self.ws)
        return seq[self.turn]

    def fns(self, x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
        fns = {
            "linear": lambda: F.linear(x, self.pick(self.ws)),
            "w_t": lambda: x @ self.pick(self.w_ts),
            "onednn": lambda: torch.ops.mkldnn._linear_pointwise(
                x, self.pick(self.packs), None, "none", [], ""
            ),
        }
        if self.tiles:
            fns["tiles"] = lambda: torch.ops.kvledger_quant.linear_f32_rows16(
                x, self.pick(self.tiles), self.out_f
            )
        return fns

    def errors(self, x: torch.Tensor) -> dict[str, float]:
        """Each layout's largest difference from float64 on the first copy."""
        ref = F.linear(x.double(), self.ws[0].double())
        err = {}
        for name, fn in self.fns(x).items():
            self.turn = len(self.ws) - 1  # the next pick is copy 0
            err[name] = (fn().double() - ref).abs().max().item()
        return err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,128,548")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--streamed", action="store_true", help="weights read from memory each call")
    ap.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    args = ap.parse_args()
    module = kernels.load().module
    tiles = module is not None and bool(module.cpu_has(kernels.ISAS["avx512"]))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, float32; median ms (max error)")
    print("weights streamed from memory" if args.streamed else "weights in cache")
    cols = "F.linear | x @ w_t | oneDNN |" + (" f32 tiles |" if tiles else "")
    print(f"| weight | [out, in] | rows | {cols} F.linear / oneDNN |")
    print("|---|---|---:|---:|---:|---:|" + ("---:|" if tiles else "") + "---:|")
    for name in args.shapes.split(",") if args.shapes else SHAPES:
        out_f, in_f = SHAPES[name]
        copies = (64 << 20) // (out_f * in_f * 4) + 1 if args.streamed else 1
        layouts = Copies(out_f, in_f, copies, tiles)
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, in_f)
            ms = median_ms(layouts.fns(x), args.repeats)
            err = layouts.errors(x)
            cells = " | ".join(f"{ms[k]:.3f} ({err[k]:.0e})" for k in ms)
            print(
                f"| {name} | [{out_f}, {in_f}] | {rows} | {cells} | "
                f"{ms['linear'] / ms['onednn']:.1f}x |"
            )


if __name__ == "__main__":
    main()
