"""gRPC servicers: the frontend-facing Scheduler service and the worker-facing WorkerLink."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from kvledger.log import REQUEST_ID
from kvledger.rpc import ADMITTED
from protos import frontend_pb2, frontend_pb2_grpc, worker_pb2, worker_pb2_grpc
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.engine import Engine
from scheduler_svc.errors import PlacementError
from scheduler_svc.live import Delivery, LiveRequest, RequestFailure
from scheduler_svc.wire import response_from
from scheduler_svc.worker_link import LinkClosed, WorkerLink

log = logging.getLogger(__name__)


ALONE = (FinishReason.IGNORED, FinishReason.ERROR)  # updates a stream message carries alone


def _ready_with(
    first: Delivery, queue: asyncio.Queue[Delivery | RequestFailure], held: list
) -> list[Delivery]:
    """`first` and the updates already queued behind it, sent as one message (fewer messages
    per token; a bundle's steps arrive together). Stops at a finish; a failure, a refusal or
    an error found behind is `held` for the next turn, which sends it alone, so the tokens
    before it reach the client as they would have one step at a time."""
    batch = [first]
    while batch[-1].update.finish_reason is None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, RequestFailure) or item.update.finish_reason in ALONE:
            held.append(item)
            break
        batch.append(item)
    return batch


class SchedulerServicer(frontend_pb2_grpc.SchedulerServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def Generate(
        self, request: frontend_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[frontend_pb2.GenerateResponse]:
        REQUEST_ID.set(request.request_id)  # this call's task: every line it logs names it
        live = await self._submit(context, self.engine.submit_generate, request)
        try:
            await context.send_initial_metadata((ADMITTED,))  # live from here on
            held: list[Delivery | RequestFailure] = []
            while True:
                item = held.pop() if held else await live.updates.get()
                if isinstance(item, RequestFailure):
                    await context.abort(item.code, item.message)
                update = item.update
                if update.finish_reason == FinishReason.IGNORED:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, update.finish_message)
                batch = _ready_with(item, live.updates, held)
                yield response_from(*batch)
                if batch[-1].update.finish_reason is not None:
                    return
        finally:
            # Client gone (cancelled) or the stream ended early: release everything it holds.
            if not live.done:
                self.engine.abort(live.request_id)

    async def Embed(
        self, request: frontend_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.EmbedResponse:
        base = request.request_id or uuid.uuid4().hex
        lives: list[LiveRequest] = []
        try:
            for i, item in enumerate(request.inputs):
                params = worker_pb2.EmbedParams(
                    normalize=request.normalize,
                    dimensions=request.dimensions,
                    type_start=item.type_start,  # a cross-encoder's text pair
                )
                lives.append(
                    await self._submit(
                        context,
                        self.engine.submit_embed,
                        f"{base}-{i}",
                        request.model,
                        list(item.ids),
                        params,
                        request.tenant,
                    )
                )
            response = frontend_pb2.EmbedResponse()
            for live in lives:
                item = await live.updates.get()
                if isinstance(item, RequestFailure):
                    await context.abort(item.code, item.message)
                update = item.update
                if update.finish_reason != FinishReason.STOP or item.embedding is None:
                    code = (
                        grpc.StatusCode.INVALID_ARGUMENT
                        if update.finish_reason == FinishReason.IGNORED
                        else grpc.StatusCode.INTERNAL
                    )
                    await context.abort(code, update.finish_message or "embedding failed")
                response.embeddings.add(values=item.embedding)
                response.num_prompt_tokens += len(live.core.prompt_token_ids)
            return response
        finally:
            for live in lives:
                if not live.done:
                    self.engine.abort(live.request_id)

    async def Abort(
        self, request: frontend_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.AbortResponse:
        reasons = {"": FinishReason.ABORT, "abort": FinishReason.ABORT, "stop": FinishReason.STOP}
        reason = reasons.get(request.reason)
        if reason is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"abort reason {request.reason!r} is neither 'abort' nor 'stop'",
            )
        return frontend_pb2.AbortResponse(aborted=self.engine.abort(request.request_id, reason))

    async def ListModels(
        self, request: frontend_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.ListModelsResponse:
        return frontend_pb2.ListModelsResponse(models=self.engine.models())

    async def ResetPrefixCache(
        self, request: frontend_pb2.ResetPrefixCacheRequest, context: grpc.aio.ServicerContext
    ) -> frontend_pb2.ResetPrefixCacheResponse:
        return frontend_pb2.ResetPrefixCacheResponse(reset=self.engine.reset_prefix_cache())

    @staticmethod
    async def _submit(context: grpc.aio.ServicerContext, submit, *args) -> LiveRequest:  # noqa: ANN001
        try:
            return submit(*args)
        except PlacementError as err:
            await context.abort(err.code, err.message)
            raise  # unreachable: abort raises


class WorkerLinkServicer(worker_pb2_grpc.WorkerLinkServicer):
    def __init__(self, engine: Engine, auth_token: str = "") -> None:
        self.engine = engine
        self.auth_token = auth_token

    async def Connect(
        self,
        request_iterator: AsyncIterator[worker_pb2.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[worker_pb2.Plan]:
        messages = request_iterator.__aiter__()
        first = await messages.__anext__()
        if first.WhichOneof("kind") != "registration":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a registration"
            )
        reg = first.registration
        if self.auth_token and not hmac.compare_digest(
            reg.auth_token.encode(), self.auth_token.encode()
        ):
            await self._refuse(
                context, reg, PlacementError(grpc.StatusCode.UNAUTHENTICATED, "bad worker token")
            )
        try:
            cfg = self.engine.ledger_config(reg)
            # A large pool takes seconds to build: off the loop, which meanwhile keeps serving
            # every other call (the GIL still lets it run between the builder's slices).
            link = self.engine.attach(reg, cfg, await asyncio.to_thread(Scheduler, cfg))
        except PlacementError as err:
            await self._refuse(context, reg, err)
            return
        context.add_done_callback(lambda _ctx: self.engine.unregister(link))
        try:
            while True:
                try:
                    message = await self._next_message(messages, link)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    # Alive enough to hold the stream, not to compute: the worker is lost.
                    # Ending the call makes it reconnect (with an empty cache) once its step
                    # returns, and nothing it sends on this call is read again.
                    self.engine.step_timed_out(link)
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no step result within --worker-step-timeout "
                        f"{self.engine.config.worker_step_timeout:g} s",
                    )
                if message.WhichOneof("kind") != "result":
                    await context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION, "expected a step result"
                    )
                link.apply_result(message.result)
                if not link.has_in_flight:
                    yield await link.next_plan()
                ahead = link.plan_ahead()
                if ahead is not None:
                    yield ahead
        except LinkClosed:
            return
        finally:
            self.engine.unregister(link)

    async def _refuse(
        self, context: grpc.aio.ServicerContext, reg: worker_pb2.Registration, err: PlacementError
    ) -> None:
        """Logged (who tried, from where) and counted by reason, then the call ends."""
        reason = err.code.name.lower()
        log.warning(
            "registration of worker %r (model %r) from %s refused: %s",
            reg.worker_id,
            reg.model_name,
            context.peer(),
            err.message,
        )
        self.engine.link_metrics.registrations_refused.labels(reason).inc()
        await context.abort(err.code, err.message)

    async def _next_message(
        self, messages: AsyncIterator[worker_pb2.WorkerMessage], link: WorkerLink
    ) -> worker_pb2.WorkerMessage:
        """The worker's next message; TimeoutError when it owes the result of a plan sent
        more than --worker-step-timeout ago. An idle worker (no plan out) is never timed."""
        limit = self.engine.config.worker_step_timeout
        if limit <= 0 or link.plan_sent_at is None:
            return await messages.__anext__()
        # One limit per message, a bundle too: bundles stop at ~50 ms of steps (worker_link.py)
        remaining = link.plan_sent_at + limit - time.monotonic()
        return await asyncio.wait_for(messages.__anext__(), max(remaining, 0.0))
