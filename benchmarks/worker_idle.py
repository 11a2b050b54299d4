"""Worker idle share while serving: time between sending a step's result and receiving the next
plan (kvledger_worker_waiting_seconds_total, counted only while requests are live) against step
compute (kvledger_worker_step_seconds), at concurrency 1 and 16, alternated.

    .venv/bin/python benchmarks/worker_idle.py [--no-async-scheduling]   # extra args go to serve
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.load import Workload, drive  # noqa: E402
from tests.serving import metric_sum, scrape, start_serve  # noqa: E402


def snapshot(metrics_url: str) -> tuple[float, float, float]:
    s = scrape(metrics_url)
    return (
        metric_sum(s, "kvledger_worker_waiting_seconds_total"),
        metric_sum(s, "kvledger_worker_step_seconds_sum"),
        metric_sum(s, "kvledger_worker_step_seconds_count"),
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        served = start_serve(Path(tmp), *sys.argv[1:], debug_invariants=False)
        worker_metrics = f"http://127.0.0.1:{served.metrics_port + 1}/metrics"
        try:
            for conc in (1, 16, 1, 16):
                wl = Workload(num_requests=8 if conc == 1 else 48)
                before = snapshot(worker_metrics)
                summ = asyncio.run(drive(served.url, "tiny-llama", wl, conc, None, f"c{conc}"))
                after = snapshot(worker_metrics)
                waited, compute, steps = (b - a for a, b in zip(before, after, strict=True))
                print(
                    f"c={conc} steps={steps:.0f} compute={1e3 * compute / steps:.2f} ms/step "
                    f"wait={1e3 * waited / steps:.2f} ms/step "
                    f"idle={waited / (waited + compute):.1%} "
                    f"output_tok_s={summ.output_tok_s:.1f}",
                    flush=True,
                )
        finally:
            served.stop()


if __name__ == "__main__":
    main()
