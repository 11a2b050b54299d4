"""Command-line flags shared by every service and by `kvledger serve`.

Each flag is declared once with the services that take it. Every flag also reads its default
from the environment as ``KVLEDGER_<FLAG_IN_CAPS>``: ``--max-num-seqs`` reads
``KVLEDGER_MAX_NUM_SEQS``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

FRONTEND = "frontend"
SCHEDULER = "scheduler"
WORKER = "worker"


@dataclass(frozen=True)
class Flag:
    name: str  # "--max-num-seqs"
    services: frozenset[str]
    help: str
    type: Any = str
    default: Any = None
    kind: str = "value"  # "value" | "bool" (--x/--no-x) | "switch" (--x) | "list" (repeatable)
    choices: Sequence[str] | None = None
    secret: bool = False  # handed to child processes in the environment, never in argv

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def env_var(self) -> str:
        return "KVLEDGER_" + self.dest.upper()


def _f(name: str, services: Iterable[str], help: str, **kw: Any) -> Flag:
    return Flag(name, frozenset(services), help, **kw)


FLAGS: tuple[Flag, ...] = (
    # frontend
    _f("--host", [FRONTEND], "address the HTTP frontend binds", default="127.0.0.1"),
    _f("--port", [FRONTEND], "HTTP port of the frontend", type=int, default=8000),
    _f(
        "--api-key",
        [FRONTEND],
        "accepted API key (repeatable); none = open",
        kind="list",
        secret=True,
    ),
    _f(
        "--require-model",
        [FRONTEND],
        "model that must have a live worker for /health to be 200 (repeatable)",
        kind="list",
    ),
    _f("--api-keys-file", [FRONTEND], "file with one accepted API key per line"),
    _f(
        "--metrics-public",
        [FRONTEND],
        "serve /metrics without an API key",
        kind="switch",
        default=False,
    ),
    _f(
        "--max-request-body-bytes",
        [FRONTEND],
        "largest accepted request body",
        type=int,
        default=4 * 1024 * 1024,
    ),
    _f(
        "--max-prompts-per-request",
        [FRONTEND],
        "most prompts (times n) in one completion",
        type=int,
        default=64,
    ),
    _f("--max-n", [FRONTEND], "largest n of one completion", type=int, default=16),
    _f("--max-stop-strings", [FRONTEND], "most stop strings per request", type=int, default=16),
    _f("--max-stop-string-length", [FRONTEND], "longest stop string", type=int, default=256),
    _f(
        "--limit-concurrency",
        [FRONTEND],
        "most connections and requests the frontend holds at once; past it, new ones get 503 "
        "(slow or idle clients cannot exhaust its file descriptors; uvicorn's name)",
        type=int,
        default=1000,
    ),
    _f(
        "--timeout-keep-alive",
        [FRONTEND],
        "seconds an idle kept-alive connection stays open (uvicorn's name)",
        type=int,
        default=5,
    ),
    _f(
        "--timeout-request-header",
        [FRONTEND],
        "seconds a client has to send a request line and headers, from the connection's "
        "start or the first byte of a kept-alive connection's next request; past it the "
        "connection is closed (with a 408 if part of a request came); 0 = no limit",
        type=float,
        default=10.0,
    ),
    _f(
        "--timeout-request-body",
        [FRONTEND],
        "seconds a client has to send a request body after its headers; past it a 408 and "
        "the connection is closed; 0 = no limit",
        type=float,
        default=60.0,
    ),
    _f(
        "--max-embedding-inputs",
        [FRONTEND],
        "most inputs of one embeddings request",
        type=int,
        default=256,
    ),
    _f(
        "--chat-template",
        [FRONTEND],
        "chat template for /v1/chat/completions (a file path or the template text), used "
        "instead of each model's own",
    ),
    _f(
        "--scheduler-reconnect-timeout",
        [FRONTEND],
        "seconds a live request waits for a lost scheduler (restarted, or unreachable) before "
        "it fails; once the scheduler answers again, the request goes on where its stream "
        "was, as a continuation; 0 = fail at once",
        type=float,
        default=30.0,
    ),
    # scheduler
    _f(
        "--grpc-host", [SCHEDULER], "address the scheduler's gRPC server binds", default="127.0.0.1"
    ),
    _f("--grpc-port", [SCHEDULER], "gRPC port of the scheduler", type=int, default=50051),
    _f("--max-num-seqs", [SCHEDULER], "most sequences in one step", type=int, default=64),
    _f("--max-num-batched-tokens", [SCHEDULER], "token budget of one step", type=int, default=2048),
    _f(
        "--enable-prefix-caching",
        [SCHEDULER],
        "reuse KV blocks of shared prefixes",
        kind="bool",
        default=True,
    ),
    _f(
        "--enable-chunked-prefill",
        [SCHEDULER],
        "split long prompts across steps",
        kind="bool",
        default=True,
    ),
    _f(
        "--scheduling-policy",
        [SCHEDULER],
        "who is served first: fcfs (first come, first served), priority (the request's "
        "priority, lower first, as in vLLM), fair (tenants, one per API key, take turns; "
        "a tenant's own requests in arrival order; a burst may lose seats to another tenant)",
        default="fcfs",
        choices=("fcfs", "priority", "fair"),
    ),
    _f(
        "--max-waiting-requests",
        [SCHEDULER],
        "queue length per model past which requests get 429",
        type=int,
        default=4096,
    ),
    _f(
        "--worker-step-timeout",
        [SCHEDULER],
        "seconds a worker may take to answer one plan before it counts as lost "
        "(its requests move to another worker); 0 = wait forever",
        type=float,
        default=300.0,
    ),
    _f(
        "--async-scheduling",
        [SCHEDULER],
        "plan each worker's next step while it computes the current one (two plans in "
        "flight), so it never waits for the scheduler between steps",
        kind="bool",
        default=True,
    ),
    _f(
        "--frontend-auth-token",
        [FRONTEND, SCHEDULER],
        "shared secret frontends send with every call to the scheduler; the scheduler refuses "
        "to start without one unless --allow-unauthenticated-frontends",
        default="",
        secret=True,
    ),
    _f(
        "--allow-unauthenticated-frontends",
        [SCHEDULER],
        "serve the frontend API (Generate, ListModels, ResetPrefixCache...) to any caller "
        "without --frontend-auth-token (loopback tests only)",
        kind="switch",
        default=False,
    ),
    _f(
        "--allow-unauthenticated-workers",
        [SCHEDULER],
        "accept workers without --worker-auth-token: any process that reaches the gRPC port "
        "can then register, read users' prompts and choose their tokens (loopback tests only)",
        kind="switch",
        default=False,
    ),
    _f(
        "--debug-invariants",
        [SCHEDULER],
        "check every ledger invariant after every step",
        kind="switch",
        default=False,
    ),
    # worker
    _f(
        "--model",
        [WORKER],
        "HF model directory, or tiny-llama (generated random weights)",
        default="tiny-llama",
    ),
    _f("--served-model-name", [WORKER], "name clients use for the model (default: derived)"),
    _f("--block-size", [WORKER], "tokens per KV block", type=int, default=16),
    _f(
        "--num-kv-blocks",
        [WORKER],
        "fixed number of KV blocks (overrides the memory budget)",
        type=int,
    ),
    _f(
        "--kv-cache-memory-bytes",
        [WORKER],
        "KV cache budget in bytes (default: 512 MiB on "
        "CPU; on CUDA, --gpu-memory-utilization decides)",
        type=int,
    ),
    _f(
        "--gpu-memory-utilization",
        [WORKER],
        "fraction of GPU memory for weights and KV",
        type=float,
        default=0.9,
    ),
    _f("--max-model-len", [WORKER], "context length (default: the model's)", type=int),
    _f(
        "--dtype",
        [WORKER],
        "weight and activation dtype",
        default="float32",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    _f("--device", [WORKER], "torch device", default="cpu"),
    _f(
        "--attention-backend",
        [WORKER],
        "paged attention kernel (auto: flash_attn on CUDA when importable; on CPU the "
        "compiled paged kernel, cpu, when it builds; else torch, the reference)",
        default="auto",
        choices=("auto", "torch", "cpu", "flash_attn"),
    ),
    _f("--seed", [WORKER], "base random seed", type=int, default=0),
    _f("--worker-id", [WORKER], "name of this worker (default: host-pid)"),
    # more than one service
    _f(
        "--scheduler",
        [FRONTEND, WORKER],
        "scheduler gRPC address HOST:PORT",
        default="127.0.0.1:50051",
    ),
    _f(
        "--metrics-port",
        [FRONTEND, SCHEDULER, WORKER],
        "Prometheus port (serve: scheduler here, worker i at +1+i); the frontend serves "
        "/metrics on its HTTP port (behind --api-key) and, with this set, also here without "
        "a key, for a Prometheus on an internal network",
        type=int,
    ),
    _f(
        "--metrics-host",
        [FRONTEND, SCHEDULER, WORKER],
        "address the Prometheus endpoint binds (loopback, like every other port by default; "
        "0.0.0.0 where a Prometheus on another host scrapes it)",
        default="127.0.0.1",
    ),
    _f(
        "--worker-auth-token",
        [SCHEDULER, WORKER],
        "shared secret a worker presents when it registers; the scheduler refuses to start "
        "without one unless --allow-unauthenticated-workers",
        default="",
        secret=True,
    ),
    _f(
        "--shutdown-timeout",
        [FRONTEND, SCHEDULER, WORKER],
        "seconds a stopping service gives in-flight work before it exits anyway "
        "(serve: each child, then it kills what is left)",
        type=float,
        default=10.0,
    ),
    _f(
        "--log-format",
        [FRONTEND, SCHEDULER, WORKER],
        "text, or json: one JSON object per line, with the request id on lines about a request",
        default="text",
        choices=("text", "json"),
    ),
    _f(
        "--log-level",
        [FRONTEND, SCHEDULER, WORKER],
        "logging level",
        default="info",
        choices=("debug", "info", "warning", "error"),
    ),
)

DEFAULT_METRICS_PORT = {SCHEDULER: 9400, WORKER: 9401}


def flags_for(service: str) -> list[Flag]:
    return [f for f in FLAGS if service in f.services]


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


class EnvValueError(ValueError):
    """An environment variable holds a value its flag would refuse on the command line."""


def _env_default(flag: Flag) -> Any:
    """The flag's default, or its environment variable parsed exactly as the flag would be.

    A value the flag would refuse stops startup: compose and Kubernetes configure every service
    through the environment, where a typo (`flase`, `lifo`) must not quietly mean something else.
    """
    raw = os.environ.get(flag.env_var)
    if raw is None:
        return flag.default
    if flag.kind in ("bool", "switch"):
        word = raw.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise EnvValueError(
            f"{flag.env_var}={raw!r}: expected a boolean "
            f"({', '.join(TRUE_WORDS)} or {', '.join(w for w in FALSE_WORDS if w)})"
        )
    if flag.kind == "list":
        return [item for item in raw.replace(",", " ").split() if item]
    try:
        value = flag.type(raw.strip())
    except ValueError:
        kind = getattr(flag.type, "__name__", "value")
        raise EnvValueError(f"{flag.env_var}={raw!r}: expected {_a(kind)}") from None
    if flag.choices is not None and value not in flag.choices:
        raise EnvValueError(f"{flag.env_var}={raw!r}: expected one of {', '.join(flag.choices)}")
    return value


def _a(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string"}.get(kind, kind)


def env_errors(flags: Iterable[Flag]) -> list[str]:
    """Every environment variable of these flags whose value the flag would refuse."""
    problems = []
    for flag in flags:
        try:
            _env_default(flag)
        except EnvValueError as err:
            problems.append(str(err))
    return problems


def check_env(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Stops startup with one line naming each bad variable and what it accepts (exit 2, as
    argparse does for a bad flag) when an environment variable holds a value its flag would
    refuse."""
    problems = env_errors(flags)
    if problems:
        parser.exit(2, f"{parser.prog}: error: {'; '.join(problems)}\n")


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    flags = list(flags)
    check_env(parser, flags)
    for flag in flags:
        default = _env_default(flag)
        help_text = f"{flag.help} [env {flag.env_var}]"
        if flag.kind == "bool":
            parser.add_argument(
                flag.name,
                dest=flag.dest,
                default=default,
                help=help_text,
                action=argparse.BooleanOptionalAction,
            )
        elif flag.kind == "switch":
            parser.add_argument(
                flag.name, dest=flag.dest, default=default, help=help_text, action="store_true"
            )
        elif flag.kind == "list":
            parser.add_argument(
                flag.name, dest=flag.dest, default=None, help=help_text, action="append"
            )
        else:
            parser.add_argument(
                flag.name,
                dest=flag.dest,
                default=default,
                help=help_text,
                type=flag.type,
                choices=flag.choices,
            )


