"""Tensor parallelism on CPU: two gloo ranks serve what one process serves, token for token.

The ranks are real processes (spawned, as `python -m worker -tp 2` spawns them) joined in a
gloo group; rank 0 drives a `GroupExecutor` with plans and the other rank follows. Checked:
greedy tokens equal the single-rank worker's and transformers' (MHA-style GQA split, fewer KV
heads than ranks with an odd vocabulary, tied LM heads with biases), every rank's outcome is
the same step for step (provenance refusals included), a dead rank breaks the group at once
rather than at the collective timeout, and sizes that do not divide are refused clearly.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from tests.worker.helpers import greedy, hf_greedy, hf_model, make_runner, save_hf_model
from tests.worker.tp_ranks import (
    BLOCK_SIZE,
    Job,
    greedy_plans,
    provenance_plans,
    run_rank,
    sampling_plans,
    summary,
)
from worker.executor import Executor
from worker.parallel.distributed import VocabShard, split_heads
from worker.parallel.tp_spawn import check_group

STEPS = 12
RESULT_TIMEOUT = 90


def run_group(
    jobs: list[Job], size: int = 2, reporting: tuple[int, ...] = (0, 1)
) -> dict[tuple[Any, ...], Any]:
    """Runs the jobs on `size` spawned ranks; {(rank, job name): outputs} from the
    `reporting` ranks."""
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=run_rank, args=(rank, size, store.port, jobs, results), daemon=True)
        for rank in range(size)
    ]
    for proc in procs:
        proc.start()
    got: dict[tuple[int, str], Any] = {}
    try:
        for _ in range(len(reporting) * len(jobs)):
            rank, name, outputs, sizes = results.get(timeout=RESULT_TIMEOUT)
            assert name != "error", outputs
            got[(rank, name)] = outputs
            got[(rank, name, "blocks")], got[(rank, name, "params")] = sizes
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return got


@pytest.fixture(scope="module", autouse=True)
def kernels_built(kv_cache_dir: Path) -> None:
    """The compiled kernels built (or found) in the cache the ranks will use, before any rank
    starts: a build inside a rank would run past RESULT_TIMEOUT on a two-core machine. Where
    they cannot build, the ranks fail as fast and take torch's ops, as a worker does."""
    subprocess.run([sys.executable, "-m", "worker.build_kernels"], capture_output=True, timeout=900)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    def save(name: str, kind: str, **overrides: Any) -> Path:
        return save_hf_model(tmp_path_factory.mktemp(name), kind, overrides)

    return {
        "llama": save("llama", "llama"),  # 4 heads, 2 KV heads: one KV head per rank
        # one KV head for two ranks (replicated), a vocabulary that does not split evenly
        "gqa1_odd_vocab": save("gqa1", "llama", num_key_value_heads=1, vocab_size=251),
        "tied_bias": save(
            "tied",
            "llama",
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=True,
            head_dim=32,
        ),
        "qwen2_tied": save("qwen2", "qwen2", tie_word_embeddings=True),
    }


def _prompt(vocab: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (11,), generator=gen).tolist()


