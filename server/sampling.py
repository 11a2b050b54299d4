"""From a validated request body to a `Generation`: the checks every generating endpoint shares
(model kind, limits, context length, logit_bias ids, the structured-output constraint) and the
GenerateRequest of each choice."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from kvledger.log import REQUEST_ID
from kvledger.structured import StructuredSpec
from protos import frontend_pb2
from server.bounds import check_names, check_sampling_lists
from server.choice import Choice, Generation
from server.client import ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError
from server.limits import Limits, check_sampling_limits
from server.protocol import NOT_IMPLEMENTED, NOT_IMPLEMENTED_UNLESS, SamplingRequest
from server.structured import check_structured, structured_spec, to_wire

SEED_RANGE = 2**64  # SamplingParams.seed is a uint64


@dataclass(frozen=True)
class ChoiceOptions:
    """What an endpoint asks of each choice, beyond the shared sampling fields."""

    id_prefix: str
    max_tokens: int | None  # None: fill the context
    top_logprobs: int | None = None  # None: no logprobs
    prompt_logprobs: int | None = None  # None: none
    echo_only: bool = False
    prompt_param: str = "prompt"  # the request's field that holds the prompt, for errors
    structured: StructuredSpec | None = None  # the constraint `check_request` returned


def check_request(
    body: SamplingRequest, model: ServedModel, limits: Limits, num_prompts: int
) -> StructuredSpec | None:
    """The checks that need no tokens: run before tokenizing. Returns the request's
    structured-output constraint (compiled once here, so a bad one is a 400), for its
    ChoiceOptions."""
    if model.is_embedding:
        raise APIError(400, f"model `{model.name}` is an embedding model", param="model")
    if body.stream_options is not None and not body.stream:
        raise APIError(
            400, "stream_options may only be set when stream is true", param="stream_options"
        )
    refuse_unsupported(body)
    check_names(limits, model=body.model, user=body.user, cache_salt=body.cache_salt)
    vocab = model.info.vocab_size
    check_sampling_lists(body.stop_token_ids, body.logit_bias, limits, vocab)
    bad = [k for k in body.logit_bias or {} if int(k) >= vocab]
    if bad:
        raise APIError(
            400,
            f"logit_bias keys must be token ids below the vocabulary size {vocab}, not {bad[0]}",
            param="logit_bias",
        )
    check_sampling_limits(body, limits, num_prompts)
    spec = structured_spec(body, limits)
    if spec is not None:
        check_structured(body, spec, model, limits)
    return spec


def build_generation(
    body: SamplingRequest,
    model: ServedModel,
    prompts: list[list[int]],
    salt: str,
    tenant: str,
    options: ChoiceOptions,
) -> Generation:
    """`salt` namespaces the prefix cache per tenant; `tenant` is the tenant's tag
    (deps.tenant_tag), which the fair scheduling policy shares a worker by."""
    generation = Generation(
        id=f"{options.id_prefix}-{REQUEST_ID.get() or uuid.uuid4().hex}",  # the HTTP request's
        model=model,
        prompts=prompts,
        stops=body.stop_strings,
        include_stop=body.include_stop_str_in_output,
    )
    limit = model.info.max_model_len
    for p_index, prompt in enumerate(prompts):
        # Without max_tokens, a completion may fill the context, but must have room for one.
        max_tokens = options.max_tokens if options.max_tokens is not None else limit - len(prompt)
        max_tokens = max(max_tokens, 1)
        check_context(prompt, max_tokens, limit, options.prompt_param)
        for sample in range(body.n):
            index = len(generation.choices)
            request = generate_request(
                body,
                model,
                prompt,
                max_tokens,
                salt,
                tenant,
                f"{generation.id}-{index}",
                sample,
                options,
            )
            detok = IncrementalDetokenizer(model.tokenizer, prompt, body.skip_special_tokens)
            choice = Choice(index, p_index, request, detok, echo_only=options.echo_only)
            if options.top_logprobs is not None:
                choice.entries = []
            generation.choices.append(choice)
    return generation


def refuse_unsupported(body: SamplingRequest) -> None:
    """A parameter this server does not implement, set to anything but its no-op value, is a
    400 naming it: a reply that silently ignored it would not be what the client asked for."""
    extra = body.model_extra or {}
    for name in NOT_IMPLEMENTED:
        value = extra.get(name)
        if value is not None and value is not False and value != [] and value != {}:
            raise APIError(400, f"`{name}` is not supported by this server", param=name)
    for name, no_ops in NOT_IMPLEMENTED_UNLESS.items():
        refuse_unless_no_op(name, extra.get(name), no_ops)
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(
            400, "best_of is not supported by this server (only best_of equal to n)",
            param="best_of",
        )  # fmt: skip


def refuse_unless_no_op(name: str, value: object, no_ops: tuple[object, ...]) -> None:
    """A 400 naming field `name` unless its value is one that asks for nothing."""
    if not any(_same(value, no_op) for no_op in no_ops):
        accepted = ", ".join(json.dumps(v) for v in no_ops)
        raise APIError(
            400,
            f"`{name}`: {json.dumps(value)[:64]} is not supported by this server "
            f"(accepted: {accepted})",
            param=name,
        )


def _same(value: object, no_op: object) -> bool:
    """Equal as JSON values: `false` is not `0`, though Python's False == 0."""
    return type(value) is type(no_op) and value == no_op


def check_context(prompt: list[int], max_tokens: int, limit: int, param: str) -> None:
    if len(prompt) + max_tokens > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param=param,
            code="context_length_exceeded",
        )


def generate_request(
    body: SamplingRequest,
    model: ServedModel,
    prompt: list[int],
    max_tokens: int,
    salt: str,
    tenant: str,
    request_id: str,
    sample_index: int,
    options: ChoiceOptions,
) -> frontend_pb2.GenerateRequest:
    temperature = 1.0 if body.temperature is None else body.temperature
    sampling = frontend_pb2.SamplingParams(
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        min_p=body.min_p or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        logprobs=-1 if options.top_logprobs is None else options.top_logprobs,
        logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
    )
    if body.seed is not None:
        # The n samples of a prompt differ, yet the whole response is reproducible (vLLM's
        # seed + index); the worker's noise depends only on (seed, position).
        sampling.seed = (body.seed + sample_index) % SEED_RANGE
    if options.prompt_logprobs is not None:
        sampling.prompt_logprobs = options.prompt_logprobs
    if options.structured is not None:
        sampling.structured.CopyFrom(to_wire(options.structured))
    stop = frontend_pb2.StopCriteria(
        max_tokens=max_tokens,
        stop_token_ids=body.stop_token_ids or [],
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
    )
    return frontend_pb2.GenerateRequest(
        request_id=request_id,
        model=model.name,
        prompt_token_ids=prompt,
        sampling=sampling,
        stop=stop,
        cache_salt=salt,
        priority=body.priority,
        skip_prefix_cache=options.prompt_logprobs is not None,
        tenant=tenant,
    )
