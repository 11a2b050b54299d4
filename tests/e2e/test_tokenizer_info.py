"""Evaluation harnesses with no tokenizer of their own: GET /tokenizer_info (vLLM's shape) and
/tokenize and /detokenize without `model`, in the frontend in this process over stand-in
workers (tests/e2e/stand_in.py). lm-eval's `local-completions` is replayed request by request
in the shapes its remote tokenizer sends (lm_eval/utils.py: RemoteTokenizer and
check_remote_tokenizer_support; lm_eval/models/openai_completions.py: the loglikelihood
payload): lm-eval itself is not a test dependency (it brings datasets, pandas and pyarrow)."""

from __future__ import annotations

import asyncio
import json
import math

from kvledger.models import smollm2_path
from server.app import Settings
from tests.e2e.helpers import with_app
from tests.e2e.stand_in import EMBED, TINY_LLAMA_VOCAB, stand_in_worker
from tests.service.helpers import ScoringRunner, wait_for

CONTEXT, CONTINUATION = "The ledger", " says hello"


def serve(scheduler, requests) -> list:  # noqa: ANN001
    """Runs `requests(http)` (a coroutine function) against a frontend in this process."""

    async def body(app, http):  # noqa: ANN001, ANN202
        del app
        return await requests(http)

    return asyncio.run(with_app(Settings(scheduler=scheduler.target), body))


async def lm_eval_loglikelihood(http) -> dict:  # noqa: ANN001
    """What local-completions sends, in order, to score CONTINUATION after CONTEXT."""
    info = await http.get("/tokenizer_info")  # the probe: it needs `eos_token`
    probe = await http.post("/tokenize", json={"prompt": "test", "add_special_tokens": False})

    async def encode(text: str) -> list[int]:
        reply = await http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
        assert reply.status_code == 200, reply.text
        return reply.json()["tokens"]

    eos_id = (await encode(info.json()["eos_token"]))[0]
    bos_id = (await encode(info.json()["bos_token"]))[0]
    whole = await encode(CONTEXT + CONTINUATION)
    context = await encode(CONTEXT)
    payload = {
        "model": "m", "prompt": [whole], "temperature": 0, "max_tokens": 1, "logprobs": 1,
        "seed": 1234, "echo": True,
    }  # fmt: skip
    scored = await http.post("/v1/completions", json=payload)
    decoded = await http.post("/detokenize", json={"tokens": whole})
    return dict(
        info=info, probe=probe, eos_id=eos_id, bos_id=bos_id, whole=whole, context=context,
        scored=scored, decoded=decoded,
    )  # fmt: skip


def test_lm_evals_remote_tokenizer_scores_a_continuation(scheduler, model_dir):
    runner = ScoringRunner()
    with stand_in_worker(scheduler.target, "m", model_dir, runner, **TINY_LLAMA_VOCAB):
        wait_for(lambda: len(scheduler.engine.links) == 1)
        seen = serve(scheduler, lm_eval_loglikelihood)
    info = seen["info"].json()
    assert seen["info"].status_code == 200
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == ("[SEP]", "[CLS]", "[PAD]")
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["chat_template"].startswith("{{ bos_token }}")
    assert info["model_max_length"] == 256  # the context served, not the tokenizer's 2048
    assert model_dir not in json.dumps(info)  # no server paths
    assert isinstance(seen["probe"].json()["tokens"], list)
    assert (seen["eos_id"], seen["bos_id"]) == (102, 101)
    whole, context = seen["whole"], seen["context"]
    assert whole[: len(context)] == context and len(whole) > len(context)
    assert seen["scored"].status_code == 200, seen["scored"].text
    logprobs = seen["scored"].json()["choices"][0]["logprobs"]
    # lm-eval sums token_logprobs[ctxlen:-1]: the continuation's, the one generated token off
    continuation = logprobs["token_logprobs"][len(context) : -1]
    assert len(continuation) == len(whole) - len(context)
    assert all(math.isfinite(lp) for lp in continuation)
    assert len(logprobs["top_logprobs"]) == len(logprobs["token_logprobs"])
    assert seen["decoded"].json()["prompt"] == (CONTEXT + CONTINUATION).lower()


def test_model_defaults_to_the_only_generative_model(scheduler, model_dir):
    async def requests(http):  # noqa: ANN001, ANN202
        return [
            await http.post("/tokenize", json={"prompt": "hi"}),
            await http.post("/detokenize", json={"tokens": [7592]}),
            await http.get("/tokenizer_info"),
        ]

    async def named(http):  # noqa: ANN001, ANN202
        return [
            await http.post("/tokenize", json={"model": "b", "prompt": "hi"}),
            await http.get("/tokenizer_info", params={"model": "b"}),
            await http.get("/tokenizer_info", params={"model": "nope"}),
        ]

    with (
        stand_in_worker(scheduler.target, "a", model_dir, **TINY_LLAMA_VOCAB),
        stand_in_worker(scheduler.target, "e", model_dir, kind=EMBED, **TINY_LLAMA_VOCAB),
    ):
        wait_for(lambda: len(scheduler.engine.links) == 2)
        alone = serve(scheduler, requests)  # the embedding model is not a candidate
        with stand_in_worker(scheduler.target, "b", model_dir, **TINY_LLAMA_VOCAB):
            wait_for(lambda: len(scheduler.engine.links) == 3)
            several = serve(scheduler, requests)
            chosen = serve(scheduler, named)
    assert [r.status_code for r in alone] == [200, 200, 200], [r.text for r in alone]
    assert alone[0].json()["tokens"] == [101, 7632]  # [CLS] hi
    assert alone[1].json()["prompt"] == "hello"
    for reply in several:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "model" and "a, b" in error["message"]
    assert [r.status_code for r in chosen] == [200, 200, 404]


def test_a_gguf_files_tokenizer_info(scheduler):
    """The file's special tokens and template, as `kvledger export-tokenizer` writes them."""
    path = str(smollm2_path())
    with stand_in_worker(scheduler.target, "s", path, vocab_size=49152, eos_token_ids=(2,)):
        wait_for(lambda: len(scheduler.engine.links) == 1)

        async def requests(http):  # noqa: ANN001, ANN202
            info = await http.get("/tokenizer_info")
            body = {"prompt": info.json()["eos_token"], "add_special_tokens": False}
            return info, await http.post("/tokenize", json=body)

        info, eos = serve(scheduler, requests)
    assert info.status_code == 200, info.text
    found = info.json()
    assert (found["eos_token"], found["bos_token"]) == ("<|im_end|>", "<|im_start|>")
    assert found["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>assistant" in found["chat_template"]
    assert path not in json.dumps(found)
    assert eos.json()["tokens"] == [2]