def test_two_ranks_generate_what_one_rank_and_transformers_generate(models) -> None:
    prompts = {name: _prompt(251, seed=i) for i, name in enumerate(models)}
    jobs = [Job(name, path, greedy_plans(prompts[name], STEPS)) for name, path in models.items()]
    jobs.append(Job("provenance", models["llama"], provenance_plans(prompts["llama"] * 2)))
    sampling = sampling_plans(prompts["qwen2_tied"], 6)
    jobs.append(Job("sampling", models["qwen2_tied"], sampling))
    got = run_group(jobs)
    for name, path in models.items():
        steps = got[(0, name)]
        tokens = [tok for step in steps for rid, tok, err in step["sampled"] if err is None]
        runner = make_runner(path, block_size=BLOCK_SIZE, num_blocks=16)
        single = greedy(runner, prompts[name], STEPS)
        whole = sum(p.numel() for p in runner.model.parameters())
        # each rank holds its shard: about half, plus the replicated norms (and biases, and
        # a KV head replicated rather than split)
        assert all(got[(r, name, "params")] < 0.6 * whole for r in (0, 1)), name
        assert tokens == single, name
        assert tokens == hf_greedy(hf_model(path), prompts[name], STEPS), name
        assert got[(1, name)] == steps, f"{name}: the ranks disagree"
        assert got[(0, name, "blocks")] == got[(1, name, "blocks")] == 16
    prov = got[(0, "provenance")]
    assert got[(1, "provenance")] == prov
    assert [s["stale"] for s in prov] == [[], ["b"], []]
    assert 1 in prov[1]["removed"]
    assert [len(s["sampled"]) for s in prov] == [1, 0, 1]  # c read block 0: vouched for
    # seeded and unseeded sampling, penalties, logprobs, a chunked prefill and an embedding
    # pass: the ranks agree to the bit, and draw what a single-rank executor draws
    assert got[(1, "sampling")] == got[(0, "sampling")]
    single_ex = Executor(make_runner(models["qwen2_tied"], block_size=BLOCK_SIZE, num_blocks=16))
    single_steps = [summary(single_ex.step(plan)) for plan in sampling]
    assert [s["sampled"] for s in got[(0, "sampling")]] == [s["sampled"] for s in single_steps]
    assert any(s["full"][1] for s in single_steps)  # prompt logprobs were asked and given
    (_, vector), *_ = got[(0, "sampling")][0]["full"][2]  # the embedding pass
    (_, reference), *_ = single_steps[0]["full"][2]
    assert vector == pytest.approx(reference, abs=1e-5)


def test_a_dead_rank_breaks_the_group_at_once_not_at_the_timeout(models) -> None:
    plans = greedy_plans(_prompt(256, seed=9), 6)
    got = run_group([Job("die", models["llama"], plans, follower_dies_after=2)], reporting=(0,))
    verdict = got[(0, "die")]
    assert isinstance(verdict, str) and verdict.startswith("lost after"), verdict
    assert float(verdict.split()[-1].rstrip("s")) < 30  # the collective timeout is 120 s


def test_an_idle_group_outlives_the_collective_timeout(models) -> None:
    """Rank 1 waits for the next plan in a collective: rank 0's heartbeat keeps that wait
    under the timeout (5 s here: room for the ranks' start-up skew on a loaded machine, which
    the timeout also bounds) however long the group idles (8 s)."""
    plans = greedy_plans(_prompt(256, seed=4), 3)
    got = run_group([Job("idle", models["llama"], plans, idle_seconds=8.0)])
    assert isinstance(got[(0, "idle")], list), got[(0, "idle")]
    assert [len(s["sampled"]) for s in got[(0, "idle")]] == [1, 1, 1]
    assert got[(1, "idle")] == got[(0, "idle")]


def test_heads_split_as_megatron_and_vllm_do() -> None:
    assert (split_heads(8, 4, 1, 2).q_start, split_heads(8, 4, 1, 2).kv_start) == (4, 2)
    # 2 KV heads on 4 ranks: each replicated twice, rank r reads KV head r * 2 // 4
    assert [split_heads(8, 2, r, 4).kv_start for r in range(4)] == [0, 0, 1, 1]
    assert all(split_heads(8, 2, r, 4).kv_heads == 1 for r in range(4))
    assert [VocabShard.of(251, r, 2) for r in range(2)] == [
        VocabShard(0, 126, 126),
        VocabShard(126, 251, 126),
    ]


@pytest.mark.parametrize(
    ("heads", "kv", "size", "words"),
    [
        (4, 2, 3, "does not divide the model's 4 attention heads"),
        (12, 6, 4, "does not divide the model's 6 KV heads"),
        (12, 4, 6, "is not a multiple of the model's 4 KV heads"),
    ],
)
def test_a_size_that_does_not_divide_is_refused(tmp_path, heads, kv, size, words) -> None:
    import json

    from tests.worker.helpers import SMALL

    config = {
        **SMALL,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": 16 * heads,
        "intermediate_size": 96,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=words):
        check_group(size, tmp_path)


def test_the_worker_refuses_a_bad_size_before_spawning_anything(models) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "--model", str(models["llama"]), "-tp", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "--tensor-parallel-size 3 does not divide the model's 4 attention heads" in proc.stderr


def test_an_embedding_model_stays_single_rank(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(SystemExit, match="embedding model, served by a single-rank worker"):
        check_group(2, tmp_path)
