"""`kvledger serve`: scheduler, worker(s) and frontend as separate OS processes on one machine."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvledger.children import (
    SERVE_ONLY_FLAGS,
    ChildSpec,
    expected_workers,
    metrics_port_count,
    plan,
    required_models,
    scheduler_metrics_url,
    serve_parser,
)
from kvledger.flag_values import fill_list_defaults, warn_secrets_on_command_line
from kvledger.flags import DEFAULT_METRICS_PORT, FLAGS, SCHEDULER
from kvledger.groups import SCHEDULER_GRPC_PORT
from kvledger.log import setup_logging
from kvledger.ports import Defaults, PortTaken, claim_ports

log = logging.getLogger("kvledger.serve")

STARTUP_TIMEOUT_SECONDS = 600
PORT_DEFAULTS = Defaults(SCHEDULER_GRPC_PORT, DEFAULT_METRICS_PORT[SCHEDULER])
# Past that timeout serve keeps waiting while a worker's kernel build writes files this recently.
BUILD_GRACE_SECONDS = 120
# Beyond each child's own --shutdown-timeout, before serve kills it.
STOP_MARGIN_SECONDS = 3
MAX_RESTARTS_PER_MINUTE = 5
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    name: str
    module: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen
    restarts: list[float] = field(default_factory=list)

    def restart(self) -> bool:
        """Starts the service again; False when it keeps dying (more than MAX_RESTARTS a minute)."""
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 60] + [now]
        if len(self.restarts) > MAX_RESTARTS_PER_MINUTE:
            return False
        self.process = _popen(self.module, self.argv, self.env)
        return True


def _die_with_parent() -> None:
    """Children get SIGTERM if `kvledger serve` itself dies, so nothing is left running."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _popen(module: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", module, *argv]
    log.debug("starting %s", " ".join(cmd))
    return subprocess.Popen(cmd, env=os.environ | env, preexec_fn=_die_with_parent)


def _spawn(spec: ChildSpec) -> Child:
    return Child(
        spec.name, spec.module, spec.argv, spec.env, _popen(spec.module, spec.argv, spec.env)
    )


def _supervise(children: list[Child]) -> bool:
    """Restarts a service that died after startup; False when one keeps dying."""
    for child in children:
        code = child.process.poll()
        if code is None:
            continue
        log.warning("%s exited with code %s; restarting it", child.name, code)
        if not child.restart():
            log.error("%s keeps exiting; stopping everything", child.name)
            return False
    return True


def _wait_ready(
    url: str, metrics_url: str, expected: Counter[str], children: list[Child], stopping: dict
) -> bool:
    """Until the frontend's /health is 200 and every worker serve started has registered.
    /health needs one worker of each model (a probe's question: can it serve?); serve waits
    for all of them, so `--num-workers 2` means two serving workers when it says so. A worker
    that compiles its kernels first (their sources changed since `make install` built them)
    may need longer than the timeout on a slow machine: while that build keeps writing files,
    serve waits on (`_still_building`)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline or _still_building():
        if stopping["signal"] is not None:
            log.info("stopped during startup")
            return False
        for child in children:
            if child.process.poll() is not None:
                log.error(
                    "%s exited with code %s during startup", child.name, child.process.returncode
                )
                return False
        if _healthy(url) and not expected - _workers_connected(metrics_url):
            return True
        time.sleep(0.25)
    log.error("not ready after %d s (and no kernel build in progress)", STARTUP_TIMEOUT_SECONDS)
    return False


def _still_building() -> bool:
    """Whether a kernel build under the cache directory wrote a file in the last
    BUILD_GRACE_SECONDS (ninja writes each object file and its log as a step finishes)."""
    from kvledger.models import cache_dir

    root = cache_dir() / "torch_extensions"
    newest = 0.0
    with contextlib.suppress(OSError):
        for build in os.scandir(root):
            if build.is_dir():
                for entry in os.scandir(build.path):
                    newest = max(newest, entry.stat().st_mtime)
    return time.time() - newest < BUILD_GRACE_SECONDS


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _workers_connected(metrics_url: str) -> Counter[str]:
    """The scheduler's `kvledger_workers_connected`, per model (empty while it does not answer)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=2) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, OSError):
        return Counter()
    connected: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "kvledger_workers_connected":
            for sample in family.samples:
                connected[sample.labels["model"]] += int(sample.value)
    return connected


def _stop_all(children: list[Child], grace: float) -> None:
    """SIGTERM to every child (a child that already got the signal from its process group
    ignores the second one), then wait; what outlives the grace period is killed, and said.
    Returns only when no child is left."""
    for child in reversed(children):  # frontend first, scheduler last
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace + STOP_MARGIN_SECONDS
    for child in children:
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %g s; killing it", child.name, grace)
            child.process.kill()
            child.process.wait()


def serve(argv: Sequence[str]) -> int:
    warn_secrets_on_command_line(argv, FLAGS)
    args = serve_parser().parse_args(argv)
    fill_list_defaults(args, [*FLAGS, *SERVE_ONLY_FLAGS])
    setup_logging("serve", args.log_level, args.log_format)
    from kvledger.models import resolve_model  # torch-free, but only serve needs it

    try:
        resolve_model(args.model)  # generate tiny-llama once, before workers race for it
    except (OSError, ValueError) as err:
        # a missing path or package: one line, before any service starts
        print(f"kvledger serve: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        return 2
    try:
        moved = claim_ports(args, metrics_port_count(args), PORT_DEFAULTS)
    except PortTaken as err:
        print(f"kvledger serve: {err}", file=sys.stderr, flush=True)
        return 2
    for line in moved:
        log.warning("%s", line)
    args.worker_auth_token = args.worker_auth_token or secrets.token_hex(16)
    args.frontend_auth_token = args.frontend_auth_token or secrets.token_hex(16)

    stopping = {"signal": None}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    children: list[Child] = []
    try:
        for spec in plan(args):
            children.append(_spawn(spec))
        required = required_models(args)
        host = "localhost" if args.host in ("0.0.0.0", "127.0.0.1") else args.host
        url = f"http://{host}:{args.port}"
        local = f"http://127.0.0.1:{args.port}" if host == "localhost" else url
        if not _wait_ready(
            local, scheduler_metrics_url(args), expected_workers(args), children, stopping
        ):
            return 0 if stopping["signal"] is not None else 1
        ready = f"kvledger is serving {', '.join(required)} at {url}  (OpenAI API under {url}/v1)"
        if args.log_format == "json":
            log.info(ready)  # log pipelines read JSON lines only
        else:
            print(ready, flush=True)
        while stopping["signal"] is None:
            if not _supervise(children):
                return 1
            time.sleep(0.2)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopping: a second Ctrl-C changes nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_all(children, args.shutdown_timeout)
        log.info("stopped")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: kvledger serve [flags]   (kvledger serve --help for the flags)")
        print("       kvledger export-tokenizer GGUF DIR   (a GGUF file's tokenizer, for HF tools)")
        raise SystemExit(0 if argv else 2)
    if argv[0] == "export-tokenizer":
        from kvledger.export_tokenizer import main as export_tokenizer

        raise SystemExit(export_tokenizer(argv[1:]))
    if argv[0] != "serve":
        print(f"kvledger: unknown command {argv[0]!r}; try `kvledger serve`", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(serve(argv[1:]))


if __name__ == "__main__":
    main()
