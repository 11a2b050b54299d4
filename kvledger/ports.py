"""The ports `kvledger serve` binds, checked before any service starts.

Two kinds: the frontend's HTTP port (`--port`), which users and their clients name, and the
internal ones (the scheduler's gRPC port, and the metrics ports of the scheduler, each worker
and the embedding worker: `--metrics-port` + 0, 1, ...). A second `kvledger serve` on one
machine would find the first one's internal ports taken. The rule:

- an internal port left at its default and taken is moved to a free one, and serve says where
  in one line (a Prometheus scraping the defaults then needs the new ports: the line names them);
- a port the user chose (a value other than the default, or `--port` whatever its value) is
  never moved: when it is taken serve stops before starting anything, naming the port, what it
  is for and the flag that moves it.
"""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

# how far from a taken default serve looks for free ports
SEARCH = 200


class PortTaken(Exception):
    """A port the user chose is bound by another process."""


@dataclass(frozen=True)
class Defaults:
    grpc_port: int
    metrics_port: int


def is_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now (as the service will, with SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _run_free(host: str, base: int, length: int) -> bool:
    return all(is_free(host, p) for p in range(base, base + length))


def claim_ports(args: argparse.Namespace, count: int, defaults: Defaults) -> list[str]:
    """Checks every port serve's children will bind (`count` metrics ports from the base);
    moves taken defaults (setting `args`), returns a line per move; PortTaken for a taken port
    the user chose."""
    if not is_free(args.host, args.port):
        raise PortTaken(f"port {args.port} (the HTTP API) is taken; --port moves it")
    moved = []
    grpc_default = args.grpc_port == defaults.grpc_port
    if not is_free(args.grpc_host, args.grpc_port):
        if not grpc_default:
            raise PortTaken(
                f"port {args.grpc_port} (the scheduler's gRPC) is taken; --grpc-port moves it"
            )
        args.grpc_port = _first_free(args.grpc_host, args.grpc_port, 1, "--grpc-port")
        moved.append(
            f"port {defaults.grpc_port} is taken: the scheduler's gRPC is on {args.grpc_port} "
            "(--grpc-port sets it)"
        )
    base = args.metrics_port or defaults.metrics_port
    if not _run_free(args.metrics_host, base, count):
        if args.metrics_port is not None:
            last = base + count - 1
            raise PortTaken(
                f"a port of {base}-{last} (the metrics) is taken; --metrics-port moves them"
            )
        args.metrics_port = _first_free(args.metrics_host, base, count, "--metrics-port")
        moved.append(
            f"port {base} or the {count - 1} after it are taken: metrics are on "
            f"{args.metrics_port}-{args.metrics_port + count - 1} (--metrics-port sets them)"
        )
    return moved


def _first_free(host: str, start: int, length: int, flag: str) -> int:
    """The first run of `length` free ports above `start`, searched in steps of `length`."""
    for base in range(start + length, start + length * SEARCH, length):
        if base + length <= 65536 and _run_free(host, base, length):
            return base
    raise PortTaken(f"no free port near {start}; {flag} sets one")
