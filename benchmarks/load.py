"""A streaming load generator for any OpenAI-compatible `/v1/completions` server.

Token-id prompts (every engine sees the very same tokens, whatever its tokenizer), greedy,
`ignore_eos` and a fixed `max_tokens`, so every request generates the same number of tokens.
Requests go out at a fixed concurrency (closed loop) or at a Poisson request rate (open loop).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import httpx
from tqdm import tqdm


@dataclass(frozen=True)
class Workload:
    dataset: str = "shared-prefix"  # or "random", or "given" (the prompts in `given`)
    num_requests: int = 48
    prefix_len: int = 512  # shared-prefix: tokens every prompt starts with
    suffix_len: int = 36  # shared-prefix: each prompt's own tokens; random: the prompt length
    max_tokens: int = 128
    vocab_low: int = 1000  # token ids drawn from [vocab_low, vocab_high)
    vocab_high: int = 30000
    seed: int = 0
    given: tuple[tuple[int, ...], ...] = ()  # "given": the prompts themselves
    # JSON object merged into every request body (e.g. a response_format constraint)
    extra_body: str = ""

    def prompts(self) -> list[list[int]]:
        rng = random.Random(self.seed)

        def draw(n: int) -> list[int]:
            return [rng.randrange(self.vocab_low, self.vocab_high) for _ in range(n)]

        if self.dataset == "given":
            return [list(p) for p in self.given[: self.num_requests]]
        if self.dataset == "random":
            return [draw(self.suffix_len) for _ in range(self.num_requests)]
        if self.dataset != "shared-prefix":
            raise ValueError(f"unknown dataset {self.dataset!r} (random, shared-prefix)")
        prefix = draw(self.prefix_len)
        return [prefix + draw(self.suffix_len) for _ in range(self.num_requests)]

    def warm_up_prompt(self) -> list[int]:
        """One more prompt drawn as the measured ones are (sharing their prefix, if any), but
        not one of them: an engine that caches whole prompts must not serve a measured one
        from its cache. A "given" workload holds it after the measured prompts."""
        extra = replace(self, num_requests=self.num_requests + 1).prompts()
        if len(extra) <= self.num_requests:
            raise ValueError("a given workload needs one prompt more than it measures to warm up")
        return extra[-1]


@dataclass
class Result:
    ttft: float
    gaps: list[float]  # between successive streamed chunks
    output_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, if reported
    last: float = 0.0  # seconds from the request to its last chunk

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: the same whether a server streams a token
        an event or several (inter-token gaps are between events)."""
        if self.output_tokens < 2:
            return None
        return (self.last - self.ttft) / (self.output_tokens - 1)


@dataclass
class Summary:
    engine: str
    concurrency: int | None
    request_rate: float | None
    seconds: float
    requests: int
    output_tokens: int
    output_tok_s: float
    requests_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]  # between streamed events (a server may send several tokens in one)
    tpot_ms: dict[str, float]  # per request: (last event - first) / (output tokens - 1)
    cached_share: float | None
    results: list[Result] = field(default_factory=list, repr=False)

    def row(self) -> dict:
        out = asdict(self)
        out.pop("results")
        return out


def percentiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {k: (values[0] * 1e3 if values else 0.0) for k in ("p50", "p90", "p99")}
    qs = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": qs[49] * 1e3, "p90": qs[89] * 1e3, "p99": qs[98] * 1e3}


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], wl: Workload):
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": wl.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(json.loads(wl.extra_body) if wl.extra_body else {}),
    }
    start = time.perf_counter()
    first, last, gaps, tokens, cached = None, 0.0, [], 0, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {(await reply.aread())[:300]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{url}: {chunk['error']}")
            usage = chunk.get("usage")
            if usage:
                tokens = usage.get("completion_tokens", tokens)
                details = usage.get("prompt_tokens_details") or {}
                cached = details.get("cached_tokens", cached)
            if chunk.get("choices"):
                now = time.perf_counter()
                if first is None:
                    first = now - start
                else:
                    gaps.append(now - last)
                last = now
    return Result(first or 0.0, gaps, tokens or wl.max_tokens, cached, last - start)


async def drive(
    url: str,
    model: str,
    wl: Workload,
    concurrency: int | None = None,
    request_rate: float | None = None,
    engine: str = "",
    progress: bool = True,
    warm_up: bool = True,
) -> Summary:
    """Runs the workload once (after one warm-up request on a prompt it does not measure,
    unless not `warm_up`: the cold-prefill run has none) and summarizes it."""
    prompts = wl.prompts()
    # A fresh connection per request: llama.cpp's HTTP server closes a kept-alive connection
    # after a few requests, and a POST on a closed one fails. Loopback connects cost ~0.1 ms.
    limits = httpx.Limits(
        max_connections=(concurrency or len(prompts)) + 4, max_keepalive_connections=0
    )
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
        if warm_up:
            await one(client, url, model, wl.warm_up_prompt(), Workload(max_tokens=4))
        gate = asyncio.Semaphore(concurrency or len(prompts))
        bar = tqdm(total=len(prompts), desc=engine or url, disable=not progress, leave=False)
        rng = random.Random(wl.seed + 1)

        async def guarded(prompt: list[int]) -> Result:
            async with gate:
                result = await one(client, url, model, prompt, wl)
            bar.update()
            return result

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(guarded(prompt)))
            if request_rate:  # Poisson arrivals: exponential gaps
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        seconds = time.perf_counter() - start
        bar.close()
    return summarize(engine, concurrency, request_rate, seconds, results, wl)


def summarize(engine, concurrency, request_rate, seconds, results, wl) -> Summary:  # noqa: ANN001
    tokens = sum(r.output_tokens for r in results)
    cached = [r.cached_tokens for r in results if r.cached_tokens is not None]
    prompt_tokens = sum(len(p) for p in wl.prompts()[: len(results)])
    return Summary(
        engine=engine,
        concurrency=concurrency,
        request_rate=request_rate,
        seconds=seconds,
        requests=len(results),
        output_tokens=tokens,
        output_tok_s=tokens / seconds,
        requests_s=len(results) / seconds,
        ttft_ms=percentiles([r.ttft for r in results]),
        itl_ms=percentiles([g for r in results for g in r.gaps]),
        tpot_ms=percentiles([t for r in results if (t := r.tpot) is not None]),
        cached_share=(sum(cached) / prompt_tokens) if len(cached) == len(results) else None,
        results=list(results),
    )
