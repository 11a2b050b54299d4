"""Structured-output constraints from clients the server does not trust, against `kvledger
serve` with the real model (SmolLM2, byte-level BPE), through real HTTP:

- a JSON schema whose `$defs` chain 1,200 deep (47 KB, four levels of JSON: it overflowed the
  native stack of the frontend's compile, signal 11), the same chain in a forced tool's
  parameters, and a Lark grammar whose rules chain 2,800 deep are 400s naming
  --max-structured-depth, while another stream goes on, and the frontend keeps its pid;
- a schema of 4,000 optional properties (about a second to compile) does not stall a running
  stream: the frontend compiles it in its sandbox and the worker defers it until it has
  compiled (kvledger_grammar_deferrals_total), and the other stream's gaps stay within twice
  its own;
- a schema value the engine cannot take (an integer past 64 bits) is a 400, not a 500;
- a fuzz over depth and width of schemas with references, bounded in time: every reply is a
  200 or a 400 and the frontend never dies; afterwards the ledger is idle.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvledger.models import SMOLLM2
from tests.e2e.helpers import cmdline, idle
from tests.serving import descendants, metric_sum, scrape, start_serve

pytestmark = pytest.mark.timeout(900)

ASK = [{"role": "user", "content": "Write a long story about a cat."}]


def ref_chain(n: int) -> dict:
    defs = {str(i): {"items": {"$ref": f"#/$defs/{i + 1}"}} for i in range(n)}
    defs[str(n)] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/0"}


def lark_chain(n: int) -> str:
    rules = ["start: r0"] + [f'r{i}: "a" r{i + 1} | "b"' for i in range(n)] + [f'r{n}: "c"']
    return "\n".join(rules)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_serve(tmp_path_factory.mktemp("hostile"), "--model", SMOLLM2, timeout=600)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served.url, timeout=300) as client:
        yield client


def frontend_pid(served) -> int:  # noqa: ANN001
    """The frontend's process (not its grammar sandbox's children, `-m server.grammar_child`)."""
    return next(p for p in descendants(served.process.pid) if "-m server " in cmdline(p) + " ")


class Stream(threading.Thread):
    """A streaming chat request in the background, timing each content chunk's arrival (a
    chunk carries the text of one token or more: the detokenizer holds incomplete UTF-8)."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.arrivals: list[float] = []
        self.finish: str | None = None
        self.tokens = 0

    def run(self) -> None:
        body = {
            "model": SMOLLM2,
            "messages": ASK,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if '"content":"' in line:
                    self.arrivals.append(time.monotonic())
                if '"finish_reason":"' in line:
                    self.finish = line.split('"finish_reason":"')[1].split('"')[0]
                if '"completion_tokens":' in line:
                    self.tokens = int(line.split('"completion_tokens":')[1].split(",")[0])

    def wait_for(self, tokens: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while len(self.arrivals) < tokens:
            assert time.monotonic() < deadline and self.is_alive(), "the stream stalled"
            time.sleep(0.005)


def refused(reply: httpx.Response, says: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert says in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_deep_chains_are_refused_while_a_stream_goes_on_and_the_frontend_lives(served, http):
    pid = frontend_pid(served)
    stream = Stream(served.url, 48)
    stream.start()
    stream.wait_for(2)
    chain = ref_chain(1200)
    reply = http.post(
        "/v1/chat/completions",
        json={"model": SMOLLM2, "messages": ASK, "response_format": schema_format(chain)},
    )
    refused(reply, "--max-structured-depth")
    assert reply.json()["error"]["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "f", "parameters": chain}}
    reply = http.post(
        "/v1/chat/completions",
        json={
            "model": SMOLLM2,
            "messages": ASK,
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
    )
    refused(reply, "--max-structured-depth")
    reply = http.post(
        "/v1/completions",
        json={"model": SMOLLM2, "prompt": "x", "structured_outputs": {"grammar": lark_chain(2800)}},
    )
    refused(reply, "--max-structured-depth")
    stream.join(300)
    assert (stream.finish, stream.tokens) == ("length", 48)
    assert frontend_pid(served) == pid
    assert "exited with code" not in served.log()


def test_a_schema_past_64_bits_is_a_400(http):
    schema = {"type": "string", "maxLength": 10**30}
    reply = http.post(
        "/v1/chat/completions",
        json={"model": SMOLLM2, "messages": ASK, "response_format": schema_format(schema)},
    )
    refused(reply, "cannot be compiled")


def patterned(n: int) -> dict:
    """`n` patternProperties: the engine's compile grows faster than n (0.4 s at 200 and 2.4 s
    at 300 on a 2-core EPYC), its masks stay cheap."""
    return {"type": "object", "patternProperties": {f"^a{i}[a-z]*$": {} for i in range(n)}}


def test_a_schema_past_the_compile_deadline_is_a_400_and_the_frontend_lives(served, http):
    pid = frontend_pid(served)
    started = time.monotonic()
    reply = http.post(
        "/v1/chat/completions",
        json={"model": SMOLLM2, "messages": ASK, "response_format": schema_format(patterned(800))},
    )
    refused(reply, "--structured-compile-timeout")
    assert time.monotonic() - started < 30
    assert frontend_pid(served) == pid


def test_a_slow_schema_does_not_stall_another_stream(served, http):
    """The schema's compile (about half a second, twice: the frontend's check, then the
    worker's) runs beside the stream: the worker defers the request until its grammar
    compiled, so the stream's gaps while it compiles stay within twice its gaps before."""
    metrics = served.scheduler_metrics_url
    deferred_before = metric_sum(scrape(metrics), "kvledger_grammar_deferrals_total")
    stream = Stream(served.url, 1200)
    stream.start()
    stream.wait_for(24)
    wide = patterned(200)
    started = time.monotonic()
    reply = http.post(
        "/v1/chat/completions",
        json={
            "model": SMOLLM2,
            "messages": [{"role": "user", "content": "JSON please"}],
            "response_format": schema_format(wide),
            "max_tokens": 8,
        },
    )
    ended = time.monotonic()
    stream.join(600)
    assert reply.status_code == 200, reply.text
    assert metric_sum(scrape(metrics), "kvledger_grammar_deferrals_total") > deferred_before
    gaps = list(zip(stream.arrivals, stream.arrivals[1:], strict=False))
    before = [b - a for a, b in gaps[2:22]]  # the first gaps hold the prompt's prefill
    during = [b - a for a, b in gaps if a >= started and b <= ended]
    assert len(during) >= 5, f"the stream ended before the compile: {len(during)} gaps"
    normal, usual = statistics.median(before), _p90(before)
    assert statistics.median(during) <= 2 * normal, (normal, sorted(during))
    assert _p90(during) <= 2 * usual, (usual, sorted(during))
    # no gap holds a compile's length (the frontend's and the worker's took seconds each)
    assert max(during) < (ended - started) / 4, (ended - started, sorted(during))


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


@st.composite
def schemas(draw: st.DrawFn) -> dict:
    """Schemas with $defs chains and cycles of random length, nested and wide."""
    n = draw(st.integers(1, 400))
    cycle = draw(st.booleans())
    width = draw(st.integers(1, 40))
    defs = {}
    for i in range(n):
        target = (i + 1) % n if cycle else i + 1
        node: dict = {"type": "array", "items": {"$ref": f"#/$defs/{target}"}}
        if draw(st.booleans()):
            node = {
                "type": "object",
                "properties": {f"k{j}": {"$ref": f"#/$defs/{target}"} for j in range(width)},
            }
        defs[str(i)] = node
    defs[str(n)] = {"type": "integer"}
    nest = draw(st.integers(0, 70))
    root: dict = {"$ref": "#/$defs/0"}
    for _ in range(nest):
        root = {"type": "array", "items": root}
    return {"$defs": defs, **root}


def test_fuzzed_schemas_get_a_200_or_a_400_and_the_frontend_never_dies(served, http):
    pid = frontend_pid(served)
    seen: dict[int, int] = {}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(schemas())
    def check(schema: dict) -> None:
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": SMOLLM2,
                "messages": [{"role": "user", "content": "x"}],
                "response_format": schema_format(schema),
                "max_tokens": 2,
            },
        )
        assert reply.status_code in (200, 400), reply.text
        seen[reply.status_code] = seen.get(reply.status_code, 0) + 1

    check()
    assert frontend_pid(served) == pid
    assert seen.get(400), seen  # the fuzz reached the bound
    assert idle(served), "a refused or finished constraint left something held"


def test_a_grammar_past_the_engines_limits_mid_output_is_a_400(served, http):
    """4,000 optional properties compile (in about a second), and the first mask holds; the
    second exceeds the engine's items per row: the request fails alone, as the client's
    constraint (a 400), and the server keeps serving."""
    wide = {"type": "object", "properties": {f"p{i}": {} for i in range(4000)}}
    reply = http.post(
        "/v1/chat/completions",
        json={"model": SMOLLM2, "messages": ASK, "response_format": schema_format(wide)},
    )
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "max is 2000" in message or "--structured-compile-timeout" in message, message
    reply = http.post("/v1/completions", json={"model": SMOLLM2, "prompt": "x", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
