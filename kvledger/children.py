"""What `kvledger serve` starts: its own flags, and each child's argv and environment.

serve takes every flag of every service (kvledger/flags.py) plus its own (`ServeSettings`), and
hands each child every flag that child takes, through the same derived flags: secrets in the
environment, the rest in argv. The only exceptions are named here, each with its reason, and
tests/test_flags.py holds every child's argv to them: the flags serve sets per process
(`SET_PER_PROCESS`), and those it leaves at the child's own default (`LEFT_AT_DEFAULT`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvledger.flag_values import flag_argv
from kvledger.flags import (
    DEFAULT_METRICS_PORT,
    FLAGS,
    FRONTEND,
    SCHEDULER,
    WORKER,
    add_flags,
    flags_for,
    to_env,
)
from kvledger.models import EMBEDDING_MODEL
from kvledger.options import Flag, config_flags, option

SERVE = "serve"
EMBEDDING_WORKER = "embedding worker"


@dataclass(frozen=True)
class ServeSettings:
    """Flags of `kvledger serve` itself (not a service's)."""

    num_workers: int = option(1, "workers started for --model")
    embedding_model: str = option(
        EMBEDDING_MODEL, "model of the embedding worker, or 'none' to start none"
    )


# serve computes these for each child instead of handing over its own value.
SET_PER_PROCESS: dict[str, frozenset[str]] = {
    # its metrics port is serve's --metrics-port (or the scheduler's default)
    SCHEDULER: frozenset({"--metrics-port"}),
    # the scheduler serve started; metrics at --metrics-port + 1 + i; ids and the model's
    # name numbered and filled in
    WORKER: frozenset({"--scheduler", "--metrics-port", "--worker-id", "--served-model-name"}),
    # the embedding worker also serves its own model
    EMBEDDING_WORKER: frozenset(
        {"--scheduler", "--metrics-port", "--worker-id", "--served-model-name", "--model"}
    ),
    # the scheduler serve started; /health waits for every model serve starts as well
    FRONTEND: frozenset({"--scheduler", "--require-model"}),
}
# serve leaves these at the child's default.
LEFT_AT_DEFAULT: dict[str, frozenset[str]] = {
    SCHEDULER: frozenset(),
    WORKER: frozenset(),
    # the generative model's sizing, kernel and tensor parallelism: the encoder has no KV
    # cache and stays single-rank
    EMBEDDING_WORKER: frozenset(
        {
            "--block-size",
            "--num-kv-blocks",
            "--kv-cache-memory-bytes",
            "--kv-cache-dtype",
            "--gpu-memory-utilization",
            "--max-model-len",
            "--attention-backend",
            "--tensor-parallel-size",
            # the generative model's tokenizer override, not the encoder's
            "--tokenizer",
        }
    ),
    # serve's --metrics-port is the scheduler's: the frontend keeps /metrics on its HTTP port
    FRONTEND: frozenset({"--metrics-port"}),
}
SERVE_ONLY_FLAGS = config_flags(ServeSettings, [SERVE])
# Flags no child takes from serve's command line, so serve does not offer them.
NOT_OFFERED = ("--scheduler",)


def serve_flags() -> list[Flag]:
    return [f for f in FLAGS if f.name not in NOT_OFFERED] + SERVE_ONLY_FLAGS


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvledger serve",
        description="Start the scheduler, worker(s) and the HTTP frontend as separate processes.",
    )
    add_flags(parser, serve_flags())
    return parser


@dataclass(frozen=True)
class ChildSpec:
    name: str
    module: str
    service: str
    role: str  # the service, or EMBEDDING_WORKER (keys of SET_PER_PROCESS, LEFT_AT_DEFAULT)
    argv: list[str]
    env: dict[str, str]  # secrets (added to serve's own environment)


def _spec(
    name: str, module: str, service: str, role: str, args: argparse.Namespace, **own: Any
) -> ChildSpec:
    """The child's argv: serve's value of each flag the child takes, except `LEFT_AT_DEFAULT`
    and the `SET_PER_PROCESS` values given here (keyed by dest)."""
    expected = {"--" + dest.replace("_", "-") for dest in own}
    if expected != SET_PER_PROCESS[role]:
        raise ValueError(f"{name}: per-process flags {sorted(expected)} != SET_PER_PROCESS")
    argv: list[str] = []
    for flag in flags_for(service):
        if flag.secret or flag.name in LEFT_AT_DEFAULT[role]:
            continue
        value = own[flag.dest] if flag.name in expected else getattr(args, flag.dest)
        argv += flag_argv(flag, value)
    return ChildSpec(name, module, service, role, argv, to_env(args, service))


def scheduler_address(args: argparse.Namespace) -> str:
    host = args.grpc_host
    if host in ("127.0.0.1", "0.0.0.0", "localhost"):
        host = "127.0.0.1"
    return f"{host}:{args.grpc_port}"


def served_model_name(args: argparse.Namespace) -> str:
    return args.served_model_name or args.model


def required_models(args: argparse.Namespace) -> list[str]:
    """The models serve starts, which the frontend's /health waits for."""
    models = [served_model_name(args)]
    if args.embedding_model != "none":
        models.append(args.embedding_model)
    return models


def expected_workers(args: argparse.Namespace) -> Counter[str]:
    """How many workers of each model serve starts (a tensor-parallel worker counts once)."""
    expected = Counter({served_model_name(args): args.num_workers})
    if args.embedding_model != "none":
        expected[args.embedding_model] += 1
    return expected


def metrics_port_count(args: argparse.Namespace) -> int:
    """How many metrics ports serve's children bind from --metrics-port on (`plan`)."""
    return 1 + args.num_workers + (args.embedding_model != "none")


def scheduler_metrics_url(args: argparse.Namespace) -> str:
    """Where serve reads the scheduler's metrics (any-address binds are read on loopback)."""
    host = args.metrics_host
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = args.metrics_port or DEFAULT_METRICS_PORT[SCHEDULER]
    return f"http://{host}:{port}/metrics"


def plan(args: argparse.Namespace) -> list[ChildSpec]:
    """Every child serve starts, in start order (scheduler, workers, embedding worker,
    frontend), from serve's parsed flags (its secrets already filled in)."""
    address = scheduler_address(args)
    metrics_base = args.metrics_port or DEFAULT_METRICS_PORT[SCHEDULER]
    children = [
        _spec("scheduler", "scheduler_svc", SCHEDULER, SCHEDULER, args, metrics_port=metrics_base)
    ]
    for i in range(args.num_workers):
        children.append(
            _spec(
                f"worker-{i}",
                "worker",
                WORKER,
                WORKER,
                args,
                scheduler=address,
                metrics_port=metrics_base + 1 + i,
                worker_id=f"{args.worker_id or 'worker'}-{i}",
                served_model_name=served_model_name(args),
            )
        )
    if args.embedding_model != "none":
        children.append(
            _spec(
                "embed-0",
                "worker",
                WORKER,
                EMBEDDING_WORKER,
                args,
                model=args.embedding_model,
                served_model_name=args.embedding_model,
                scheduler=address,
                metrics_port=metrics_base + 1 + args.num_workers,
                worker_id="embed-0",
            )
        )
    children.append(
        _spec(
            "frontend",
            "server",
            FRONTEND,
            FRONTEND,
            args,
            scheduler=address,
            require_model=list(args.require_model) + required_models(args),
        )
    )
    return children
