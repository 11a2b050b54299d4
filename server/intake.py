"""The scheduler's responses into a choice (server/choice.py): tokens detokenized, logprob
entries recorded, stop strings cut, a bundle's tokens taken one at a time where stop strings
need it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvledger.structured import CONSTRAINT_FAILED
from protos import frontend_pb2
from server.choice import Choice, Generation, TokenEntry
from server.errors import APIError


def apply_response(
    generation: Generation, choice: Choice, response: frontend_pb2.GenerateResponse
) -> bool:
    """Takes one response into the choice; True when a stop string ended a request that the
    scheduler still runs (it must be told).

    A response may carry several tokens (a bundle's, `--num-scheduler-steps`). With stop
    strings they are taken one at a time, so that the tokens after the one that completes a
    stop string are neither shown nor counted in usage, as when each came alone."""
    if not (generation.stops and len(response.token_ids) > 1 and not choice.echo_only):
        return _apply_one(generation, choice, response)
    for part in _one_token_each(response):
        ended_early = _apply_one(generation, choice, part)
        if choice.finish_reason is not None:
            return ended_early and not response.finish_reason
    return False


def _one_token_each(
    response: frontend_pb2.GenerateResponse,
) -> Iterator[frontend_pb2.GenerateResponse]:
    """The response as single-token responses: the prompt logprobs with the first, the finish
    with the last."""
    last = len(response.token_ids) - 1
    for i, token in enumerate(response.token_ids):
        part = frontend_pb2.GenerateResponse(
            token_ids=[token],
            num_prompt_tokens=response.num_prompt_tokens,
            num_cached_tokens=response.num_cached_tokens,
        )
        if response.logprobs:
            part.logprobs.append(response.logprobs[i])
        if i == 0:
            part.prompt_logprobs.extend(response.prompt_logprobs)
        if i == last:
            part.finish_reason, part.message = response.finish_reason, response.message
        yield part


def _apply_one(
    generation: Generation, choice: Choice, response: frontend_pb2.GenerateResponse
) -> bool:
    if choice.wants_prompt_logprobs and choice.prompt_entries is None:
        _add_prompt_entries(generation, choice, response.prompt_logprobs)
    if not choice.echo_only:
        _push(choice, response)
    if response.finish_reason:
        if response.finish_reason == "error":
            message = response.message or "the worker failed this request"
            raise APIError(400 if message.startswith(CONSTRAINT_FAILED) else 500, message)
        choice.text += choice.detokenizer.flush()
        length = response.finish_reason == "length" or choice.echo_only
        choice.finish_reason = "length" if length else "stop"
    stops = generation.stops
    if stops and _cut_at_stop(choice, stops, generation.include_stop):
        choice.finish_reason = "stop"
        if choice.entries is not None:
            choice.entries = [e for e in choice.entries if e.offset < len(choice.text)]
        return not response.finish_reason
    return False


def _push(choice: Choice, response: frontend_pb2.GenerateResponse) -> None:
    choice.token_ids.extend(response.token_ids)
    if choice.entries is None:
        choice.text += choice.detokenizer.push(list(response.token_ids))
        return
    # Token by token, so that each token's text offset is known.
    for token, entry in zip(response.token_ids, response.logprobs, strict=True):
        offset = len(choice.text)
        choice.text += choice.detokenizer.push([token])
        choice.entries.append(TokenEntry.of(entry, offset))


def _add_prompt_entries(
    generation: Generation, choice: Choice, entries: Sequence[frontend_pb2.TokenLogprob]
) -> None:
    """All sent with the first response: the first token has no logprob; one the scheduler
    did not send (a bug signal it logs) has none either."""
    prompt = generation.prompts[choice.prompt_index]
    scored: list[TokenEntry | None] = [None, *(TokenEntry.of(e) for e in entries)]
    choice.prompt_entries = (scored + [None] * len(prompt))[: len(prompt)]


def _cut_at_stop(choice: Choice, stops: list[str], include: bool) -> bool:
    """Cuts the text at its earliest stop string (after it, with `include`); True on a hit."""
    window_start = max(0, choice.sent - max(len(s) for s in stops))
    hits = [(i, len(s), s) for s in stops if (i := choice.text.find(s, window_start)) != -1]
    if not hits:
        return False
    at, length, choice.stop_string = min(hits)
    choice.text = choice.text[: at + length if include else at]
    return True
