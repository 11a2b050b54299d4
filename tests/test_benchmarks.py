"""The benchmarks' pure parts: the workload they send and the GGUF weight layout for llama.cpp.
(Timings are never asserted: they live in docs/benchmarks.md.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.load import Workload, percentiles
from tools.gguf_export import gguf_name, rotate_half_to_interleaved


def test_shared_prefix_prompts_share_exactly_the_prefix_and_are_deterministic():
    wl = Workload(num_requests=5, prefix_len=64, suffix_len=8, seed=3)
    prompts = wl.prompts()
    assert prompts == wl.prompts()
    assert all(len(p) == 72 and p[:64] == prompts[0][:64] for p in prompts)
    assert len({tuple(p[64:]) for p in prompts}) == 5
    random = Workload(dataset="random", num_requests=3, suffix_len=10).prompts()
    assert [len(p) for p in random] == [10, 10, 10] and random[0][:4] != random[1][:4]


def test_percentiles_in_ms():
    assert abs(percentiles([0.001 * i for i in range(1, 101)])["p50"] - 50.5) < 1e-9
    assert percentiles([0.002]) == {"p50": 2.0, "p90": 2.0, "p99": 2.0}


def _rope(x: np.ndarray, pos: int, interleaved: bool) -> np.ndarray:
    """Rotary embedding of one head's vector, in either pairing convention."""
    dim = x.shape[-1]
    freqs = pos / 10000 ** (np.arange(0, dim, 2) / dim)
    cos, sin = np.cos(freqs), np.sin(freqs)
    if interleaved:  # llama.cpp's `llama`: pairs (0,1), (2,3), ...
        a, b = x[0::2], x[1::2]
        out = np.empty_like(x)
        out[0::2], out[1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[: dim // 2], x[dim // 2 :]  # Hugging Face: halves
    return np.concatenate([a * cos - b * sin, a * sin + b * cos])


def test_permuted_q_and_k_give_llama_cpp_the_same_attention_scores():
    """HF's rotate-half RoPE on W x equals llama.cpp's interleaved RoPE on the permuted rows,
    up to a per-head reordering of dimensions that q.k does not see."""
    rng = np.random.default_rng(0)
    heads, head_dim, hidden = 2, 8, 16
    wq, wk = rng.normal(size=(2, heads * head_dim, hidden))
    x1, x2 = rng.normal(size=(2, hidden))
    pq, pk = rotate_half_to_interleaved(wq, heads), rotate_half_to_interleaved(wk, heads)
    for h in range(heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        hf = _rope(wq[rows] @ x1, 7, False) @ _rope(wk[rows] @ x2, 3, False)
        cpp = _rope(pq[rows] @ x1, 7, True) @ _rope(pk[rows] @ x2, 3, True)
        assert np.isclose(hf, cpp)


def test_gguf_tensor_names():
    assert gguf_name("model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert gguf_name("model.layers.1.post_attention_layernorm.weight") == "blk.1.ffn_norm.weight"
    assert gguf_name("lm_head.weight") == "output.weight"


def test_chat_workload_shares_the_system_prompt_and_survives_json():
    """The real model's workload: ChatML prompts from the file's template, the system prompt
    shared token for token, each question its own; static_batches gets it back through JSON."""
    import json

    from benchmarks.peers.chat_workload import chat_workload
    from kvledger.gguf_tokenizer import load_gguf_tokenizer
    from kvledger.models import smollm2_path

    wl = chat_workload(smollm2_path(), 20, 128)
    prompts = wl.prompts()
    assert len(prompts) == 20 and len({tuple(p) for p in prompts}) == 20
    shared = len(os.path.commonprefix(prompts))
    assert 380 <= shared < min(len(p) for p in prompts) and max(len(p) for p in prompts) < 480
    text = load_gguf_tokenizer(smollm2_path()).tokenizer.decode(
        prompts[0], skip_special_tokens=False
    )
    assert text.startswith("<|im_start|>system\nYou are Ledger")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert Workload(**json.loads(json.dumps(dict(wl.__dict__)))).prompts() == prompts
    warm = wl.warm_up_prompt()  # the system prompt too, but no measured question
    assert warm not in prompts and warm[:shared] == prompts[0][:shared]


def test_the_warm_up_prompt_is_never_a_measured_one():
    """An engine that caches whole prompts would otherwise serve one measured prompt from its
    cache (a c=1 run of two requests showed a 26 ms TTFT for llama.cpp)."""
    wl = Workload(num_requests=2, max_tokens=8)
    prompts, warm = wl.prompts(), wl.warm_up_prompt()
    assert warm not in prompts and warm[: wl.prefix_len] == prompts[0][: wl.prefix_len]
    assert len(os.path.commonprefix([warm, prompts[-1]])) < wl.prefix_len + 16
    random = Workload("random", 3, suffix_len=40)
    assert random.warm_up_prompt() not in random.prompts()
    given = Workload("given", 2, given=((1, 2), (3, 4)))
    with pytest.raises(ValueError, match="one prompt more"):
        given.warm_up_prompt()
    assert Workload("given", 1, given=((1, 2), (3, 4))).warm_up_prompt() == [3, 4]


def test_cold_chat_prompts_share_no_cache_block():
    """The cold-prefill run's prompts: as long as the shared ones, but no two share a 16-token
    block (kvledger's default block size), so no prefix cache can serve any of it."""
    from benchmarks.peers.chat_workload import chat_workload
    from kvledger.models import smollm2_path

    prompts = chat_workload(smollm2_path(), 8, 8, cold=True).prompts()
    assert len({tuple(p) for p in prompts}) == 8
    for i, a in enumerate(prompts):
        for b in prompts[i + 1 :]:
            assert len(os.path.commonprefix([a, b])) < 16
    assert all(430 <= len(p) < 460 for p in prompts)


def test_the_random_sizes_cold_prompts_share_no_block_with_the_others():
    """The cold run's random prompts: as long as the shared-prefix ones and sharing no 16-token
    block with them or each other (the same seed would have repeated the shared prefix)."""
    from pathlib import Path

    from benchmarks.peers.runs import workloads

    runs = workloads(Path("unused"), "tiny", 48, 8, 4, 128)
    assert [r.key for r in runs] == [16, 1, "cold"] and not runs[2].warm_up
    cold = runs[2].workload.prompts()
    warm = runs[0].workload.prompts() + runs[1].workload.prompts()
    assert {len(p) for p in cold} == {len(warm[0])}
    for i, a in enumerate(cold):
        assert all(len(os.path.commonprefix([a, b])) < 16 for b in warm + cold[i + 1 :])
    assert [r.key for r in workloads(Path("unused"), "tiny", 48, 8, 0, 128)] == [16, 1]


def test_static_batches_pad_on_the_left_and_mask_the_padding():
    from benchmarks.peers.static_batches import left_padded

    ids, mask = left_padded([[5, 6, 7], [8, 9]], "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 8, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]]


def test_the_json_schema_comparison_cannot_end_before_max_tokens():
    """Every item takes a token at least, so the constrained run generates max_tokens tokens a
    request, as the free run (ignore_eos) does; the constraint rides in each request body."""
    import json

    from benchmarks.serving import json_schema_body

    body = json.loads(json_schema_body(64))
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["minItems"] == 64 and body["ignore_eos"] is False
    wl = Workload(extra_body=json_schema_body(64))
    assert json.loads(wl.extra_body) == body


def engine_run(tok_s: float) -> dict:
    """One engine's figures as peers.py reports them: `tok_s` at c=1, 16x it at c=16, and a
    cold TTFT that falls as `tok_s` rises (faster engines start sooner)."""
    from benchmarks.load import Summary

    ms = {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    summaries = {
        c: Summary(f"e c={c}", c, None, 1.0, 1, 1, tok_s * c, 1.0, ms, ms, ms, None)
        for c in (16, 1)
    }
    cold_ms = {k: 1000.0 / tok_s for k in ms}
    summaries["cold"] = Summary("e cold", 1, None, 1.0, 1, 1, 1.0, 1.0, cold_ms, ms, ms, None)
    return {"summaries": summaries, "memory_mib": {"p": 100.0}}


def test_peers_report_gives_every_kvledger_row_its_ratios(capsys):
    import argparse
    from pathlib import Path

    from benchmarks.peers.report import print_table

    report = {
        "kvledger": engine_run(200.0),
        "kvledger --quantization=gguf-int8": engine_run(300.0),
        "llama.cpp Q4_1": engine_run(100.0),
    }
    args = argparse.Namespace(threads=2, device="cpu", dtype=None)
    print_table(report, args, Path("m.gguf"))
    out = capsys.readouterr().out
    assert "kvledger / llama.cpp Q4_1: c=16 2.00x, c=1 2.00x, cold TTFT 0.50x" in out
    assert "kvledger --quantization=gguf-int8 / llama.cpp Q4_1: c=16 3.00x, c=1 3.00x" in out
    assert "| kvledger | 3200 | 200 | 1 | 1 | 5 | p 100 |" in out
    assert "kvledger cold: TTFT p50/p90/p99 5/5/5 ms" in out
    assert "kvledger / kvledger --quantization" not in out  # rows of ours are not peers


def test_peers_rounds_print_each_ratio_and_its_median(capsys):
    from benchmarks.peers.report import print_rounds

    rounds = [{"kvledger": engine_run(a), "vllm": engine_run(100.0)} for a in (300.0, 150.0, 210.0)]
    print_rounds(rounds)
    out = capsys.readouterr().out
    assert "ratios of 3 rounds (median first)" in out
    assert "kvledger / vllm: c=16 2.10x (3.00 / 1.50 / 2.10), c=1 2.10x (3.00 / 1.50 / 2.10)" in out
    assert "cold TTFT 0.48x (0.33 / 0.67 / 0.48)" in out  # a time: the faster, the lower


def test_peers_report_checks_every_peers_greedy_tokens_against_transformers(capsys):
    import argparse
    from pathlib import Path

    from benchmarks.peers.report import print_table

    report = {
        "transformers": {
            "tok_s": {"16": 50.0, "1": 10.0},
            "memory_mib": {"python": 1.0},
            "greedy_tokens": [[1, 2, 3], [4, 5, 6]],
        },
        "llama.cpp Q4_1": {"summaries": {}, "memory_mib": {}, "greedy_tokens": [[1, 2], [4]]},
        "vllm": {"summaries": {}, "memory_mib": {}, "greedy_tokens": [[1, 2, 3], [4, 9, 6]]},
    }
    print_table(report, argparse.Namespace(threads=2, device="cpu", dtype=None), Path("m"))
    out = capsys.readouterr().out
    assert (
        "llama.cpp Q4_1's first greedy tokens equal to transformers' (of 16, 2 prompts): [2, 1]"
        in out
    )
    assert "vllm's first greedy tokens equal to transformers' (of 16, 2 prompts): [3, 1]" in out


def test_vllm_binds_the_cores_the_benchmark_may_use():
    from benchmarks.peers.vllm_cpu import cores_bind

    cores = sorted(os.sched_getaffinity(0))
    assert cores_bind(1) == str(cores[0])
    assert cores_bind(len(cores)) == ",".join(map(str, cores))


def test_the_tool_benchmark_offers_what_its_prompts_need():
    from benchmarks.tool_auto import APPLIES, NONE_APPLIES, TOOLS

    names = {t["function"]["name"] for t in TOOLS}
    assert len(APPLIES) == len(NONE_APPLIES) == 20
    assert {tool for _, tool in APPLIES} == names  # every tool is the answer somewhere
    assert len({p for p, _ in APPLIES} | set(NONE_APPLIES)) == 40
