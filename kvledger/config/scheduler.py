"""The scheduler service's configuration: every flag of `python -m scheduler_svc` is a field here
(kvledger/options.py derives the flags, their environment variables and help from it).

The ledger's knobs (`EngineConfig`) carry the same defaults and policy names as the core's
`SchedulerConfig` (scheduler_svc/core/config.py); the engine hands them to every ledger it builds
under the same names. They are written in both places because the shared package imports no
service and the core imports nothing outside itself; tests/test_flags.py keeps them equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvledger.config.speculative import parse_speculative_config
from kvledger.groups import (
    LOOPBACK,
    SCHEDULER_GRPC_PORT,
    FrontendToken,
    GrpcTlsOptions,
    LogOptions,
    MetricsOptions,
    ShutdownOptions,
    WorkerToken,
)
from kvledger.options import check_bounds, group, option

# The core's scheduling policies (scheduler_svc/core/config.py: POLICIES).
POLICIES = ("fcfs", "priority", "fair")


@dataclass(frozen=True)
class EngineConfig:
    """What the engine needs: the ledgers' knobs, queue bounds, the step deadline."""

    max_num_seqs: int = option(64, "most sequences in one step")
    max_num_batched_tokens: int = option(2048, "token budget of one step")
    enable_prefix_caching: bool = option(True, "reuse KV blocks of shared prefixes")
    enable_chunked_prefill: bool = option(True, "split long prompts across steps")
    scheduling_policy: str = option(
        "fcfs",
        "who is served first: fcfs (first come, first served), priority (the request's "
        "priority, lower first, as in vLLM), fair (tenants, one per API key, take turns; "
        "a tenant's own requests in arrival order; a burst may lose seats to another tenant)",
        choices=POLICIES,
    )
    max_waiting_requests: int = option(
        4096,
        "queue length per model past which requests get 429; under fair, a full queue still "
        "admits a tenant holding less than its share (this cap over the tenants waiting), up "
        "to twice the cap",
    )
    # seconds a plan may stay unanswered; 0 = no limit
    worker_step_timeout: float = option(
        300.0,
        "seconds a worker may take to answer one plan before it counts as lost "
        "(its requests move to another worker); 0 = wait forever",
    )
    # plan step N+1 while the worker computes step N
    async_scheduling: bool = option(
        True,
        "plan each worker's next step while it computes the current one (two plans in "
        "flight), so it never waits for the scheduler between steps",
    )
    # decode steps sent to a worker in one message (bundles: scheduler_svc/worker_link.py)
    num_scheduler_steps: int = option(
        8,
        "decode steps planned at once and sent to a worker in one message, while every "
        "running request decodes and none waits: fewer messages per token, tokens streamed "
        "in groups of up to this many; 1 = a message per step",
        ge=1,
    )
    speculative_config: str = option(
        "",
        "speculative decoding, as vLLM's JSON: "
        '\'{"method": "ngram", "num_speculative_tokens": 4}\' drafts from the request\'s own '
        "text (prompt_lookup_min/max: n-gram lengths matched, default 3/5); method suffix drafts "
        "as long as the match (suffix_decoding_max_spec_factor); no drafts while more than "
        "disable_by_batch_size (default 4) requests run; '' = off",
    )
    debug_invariants: bool = option(False, "check every ledger invariant after every step")

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_speculative_config(self.speculative_config)


@dataclass(frozen=True)
class SchedulerSettings(
    FrontendToken, GrpcTlsOptions, MetricsOptions, WorkerToken, ShutdownOptions, LogOptions
):
    """`python -m scheduler_svc`'s flags."""

    DEFAULT_METRICS_PORT = 9400

    grpc_host: str = option(LOOPBACK, "address the scheduler's gRPC server binds")
    grpc_port: int = option(SCHEDULER_GRPC_PORT, "gRPC port of the scheduler")
    engine: EngineConfig = group(EngineConfig)
    allow_unauthenticated_frontends: bool = option(
        False,
        "serve the frontend API (Generate, ListModels, ResetPrefixCache...) to any caller "
        "without --frontend-auth-token (loopback tests only)",
    )
    allow_unauthenticated_workers: bool = option(
        False,
        "accept workers without --worker-auth-token: any process that reaches the gRPC port "
        "can then register, read users' prompts and choose their tokens (loopback tests only)",
    )
