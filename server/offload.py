"""Work that must not run on the event loop (tokenizing, rendering templates), in threads, a
bounded number at once.

The loop streams every request's tokens, so a long tokenization runs in a thread; and at most
TOKENIZE_SLOTS run together, so many large bodies arriving at once wait their turn rather than
each holding a tokenizer's working memory (a few concurrent prompts of a few MB each took the
frontend to gigabytes before prompts were bounded; see ServedModel.max_prompt_chars and
docs/performance.md, "Frontend under large requests").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request

T = TypeVar("T")

TOKENIZE_SLOTS = 4


def tokenize_slots() -> asyncio.Semaphore:
    return asyncio.Semaphore(TOKENIZE_SLOTS)


async def off_loop(request: Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    async with request.app.state.tokenize_slots:
        return await asyncio.to_thread(fn, *args, **kwargs)
