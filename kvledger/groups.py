"""Settings several services take, each declared once (kvledger/options.py).

A service config inherits the groups it takes; a flag shared by services is one field here, and
which services take it follows from which service configs inherit its group
(kvledger/flags.py). Each group is a dataclass of `option`s only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvledger.log import FORMATS, LEVELS
from kvledger.options import option

LOOPBACK = "127.0.0.1"  # every port binds loopback unless told otherwise
SCHEDULER_GRPC_PORT = 50051


@dataclass(frozen=True)
class SchedulerAddress:
    """Services that call the scheduler (frontend, worker)."""

    scheduler: str = option(f"{LOOPBACK}:{SCHEDULER_GRPC_PORT}", "scheduler gRPC address HOST:PORT")


@dataclass(frozen=True)
class FrontendToken:
    """The frontend sends it, the scheduler checks it."""

    frontend_auth_token: str = option(
        "",
        "shared secret frontends send with every call to the scheduler; the scheduler refuses "
        "to start without one unless --allow-unauthenticated-frontends",
        secret=True,
    )


@dataclass(frozen=True)
class WorkerToken:
    """A worker presents it, the scheduler checks it."""

    worker_auth_token: str = option(
        "",
        "shared secret a worker presents when it registers; the scheduler refuses to start "
        "without one unless --allow-unauthenticated-workers",
        secret=True,
    )


@dataclass(frozen=True)
class MetricsOptions:
    """The Prometheus endpoint. A service config's DEFAULT_METRICS_PORT (a class attribute,
    not a flag) is its port when --metrics-port is not given; None: no separate endpoint."""

    DEFAULT_METRICS_PORT = None

    metrics_port: int | None = option(
        None,
        "Prometheus port (serve: scheduler here, worker i at +1+i); the frontend serves "
        "/metrics on its HTTP port (behind --api-key) and, with this set, also here without "
        "a key, for a Prometheus on an internal network",
    )
    metrics_host: str = option(
        LOOPBACK,
        "address the Prometheus endpoint binds (loopback, like every other port by default; "
        "0.0.0.0 where a Prometheus on another host scrapes it)",
    )


@dataclass(frozen=True)
class ShutdownOptions:
    shutdown_timeout: float = option(
        10.0,
        "seconds a stopping service gives in-flight work before it exits anyway "
        "(serve: each child, then it kills what is left)",
    )


@dataclass(frozen=True)
class LogOptions:
    log_format: str = option(
        "text",
        "text, or json: one JSON object per line, with the request id on lines about a request",
        choices=FORMATS,
    )
    log_level: str = option("info", "logging level", choices=LEVELS)


@dataclass(frozen=True)
class GrpcTlsOptions:
    """TLS on the gRPC links between hosts (kvledger/tls.py): the scheduler serves with a
    certificate, frontends and workers trust a CA; a CA on the scheduler makes it mutual."""

    grpc_tls_cert: str | None = option(
        None,
        "PEM certificate (chain) for the gRPC links: the scheduler serves TLS with it; a "
        "frontend or worker presents it to a scheduler that requires client certificates",
    )
    grpc_tls_key: str | None = option(None, "PEM private key of --grpc-tls-cert")
    grpc_tls_ca: str | None = option(
        None,
        "PEM CA certificate(s): a frontend or worker trusts only scheduler certificates it "
        "signed (and uses TLS); on the scheduler, every caller must present a certificate it "
        "signed (mutual TLS). No TLS flag: plaintext (loopback only, or a private network)",
    )


@dataclass(frozen=True)
class GrammarLimits:
    """What a structured-output constraint may cost the grammar engine (llguidance), for the
    frontend, which compiles each one to check it, and the worker, which compiles it again
    and computes its masks (docs/structured-outputs.md, "Bounds"). The engine's own limits
    bound each step's work; the depth is checked before any of it runs (its native compiler
    recurses on it)."""

    max_structured_depth: int = option(
        64,
        "deepest a structured-output constraint may go, counted through its references: "
        "objects and arrays on any path of a JSON schema, each $ref followed (a cycle counts "
        "its members once), or rules on any path of a grammar; deeper is a 400",
        ge=1,
        le=1024,
    )
    grammar_max_size: int = option(
        200_000,
        "most symbols in a compiled grammar's productions (the engine's max_grammar_size)",
        ge=1,
    )
    grammar_initial_lexer_fuel: int = option(
        1_000_000,
        "lexer work allowed to build a grammar's regular expressions (the engine's "
        "initial_lexer_fuel; about 50,000 a millisecond)",
        ge=1,
    )
    grammar_step_lexer_fuel: int = option(
        200_000,
        "lexer work allowed for one token mask (the engine's step_lexer_fuel; about 14,000 a "
        "millisecond): past it the request fails, never the step",
        ge=1,
    )
    grammar_step_max_items: int = option(
        50_000,
        "parser items allowed for one token mask (the engine's step_max_items; about 20,000 "
        "a millisecond)",
        ge=1,
    )
    grammar_max_lexer_states: int = option(
        100_000,
        "most lexer states one grammar may build (the engine's max_lexer_states; 1-2 KB each)",
        ge=1,
    )
