"""Greedy outputs: cache on == cache off == Hugging Face transformers, under concurrency with a
KV pool small enough to force preemption; quiescence leaves an empty ledger."""

from __future__ import annotations

import importlib.util
import threading

import openai
import pytest
import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from kvledger.models import resolve_model
from server.detokenizer import IncrementalDetokenizer
from tests.serving import metric_sum, scrape, start_serve

MODEL = "tiny-llama"
MAX_TOKENS = 40
SHARED = "Every block in the pool is accounted for by the ledger, and every entry "
PROMPTS = [SHARED * 2 + f"variant {i} " * (1 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def reference() -> list[str]:
    path = resolve_model(MODEL)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    texts = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                min_new_tokens=MAX_TOKENS,
                pad_token_id=0,
            )
        new = out[0, len(ids) :].tolist()
        detok = IncrementalDetokenizer(tokenizer, ids)
        texts.append(detok.push(new) + detok.flush())
    return texts


def run_concurrently(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    texts: list[str | None] = [None] * len(PROMPTS)

    def one(i: int) -> None:
        out = client.completions.create(
            model=MODEL,
            prompt=PROMPTS[i],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        texts[i] = out.choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return texts  # type: ignore[return-value]


SPECULATIVE = (
    "--speculative-config",
    '{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 8}',
)


@pytest.mark.parametrize(
    "flags",
    [("--enable-prefix-caching",), ("--no-enable-prefix-caching",), SPECULATIVE],
    ids=["cache-on", "cache-off", "speculative"],
)
def test_greedy_matches_reference_under_preemption(tmp_path, reference, flags):
    # Each request grows to ~75 tokens (5 blocks of 16); 12 blocks cannot hold three of them:
    # preemption happens however the 8 arrive and however many steps a message carries.
    served = start_serve(tmp_path, *flags, "--num-kv-blocks", "12", "--max-num-seqs", "8")
    try:
        texts = run_concurrently(served.url)
        assert texts == reference
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_num_preemptions_total") > 0
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
        assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
        hits = metric_sum(samples, "kvledger_prefix_cache_hits_total")
        assert (hits > 0) == ("--no-enable-prefix-caching" not in flags)
        accepted = metric_sum(samples, "kvledger_spec_decode_num_accepted_tokens_total")
        drafted = metric_sum(samples, "kvledger_spec_decode_num_draft_tokens_total")
        assert (drafted >= accepted > 0) == (flags == SPECULATIVE)
    finally:
        served.stop()


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"
)


@needs_cuda
@pytest.mark.parametrize("caching", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_greedy_on_cuda_matches_reference_under_preemption(tmp_path, reference, caching):
    """The same, with the worker on the GPU (float32, hence the torch attention backend)."""
    served = start_serve(
        tmp_path,
        caching,
        *("--num-kv-blocks", "12", "--max-num-seqs", "8", "--device", "cuda"),
        *("--dtype", "float32"),
    )
    try:
        assert run_concurrently(served.url) == reference
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_num_preemptions_total") > 0
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
    finally:
        served.stop()


@needs_cuda
@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="needs the flash-attn package"
)
def test_flash_attn_serving_under_preemption_leaks_nothing(tmp_path):
    """bfloat16 through flash-attn with 256-token blocks: 8 requests share a one-block prefix
    and each grows into a third block, which 12 blocks cannot hold at once, so preemption,
    prefix hits, and an empty ledger after. (The numerics are tests/worker/test_cuda.py's:
    flash-attn against the torch backend per layer, and greedy up to rounding.)"""
    served = start_serve(
        tmp_path,
        *("--num-kv-blocks", "12", "--block-size", "256", "--max-num-seqs", "8"),
        *("--device", "cuda", "--dtype", "bfloat16", "--attention-backend", "flash_attn"),
    )
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=300)
    shared = [1000 + i for i in range(256)]
    lengths: list[int] = [0] * 8

    def one(i: int) -> None:
        out = client.completions.create(
            model=MODEL,
            prompt=shared + [5000 + 10 * i + j for j in range(10)],
            max_tokens=250,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        lengths[i] = out.usage.completion_tokens

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert lengths == [250] * 8
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_num_preemptions_total") > 0
        assert metric_sum(samples, "kvledger_prefix_cache_hits_total") > 0
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
        assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
    finally:
        served.stop()


@needs_cuda
@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="needs the flash-attn package"
)
def test_cuda_defaults_serve_through_flash_attn_with_graphs(tmp_path):
    """`kvledger serve --device cuda` and nothing else: bfloat16, flash-attn at 256-token
    blocks, decode steps as CUDA graphs, each chosen and said in the log; 8 concurrent requests
    of 300-token prompts complete and leave the ledger empty."""
    served = start_serve(tmp_path, "--device", "cuda", "--max-num-seqs", "8")
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=300)
    lengths: list[int] = [0] * 8

    def one(i: int) -> None:
        out = client.completions.create(
            model=MODEL,
            prompt=[1000 + 7 * i + j for j in range(300)],
            max_tokens=60,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        lengths[i] = out.usage.completion_tokens

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert lengths == [60] * 8
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
    finally:
        served.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "attention flash_attn on cuda, torch.bfloat16, KV blocks of 256 tokens" in log
    assert "CUDA graphs for decode steps of up to 64 sequences" in log
    assert "multiple of 256" in log  # the reason, from worker/device_defaults.py
