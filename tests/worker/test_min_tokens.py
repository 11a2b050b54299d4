"""min_tokens masks EOS and stop ids until reached (vLLM's semantics): the masked ids are not
sampled, shown or counted before the request has min_tokens outputs, in a lone step and in
every step of a bundle; after it, they are sampled as usual."""

from __future__ import annotations

import torch

from protos import frontend_pb2
from scheduler_svc.wire import sampling_with_min_tokens
from worker.link.wire import sampling_from_wire
from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sampler
from worker.sample.sampling_params import SamplingParams

EOS, STOP = 5, 0
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])  # greedy: EOS, then STOP


def chunk(num_outputs: int, prompt: int = 4, **kw) -> SeqChunk:  # noqa: ANN003
    """A decode chunk of a request with `prompt` prompt tokens and `num_outputs` outputs."""
    end = prompt + num_outputs
    return SeqChunk("r", [1], end - 1, [0], True, SamplingParams(**kw), [1] * end, prompt)


def test_masked_ids_are_not_sampled_until_min_tokens() -> None:
    sampler = Sampler(0)
    masked = {"min_tokens": 3, "min_tokens_masked": (EOS, STOP)}
    rows = LOGITS.repeat(5, 1)
    chunks = [
        chunk(0, **masked),  # the prefill's sample: no outputs yet
        chunk(2, **masked),
        chunk(3, **masked),  # reached: EOS again
        chunk(0),  # no min_tokens in the same batch
        chunk(1, min_tokens=3, min_tokens_masked=(EOS,)),  # ignore_eos kept STOP off the list
    ]
    assert [s.token_id for s in sampler(rows, chunks)] == [1, 1, EOS, EOS, STOP]


def test_the_masked_token_draws_nothing_at_any_temperature() -> None:
    sampler = Sampler(0)
    rows = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 8.0]]).repeat(64, 1)
    chunks = [
        chunk(1, temperature=1.5, seed=s, min_tokens=2, min_tokens_masked=(EOS,)) for s in range(64)
    ]
    assert EOS not in {s.token_id for s in sampler(rows, chunks)}


def test_the_scheduler_masks_stop_ids_and_eos_unless_ignored() -> None:
    request = frontend_pb2.GenerateRequest(
        sampling=frontend_pb2.SamplingParams(temperature=0.5),
        stop=frontend_pb2.StopCriteria(max_tokens=9, stop_token_ids=[7, 3], min_tokens=2),
    )
    sampling = sampling_from_wire(sampling_with_min_tokens(request, [2]))
    assert (sampling.min_tokens, sampling.min_tokens_masked) == (2, (2, 3, 7))
    assert sampling.temperature == 0.5
    request.stop.ignore_eos = True
    assert sampling_from_wire(sampling_with_min_tokens(request, [2])).min_tokens_masked == (3, 7)
    request.stop.min_tokens = 0
    assert sampling_from_wire(sampling_with_min_tokens(request, [2])).min_tokens_masked == ()


def test_a_continuations_resumed_tokens_count_toward_min_tokens() -> None:
    """A continuation (resumed_token_ids) reaches a worker as one prefill of its prompt and the
    tokens already sent: those are outputs, so with 3 of them min_tokens=3 is reached and
    min_tokens=4 is not. Counting from the prompt alone would mask EOS for 3 tokens too many."""
    sampler = Sampler(0)
    prompt, resumed = 4, 3
    end = prompt + resumed

    def continuation(min_tokens: int) -> SeqChunk:
        params = SamplingParams(min_tokens=min_tokens, min_tokens_masked=(EOS, STOP))
        return SeqChunk("r", [1] * end, 0, [0], True, params, [1] * end, prompt)

    rows = LOGITS.repeat(2, 1)
    assert [s.token_id for s in sampler(rows, [continuation(3), continuation(4)])] == [EOS, 1]
