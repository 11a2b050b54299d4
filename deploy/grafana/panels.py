"""The panels of the kvledger dashboard, row by row, and the query builders they use.

Every query uses the same datasource, model filter and rate window, and the metric names stay
those of docs/design.md, "Contracts". deploy/grafana/dashboard.py lays these panels out and
writes the JSON. Standard library only. What each panel means: docs/operations.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

M = '{model=~"$model"}'  # every kvledger series carries `model` (the frontend's does not)
W = "[$__rate_interval]"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Panel:
    title: str
    description: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    red_at: float | None = None  # stat: background turns red at this value
    extra: dict = field(default_factory=dict)


@dataclass
class Row:
    title: str
    panels: list[Panel]


def rate(metric: str, by: str = "") -> str:
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}(rate({metric}{M}{W}))"


def hit_rate(by: str = "") -> str:
    return (
        f"{rate('kvledger_prefix_cache_hits_total', by)} / "
        f"{rate('kvledger_prefix_cache_queries_total', by)}"
    )


def quantiles(histogram: str, by: str = "", legend: str = "") -> list[tuple[str, str]]:
    keys = f"{by}, le" if by else "le"
    return [
        (
            f"histogram_quantile({q}, sum by ({keys}) (rate({histogram}_bucket{M}{W})))",
            f"{legend}p{round(q * 100)}",
        )
        for q in QUANTILES
    ]


def gauge(metric: str, by: str) -> str:
    return f"sum by ({by}) ({metric}{M})"


ROWS: list[Row] = [
    Row(
        "Prefix cache and ledger",
        [
            Panel(
                "Prefix cache hit rate",
                "Prompt tokens found in the prefix cache / prompt tokens looked up (token "
                "counters of the scheduler's ledger), all workers of the selected models.",
                [(hit_rate(), "all")],
                unit="percentunit",
                extra={"max": 1},
            ),
            Panel(
                "Prefix cache hit rate by worker",
                "The same ratio per worker's ledger. A worker far below the others gets requests "
                "whose prefixes live elsewhere (routing) or evicts them too soon (small KV pool).",
                [(hit_rate("model, worker"), "{{worker}} ({{model}})")],
                unit="percentunit",
                extra={"max": 1},
            ),
            Panel(
                "Stale tracker entries by source",
                "Tracker lookups found stale (the pool's removal epoch moved) and recomputed "
                "before use. Expected under eviction pressure; a steady rise means the KV pool "
                "is too small for the load.",
                [(rate("kvledger_tracker_stale_entries_total", "source"), "{{source}}")],
                unit="ops",
            ),
            Panel(
                "Tracker releases by reason",
                "Tracker lookups dropped because a scheduling attempt did not admit the request "
                "(budget, no free blocks, ...), on preemption, and entries removed on "
                "finish/abort/ignore.",
                [(rate("kvledger_tracker_entries_released_total", "reason"), "{{reason}}")],
                unit="ops",
            ),
            Panel(
                "Tracker orphans since scheduler start",
                "Tracker entries found without a live request, counted and purged by the "
                "auditor. A bug signal: must stay 0 (see docs/operations.md).",
                [(f"sum(kvledger_tracker_orphans_total{M})", "orphans")],
                kind="stat",
                width=6,
                red_at=1,
            ),
            Panel(
                "Worker stale-block refusals since start",
                "Cached blocks a worker refused because the hash declared by the plan did not "
                "match what it wrote (provenance check). A bug signal: must stay 0.",
                [(f"sum(kvledger_worker_stale_block_hits_total{M})", "refusals")],
                kind="stat",
                width=6,
                red_at=1,
            ),
            Panel(
                "Tracker entries",
                "Live tracker entries per worker: follows running + waiting requests and "
                "returns to 0 at idle.",
                [(gauge("kvledger_tracker_entries", "worker"), "{{worker}}")],
            ),
            Panel(
                "Orphans and worker stale-block hits /s",
                "Rates of the two bug signals, per worker.",
                [
                    (rate("kvledger_tracker_orphans_total", "worker"), "orphans {{worker}}"),
                    (
                        rate("kvledger_worker_stale_block_hits_total", "worker"),
                        "stale-block hits {{worker}}",
                    ),
                ],
                unit="ops",
            ),
        ],
    ),
    Row(
        "KV cache",
        [
            Panel(
                "KV cache usage",
                "Blocks referenced by a request / blocks in the worker's pool.",
                [
                    (
                        f"max by (model, worker) (kvledger_kv_cache_usage_ratio{M})",
                        "{{worker}} ({{model}})",
                    )
                ],
                unit="percentunit",
                extra={"max": 1},
            ),
            Panel(
                "KV blocks: cached, in use, total",
                "Blocks holding a cached prefix hash (reusable until evicted), blocks referenced "
                "by requests, and the pool size, per worker.",
                [
                    (gauge("kvledger_kv_blocks_cached", "worker"), "cached {{worker}}"),
                    (gauge("kvledger_kv_blocks_in_use", "worker"), "in use {{worker}}"),
                    (gauge("kvledger_kv_blocks_capacity", "worker"), "total {{worker}}"),
                ],
            ),
            Panel(
                "Block evictions /s",
                "Cached blocks whose hash was dropped so the block could be reused.",
                [(rate("kvledger_kv_block_evictions_total", "worker"), "{{worker}}")],
                unit="ops",
            ),
            Panel(
                "Worker KV events /s by type",
                "What workers report up: blocks written (stored), dropped (removed), and "
                "all_cleared at (re)connect.",
                [(rate("kvledger_worker_kv_events_total", "worker, type"), "{{type}} {{worker}}")],
                unit="ops",
            ),
        ],
    ),
    Row(
        "Requests and throughput",
        [
            Panel(
                "Running and waiting requests",
                "Requests in the running batch and in the waiting queue, per model.",
                [
                    (gauge("kvledger_num_requests_running", "model"), "running {{model}}"),
                    (gauge("kvledger_num_requests_waiting", "model"), "waiting {{model}}"),
                ],
            ),
            Panel(
                "Preemptions /s",
                "Running requests preempted (blocks freed, recomputed later) because the KV pool "
                "ran out.",
                [(rate("kvledger_num_preemptions_total", "worker"), "{{worker}}")],
                unit="ops",
            ),
            Panel(
                "Prompt and generation tokens /s",
                "Prompt tokens of finished requests and generated tokens, per model.",
                [
                    (rate("kvledger_prompt_tokens_total", "model"), "prompt {{model}}"),
                    (rate("kvledger_generation_tokens_total", "model"), "generation {{model}}"),
                ],
                unit="short",
            ),
            Panel(
                "Speculative decoding: drafts kept",
                "Drafted tokens the workers kept / drafted tokens (--speculative-config), and "
                "drafted tokens /s, per model. A low share means drafts rarely match what the "
                "model writes: requests then back off from drafting (docs/architecture.md).",
                [
                    (
                        f"{rate('kvledger_spec_decode_num_accepted_tokens_total', 'model')} / "
                        f"{rate('kvledger_spec_decode_num_draft_tokens_total', 'model')}",
                        "kept {{model}}",
                    ),
                    (
                        rate("kvledger_spec_decode_num_drafts_total", "model"),
                        "drafts /s {{model}}",
                    ),
                    (
                        rate("kvledger_spec_decode_num_accepted_tokens_per_pos_total", "position"),
                        "kept /s at position {{position}}",
                    ),
                ],
                unit="short",
            ),
            Panel(
                "Finished requests /s by reason",
                "Requests that ended, by finish reason (stop, length, abort, ...).",
                [(rate("kvledger_requests_finished_total", "reason"), "{{reason}}")],
                unit="reqps",
            ),
            Panel(
                "HTTP responses /s by status",
                "Frontend responses by status code: 429 = queue full, 503 = no worker or no "
                "scheduler, 4xx = client errors.",
                [("sum by (status) (rate(kvledger_http_requests_total" + W + "))", "{{status}}")],
                unit="reqps",
            ),
            Panel(
                "Slow clients cut off /s",
                "Connections the frontend closed because a client sent its request line and "
                "headers (phase header, --timeout-request-header) or its body (phase body, "
                "--timeout-request-body) too slowly. A steady rate is a slow-client attack or "
                "a broken client; docs/operations.md, slow clients.",
                [(rate("kvledger_http_request_timeouts_total", "phase"), "{{phase}}")],
                unit="ops",
            ),
            Panel(
                "Requests resumed after a scheduler restart /s",
                "Live requests whose link to the scheduler broke: re-submitted as continuations "
                "and admitted (resumed), or ended past --scheduler-reconnect-timeout (gave_up).",
                [(rate("kvledger_request_resumptions_total", "outcome"), "{{outcome}}")],
                unit="ops",
            ),
            Panel(
                "Scrape targets up",
                "1 when Prometheus reaches the service's metrics endpoint.",
                [("up", "{{job}} {{instance}}")],
                extra={"max": 1},
            ),
        ],
    ),
    Row(
        "Latency",
        [
            Panel(
                "Time to first token",
                "Arrival to first generated token.",
                quantiles("kvledger_time_to_first_token_seconds"),
                unit="s",
            ),
            Panel(
                "Time per output token",
                "Mean time between generated tokens after the first.",
                quantiles("kvledger_time_per_output_token_seconds"),
                unit="s",
            ),
            Panel(
                "End-to-end request latency",
                "Arrival to finish.",
                quantiles("kvledger_e2e_request_latency_seconds"),
                unit="s",
            ),
            Panel(
                "Queue time",
                "Arrival to first scheduled step.",
                quantiles("kvledger_request_queue_time_seconds"),
                unit="s",
            ),
            Panel(
                "Worker step time",
                "Duration of one forward step, per worker.",
                quantiles("kvledger_worker_step_seconds", "worker", "{{worker}} "),
                unit="s",
                width=18,
            ),
            Panel(
                "Workers dropped by the step deadline",
                "Workers that left a plan unanswered past --worker-step-timeout (a hung step) "
                "and were dropped, their requests moved elsewhere. Should stay 0; if it moves "
                "on a healthy but slow worker, raise the timeout (docs/operations.md).",
                [(f"sum(kvledger_worker_step_timeouts_total{M})", "dropped")],
                kind="stat",
                width=6,
                red_at=1,
            ),
        ],
    ),
]
