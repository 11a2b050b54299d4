"""The worker's side of the Connect stream: register, then pull plans and push results."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator

import grpc

from kvledger.rpc import CHANNEL_OPTIONS
from kvledger.tls import TlsFiles, channel_credentials, channel_with
from protos import worker_pb2, worker_pb2_grpc
from worker.executor import Executor
from worker.link.wire import plan_from_wire, result_to_wire
from worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# The scheduler's answers that retrying cannot change: the worker exits.
REFUSALS = (
    grpc.StatusCode.UNAUTHENTICATED,  # bad --worker-auth-token
    grpc.StatusCode.FAILED_PRECONDITION,  # differs from the other workers of its model
    grpc.StatusCode.INVALID_ARGUMENT,  # a malformed registration
)


# A worker that cannot connect says so this often (a wrong CA is otherwise silent).
NOT_READY_WARN_SECONDS = 10.0

# Plans this worker runs from one message (a bundle: Plan.then, --num-scheduler-steps), said
# in its registration; the scheduler sends no more.
MAX_STEPS_PER_PLAN = 64


class WorkerLinkClient:
    def __init__(
        self,
        target: str,
        registration: worker_pb2.Registration,
        executor: Executor,
        metrics: WorkerMetrics,
        tls: TlsFiles | None = None,
    ) -> None:
        self.target = target
        self.tls = tls or TlsFiles()
        self._credentials = channel_credentials(self.tls)  # read once, at startup
        self.registration = worker_pb2.Registration()
        self.registration.CopyFrom(registration)
        self.registration.max_steps_per_plan = MAX_STEPS_PER_PLAN
        self.executor = executor
        self.metrics = metrics
        self.stopping = threading.Event()
        self._call: grpc.Call | None = None

    def stop(self) -> None:
        """Ends the link (the scheduler sees a lost worker) and stops reconnecting."""
        self.stopping.set()
        call = self._call  # the link's thread may clear it meanwhile
        if call is not None:
            call.cancel()

    def run_forever(self) -> None:
        """Serve plans; after a lost scheduler, reconnect with an empty KV cache."""
        backoff = 0.2
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self._serve_once()
            except grpc.RpcError as err:
                if self.stopping.is_set():
                    return  # stop() cancelled the call: not a lost link
                if err.code() in REFUSALS:
                    raise SystemExit(f"scheduler refused this worker: {err.details()}") from err
                if err.code() == grpc.StatusCode.ALREADY_EXISTS:
                    # Our id is still registered: the scheduler has not yet dropped the
                    # connection this worker (or the one it replaces) had. It will.
                    log.warning(
                        "scheduler %s still holds worker id %r (%s); retrying in %.1f s",
                        self.target,
                        self.registration.worker_id,
                        err.details(),
                        backoff,
                    )
                else:
                    log.warning("link to scheduler %s lost: %s", self.target, err.code().name)
            if time.monotonic() - started > 10:
                backoff = 0.2
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _step(self, plan: worker_pb2.Plan) -> worker_pb2.StepResult:
        """One plan of a bundle, in order: each runs on the tokens the ones before it sampled.
        A failing step errors its requests only."""
        stale_before = self.executor.counters.stale_block_hits
        result = result_to_wire(self.executor.step(plan_from_wire(plan)))
        self.metrics.observe(result, self.executor.counters.stale_block_hits - stale_before)
        return result

    def _wait_ready(self, grpc_channel: grpc.Channel) -> bool:
        """Waits for the channel to connect, saying every NOT_READY_WARN_SECONDS why it may
        not (gRPC retries a refused connection or a failed TLS handshake quietly, forever);
        False when the worker stops meanwhile."""
        ready = grpc.channel_ready_future(grpc_channel)
        started = warned = time.monotonic()
        while not self.stopping.is_set():
            try:
                ready.result(timeout=0.25)  # short: stop() must not wait on it
                return True
            except grpc.FutureTimeoutError:
                if time.monotonic() - warned < NOT_READY_WARN_SECONDS:
                    continue
                warned = time.monotonic()
                log.warning(
                    "scheduler at %s not reachable after %.0f s: is it up, and%s",
                    self.target,
                    warned - started,
                    " do --grpc-tls-ca and the scheduler's certificate match (its name too)?"
                    if self.tls.enabled
                    else " does it serve plaintext (no --grpc-tls-cert)?",
                )
        ready.cancel()
        return False

    def _serve_once(self) -> None:
        outbox: queue.SimpleQueue[worker_pb2.WorkerMessage | None] = queue.SimpleQueue()
        self.executor.reset()
        outbox.put(worker_pb2.WorkerMessage(registration=self.registration))
        hello = worker_pb2.StepResult(all_cleared=True)
        self.metrics.observe(hello, 0)
        outbox.put(worker_pb2.WorkerMessage(result=hello))

        def outgoing() -> Iterator[worker_pb2.WorkerMessage]:
            while (message := outbox.get()) is not None:
                yield message

        with channel_with(self.target, self._credentials, CHANNEL_OPTIONS) as grpc_channel:
            stub = worker_pb2_grpc.WorkerLinkStub(grpc_channel)
            log.info("connecting to scheduler at %s", self.target)
            if not self._wait_ready(grpc_channel):
                return  # stopping
            self._call = stub.Connect(outgoing(), wait_for_ready=True)
            if self.stopping.is_set():
                self._call.cancel()
            try:
                finished_at: float | None = None
                for plan in self._call:
                    if finished_at is not None and self.executor.seqs:
                        # requests are live: the worker was waiting for this plan, not for work
                        self.metrics.waited(time.perf_counter() - finished_at)
                    result, *rest = (self._step(p) for p in [plan, *plan.then])
                    result.then.extend(rest)  # a bundle (--num-scheduler-steps): one answer
                    outbox.put(worker_pb2.WorkerMessage(result=result))
                    finished_at = time.perf_counter()
            finally:
                self._call = None
                outbox.put(None)
