"""The frontend's grammar sandbox (server/grammar_sandbox.py): specs compiled in real child
processes. A child that dies mid-compile (a real SIGSEGV) refuses that spec with a message
naming the signal and is replaced; a compile past its CPU budget is killed and refused naming
the flag; the engine's own refusals come back as they are; a spec past the depth bound never
reaches a child."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from kvledger.config.frontend import Limits
from kvledger.structured import StructuredError, StructuredSpec, json_schema_spec
from server.grammar_sandbox import GrammarModel, GrammarSandbox, _Budget
from server.token_bytes import byte_of_char

LIMITS = Limits()


def patterned(n: int) -> StructuredSpec:
    """A schema the engine takes seconds to compile (its cost grows faster than n)."""
    props = {f"^a{i}[a-z]*$": {} for i in range(n)}
    return json_schema_spec({"type": "object", "patternProperties": props})


@pytest.fixture(scope="module")
def model() -> GrammarModel:
    char = {b: c for c, b in byte_of_char().items()}
    tokenizer = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    return GrammarModel("bytes", tokenizer.to_str(), 300, (256,))


@pytest.fixture
def sandbox():
    box = GrammarSandbox(children=1)
    yield box
    box.close()


def _child_pid(box: GrammarSandbox) -> int:
    child = box._idle.queue[0]
    assert child is not None
    return child.proc.pid


def test_a_good_spec_passes_and_a_bad_one_is_the_engines_message(sandbox, model):
    sandbox.check(StructuredSpec("regex", "[a-z]+"), model, LIMITS, 5.0)
    with pytest.raises(StructuredError, match="unclosed"):
        sandbox.check(StructuredSpec("regex", "a(b"), model, LIMITS, 5.0)
    assert (sandbox.crashes, sandbox.timeouts) == (0, 0)


def test_a_child_that_crashes_mid_compile_refuses_the_spec_and_is_replaced(sandbox, model):
    sandbox.check(StructuredSpec("regex", "x"), model, LIMITS, 5.0)  # the child is up
    pid = _child_pid(sandbox)
    outcome: list[BaseException] = []

    def slow() -> None:
        try:
            sandbox.check(patterned(1000), model, LIMITS, 60.0)
        except StructuredError as err:
            outcome.append(err)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)  # the compile is under way
    os.kill(pid, signal.SIGSEGV)
    thread.join(60)
    assert outcome and "SIGSEGV" in str(outcome[0]), outcome
    assert sandbox.crashes == 1
    sandbox.check(StructuredSpec("regex", "[0-9]+"), model, LIMITS, 5.0)  # a new child
    assert _child_pid(sandbox) != pid


def test_a_compile_past_its_cpu_budget_is_killed_and_refused(sandbox, model):
    sandbox.check(StructuredSpec("regex", "x"), model, LIMITS, 5.0)
    pid = _child_pid(sandbox)
    started = time.monotonic()
    with pytest.raises(StructuredError, match="--structured-compile-timeout"):
        sandbox.check(patterned(1000), model, LIMITS, 0.3)
    assert time.monotonic() - started < 20
    assert sandbox.timeouts == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the child is gone
    sandbox.check(StructuredSpec("regex", "y"), model, LIMITS, 5.0)


def test_the_budget_counts_the_childs_cpu_not_the_wall_clock():
    """A child that sleeps spends no CPU: its budget is not spent while the wall clock runs."""
    sleeper = os.fork()
    if sleeper == 0:
        time.sleep(2)
        os._exit(0)
    try:
        budget = _Budget(sleeper, 0.05)
        time.sleep(0.3)
        assert not budget.spent()
    finally:
        os.kill(sleeper, signal.SIGKILL)
        os.waitpid(sleeper, 0)


def test_a_tokenizer_the_engine_refuses_is_refused_for_every_spec(sandbox):
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    wordpiece = GrammarModel("wp", tokenizer.to_str(), 3, (0,))
    for _ in range(2):
        with pytest.raises(StructuredError, match="not available for this model"):
            sandbox.check(StructuredSpec("regex", "a"), wordpiece, LIMITS, 5.0)
