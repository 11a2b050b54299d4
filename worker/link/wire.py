"""Translation between the worker's dataclasses (`worker/link/step.py`) and the wire messages.

The one place where a proto3 default has to be read as "not set": an unset `top_p` or
`repetition_penalty` arrives as 0, which means off (1), not "filter everything"; `seed` and
`prompt_logprobs` are `optional` fields, and `structured` a message, read with `HasField`.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvledger.structured import StructuredSpec
from protos import frontend_pb2, worker_pb2
from worker.link.step import (
    BlockHashPair,
    ContinueSeq,
    EmbedParams,
    NewSeq,
    StepOutput,
    StepPlan,
)
from worker.sample.sampler import PromptLogprobs, Sample, TokenLogprobs
from worker.sample.sampling_params import SamplingParams


def sampling_from_wire(sp: frontend_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p or 1.0,
        top_k=sp.top_k,
        min_p=sp.min_p,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty or 1.0,
        seed=sp.seed if sp.HasField("seed") else None,
        logprobs=sp.logprobs,
        prompt_logprobs=sp.prompt_logprobs if sp.HasField("prompt_logprobs") else -1,
        logit_bias=dict(sp.logit_bias) or None,
        min_tokens=sp.min_tokens,
        min_tokens_masked=tuple(sp.min_tokens_masked_ids) if sp.min_tokens else (),
        structured=(
            StructuredSpec(sp.structured.kind, sp.structured.spec)
            if sp.HasField("structured")
            else None
        ),
    )


def _pairs(blocks: Iterable[worker_pb2.BlockHash]) -> list[BlockHashPair]:
    return [(b.block_id, b.hash) for b in blocks]


def plan_from_wire(plan: worker_pb2.Plan) -> StepPlan:
    return StepPlan(
        step_id=plan.step_id,
        new=[
            NewSeq(
                request_id=new.request_id,
                token_ids=list(new.token_ids),
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                num_scheduled_tokens=new.num_scheduled_tokens,
                num_prompt_tokens=new.num_prompt_tokens,
                sampling=sampling_from_wire(new.sampling),
                claimed=_pairs(new.claimed),
                written=_pairs(new.written),
                embed=(
                    EmbedParams(new.embed.normalize, new.embed.dimensions, new.embed.type_start)
                    if new.HasField("embed")
                    else None
                ),
            )
            for new in plan.new_requests
        ],
        cont=[
            ContinueSeq(
                request_id=cont.request_id,
                new_block_ids=list(cont.new_block_ids),
                num_computed_tokens=cont.num_computed_tokens,
                num_scheduled_tokens=cont.num_scheduled_tokens,
                written=_pairs(cont.written),
                draft_token_ids=list(cont.draft_token_ids),
            )
            for cont in plan.continuing
        ],
        dropped=list(plan.dropped_request_ids),
    )


def result_to_wire(out: StepOutput) -> worker_pb2.StepResult:
    result = worker_pb2.StepResult(
        step_id=out.step_id,
        stale_request_ids=out.stale_request_ids,
        deferred_request_ids=out.deferred_request_ids,
        removed_block_ids=out.removed_block_ids,
        step_seconds=out.step_seconds,
    )
    for request_id, sample in out.sampled:
        _add_sampled(result, request_id, sample)
    for request_id, prompt in out.prompt_logprobs:
        _add_prompt_logprobs(result, request_id, prompt)
    for request_id, vector in out.embeddings:
        result.embeddings.add(request_id=request_id, values=vector)
    for request_id, message in out.errors:
        result.errors.add(request_id=request_id, message=message)
    for block_id, block_hash in out.stored:
        result.stored.add(block_id=block_id, hash=block_hash)
    return result


def _add_sampled(result: worker_pb2.StepResult, request_id: str, sample: Sample) -> None:
    sampled = result.sampled.add(
        request_id=request_id, token_id=sample.token_id, num_accepted=sample.num_accepted
    )
    if sample.logprobs is not None:
        _fill_logprob(sampled.logprob, sample.token_id, sample.logprobs)
    if sample.accepted_logprobs:  # asked for: one for each kept draft
        for token_id, lp in zip(sample.accepted_ids, sample.accepted_logprobs, strict=True):
            _fill_logprob(sampled.accepted_logprobs.add(), token_id, lp)


def _add_prompt_logprobs(
    result: worker_pb2.StepResult, request_id: str, prompt: PromptLogprobs
) -> None:
    msg = result.prompt_logprobs.add(request_id=request_id, start=prompt.start)
    for token_id, lp in zip(prompt.token_ids, prompt.entries, strict=True):
        _fill_logprob(msg.entries.add(), token_id, lp)


def _fill_logprob(entry: frontend_pb2.TokenLogprob, token_id: int, lp: TokenLogprobs) -> None:
    entry.token_id = token_id
    entry.logprob = lp.logprob
    for top_id, logprob in zip(lp.top_ids, lp.top_logprobs, strict=True):
        entry.top.add(token_id=top_id, logprob=logprob)
