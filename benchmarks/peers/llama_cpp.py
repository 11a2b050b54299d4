"""llama.cpp's `llama-server` as the benchmarks run it: on an F32 GGUF of the very weights
kvledger serves (written once by tools/gguf_export.py into kvledger's cache), or on a real
GGUF file as it is and requantized by `llama-quantize`, on loopback.

The binary is built from the llama-cpp-python sdist (docs/benchmarks.md, "Against llama.cpp
and transformers").
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kvledger.models import cache_dir
from tests.serving import free_port


def gguf_of(model: Path, name: str) -> Path:
    """The model's weights as an F32 GGUF, written on first use."""
    gguf = cache_dir() / f"bench-{name}-f32.gguf"
    if not gguf.exists():
        from tools.gguf_export import export

        export(model, gguf)
    return gguf


def requantized(quantize_binary: str, gguf: Path, qtype: str) -> Path:
    """`gguf` requantized to `qtype` by llama.cpp's own `llama-quantize` (F32: the same
    weights dequantized, for a like-for-like against float engines), written on first use."""
    out = cache_dir() / f"bench-{gguf.stem}-{qtype.lower()}.gguf"
    if not out.exists():
        partial = out.with_suffix(".partial")
        argv = [quantize_binary, "--allow-requantize", str(gguf), str(partial), qtype]
        subprocess.run(argv, check=True, capture_output=True)
        partial.rename(out)
    return out


@contextlib.contextmanager
def llama_server(
    binary: str, gguf: Path, threads: int, slots: int, ctx: int, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`llama-server` with `slots` parallel sequences sharing `ctx` tokens of context, and
    `extra` flags; yields its URL and process. Its log is printed when something fails."""
    port = free_port()
    argv = [binary, "-m", str(gguf), "-np", str(slots), "-c", str(ctx), "-t", str(threads)]
    # one HTTP thread per streaming client (its default pool, sized by the cores, closes the rest)
    argv += ["--cont-batching", "--threads-http", "32", "--host", "127.0.0.1", "--port", str(port)]
    argv += list(extra)
    with tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(f"{url}/health", proc)
            yield url, proc
        except Exception:
            print(Path(log.name).read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(30)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def complete(url: str, prompt: list[int], n_predict: int) -> dict:
    """One greedy `/completion` of token ids, nothing reused from earlier prompts: the reply,
    with llama.cpp's own `timings` (prompt_per_token_ms, predicted_per_token_ms, ...) and, where
    the server knows `return_tokens`, the generated ids under `tokens`."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    request = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.load(reply)
