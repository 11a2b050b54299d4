"""What the executor's tests share: stand-ins for the model at the edge of the unit (they
return len(context) as the token, can fail chosen requests or the whole step) and builders of
the plan messages the scheduler sends."""

from __future__ import annotations

from protos import worker_pb2
from worker.runner.batch import BatchLimits, SeqChunk
from worker.runner.pooling import EmbedItem
from worker.sample.sampler import Sample, TokenLogprobs

# Wide enough for every plan below that is not about limits.
WIDE = BatchLimits(block_size=16, num_blocks=16, vocab_size=1000, max_model_len=256)


class RecordingRunner:
    """Stands in for the model at the edge of this unit: returns len(context) as the token. A
    complete `Runner` that generates and computes no embeddings."""

    kind = "generate"
    embedding_size = 0

    def __init__(self, limits: BatchLimits = WIDE) -> None:
        self.limits = limits
        self.calls: list[list[SeqChunk]] = []

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        self.calls.append(chunks)
        return [Sample(c.end_pos) if c.sample else None for c in chunks]

    def embed(self, items: list[EmbedItem]) -> list[list[float]]:
        raise AssertionError("embedding_size 0: the executor never asks")


def bh(block_id: int, tag: bytes) -> worker_pb2.BlockHash:
    return worker_pb2.BlockHash(block_id=block_id, hash=tag)


def new_request(
    rid: str,
    tokens: list[int],
    blocks: list[int],
    computed: int,
    scheduled: int,
    claimed=(),
    written=(),
) -> worker_pb2.NewRequest:
    return worker_pb2.NewRequest(
        request_id=rid,
        token_ids=tokens,
        block_ids=blocks,
        num_computed_tokens=computed,
        num_scheduled_tokens=scheduled,
        num_prompt_tokens=len(tokens),
        claimed=list(claimed),
        written=list(written),
    )


class LimitedRunner(RecordingRunner):
    """With tight limits, which the executor checks each chunk against; can fail chosen
    requests' samples, and gives logprobs to those that ask."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        super().__init__(BatchLimits(block_size=4, num_blocks=16, vocab_size=100, max_model_len=64))
        self.fail = fail

    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        samples = super().execute(chunks)
        return [
            None
            if s is None
            else Sample(error="the model produced NaN or infinite logits")
            if c.request_id in self.fail
            else Sample(
                s.token_id,
                TokenLogprobs(-0.5, [s.token_id, 1], [-0.5, -2.0])
                if c.sampling.logprobs >= 0
                else None,
            )
            for c, s in zip(chunks, samples, strict=True)
        ]


class FailingRunner(RecordingRunner):
    def execute(self, chunks: list[SeqChunk]) -> list[Sample | None]:
        raise RuntimeError("out of memory")


def cont(rid: str, computed: int, written=()) -> worker_pb2.ContinueRequest:  # noqa: ANN001
    return worker_pb2.ContinueRequest(
        request_id=rid,
        num_computed_tokens=computed,
        num_scheduled_tokens=1,
        written=list(written),
    )
