"""Every service's flags, derived from its config dataclass (kvledger/options.py).

`CONFIGS` names each service's config; a flag belongs to every service whose config has its
field, so a flag several services take (kvledger/groups.py) is declared once. Every flag also
reads its default from the environment as ``KVLEDGER_<FLAG_IN_CAPS>``: ``--max-num-seqs`` reads
``KVLEDGER_MAX_NUM_SEQS``, validated exactly like the flag.

kvledger imports no wing, except here: the configs are leaf modules of the wings (no torch,
no gRPC, no web framework), so that `kvledger serve` knows every child's flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from kvledger.config.frontend import Settings
from kvledger.config.scheduler import SchedulerSettings
from kvledger.config.worker import WorkerSettings
from kvledger.flag_values import (
    FALSE_WORDS,
    TRUE_WORDS,
    EnvValueError,
    add_flags,
    check_env,
    env_errors,
    fill_list_defaults,
    flag_argv,
    flag_env,
    warn_secrets_on_command_line,
)
from kvledger.options import Flag, config_flags, from_namespace

__all__ = [
    "CONFIGS",
    "DEFAULT_METRICS_PORT",
    "FALSE_WORDS",
    "FLAGS",
    "FRONTEND",
    "SCHEDULER",
    "TRUE_WORDS",
    "WORKER",
    "EnvValueError",
    "Flag",
    "add_flags",
    "check_env",
    "config_for",
    "env_errors",
    "fill_list_defaults",
    "flags_for",
    "parse",
    "to_argv",
    "to_env",
    "warn_secrets_on_command_line",
]

FRONTEND = "frontend"
SCHEDULER = "scheduler"
WORKER = "worker"

CONFIGS: dict[str, type] = {
    FRONTEND: Settings,
    SCHEDULER: SchedulerSettings,
    WORKER: WorkerSettings,
}

# The Prometheus port of a service started without --metrics-port (the frontend: none).
DEFAULT_METRICS_PORT = {
    service: cls.DEFAULT_METRICS_PORT
    for service, cls in CONFIGS.items()
    if cls.DEFAULT_METRICS_PORT is not None
}


def _derive() -> tuple[dict[str, list[Flag]], tuple[Flag, ...]]:
    per_service = {service: config_flags(cls) for service, cls in CONFIGS.items()}
    takers: dict[str, set[str]] = {}
    declared: dict[str, str] = {}
    for service, flags in per_service.items():
        for flag in flags:
            if declared.setdefault(flag.name, flag.owner) != flag.owner:
                raise TypeError(
                    f"{flag.name} is declared twice ({declared[flag.name]}, {flag.owner}): "
                    "a setting several services take belongs in kvledger/groups.py"
                )
            takers.setdefault(flag.name, set()).add(service)

    def with_services(flag: Flag) -> Flag:
        return Flag(**{**vars(flag), "services": frozenset(takers[flag.name])})

    per_service = {s: [with_services(f) for f in flags] for s, flags in per_service.items()}
    # serve's order: each service's own flags, by service; then the shared ones
    order = list(CONFIGS)
    first: dict[str, tuple[int, int, int]] = {}
    for service, flags in per_service.items():
        for position, flag in enumerate(flags):
            key = (len(flag.services) > 1, order.index(service), position)
            first.setdefault(flag.name, key)
    everything = {f.name: f for flags in per_service.values() for f in flags}
    return per_service, tuple(sorted(everything.values(), key=lambda f: first[f.name]))


_PER_SERVICE, FLAGS = _derive()


def flags_for(service: str) -> list[Flag]:
    return list(_PER_SERVICE[service])


def config_for(service: str, args: argparse.Namespace) -> Any:
    """The service's config dataclass, built from its parsed flags."""
    return from_namespace(CONFIGS[service], args)


def parse(service: str, argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {service}", description=description)
    flags = flags_for(service)
    add_flags(parser, flags)
    argv = list(sys.argv[1:] if argv is None else argv)
    warn_secrets_on_command_line(argv, flags)
    args = parser.parse_args(argv)
    fill_list_defaults(args, flags)
    if service in DEFAULT_METRICS_PORT and args.metrics_port is None:
        args.metrics_port = DEFAULT_METRICS_PORT[service]
    return args


def to_argv(args: argparse.Namespace, service: str, skip: Iterable[str] = ()) -> list[str]:
    """Turn parsed values back into a command line for one service (used by `kvledger serve`),
    without secrets (see `to_env`) and without the flags named in `skip` (serve sets those
    per process)."""
    skipped = set(skip)
    return [
        arg
        for flag in flags_for(service)
        if not flag.secret and flag.name not in skipped
        for arg in flag_argv(flag, getattr(args, flag.dest, None))
    ]


def to_env(args: argparse.Namespace, service: str) -> dict[str, str]:
    """The secret flags of one service as environment variables (`ps` shows argv to all)."""
    env: dict[str, str] = {}
    for flag in flags_for(service):
        if flag.secret:
            env |= flag_env(flag, getattr(args, flag.dest, None))
    return env
