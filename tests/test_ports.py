"""`kvledger serve`'s port check (kvledger/ports.py) against sockets really bound: a taken
internal default moves to free ports and says so; a taken port the user chose stops serve in
one line naming the flag that moves it."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvledger.ports import Defaults, PortTaken, claim_ports, is_free
from tests.serving import free_port, free_port_run

HOST = "127.0.0.1"


@contextmanager
def held(port: int) -> Iterator[None]:
    with socket.socket() as s:
        s.bind((HOST, port))
        s.listen()
        yield


def _args(defaults: Defaults, **kw: object) -> argparse.Namespace:
    values = dict(
        host=HOST,
        port=free_port(),
        grpc_host=HOST,
        grpc_port=defaults.grpc_port,
        metrics_host=HOST,
        metrics_port=None,
    )
    return argparse.Namespace(**(values | kw))


def _defaults() -> Defaults:
    return Defaults(grpc_port=free_port(), metrics_port=free_port_run(3))


def test_free_defaults_stay_where_they_are() -> None:
    defaults = _defaults()
    args = _args(defaults)
    assert claim_ports(args, 3, defaults) == []
    assert args.grpc_port == defaults.grpc_port and args.metrics_port is None


def test_taken_internal_defaults_move_to_free_ports_and_say_where() -> None:
    defaults = _defaults()
    args = _args(defaults)
    with held(defaults.grpc_port), held(defaults.metrics_port + 2):
        moved = claim_ports(args, 3, defaults)
        assert args.grpc_port != defaults.grpc_port and is_free(HOST, args.grpc_port)
        base = args.metrics_port
        assert base is not None and all(is_free(HOST, p) for p in range(base, base + 3))
    assert len(moved) == 2
    assert f"gRPC is on {args.grpc_port}" in moved[0] and "--grpc-port" in moved[0]
    assert f"metrics are on {base}-{base + 2}" in moved[1] and "--metrics-port" in moved[1]


def test_a_taken_port_the_user_chose_stops_serve_naming_its_flag() -> None:
    defaults = _defaults()
    chosen = free_port()
    with held(chosen):
        with pytest.raises(PortTaken, match=f"port {chosen} \\(the HTTP API\\).*--port moves it"):
            claim_ports(_args(defaults, port=chosen), 3, defaults)
        with pytest.raises(PortTaken, match=f"port {chosen} .*gRPC.*--grpc-port moves it"):
            claim_ports(_args(defaults, grpc_port=chosen), 3, defaults)
        with pytest.raises(PortTaken, match="metrics.*--metrics-port moves them"):
            claim_ports(_args(defaults, metrics_port=chosen - 1), 3, defaults)
