"""Greedy outputs: cache on == cache off == Hugging Face transformers, under concurrency with a
KV pool small enough to force preemption; quiescence leaves an empty ledger."""

from __future__ import annotations

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


@pytest.mark.parametrize("caching", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_greedy_matches_reference_under_preemption(tmp_path, reference, caching):
    # 24 blocks of 16 tokens cannot hold 8 requests of ~80 tokens at once: preemption happens.
    served = start_serve(tmp_path, caching, "--num-kv-blocks", "24", "--max-num-seqs", "8")
    try:
        texts = run_concurrently(served.url)
        assert texts == reference
        samples = scrape(served.scheduler_metrics_url)
        assert metric_sum(samples, "kvledger_num_preemptions_total") > 0
        assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
        assert metric_sum(samples, "kvledger_tracker_entries") == 0
        assert metric_sum(samples, "kvledger_tracker_orphans_total") == 0
        hits = metric_sum(samples, "kvledger_prefix_cache_hits_total")
        assert (hits > 0) == (caching == "--enable-prefix-caching")
    finally:
        served.stop()
