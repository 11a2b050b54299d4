"""Worker links whose model is a stand-in (tests/service's PositionRunner unless told), running
in this process against a real scheduler service: for the frontend tests that need control over
the model's answers, its directory, or the order in which workers register."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from protos import frontend_pb2, worker_pb2
from tests.service.helpers import PositionRunner, limits_of
from worker.executor import Executor
from worker.link.client import WorkerLinkClient
from worker.metrics import WorkerMetrics

GENERATE, EMBED = frontend_pb2.MODEL_KIND_GENERATE, frontend_pb2.MODEL_KIND_EMBED
# tiny-llama's tokenizer (a BERT vocabulary, [SEP] as EOS), for tests that render its template
TINY_LLAMA_VOCAB = {"vocab_size": 30522, "eos_token_ids": (102,)}


@contextlib.contextmanager
def stand_in_worker(
    target: str,
    model: str,
    path: str,
    runner: PositionRunner | None = None,
    *,
    kind: int = GENERATE,
    vocab_size: int = 1000,
    eos_token_ids: tuple[int, ...] = (999,),
    tokenizer_path: str = "",
    max_model_len: int = 256,
    num_blocks: int = 64,
) -> Iterator[None]:
    """Registers `model` (read from `path`) with the scheduler at `target` while in the block."""
    reg = worker_pb2.Registration(
        worker_id=f"w-{model}",
        model_name=model,
        model_path=path,
        kind=kind,
        block_size=4,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        eos_token_ids=list(eos_token_ids),
        tokenizer_path=tokenizer_path,
    )
    runner = runner or PositionRunner()
    runner.limits = limits_of(reg)
    link = WorkerLinkClient(target, reg, Executor(runner), WorkerMetrics(model, reg.worker_id))
    thread = threading.Thread(target=link.run_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        link.stop()
        thread.join(5)
