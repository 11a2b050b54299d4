"""Where and under which bounds the worker compiles a grammar (worker/sample/constraints.py):
the depth bound before the engine runs, and the compile thread's large stack."""

from __future__ import annotations

import ctypes
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import llguidance
import pytest

from kvledger.groups import GrammarLimits
from kvledger.structured import StructuredSpec, json_schema_spec
from tests.worker.byte_tokenizer import EOS, VOCAB
from worker.sample.constraints import COMPILE_STACK_BYTES, Grammars


@pytest.fixture
def grammars(byte_tokenizer_dir) -> Grammars:
    return Grammars(str(byte_tokenizer_dir), VOCAB, [EOS])


def test_a_spec_past_the_depth_bound_is_refused_before_the_engine_compiles_it(
    byte_tokenizer_dir, monkeypatch
):
    """The worker applies the depth bound too (a spec reaching it past a frontend with other
    settings): refused by the pure walk, and the engine's compiler is never called."""
    chain = {"$defs": {str(i): {"items": {"$ref": f"#/$defs/{i + 1}"}} for i in range(40)}}
    chain["$ref"] = "#/$defs/0"
    limits = GrammarLimits(max_structured_depth=16)
    grammars = Grammars(str(byte_tokenizer_dir), VOCAB, [EOS], limits=limits)
    called = []
    monkeypatch.setattr(
        llguidance.LLMatcher, "grammar_from_json_schema", lambda *a, **k: called.append(a)
    )
    constraint = grammars.constraint(json_schema_spec(chain))
    constraint.sync([])
    assert constraint.error is not None and "at most 16" in constraint.error
    assert not called


def _thread_stack_bytes() -> int:
    """The calling thread's real stack size (glibc's pthread_getattr_np)."""
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    attr = ctypes.create_string_buffer(256)  # a pthread_attr_t, with room to spare
    assert libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0
    address, size = ctypes.c_void_p(), ctypes.c_size_t()
    libc.pthread_attr_getstack(attr, ctypes.byref(address), ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value


def test_specs_compile_on_a_thread_with_a_large_stack(grammars):
    """The engine's compiler recurses on a spec's depth: it runs on a thread whose stack is
    COMPILE_STACK_BYTES (the margin past the depth bound), and the process-wide default for
    other threads is left as it was."""
    grammars.constraint(StructuredSpec("regex", "[a-z]{1,8}")).template.result(timeout=60)
    assert grammars._compiler is not None
    assert grammars._compiler.submit(_thread_stack_bytes).result() >= COMPILE_STACK_BYTES
    assert threading.stack_size() == 0
    other = ThreadPoolExecutor(1)
    assert other.submit(_thread_stack_bytes).result() < COMPILE_STACK_BYTES
    other.shutdown()


def test_a_nested_counted_regex_fails_fast_under_the_engines_step_limits(byte_tokenizer_dir):
    """((a{1,100}){1,100}){1,100} once took 5.2 s for one mask before the engine gave up: under
    the step limits each mask costs milliseconds, and the walk ends with the engine's refusal
    (which fails its request alone) or a finished match, never a stalled step."""
    grammars = Grammars(str(byte_tokenizer_dir), VOCAB, [EOS])
    constraint = grammars.constraint(StructuredSpec("regex", "((a{1,100}){1,100}){1,100}"))
    outputs: list[int] = []
    slowest = 0.0
    for _ in range(200):
        started = time.perf_counter()
        masks = grammars.compute([(0, constraint, outputs)])
        slowest = max(slowest, time.perf_counter() - started)
        if masks.errors:
            assert "structured output" in masks.errors[0]
            break
        outputs.append(ord("a"))
    assert slowest < 0.5, slowest
