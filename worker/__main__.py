"""`python -m worker`: loads a model, keeps paged KV memory, serves the scheduler's plans."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import prometheus_client

from kvledger.config.worker import WorkerSettings
from kvledger.flags import WORKER, config_for, parse
from kvledger.log import setup_logging
from kvledger.metrics_http import start_metrics_server
from kvledger.models import resolve_model
from kvledger.shutdown import Stopper
from kvledger.tls import checked
from protos import frontend_pb2, worker_pb2
from worker.executor import Executor
from worker.link.client import WorkerLinkClient
from worker.metrics import WorkerMetrics
from worker.parallel.distributed import GroupLost
from worker.parallel.tp_spawn import RankGroup, exit_now
from worker.runner.base import load_runner
from worker.runner.config import runner_config

log = logging.getLogger("worker")


def main(argv: Sequence[str] | None = None) -> None:
    prometheus_client.disable_created_metrics()  # *_created series only add noise here
    settings: WorkerSettings = config_for(
        WORKER, parse(WORKER, argv, "kvledger worker: model, paged KV memory, attention")
    )
    setup_logging("worker", settings.log_level, settings.log_format)
    tls = checked(settings, server=False, service="worker")
    stopper = Stopper("worker", settings.shutdown_timeout).install()
    name = settings.served_model_name or settings.model
    worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    group: RankGroup | None = None
    try:
        model_path = resolve_model(settings.model)
        config = runner_config(settings, model_path)
        if settings.tensor_parallel_size > 1:
            group = RankGroup.start(settings, config)
        runner = load_runner(config, group.tp if group else None)
    except GroupLost as err:
        exit_now(f"the tensor-parallel group broke while loading: {err}")
    except MODEL_ERRORS as err:
        # A model that cannot be served is the operator's to fix: one line naming the cause
        # (the traceback only at debug level), and a non-zero exit.
        log.debug("loading %s failed", settings.model, exc_info=True)
        exit_now(f"cannot serve model {settings.model!r}: {model_error(err)}", logger=log)
    kind = (
        frontend_pb2.MODEL_KIND_EMBED
        if runner.kind == "embed"
        else frontend_pb2.MODEL_KIND_GENERATE
    )
    registration = worker_pb2.Registration(
        worker_id=worker_id,
        model_name=name,
        model_path=str(model_path),
        kind=kind,
        block_size=runner.block_size,
        num_blocks=runner.num_blocks,
        max_model_len=runner.max_model_len,
        vocab_size=runner.vocab_size,
        eos_token_ids=runner.eos_token_ids,
        auth_token=settings.worker_auth_token,
        embedding_size=runner.embedding_size,
        tokenizer_path=tokenizer_path(settings.tokenizer),
        num_labels=runner.num_labels,  # a cross-encoder's scores per pair
    )
    metrics = WorkerMetrics(name, worker_id)
    start_metrics_server(
        settings.metrics_port, addr=settings.metrics_host, registry=metrics.registry
    )
    log.info(
        "worker %s: model %s (%s), %d KV blocks of %d tokens, metrics on :%d",
        worker_id,
        name,
        model_path,
        runner.num_blocks,
        runner.block_size,
        settings.metrics_port,
    )
    executor = group.executor(runner) if group else Executor(runner)
    client = WorkerLinkClient(settings.scheduler, registration, executor, metrics, tls)
    stopper.on_stop(client.stop)
    try:
        client.run_forever()
    except GroupLost as err:  # a rank died or hung mid-step: the whole group goes
        exit_now(f"the tensor-parallel group is broken ({err}); exiting")
    if group:
        group.stop()
    log.info("worker %s stopped", worker_id)


# What a bad --model raises: a missing path (OSError), a config, file or checkpoint this worker
# cannot run (ValueError: UnsupportedModelError, GGUFError, ...), a package not installed.
MODEL_ERRORS = (OSError, ValueError, ImportError)


def model_error(err: BaseException) -> str:
    """One line: the error's message, or for a missing package how to install it."""
    if isinstance(err, ImportError) and err.name:
        return f"the {err.name} package is not installed (pip install {err.name})"
    text = " ".join(str(err).split())
    return text or type(err).__name__


def tokenizer_path(directory: str | None) -> str:
    """--tokenizer as an absolute path the frontend can read, refused at once when it holds no
    tokenizer.json (found only by the frontend, every request would fail)."""
    if not directory:
        return ""
    path = Path(directory).expanduser().resolve()
    if not (path / "tokenizer.json").is_file():
        exit_now(f"--tokenizer {directory}: no tokenizer.json in that directory", logger=log)
    return str(path)


if __name__ == "__main__":
    main(sys.argv[1:])
