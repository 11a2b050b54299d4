"""Histogram buckets, in seconds, for every service: one ladder, each histogram a stretch of it.

The ladder doubles from 5 ms to 163.84 s (with 1 and 2.5 ms below, for the fastest steps), so
one set of bounds serves a 2-core CPU (seconds per token) and an H100 (milliseconds). Every
histogram takes its bounds from here, so the services' quantiles fall on the same bounds and
a bound is changed in one place.
"""

from __future__ import annotations

SECONDS_LADDER = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
    163.84,
)


def seconds_buckets(low: float, high: float) -> tuple[float, ...]:
    """The ladder's bounds from `low` to `high`, both included (both must be on the ladder)."""
    assert low in SECONDS_LADDER and high in SECONDS_LADDER, (low, high)
    return tuple(bound for bound in SECONDS_LADDER if low <= bound <= high)


# Scheduler: time to first token, end to end, queue time.
LATENCY_BUCKETS = seconds_buckets(0.005, 163.84)
# Scheduler: time per output token after the first.
TOKEN_LATENCY_BUCKETS = seconds_buckets(0.001, 5.12)
# Worker: one forward step.
STEP_BUCKETS = seconds_buckets(0.001, 10.24)
