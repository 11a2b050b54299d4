"""`python -m worker`: loads a model, keeps paged KV memory, serves the scheduler's plans."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence

import prometheus_client

from kvledger.flags import WORKER, parse
from kvledger.log import setup_logging
from kvledger.metrics_http import start_metrics_server
from kvledger.models import resolve_model
from kvledger.shutdown import Stopper
from protos import frontend_pb2, worker_pb2
from worker.executor import Executor
from worker.link import WorkerLinkClient
from worker.metrics import WorkerMetrics
from worker.runners import load_runner

log = logging.getLogger("worker")
CPU_KV_CACHE_BYTES = 512 * 1024 * 1024


def main(argv: Sequence[str] | None = None) -> None:
    prometheus_client.disable_created_metrics()  # *_created series only add noise here
    args = parse(WORKER, argv, "kvledger worker: model, paged KV memory, attention")
    setup_logging("worker", args.log_level, args.log_format)
    stopper = Stopper("worker", args.shutdown_timeout).install()
    model_path = resolve_model(args.model)
    name = args.served_model_name or args.model
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    kv_bytes = args.kv_cache_memory_bytes
    if kv_bytes is None and not args.device.startswith("cuda"):
        kv_bytes = CPU_KV_CACHE_BYTES
    runner = load_runner(
        model_path,
        block_size=args.block_size,
        num_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=kv_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        seed=args.seed,
        attention_backend=args.attention_backend,
        progress=args.log_format == "text",  # a progress bar is no JSON line
    )
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
        auth_token=args.worker_auth_token,
        embedding_size=runner.embedding_size,
    )
    metrics = WorkerMetrics(name, worker_id)
    start_metrics_server(args.metrics_port, addr=args.metrics_host, registry=metrics.registry)
    log.info(
        "worker %s: model %s (%s), %d KV blocks of %d tokens, metrics on :%d",
        worker_id,
        name,
        model_path,
        runner.num_blocks,
        runner.block_size,
        args.metrics_port,
    )
    client = WorkerLinkClient(args.scheduler, registration, Executor(runner), metrics)
    stopper.on_stop(client.stop)
    client.run_forever()
    log.info("worker %s stopped", worker_id)


if __name__ == "__main__":
    main(sys.argv[1:])
