"""Large request bodies screened in a child process before the frontend parses them.

Why: `json.loads` is one C call that holds the GIL for the whole body, and the thread that
parses a body shares the GIL with the event loop that streams every other request's tokens.
A 4 MiB body of two million ids, or of a million empty lists, holds it for a large fraction
of a second; Python's own JSON scanner lets the loop run but makes it wait for the GIL at each
of its turns, so every stream crawls for seconds. So a body over SCREEN_BYTES is first parsed
by a child process, on its own GIL, which checks what `screen` checks: valid JSON, its lists
within their limits (server/prebound.py), at most `max_json_values` values. Only a body that
passes is parsed in the frontend, and its bounded number of values bounds how long that parse
holds the GIL. Smaller bodies are bounded by their size and are screened in the frontend's
thread.

The child is started with `spawn` (a fork would copy gRPC's threads broken), which imports
the frontend's main module in it: an entry point must keep its start under
`if __name__ == "__main__"`, as `python -m server` does. A child that dies (killed, out of
memory) is replaced and the body screened once more by the
new one; a body during which two children died is refused with a 400, and the server keeps
serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from kvledger.config.frontend import Limits
from server.errors import APIError
from server.prebound import prebound

log = logging.getLogger(__name__)

SCREEN_BYTES = 512 * 1024  # smaller bodies hold at most ~260,000 values: bounded as they are
CHILDREN = 1  # screening is a pass over bytes; one child keeps a 2-core machine's cores free
NICENESS = 10  # below the worker and the frontend: a hostile body waits, streams do not
PARENT_POLL_SECONDS = 1.0


def screen(raw: bytes, limits: Limits) -> Any:
    """The body parsed, or json.JSONDecodeError, or an APIError naming the first bound it
    passes: nested too deeply, not UTF-8, a list past its limit, too many values."""
    try:
        data = json.loads(raw)
    except (RecursionError, UnicodeDecodeError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else "not UTF-8 text"
        raise APIError(400, f"The request body is not valid JSON: {why}.") from None
    prebound(data, limits)
    if count_values(data, limits.max_json_values) > limits.max_json_values:
        raise APIError(
            400, f"The request body holds more than {limits.max_json_values} JSON values."
        )
    return data


def count_values(data: Any, limit: int) -> int:
    """Values in a parsed body (each number, string, list, object and null; object keys are
    not counted), counting stops once past `limit`."""
    count, stack = 0, [data]
    while stack and count <= limit:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count


@dataclass(frozen=True)
class Refusal:
    """What the child found wrong with a body, in a form that crosses the process boundary."""

    status: int
    message: str
    param: str | None = None
    json_pos: int | None = None  # set for a JSON syntax error: its message is `message`

    def error(self, raw: bytes) -> Exception:
        if self.json_pos is not None:
            return json.JSONDecodeError(self.message, raw.decode("utf-8", "replace"), self.json_pos)
        return APIError(self.status, self.message, param=self.param)


def screened_in_child(raw: bytes, limits: Limits) -> Refusal | None:
    """Runs in the child: None for a body that passes; its data stays in the child."""
    try:
        screen(raw, limits)
    except json.JSONDecodeError as err:
        return Refusal(400, err.msg, json_pos=err.pos)
    except APIError as err:
        return Refusal(err.status, err.message, err.param)
    return None


def _child_start(parent: int) -> None:
    """The child runs below the frontend's priority, leaves Ctrl-C (sent to the whole process
    group) to the frontend, which stops it, and ends when the frontend does, however that
    ended (the child holds its own end of the request pipe, so it would not see EOF)."""
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


class BodyScreen:
    """The child process (started at the frontend's start, replaced when it dies)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Starts the child now, so that the first large body does not wait for its start."""
        self._executor().submit(count_values, None, 0)

    async def check(self, raw: bytes, limits: Limits) -> None:
        """Returns for a body that passes; raises json.JSONDecodeError or APIError for one
        that does not."""
        for attempt in range(2):
            pool = self._executor()
            try:
                refusal = await asyncio.wrap_future(pool.submit(screened_in_child, raw, limits))
            except BrokenProcessPool:
                log.warning("the body screen's child died (attempt %d): replaced", attempt + 1)
                self._replace(pool)
                continue
            if refusal is not None:
                raise refusal.error(raw)
            return
        raise APIError(400, "The request body could not be parsed: its parser process died.")

    def close(self) -> None:
        """Waits for the child to end (at most the body it is screening), so that its pipes
        and locks are released before the frontend exits."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=CHILDREN,
                mp_context=context,
                initializer=_child_start,
                initargs=(os.getpid(),),
            )
        return self._pool

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        if self._pool is broken:
            broken.shutdown(wait=False, cancel_futures=True)
            self._pool = None
