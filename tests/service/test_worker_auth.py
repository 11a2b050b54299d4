"""Workers always authenticate: a worker reads users' prompts and chooses their tokens, so a
process that merely reaches the scheduler's gRPC port must not become one."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

from kvledger.flags import SCHEDULER, parse
from protos import worker_pb2
from scheduler_svc.__main__ import check_worker_auth
from tests.deploy.compose import compose_argv, compose_env
from tests.deploy.tools import REPO, run
from tests.service.helpers import PositionRunner, registration, running_scheduler, wait_for
from tests.serving import free_port
from worker.executor import Executor
from worker.link.client import WorkerLinkClient
from worker.metrics import WorkerMetrics


def _registration(worker_id: str, token: str) -> worker_pb2.Registration:
    return registration(worker_id=worker_id, num_blocks=16, max_model_len=64, auth_token=token)


def _connect(target: str, worker_id: str, token: str) -> BaseException | None:
    """Runs a worker link until it is refused (returns the SystemExit) or registers (None)."""
    client = WorkerLinkClient(
        target,
        _registration(worker_id, token),
        Executor(PositionRunner()),
        WorkerMetrics("m", worker_id),
    )
    try:
        client.run_forever()
    except SystemExit as refused:
        return refused
    return None


def _refused(registry) -> float:  # noqa: ANN001
    value = registry.get_sample_value(
        "kvledger_worker_registrations_refused_total", {"reason": "unauthenticated"}
    )
    return value or 0.0


def test_a_worker_with_a_wrong_or_no_token_is_refused_logged_and_counted(caplog):
    with running_scheduler("--worker-auth-token", "s3cret") as sched:
        registry = sched.engine.registry
        assert _refused(registry) == 0
        with caplog.at_level(logging.WARNING, logger="scheduler_svc.service"):
            for worker_id, token in (("rogue-empty", ""), ("rogue-wrong", "s3cre")):
                refused = _connect(sched.target, worker_id, token)
                assert refused is not None and "bad worker token" in str(refused)
        assert _refused(registry) == 2
        assert sched.engine.links == {}, "a refused worker must never hold a link"
        logged = caplog.text
        assert "rogue-empty" in logged and "rogue-wrong" in logged and "refused" in logged
        assert "s3cret" not in logged, "the token never goes to the log"


def test_a_worker_with_the_token_registers():
    with running_scheduler("--worker-auth-token", "s3cret") as sched:
        client = WorkerLinkClient(
            sched.target,
            _registration("good", "s3cret"),
            Executor(PositionRunner()),
            WorkerMetrics("m", "good"),
        )
        thread = threading.Thread(target=client.run_forever, daemon=True)
        thread.start()
        try:
            wait_for(lambda: "good" in sched.engine.links)
        finally:
            client.stop()
            thread.join(5)


def test_the_scheduler_refuses_to_start_without_a_worker_token():
    env = {k: v for k, v in os.environ.items() if k != "KVLEDGER_WORKER_AUTH_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_svc", "--grpc-port", str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "KVLEDGER_WORKER_AUTH_TOKEN" in proc.stderr
    assert "--allow-unauthenticated-workers" in proc.stderr


def test_allowing_unauthenticated_workers_is_said_loudly(caplog):
    args = parse(SCHEDULER, ["--allow-unauthenticated-workers"], "t")
    args.worker_auth_token = ""
    with caplog.at_level(logging.WARNING):
        check_worker_auth(args)
    assert "UNAUTHENTICATED WORKERS ALLOWED" in caplog.text


def test_compose_has_no_default_worker_token():
    """`docker-compose config` fails, naming the variable, until the operator sets it."""
    env = compose_env()
    del env["KVLEDGER_WORKER_AUTH_TOKEN"]
    proc = run(compose_argv("config", "-q"), env=env, cwd=REPO)
    assert proc.returncode != 0
    assert "KVLEDGER_WORKER_AUTH_TOKEN" in proc.stdout + proc.stderr
