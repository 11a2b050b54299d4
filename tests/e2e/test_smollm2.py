"""The default model, SmolLM2-135M-Instruct from its Q4_1 GGUF file (installed by make install),
served by `kvledger serve` with no --model: greedy chat equals transformers' GGUF path
(float32) token for token, it answers a factual question right, streaming equals
non-streaming, and concurrent chats sharing a system prompt hit the prefix cache and answer
as they do one at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from kvledger.models import SMOLLM2, smollm2_path
from tests.serving import start_serve

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give me a tip for learning Python.",
]
SYSTEM = (
    "You are a concise assistant for a bookshop. Answer in one or two short sentences, "
    "stay polite, and never invent facts about books you do not know."
)
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    # start_serve pins the suite's tiny-llama unless told; the default is checked below
    tmp = tmp_path_factory.mktemp("smollm2")
    served = start_serve(tmp, "--model", SMOLLM2, "--num-kv-blocks", "512")
    # generous: the first request waits for the frontend to read the file's tokenizer
    yield openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=600)
    served.stop()


@pytest.fixture(scope="module")
def reference():
    """transformers loading the same GGUF file (dequantized to float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    return tokenizer, model


def chat(client, content: str, system: str | None = None, **kw):  # noqa: ANN003, ANN201
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    return client.chat.completions.create(
        model=SMOLLM2, messages=messages, max_tokens=MAX_TOKENS, temperature=0, **kw
    )


def hf_greedy_chat(reference, content: str) -> list[str]:
    """transformers' greedy tokens for the chat, each as its own text, up to and with the
    EOS (<|im_end|>), as the chat logprobs list them."""
    tokenizer, model = reference
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=2
        )
    return [tokenizer.decode([t]) for t in out[0, len(ids) :].tolist()]


def test_default_model_is_smollm2():
    from kvledger.children import serve_parser

    args = serve_parser().parse_args([])
    assert args.model == SMOLLM2


def test_greedy_chat_equals_transformers_gguf(client, reference):
    for content in PROMPTS:
        reply = chat(client, content, logprobs=True)
        tokens = [entry.token for entry in reply.choices[0].logprobs.content]
        assert tokens == hf_greedy_chat(reference, content), content
        assert reply.choices[0].message.content == "".join(tokens).removesuffix("<|im_end|>")


def test_answers_a_factual_question(client):
    answer = chat(client, "What is the capital of France?").choices[0].message.content
    assert "Paris" in answer


def test_streaming_equals_non_streaming(client):
    for content in PROMPTS[:3]:
        whole = chat(client, content).choices[0].message.content
        stream = chat(client, content, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


def test_concurrent_chats_share_the_system_prompt(client):
    questions = [f"Do you have a copy of book number {i}?" for i in range(16)]
    chat(client, "Hello!", SYSTEM)  # the shared system prompt is now in the cache
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda q: chat(client, q, SYSTEM), questions))
    alone = [chat(client, q, SYSTEM) for q in questions]
    for a, b in zip(together, alone, strict=True):
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.usage.prompt_tokens_details.cached_tokens >= 16, "system prompt from the cache"
