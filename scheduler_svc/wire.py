"""Translation between the pure core's dataclasses and the wire messages: the one place where
they meet.

A step's result travels whole. What the worker sent with a sampled token (its logprob) or an
embedding goes into the core as an opaque payload of that request (`ModelResult.payloads`),
comes out on the update the core makes for that token (`RequestUpdate.payload`), and is read
back here, in `delivery_from`: nothing is parked beside the ledger and paired up later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from protos import frontend_pb2, worker_pb2
from scheduler_svc.core.output import (
    BlockHashPair,
    ModelResult,
    RequestUpdate,
    SchedulerOutput,
)
from scheduler_svc.core.request import Request
from scheduler_svc.live import Delivery, LiveRequest

log = logging.getLogger(__name__)


def request_from_generate(
    req: frontend_pb2.GenerateRequest, eos_token_ids: Iterable[int]
) -> Request:
    """The ledger's view of a Generate call; the model's EOS ids come from its registration."""
    return Request(
        request_id=req.request_id,
        prompt_token_ids=list(req.prompt_token_ids),
        # a continuation's tokens so far are outputs, as for a request moved off a lost worker
        output_token_ids=list(req.resumed_token_ids),
        max_tokens=req.stop.max_tokens,
        eos_token_ids=frozenset(eos_token_ids),
        stop_token_ids=frozenset(req.stop.stop_token_ids),
        ignore_eos=req.stop.ignore_eos,
        min_tokens=req.stop.min_tokens,
        priority=req.priority,
        tenant=req.tenant,
        cache_salt=req.cache_salt or None,
        # Prompt logprobs need every prompt position computed: nothing read from the cache.
        skip_prefix_cache=req.skip_prefix_cache or req.sampling.HasField("prompt_logprobs"),
        # A draft would need the grammar's verdict, which only the worker holds.
        may_speculate=not req.sampling.HasField("structured"),
    )


def sampling_with_min_tokens(
    req: frontend_pb2.GenerateRequest, eos_token_ids: Iterable[int]
) -> frontend_pb2.SamplingParams:
    """The request's sampling as workers get it: with min_tokens, the ids that may not be
    sampled before it is reached (stop_token_ids, and EOS unless ignore_eos), so that they are
    masked, not merely ignored as stops (vLLM's min_tokens)."""
    sampling = frontend_pb2.SamplingParams()
    sampling.CopyFrom(req.sampling)
    del sampling.min_tokens_masked_ids[:]
    sampling.min_tokens = req.stop.min_tokens
    if req.stop.min_tokens:
        masked = set(req.stop.stop_token_ids)
        if not req.stop.ignore_eos:
            masked.update(eos_token_ids)
        sampling.min_tokens_masked_ids.extend(sorted(masked))
    return sampling


def request_from_embed_input(request_id: str, token_ids: list[int], tenant: str) -> Request:
    """One input of an Embed call: a pass over its tokens, no output tokens."""
    return Request(
        request_id=request_id,
        prompt_token_ids=token_ids,
        max_tokens=0,
        tenant=tenant,
        is_embedding=True,
    )


def _hashes(pairs: Iterable[BlockHashPair]) -> list[worker_pb2.BlockHash]:
    return [worker_pb2.BlockHash(block_id=b, hash=h) for b, h in pairs]


def plan_from_output(
    out: SchedulerOutput, live_of: Callable[[str], LiveRequest]
) -> worker_pb2.Plan:
    plan = worker_pb2.Plan(step_id=out.step_id, dropped_request_ids=out.dropped_request_ids)
    for new in out.new:
        live = live_of(new.request_id)
        msg = plan.new_requests.add(
            request_id=new.request_id,
            token_ids=new.token_ids,
            block_ids=new.block_ids,
            num_computed_tokens=new.num_computed_tokens,
            num_scheduled_tokens=new.num_scheduled_tokens,
            num_prompt_tokens=new.num_prompt_tokens,
            sampling=live.plan_sampling(),
            claimed=_hashes(new.claimed),
            written=_hashes(new.written),
        )
        if live.embed is not None:
            msg.embed.CopyFrom(live.embed)
    for cont in out.cont:
        plan.continuing.add(
            request_id=cont.request_id,
            new_block_ids=cont.new_block_ids,
            num_computed_tokens=cont.num_computed_tokens,
            num_scheduled_tokens=cont.num_scheduled_tokens,
            written=_hashes(cont.written),
            draft_token_ids=cont.draft_token_ids,
        )
    return plan


def model_result_from(result: worker_pb2.StepResult) -> ModelResult:
    # A request either samples or embeds: one payload at most each.
    payloads: dict[str, object] = {e.request_id: list(e.values) for e in result.embeddings}
    payloads.update(
        (s.request_id, [*s.accepted_logprobs, s.logprob] if s.num_accepted else s.logprob)
        for s in result.sampled
        if s.HasField("logprob")
    )
    return ModelResult(
        sampled={s.request_id: s.token_id for s in result.sampled},
        accepted={s.request_id: s.num_accepted for s in result.sampled if s.num_accepted},
        errored={e.request_id: e.message for e in result.errors},
        stale_request_ids=list(result.stale_request_ids),
        deferred_request_ids=list(result.deferred_request_ids),
        embedded=[e.request_id for e in result.embeddings],
        removed_block_ids=list(result.removed_block_ids),
        all_cleared=result.all_cleared,
        payloads=payloads,
    )


def delivery_from(update: RequestUpdate, live: LiveRequest) -> Delivery:
    """One update as its stream gets it: the logprob of each new token (when asked for), the
    prompt logprobs that arrived since the last update, and an embedding request's vector."""
    embedding = update.payload if live.core.is_embedding else None
    return Delivery(
        update,
        token_logprobs(update, live) if live.wants_logprobs else [],
        live.take_prompt_logprobs(),
        embedding if isinstance(embedding, list) else None,
    )


def token_logprobs(update: RequestUpdate, live: LiveRequest) -> list[frontend_pb2.TokenLogprob]:
    """The logprob the worker sent with each new token (the update's payload: one, or one for
    each token a speculative step kept, in order). A token that came without one is a bug
    signal: logged, and given NaN, never a made-up number."""
    payload, out = update.payload, []
    sent = payload if isinstance(payload, list) else [payload]
    pending = [p for p in sent if isinstance(p, frontend_pb2.TokenLogprob)][::-1]
    for token in update.new_token_ids:
        if pending and pending[-1].token_id == token:
            out.append(pending.pop())
        else:
            log.warning("request %s: no logprob for token %d", live.request_id, token)
            out.append(frontend_pb2.TokenLogprob(token_id=token, logprob=float("nan")))
    return out


def response_from(*deliveries: Delivery) -> frontend_pb2.GenerateResponse:
    """One stream message for one or more consecutive updates of a request (those that were
    waiting together: a bundle's steps, or a slow stream): their tokens and logprobs in
    order, the usage and finish of the last."""
    last = deliveries[-1].update
    reason = last.finish_reason.value if last.finish_reason is not None else ""
    return frontend_pb2.GenerateResponse(
        token_ids=[t for d in deliveries for t in d.update.new_token_ids],
        num_prompt_tokens=last.num_prompt_tokens,
        num_cached_tokens=last.num_cached_tokens,
        finish_reason=reason,
        message=last.finish_message,
        logprobs=[e for d in deliveries for e in d.logprobs],
        prompt_logprobs=[e for d in deliveries for e in d.prompt_logprobs],
    )


def model_infos(registrations: Iterable[worker_pb2.Registration]) -> list[frontend_pb2.ModelInfo]:
    """One entry per model name, from its first worker's registration (a model's workers agree
    on what a frontend reads: registration.check_consistent), with its number of workers."""
    infos: dict[str, frontend_pb2.ModelInfo] = {}
    for reg in registrations:
        info = infos.get(reg.model_name)
        if info is None:
            info = infos[reg.model_name] = frontend_pb2.ModelInfo(
                name=reg.model_name,
                kind=reg.kind,
                model_path=reg.model_path,
                tokenizer_path=reg.tokenizer_path,
                max_model_len=reg.max_model_len,
                vocab_size=reg.vocab_size,
                eos_token_ids=reg.eos_token_ids,
                block_size=reg.block_size,
                embedding_size=reg.embedding_size,
                num_labels=reg.num_labels,
            )
        info.num_workers += 1
    return sorted(infos.values(), key=lambda m: m.name)
