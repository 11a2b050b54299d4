"""What the scheduler-service tests share: stand-in runners (the edge of those tests: a token
that depends only on the sequence position, so a request recomputed on another worker yields
the same tokens), an in-process worker, the scheduler service on its own loop, and waits."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import grpc

from kvledger.flags import SCHEDULER, parse
from kvledger.tls import TlsFiles
from protos import frontend_pb2, frontend_pb2_grpc, worker_pb2
from scheduler_svc.__main__ import start
from tests.core.harness import has_unfinished
from tests.serving import free_port
from worker.executor import Executor
from worker.link.client import WorkerLinkClient
from worker.metrics import WorkerMetrics
from worker.runner.base import Runner
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.pooling import EmbedItem
from worker.sample.sampler import PromptLogprobs, Sample, TokenLogprobs

VOCAB = 1000
EOS = 999


def limits_of(reg: worker_pb2.Registration) -> BatchLimits:
    """What a model registered as `reg` accepts: a stand-in serving under it checks the same."""
    return BatchLimits(reg.block_size, reg.num_blocks, reg.vocab_size, reg.max_model_len)


class PositionRunner:
    """A complete `Runner` that generates and computes no embeddings. Its `limits` are the
    default registration's (`Worker` below); whoever registers it otherwise sets them
    (`limits_of`)."""

    kind = "generate"
    embedding_size = 0
    limits = BatchLimits(block_size=4, num_blocks=64, vocab_size=VOCAB, max_model_len=256)

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        return [Sample(100 + c.end_pos % 800) if c.sample else None for c in chunks]

    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        raise AssertionError("embedding_size 0: the executor never asks")


class ScoringRunner(PositionRunner):
    """Also scores prompt tokens when asked: prompt token p gets logprob -p / 100."""

    def __init__(self) -> None:
        self.num_scored = 0

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.num_scored += sum(c.num_prompt_scored for c in chunks)
        return [self._one(c, s) for c, s in zip(chunks, super().execute(chunks), strict=True)]

    @staticmethod
    def _one(chunk: SeqChunk, sample: Sample | None) -> Sample | None:
        count, start = chunk.num_prompt_scored, chunk.start_pos + 1
        prompt = (
            PromptLogprobs(
                start,
                list(chunk.all_token_ids[start : start + count]),
                [TokenLogprobs(-p / 100, [], []) for p in range(start, start + count)],
            )
            if count
            else None
        )
        if sample is None and prompt is None:
            return None
        return Sample(-1 if sample is None else sample.token_id, prompt_logprobs=prompt)


def registration(**changes) -> worker_pb2.Registration:
    """A stand-in worker's registration (model "m", a small pool); `changes` override fields."""
    fields = dict(
        worker_id="w0",
        model_name="m",
        model_path="/nonexistent",
        kind=frontend_pb2.MODEL_KIND_GENERATE,
        block_size=4,
        num_blocks=64,
        max_model_len=256,
        vocab_size=VOCAB,
        eos_token_ids=[EOS],
    )
    fields.update(changes)
    return worker_pb2.Registration(**fields)


class Worker:
    def __init__(
        self,
        target: str,
        worker_id: str,
        num_blocks: int = 64,
        vocab_size: int = VOCAB,
        runner: Runner | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        reg = registration(worker_id=worker_id, num_blocks=num_blocks, vocab_size=vocab_size)
        runner = runner or PositionRunner()
        runner.limits = limits_of(reg)
        metrics = WorkerMetrics("m", worker_id)
        self.client = WorkerLinkClient(target, reg, Executor(runner), metrics, tls)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with contextlib.suppress(SystemExit):
            self.client.run_forever()

    def stop(self) -> None:
        self.client.stop()
        self.thread.join(timeout=5)


@contextlib.contextmanager
def running_scheduler(*extra: str, port: int | None = None, metrics: bool = False):
    """The scheduler service in this process, on its own loop and thread; with `metrics`, its
    Prometheus endpoint too (`handle.url`)."""
    loop = asyncio.new_event_loop()
    port = port or free_port()
    metrics_port = free_port()
    argv = ["--grpc-port", str(port), "--debug-invariants", "--max-num-batched-tokens", "64"]
    if metrics:
        argv += ["--metrics-port", str(metrics_port)]
    args = parse(SCHEDULER, [*argv, *extra], "t")
    server, engine, _ = loop.run_until_complete(start(args, metrics=metrics))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    class Handle:
        target = f"127.0.0.1:{port}"
        url = f"http://127.0.0.1:{metrics_port}/metrics"

        def call(self, fn, *a):  # noqa: ANN001, ANN202 - run on the scheduler's loop
            return asyncio.run_coroutine_threadsafe(_as_coro(fn, *a), loop).result(10)

    handle = Handle()
    handle.engine = engine
    try:
        yield handle
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def _as_coro(fn, *a):  # noqa: ANN001, ANN202
    return fn(*a)


def wait_for(predicate, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def generate(
    target: str, rid: str, prompt: list[int], max_tokens: int, **kw
) -> Iterator[frontend_pb2.GenerateResponse]:
    channel = grpc.insecure_channel(target)
    stub = frontend_pb2_grpc.SchedulerStub(channel)
    req = frontend_pb2.GenerateRequest(
        request_id=rid,
        model="m",
        prompt_token_ids=prompt,
        stop=frontend_pb2.StopCriteria(max_tokens=max_tokens, ignore_eos=True),
        **kw,
    )
    return stub.Generate(req)


def ledger_idle(scheduler) -> bool:  # noqa: ANN001
    def check() -> bool:
        for link in scheduler.engine.links.values():
            snap = link.scheduler.snapshot()
            if snap.blocks_in_use or snap.tracker_entries or has_unfinished(link.scheduler):
                return False
        return not scheduler.engine.requests

    return scheduler.call(check)


def expected_tokens(prompt_len: int, n: int) -> list[int]:
    return [100 + (prompt_len + i) % 800 for i in range(n)]


class GatedRunner(PositionRunner):
    """Holds the step that computes position `at` of request `rid` until released."""

    def __init__(self, rid: str, at: int) -> None:
        self.rid, self.at = rid, at
        self.reached, self.release = threading.Event(), threading.Event()

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        if any(c.request_id == self.rid and c.start_pos == self.at for c in chunks):
            self.reached.set()
            assert self.release.wait(10)
        return super().execute(chunks)