def warn_secrets_on_command_line(argv: Sequence[str], flags: Iterable[Flag]) -> list[str]:
    """Secret flags given as arguments (`ps` shows every process's argv to every user): each
    is named on stderr with the variable to use instead. Returns the names."""
    found = []
    for flag in flags:
        if flag.secret and any(a == flag.name or a.startswith(flag.name + "=") for a in argv):
            found.append(flag.name)
            print(
                f"warning: {flag.name} on the command line is visible to every user in `ps`; "
                f"prefer {flag.env_var}" + (" or --api-keys-file" if flag.kind == "list" else ""),
                file=sys.stderr,
            )
    return found


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


def fill_list_defaults(args: argparse.Namespace, flags: Iterable[Flag]) -> None:
    """Repeatable flags take the environment only when none is given on the command line."""
    for flag in flags:
        if flag.kind == "list" and getattr(args, flag.dest, None) is None:
            setattr(args, flag.dest, _env_default(flag) or [])


def to_argv(args: argparse.Namespace, service: str, skip: Iterable[str] = ()) -> list[str]:
    """Turn parsed values back into a command line for one service (used by `kvledger serve`),
    without the flags named in `skip` (serve sets those per process)."""
    argv: list[str] = []
    skipped = set(skip)
    for flag in flags_for(service):
        value = getattr(args, flag.dest, None)
        if value is None or flag.secret or flag.name in skipped:
            continue
        if flag.kind == "bool":
            argv.append(flag.name if value else "--no-" + flag.name[2:])
        elif flag.kind == "switch":
            if value:
                argv.append(flag.name)
        elif flag.kind == "list":
            for item in value:
                argv += [flag.name, str(item)]
        else:
            argv += [flag.name, str(value)]
    return argv


def to_env(args: argparse.Namespace, service: str) -> dict[str, str]:
    """The secret flags of one service as environment variables (`ps` shows argv to all)."""
    env: dict[str, str] = {}
    for flag in flags_for(service):
        value = getattr(args, flag.dest, None)
        if flag.secret and value:
            env[flag.env_var] = ",".join(value) if flag.kind == "list" else str(value)
    return env
