"""Counters the service exports (names: docs/design.md, "Contracts"), and the live gauges.

Only what the ledger alone knows is counted here, and every counter is exported
(scheduler_svc/metrics.py's LedgerCollector reads the snapshot). Finished requests and prompt
and generation tokens are counted per request by the service (RequestMetrics), which knows
the model; a second count here would be one nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STALE_SOURCES = ("eviction", "worker_report", "worker_lost", "cache_reset")
RELEASE_REASONS = (
    "no_blocks",
    "token_budget",
    "max_num_seqs",
    "preempted_step",
    "finished",
    "aborted",
    "preempted",
    "error",
    "worker_lost",
    "grammar_pending",
)


def _zeros(keys: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(keys, 0)


def bump(counter: dict[str, int], key: str, amount: int = 1) -> None:
    counter[key] = counter.get(key, 0) + amount


@dataclass
class SchedulerStats:
    """Monotonic counters. Token counts are in tokens, everything else in events."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    stale_entries: dict[str, int] = field(default_factory=lambda: _zeros(STALE_SOURCES))
    entries_released: dict[str, int] = field(default_factory=lambda: _zeros(RELEASE_REASONS))
    orphans: int = 0  # tracker entries without a live request: a bug signal, should stay 0
    table_orphans: int = 0  # block tables without a running request: same
    evictions: int = 0  # cached blocks taken from the free queue for new content
    preemptions: int = 0
    grammar_deferrals: int = 0  # requests not run a step: their grammar was still compiling
    # Speculative decoding (vLLM's spec_decode_* counters): steps a request drafted in, tokens
    # drafted, drafts kept, and drafts kept by their position in the draft ("0" the first).
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Counters (copied) and live gauges at one moment: what the metrics exporter reads."""

    prefix_cache_queries: int
    prefix_cache_hits: int
    stale_entries: dict[str, int]
    entries_released: dict[str, int]
    orphans: int
    table_orphans: int
    evictions: int
    preemptions: int
    tracker_entries: int
    blocks_total: int
    blocks_in_use: int
    blocks_cached: int
    usage: float
    num_running: int
    num_waiting: int
    grammar_deferrals: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: dict[str, int] = field(default_factory=dict)
