"""OpenAI's logit_bias in the sampler: per request, after the penalties, logprobs left raw."""

from __future__ import annotations

import pytest
import torch

from worker.runner.batch import SeqChunk
from worker.sample.sampler import Sampler
from worker.sample.sampling_params import SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def chunk(**kw) -> SeqChunk:  # noqa: ANN003
    return SeqChunk("r", [1], 9, [0], True, SamplingParams(**kw))


def test_logit_bias_moves_the_pick_per_request_and_leaves_logprobs_raw() -> None:
    rows = LOGITS.repeat(4, 1)
    chunks = [
        chunk(),  # no bias: the argmax, 5
        chunk(logit_bias={5: -100.0}),  # the argmax banned: the next best, 0
        chunk(logit_bias={4: 100.0}, logprobs=0),  # forced, while its logprob stays the model's
        chunk(logit_bias={4: 5.0, 10_000: 100.0}, temperature=1e-4, seed=1),  # off-vocab: skipped
    ]
    samples = Sampler(0)(rows, chunks)
    assert [s.token_id for s in samples] == [5, 0, 4, 4]
    assert samples[2].logprobs is not None
    assert samples[2].logprobs.logprob == pytest.approx(torch.log_softmax(LOGITS, -1)[4].item())
