"""Structured outputs on the real model (SmolLM2 from its GGUF file, byte-level BPE), through
the official openai client against `kvledger serve` with two workers, a KV pool small enough
that concurrent requests are preempted and recomputed, and the default bundled decode steps
(--num-scheduler-steps 4):

- every json_schema output, over seeds and temperatures from greedy to 1.5, ends with `stop`,
  parses, and validates against its schema (while the pool preempts: asserted);
- a choice is one of the choices, a regex matches whole, a Lark grammar's output parses;
- streaming and non-streaming give the same text;
- a bad schema, regex or grammar is a 400 naming it, and the server keeps serving;
- each worker builds the grammar engine's tokenizer when it starts, before any request;
- a scheduler killed mid-request (serve restarts it, the frontend resumes the streams) and a
  worker killed mid-request: the constrained requests finish with the same (seeded) output,
  still valid (each matcher is rebuilt from the outputs so far), and nothing is left held;
- LangChain's `with_structured_output(..., method="json_schema")` round-trips a model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import jsonschema
import openai
import pytest

from kvledger.models import SMOLLM2
from tests.e2e.helpers import cmdline, idle
from tests.serving import descendants, metric_sum, scrape, start_serve

# The real model on two workers sharing two cores, recomputing what the small pool preempts:
# minutes per test on a loaded machine, more than the suite's default 300 s.
pytestmark = pytest.mark.timeout(900)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 16},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 2},
    },
    "required": ["name", "age", "city", "pets"],
    "additionalProperties": False,
}
FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}
ASK = [{"role": "user", "content": "Describe a person as JSON: name, age, city and pets."}]
MAX_TOKENS = 72  # every PERSON fits: its strings and list are bounded


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # 2 workers of 12 blocks (192 tokens) each: 4 requests of ~120 tokens on a worker (their
    # system prompt shared) do not fit at once, so some are preempted and recomputed mid-output
    served = start_serve(
        tmp_path_factory.mktemp("structured"),
        "--model",
        SMOLLM2,
        "--num-workers",
        "2",
        "--num-kv-blocks",
        "12",
        timeout=600,
    )
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=600)


def person(client, **kw):  # noqa: ANN001, ANN003, ANN201
    return client.chat.completions.create(
        model=SMOLLM2, messages=ASK, max_tokens=MAX_TOKENS, response_format=FORMAT, **kw
    )


def valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    return value


def run_all(jobs: dict[int, object]) -> dict[int, object]:
    """Each job (a callable) on its own thread, at once; their results by key."""
    results: dict[int, object] = {}

    def run(key: int) -> None:
        results[key] = jobs[key]()

    threads = [threading.Thread(target=run, args=(k,)) for k in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def test_each_worker_reports_the_grammar_engine_ready_at_start(served):
    """Before any request (this module's first test), each worker has built the engine's
    tokenizer: no structured request pays for the build."""
    deadline = time.monotonic() + 120
    while served.log().count("grammar tokenizer of") < 2:
        assert time.monotonic() < deadline, served.log()[-4000:]
        time.sleep(0.1)


def test_json_schema_outputs_validate_over_seeds_and_temperatures(client, served):
    temperatures = [0.0, 0.7, 1.0, 1.5]
    jobs = {
        i: (lambda i=i: person(client, temperature=temperatures[i % 4], seed=i)) for i in range(8)
    }
    for i, out in run_all(jobs).items():
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (i, choice.message.content)
        valid(choice.message.content)
    preempted = metric_sum(scrape(served.scheduler_metrics_url), "kvledger_num_preemptions_total")
    assert preempted > 0, "the pool was meant to preempt"


def test_choice_regex_and_grammar_hold_on_completions(client):
    ask = "Is the sky blue? Answer:"
    for seed in range(4):
        kw = dict(model=SMOLLM2, prompt=ask, max_tokens=12, temperature=1.0, seed=seed)
        choice = client.completions.create(**kw, extra_body={"guided_choice": ["yes", "no"]})
        assert choice.choices[0].text in ("yes", "no")
        regex = r"\d{3}-\d{4}"
        phone = client.completions.create(
            **{**kw, "prompt": "Phone:"}, extra_body={"structured_outputs": {"regex": regex}}
        )
        assert re.fullmatch(regex, phone.choices[0].text), phone.choices[0].text
    grammar = 'start: "(" NUM ("+" NUM)~1..3 ")"\nNUM: /[1-9][0-9]?/'
    out = client.completions.create(
        model=SMOLLM2, prompt="A sum:", max_tokens=40, temperature=0.8, seed=1,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )  # fmt: skip
    assert re.fullmatch(r"\(\d{1,2}(\+\d{1,2}){1,3}\)", out.choices[0].text), out.choices[0].text


def test_json_object_on_completions_parses(client):
    out = client.completions.create(
        model=SMOLLM2, prompt="A JSON object describing a cat:", max_tokens=80, temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )  # fmt: skip
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].text), dict)
    else:  # cut by max_tokens: a prefix of an object, never anything else
        assert out.choices[0].text.startswith("{")


def test_streaming_equals_non_streaming(client):
    kw = dict(temperature=0.8, seed=7)
    whole = person(client, **kw).choices[0].message.content
    parts = person(client, stream=True, **kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole
    valid(streamed)


BAD = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nope"}},
            }
        },
        "response_format",
    ),  # noqa: E501
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: missing"}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
]


@pytest.mark.parametrize(("extra", "param"), BAD)
def test_a_bad_spec_is_a_400_naming_it_and_the_server_keeps_serving(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SMOLLM2, messages=ASK, max_tokens=4, extra_body=extra)
    assert caught.value.body["param"] == param
    assert "compile" in caught.value.body["message"] or "non-empty" in caught.value.body["message"]
    out = person(client, temperature=0)
    valid(out.choices[0].message.content)


def test_langchain_with_structured_output_round_trips(served):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Pet(BaseModel):
        name: str = Field(max_length=16)
        kind: str = Field(max_length=8)
        legs: int = Field(ge=0, le=8)

    llm = ChatOpenAI(
        model=SMOLLM2, base_url=f"{served.url}/v1", api_key="x", temperature=0, max_tokens=64
    )
    pet = llm.with_structured_output(Pet, method="json_schema").invoke("Describe a pet.")
    assert isinstance(pet, Pet)


def stream_person(client, kw: dict, progress: list[int], i: int) -> str:  # noqa: ANN001
    chunks = person(client, stream=True, **kw)
    text = []
    for c in chunks:
        if c.choices and c.choices[0].delta.content:
            text.append(c.choices[0].delta.content)
            progress[i] += 1
    return "".join(text)


def test_a_scheduler_killed_mid_request_leaves_valid_outputs(client, served):
    """serve restarts a killed scheduler, the workers register again, and the frontend
    re-submits each live request with its outputs so far: every worker builds a fresh matcher
    that replays them, so the seeded outputs end as an undisturbed run does, still valid, and
    the new scheduler's ledger is empty afterwards."""
    kw = [dict(temperature=1.0, seed=200 + i) for i in range(4)]
    reference = {i: person(client, **k).choices[0].message.content for i, k in enumerate(kw)}
    frontend = f"{served.url}/metrics"
    resumed_before = metric_sum(
        scrape(frontend), "kvledger_request_resumptions_total", outcome="resumed"
    )
    scheduler = next(p for p in descendants(served.process.pid) if "-m scheduler_svc" in cmdline(p))
    progress = [0] * len(kw)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = stream_person(client, kw[i], progress, i)
        except Exception as err:  # noqa: BLE001 - reported below
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(kw))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while sum(1 for n in progress if n >= 2) < 2:  # two streams under way, mid-JSON
        assert time.monotonic() < deadline, f"streams did not start: {progress}"
        time.sleep(0.005)
    killed_at = list(progress)
    os.kill(scheduler, signal.SIGKILL)
    for t in threads:
        t.join(600)
    assert results == reference, killed_at
    for text in results.values():
        valid(text)
    after = scrape(frontend)
    assert metric_sum(after, "kvledger_request_resumptions_total", outcome="gave_up") == 0
    resumed = metric_sum(after, "kvledger_request_resumptions_total", outcome="resumed")
    assert resumed > resumed_before, "no request was live when the scheduler died"
    assert idle(served), "the restarted scheduler's ledger is not empty"
    valid(person(client, temperature=0).choices[0].message.content)  # still serving


def test_a_worker_killed_mid_request_leaves_valid_outputs(client, served):
    """Last: the kill restarts worker-0. Seeded sampling draws the same token at each
    position wherever it runs, so the moved requests end as an undisturbed run does."""
    kw = [dict(temperature=1.0, seed=100 + i) for i in range(4)]
    reference = {i: person(client, **k).choices[0].message.content for i, k in enumerate(kw)}
    victim = next(
        p
        for p in descendants(served.process.pid)
        if "-m worker" in cmdline(p) and "worker-0" in cmdline(p)
    )

    def stream(i: int) -> str:
        chunks = person(client, stream=True, **kw[i])
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    results: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, stream(i))) for i in range(4)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    metrics = served.scheduler_metrics_url
    while metric_sum(scrape(metrics), "kvledger_num_requests_running", worker="worker-0") == 0:
        assert time.monotonic() < deadline, "worker-0 never got a request"
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(600)
    assert results == reference
    for text in results.values():
        valid(text)
    assert "worker worker-0 lost" in served.log()
