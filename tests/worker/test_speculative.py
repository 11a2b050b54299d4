"""Speculative decoding over a real model: the scheduler's core drafts, the real executor and
runner verify, both wires translate between them, and every token equals what the same
requests give without speculation: greedy, and seeded sampling with penalties, filters and
logprobs, alone and several requests together on a pool small enough to preempt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from protos import frontend_pb2
from scheduler_svc.core import Request, Scheduler, SchedulerConfig
from scheduler_svc.core.speculative import SpecConfig
from scheduler_svc.wire import model_result_from, plan_from_output
from tests.worker.helpers import make_runner, random_tokens, wire_step
from worker.executor import Executor
from worker.runner.model_runner import ModelRunner

# drafting at every batch size: these tests batch up to 40 requests
NGRAM = SpecConfig(
    num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3, disable_by_batch_size=64
)
SUFFIX = SpecConfig(
    method="suffix", num_speculative_tokens=6, prompt_lookup_min=1, disable_by_batch_size=64
)
# a random model's greedy text falls into loops that drafts then follow; its prompt repeats too
PROMPT = random_tokens(12, 256, seed=7) * 3


@dataclass
class Live:
    """What plan_from_output reads of the service's LiveRequest."""

    sampling: frontend_pb2.SamplingParams
    embed: None = None

    def plan_sampling(self) -> frontend_pb2.SamplingParams:
        return self.sampling


@dataclass
class Outcome:
    tokens: dict[str, list[int]]
    logprobs: dict[str, list[float]]
    accepted: int
    drafted: int


@pytest.fixture(scope="module")
def runner(hf_checkpoint) -> ModelRunner:  # noqa: ANN001
    return make_runner(Path(hf_checkpoint("llama")), num_blocks=64, block_size=4)


def serve(
    runner: ModelRunner,
    spec: SpecConfig | None,
    sampling: list[frontend_pb2.SamplingParams],
    max_tokens: int = 24,
    num_blocks: int = 64,
) -> Outcome:
    cfg = SchedulerConfig(
        num_blocks=num_blocks,
        block_size=4,
        max_model_len=256,
        speculative=spec,
        debug_invariants=True,
    )
    sched, ex = Scheduler(cfg), Executor(runner)
    ex.reset()
    live = {f"r{i}": Live(sp) for i, sp in enumerate(sampling)}
    for i, rid in enumerate(live):
        sched.add_request(Request(rid, [i + 1, *PROMPT], max_tokens=max_tokens))
    tokens: dict[str, list[int]] = {rid: [] for rid in live}
    logprobs: dict[str, list[float]] = {rid: [] for rid in live}
    for _ in range(400):
        out = sched.schedule()
        if out.is_empty:
            break
        result = wire_step(ex, plan_from_output(out, live.__getitem__))
        for update in sched.update_from_output(out, model_result_from(result)):
            assert update.finish_reason in (None, "length"), update.finish_message
            tokens[update.request_id] += update.new_token_ids
            payload = update.payload
            sent = payload if isinstance(payload, list) else [payload] if payload else []
            logprobs[update.request_id] += [p.logprob for p in sent][: len(update.new_token_ids)]
    snap = sched.snapshot()
    assert (snap.blocks_in_use, snap.tracker_entries, snap.num_running) == (0, 0, 0)
    return Outcome(tokens, logprobs, snap.spec_accepted_tokens, snap.spec_draft_tokens)


def greedy() -> frontend_pb2.SamplingParams:
    return frontend_pb2.SamplingParams(temperature=0.0)


def seeded(seed: int) -> frontend_pb2.SamplingParams:
    return frontend_pb2.SamplingParams(
        temperature=0.8, top_p=0.95, top_k=40, presence_penalty=0.3, seed=seed, logprobs=2
    )


@pytest.mark.parametrize("spec", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_greedy_tokens_are_the_same_with_drafts_kept_and_rejected(runner, spec):  # noqa: ANN001
    off = serve(runner, None, [greedy()])
    on = serve(runner, spec, [greedy()])
    assert on.tokens == off.tokens
    assert 0 < on.accepted < on.drafted  # both verdicts happened


def test_seeded_sampling_with_penalties_gives_the_same_tokens_and_logprobs(runner):  # noqa: ANN001
    sampling = [seeded(s) for s in range(4)]
    off = serve(runner, None, sampling)
    on = serve(runner, NGRAM, sampling)
    assert on.tokens == off.tokens
    assert on.drafted > 0
    for rid, values in off.logprobs.items():
        assert len(on.logprobs[rid]) == len(values) == len(off.tokens[rid])
        assert on.logprobs[rid] == pytest.approx(values, abs=1e-4)


def test_many_requests_on_a_pool_that_preempts_give_the_same_tokens(runner):  # noqa: ANN001
    sampling = [greedy(), seeded(3), greedy(), seeded(9)]
    off = serve(runner, None, sampling, num_blocks=24)
    on = serve(runner, NGRAM, sampling, num_blocks=24)
    assert on.tokens == off.tokens and on.accepted > 0


def test_the_kept_tokens_follow_the_model_over_many_seeds(runner):  # noqa: ANN001
    """The rejection rule, checked where it decides: with no filter, each of 40 seeds gives the
    same tokens with and without drafts (temperature 0.05: this random model is nearly flat).
    A rule that kept a draft the model did not sample (say, any draft it gives over 10%) would
    change some of them."""
    sampling = [frontend_pb2.SamplingParams(temperature=0.05, seed=s) for s in range(40)]
    off = serve(runner, None, sampling, max_tokens=8)
    on = serve(runner, NGRAM, sampling, max_tokens=8)
    assert on.tokens == off.tokens
    assert on.drafted > on.accepted > 0


def test_a_structured_request_keeps_no_draft_even_if_one_came():
    from worker.runner.batch import SeqChunk
    from worker.sample.sampler import Sample
    from worker.sample.verify import draft_views, verdicts

    chunk = SeqChunk("r", [5, 6, 7], 4, [0, 1], True, num_drafts=2, constraint=object())  # type: ignore[arg-type]
    views = draft_views([chunk], [0])
    assert [v.end_pos for _, v in views] == [5]  # the last known token's position only
    [verdict] = verdicts([chunk], [0], views, [Sample(6)])
    assert (verdict.token_id, verdict.accepted_ids) == (6, [])
