"""Schema-driven fuzzing of the frontend's HTTP API: schemathesis reads the running frontend's
own /openapi.json and sends generated requests, valid and invalid, over real HTTP to a live
stack (frontend, scheduler, a generative and an embedding worker) started with an API key.

Every response must conform to the schema (status codes, content types, headers, bodies), no
response may be a 5xx, every error must be in OpenAI's shape (Anthropic's under /v1/messages),
requests without the key must be refused, a wrong method must be a 405 that says which is
allowed, invalid data must be refused, and afterwards the server must still complete and its
ledger must be idle (the last test).

Two of schemathesis' judgements are not this server's contract. Schema-valid requests may be
refused: the server checks what the schema cannot say (token ids below the vocabulary size,
non-empty prompts, the context length, the request limits), so positive_data_acceptance is off.
And invalid values that pydantic's lax mode converts are accepted (see _not_a_lax_conversion).

A failure prints schemathesis' seed; put it in the config ("seed": ...) to replay the run."""

from __future__ import annotations

import json
import zlib
from collections import Counter, defaultdict

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import engine
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.engine import Status, events

from server.responses_api.protocol import NO_OPS
from tests.e2e.fuzz_checks import ANTHROPIC, GENERATING, RESPONSES, is_anthropic
from tests.e2e.helpers import idle
from tests.e2e.stacks import Stack

KEY = "key-schema-fuzz"
MODEL, EMBEDDING_MODEL = "tiny-llama", "all-MiniLM-L6-v2"
MAX_EXAMPLES = 50  # per operation, fuzzing phase; the coverage phase adds its own cases
# The server's own limits keep generated work small: a context of 64 tokens caps max_tokens
# (a larger request is a 400) and at most 16 sequences run per request.
SERVER_LIMITS = (
    "--max-model-len",
    "64",
    "--max-n",
    "4",
    "--max-prompts-per-request",
    "16",
    "--max-embedding-inputs",
    "16",
    "--num-kv-blocks",  # --debug-invariants checks the whole pool every step
    "128",
)
# A cross-encoder's routes are left out: this stack serves none (serve's one embedding worker
# serves all-MiniLM-L6-v2), so none could succeed here, and fuzzing them took the fuzz
# past its timeout on two cores. Their shapes and refusals are tests/e2e/test_rerank.py's.
CROSS_ENCODER_PATHS = "^/(v[12]/)?(rerank|score)$"
CROSS_ENCODER_ROUTES = {
    f"POST {path}" for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score")
}


STACK = Stack(("--api-key", KEY, *SERVER_LIMITS), embedding=True)


def _widened(ctx, body: object) -> st.SearchStrategy:  # noqa: ANN001
    """Two things schemathesis seldom or never sends. JSON may escape a lone UTF-16 surrogate
    ("\\ud800"), which it never generates (its strings are valid UTF-8): now and then one is
    appended to a string field. And its valid completions are mostly minimal bodies, seldom
    streamed: a third of the completions that do not say `stream` ask for it."""
    if not isinstance(body, dict):
        return st.just(body)
    if ctx.operation.path == RESPONSES:
        body = _mostly_served(body)
    if ctx.operation.path in (*GENERATING, ANTHROPIC) and "stream" not in body:
        streamed = st.sampled_from([body, body, {**body, "stream": True}])
    else:
        streamed = st.just(body)
    return streamed.flatmap(_with_lone_surrogate)


