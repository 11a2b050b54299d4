"""The grammar sandbox's child process (`python -m server.grammar_child`): it compiles the
structured-output specs the frontend is asked to check, so that a native crash or a runaway
compile costs this process, never the one serving every stream (server/grammar_sandbox.py).

Protocol, over stdin and the original stdout: each message a 4-byte big-endian length and a
JSON object. Requests: `{"op": "tokenizer", "key", "json", "vocab_size", "eos"}` (build the
engine's tokenizer for `key`) and `{"op": "check", "key", "kind", "spec", "limits"}`; each is
answered `{"ok": true}` or `{"error": "..."}`. The child exits when stdin closes.

It runs at a lower CPU priority than the services (a compile must not slow the worker's steps
on a small machine), under an address-space cap, and compiles on a thread with a large stack:
the depth bound is checked first, and the stack is the margin beyond it.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import llguidance

from kvledger.grammar_tokenizer import grammar_tokenizer_of_json
from kvledger.groups import GrammarLimits
from kvledger.structured import StructuredError, StructuredSpec, check

NICENESS = 10
ADDRESS_SPACE_BYTES = 8 << 30
COMPILE_STACK_BYTES = 256 << 20


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """The next framed JSON message, or None at end of stream."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return json.loads(body)


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


class Compiler:
    """The engine's tokenizers, per model key, and the checks made against them."""

    def __init__(self) -> None:
        self.tokenizers: dict[str, llguidance.LLTokenizer] = {}

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            if message["op"] == "tokenizer":
                self.tokenizers[message["key"]] = grammar_tokenizer_of_json(
                    message["json"], message["vocab_size"], message["eos"]
                )
            elif message["op"] == "check":
                spec = StructuredSpec(message["kind"], message["spec"])
                limits = GrammarLimits(**message["limits"])
                check(spec, self.tokenizers[message["key"]], limits)
            else:
                return {"error": f"unknown op {message['op']!r}"}
        except StructuredError as err:
            return {"error": str(err)}
        except Exception as err:  # noqa: BLE001 - the engine's own errors; the child goes on
            return {"error": f"the structured output spec cannot be compiled: {err}"}
        return {"ok": True}


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing the engine prints can corrupt the replies
    requests = sys.stdin.buffer
    os.nice(NICENESS)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    threading.stack_size(COMPILE_STACK_BYTES)
    compiler = Compiler()
    with ThreadPoolExecutor(1, thread_name_prefix="grammar-compile") as pool:
        while (message := read_message(requests)) is not None:
            write_message(replies, pool.submit(compiler.handle, message).result())


if __name__ == "__main__":
    main()