def _mostly_served(body: dict) -> dict:
    """Random values of the fields the Responses route does not serve (NO_OPS) and of
    `previous_response_id` are refused, and its generated bodies seldom keep the model the
    config names or an output that fits the 64-token context: in three of four bodies those
    fields are left out, the model is MODEL and at most 8 tokens are asked for, so that some
    get to the model."""
    if zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) % 4 == 0:
        return body
    kept = {k: v for k, v in body.items() if k not in NO_OPS and k != "previous_response_id"}
    limit = kept.pop("max_output_tokens", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
        kept["max_output_tokens"] = min(limit, 8)
    return {**kept, "model": MODEL}


def _with_lone_surrogate(body: dict) -> st.SearchStrategy:
    texts = [k for k, v in body.items() if isinstance(v, str)]
    choices = [None] * 4 + texts  # mostly the body as generated
    return st.sampled_from(choices).map(
        lambda key: body if key is None else {**body, key: body[key] + "\ud800"}
    )


def _stored_response(served) -> str:  # noqa: ANN001
    """A response stored under KEY, for the routes that read or delete one by id."""
    body = {"model": MODEL, "input": "The ledger says", "max_output_tokens": 2}
    headers = {"Authorization": f"Bearer {KEY}"}
    reply = httpx.post(f"{served.url}{RESPONSES}", json=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


@pytest.fixture(scope="module")
def api_schema(served):
    # One stored response is read (GET, input_items), another deleted: each route then
    # succeeds at least once, whatever order schemathesis takes them in.
    read, deleted = _stored_response(served), _stored_response(served)
    by_id = f"{RESPONSES}/{{response_id}}"
    config = schemathesis.Config.from_dict(
        {
            "auth": {"openapi": {"apiKey": {"bearer": KEY}}},
            # Every body names a served model (unknown names are other tests' business) and most
            # ask for amounts the limits allow, so that many requests get past validation to the
            # model: the coverage phase's boundary values of each field, too.
            "operations": [
                # An operation's settings are those of the first entry it matches.
                {"include-path": RESPONSES, "parameters": {"body.model": MODEL}},
                {
                    "include-path": by_id,
                    "include-method": "GET",
                    "parameters": {"path.response_id": read},
                },
                {"include-path": f"{by_id}/input_items", "parameters": {"path.response_id": read}},
                {
                    "include-path": by_id,
                    "include-method": "DELETE",
                    "parameters": {"path.response_id": deleted},
                },
                {"include-path": "/v1/embeddings", "parameters": {"body.model": EMBEDDING_MODEL}},
                {"include-path": "/v1/models/{model}", "parameters": {"path.model": MODEL}},
                {"exclude-path": "/v1/embeddings", "parameters": {"body.model": MODEL}},
                {"include-path-regex": CROSS_ENCODER_PATHS, "enabled": False},
            ],
            "dictionaries": {
                "small": {"values": [0, 1, 2, 3, 4, 5, 8]},
                "widths": {"values": [1, 16, 256, 384, 385]},
                "texts": {"values": ["The ledger says", "x", "東京 🎉 café", "[CLS] a [SEP]"]},
                # tool_choice other than none needs valid tools (and forced calls a BPE model)
                "tool_choices": {"values": ["none"]},
            },
            "parameters": {
                "body.max_tokens": {"dictionary": "small", "probability": 0.7},
                "body.n": {"dictionary": "small", "probability": 0.7},
                "body.dimensions": {"dictionary": "widths", "probability": 0.7},
                "body.prompt": {"dictionary": "texts", "probability": 0.5},
                "body.input": {"dictionary": "texts", "probability": 0.5},
                "body.tool_choice": {"dictionary": "tool_choices", "probability": 0.7},
            },
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "unique-inputs": True},
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "checks": {
                "positive_data_acceptance": {"enabled": False},
                "max_response_time": 20.0,
            },
            "request-timeout": 30,
        }
    )
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json", config=config)
    schema.hook("flatmap_body")(_widened)
    schema.hook("filter_failure")(_not_a_lax_conversion)
    return schema


def _not_a_lax_conversion(_ctx, failure, case, _response) -> bool:  # noqa: ANN001
    """Keeps every failure but one kind. The server validates bodies in pydantic's lax mode, as
    vLLM does: a value of another JSON type that converts without loss (`true` or `1.0` for the
    integer 1, `"2"` for 2, `0` for false) is accepted. schemathesis generates such values as
    invalid data, and negative_data_rejection reports their acceptance; invalid data whose
    every mutation is a change of JSON type, and which the server accepted, is such a case."""
    if not isinstance(failure, AcceptedNegativeData) or case.meta is None:
        return True
    mutations = getattr(case.meta.phase.data, "mutations", ())
    return not mutations or any(m.keywords != ("type",) for m in mutations)


def test_the_schema_declares_what_the_server_does(served):
    """What schemathesis cannot see from responses alone: no operation documents FastAPI's 422
    (validation errors are 400s), every documented error is OpenAI's error object, and the
    routes behind the API key say so."""
    schema = httpx.get(f"{served.url}/openapi.json").json()
    public = {"/health", "/version"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            responses = operation["responses"]
            assert "422" not in responses, where
            for status, response in responses.items():
                if int(status) >= 400 and path != "/health":  # its 503 has no body
                    body = response["content"]["application/json"]["schema"]
                    shape = "AnthropicErrorResponse" if is_anthropic(path) else "ErrorResponse"
                    assert body == {"$ref": f"#/components/schemas/{shape}"}, where
            keys = [{"apiKey": []}, {"xApiKey": []}] if is_anthropic(path) else [{"apiKey": []}]
            assert (operation.get("security") == keys) == (path not in public), where
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


def test_every_operation_conforms_to_its_schema(api_schema):
    """Runs schemathesis' engine, as `schemathesis run` does (its pytest integration does not
    run under this pytest), over every operation: examples, coverage and fuzzing phases."""
    operations = {op.ok().label for op in api_schema.get_all_operations()} - CROSS_ENCODER_ROUTES
    assert {
        "POST /v1/completions",
        "POST /v1/chat/completions",
        "POST /v1/embeddings",
        "GET /v1/models",
        "GET /v1/models/{model}",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
    } <= operations
    failures: set[str] = set()
    errors: list[str] = []
    statuses: dict[str, Counter[int]] = defaultdict(Counter)
    for event in engine.from_schema(api_schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for interaction in recorder.interactions.values():
                if interaction.response is not None:
                    statuses[recorder.label][interaction.response.status_code] += 1
            for checks in recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        info = check.failure_info
                        failures.add(
                            f"{recorder.label}: {info.failure.title}\n"
                            f"{info.failure.message}\n{info.code_sample}"
                        )
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            errors.append(repr(event.value if hasattr(event, "value") else event.exception))
        elif isinstance(event, events.EngineFinished):
            failures.update(f.title + "\n" + f.message for f in event.failures)
    seen = {label: dict(sorted(counts.items())) for label, counts in statuses.items()}
    seed = f"schemathesis seed {api_schema.config.seed}"
    print(f"{seed}; statuses {seen}")
    assert not errors, f"{seed}: {errors}"
    assert not failures, f"{seed}\n" + "\n\n".join(sorted(failures))
    assert set(seen) == operations, "every operation was exercised"
    for label in operations:
        assert any(200 <= code < 300 for code in seen[label]), f"{label} never succeeded: {seen}"


def test_after_the_fuzz_the_server_serves_and_the_ledger_is_idle(served, http):
    reply = http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "still serving", "max_tokens": 2}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert idle(served), "blocks, tracker entries or requests outlived the fuzz"
    server_errors = []
    for line in http.get("/metrics").text.splitlines():
        key, _, value = line.rpartition(" ")
        if not key.startswith("kvledger_http_requests_total{") or not float(value):
            continue
        # /health answers 503 while the stack starts; any other 5xx is a failure.
        if 'status="5' in key and 'route="/health"' not in key:
            server_errors.append(line)
    assert not server_errors
