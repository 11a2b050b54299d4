"""The worker's configuration: every flag of `python -m worker` is a field here
(kvledger/options.py derives the flags, their environment variables and help from it).

A leaf module, free of torch, so that `kvledger serve`, the frontend and the scheduler can
read the worker's flags without loading it: the names the worker accepts for dtypes and
attention backends live here, and the modules that implement them import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvledger.groups import (
    GrammarLimits,
    GrpcTlsOptions,
    LogOptions,
    MetricsOptions,
    SchedulerAddress,
    ShutdownOptions,
    WorkerToken,
)
from kvledger.options import option

# "auto": the checkpoint's dtype when it is a half type, else float32
# (worker/runner/model_runner.py).
DTYPES = ("auto", "float32", "bfloat16", "float16")
# the KV cache's dtype (worker/runner/kv_cache.py: kv_dtype); auto: the model's
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")
# worker/attention/__init__.py: get_backend
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "flash_attn")
# worker/quant/select.py: what a GGUF file's quantized weights become in memory
QUANTIZATIONS = ("auto", "gguf", "gguf-int8", "none")
# The KV budget on CPU when --kv-cache-memory-bytes is not given.
CPU_KV_CACHE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class WorkerSettings(
    SchedulerAddress,
    GrpcTlsOptions,
    MetricsOptions,
    WorkerToken,
    ShutdownOptions,
    LogOptions,
    GrammarLimits,
):
    """`python -m worker`'s flags."""

    DEFAULT_METRICS_PORT = 9401  # + i for the i-th worker `kvledger serve` starts

    model: str = option(
        "smollm2-135m-instruct",
        "HF model directory, GGUF file (or a directory holding one), smollm2-135m-instruct "
        "(the packaged SmolLM2-135M-Instruct GGUF) or tiny-llama (generated random weights)",
    )
    served_model_name: str | None = option(
        None, "name clients use for the model (default: derived)"
    )
    tokenizer: str | None = option(
        None,
        "directory with the tokenizer.json (and tokenizer_config.json: chat template) the "
        "frontend uses instead of the model's own (e.g. for a GGUF file's)",
    )
    block_size: int | None = option(
        None,
        "tokens per KV block (default: 256 on CUDA where flash-attn runs, the multiple of 256 "
        "its paged kernel needs; else 16)",
    )
    num_kv_blocks: int | None = option(
        None, "fixed number of KV blocks (overrides the memory budget)"
    )
    kv_cache_memory_bytes: int | None = option(
        None,
        f"KV cache budget in bytes (default: {CPU_KV_CACHE_BYTES >> 20} MiB on "
        "CPU; on CUDA, --gpu-memory-utilization decides)",
    )
    gpu_memory_utilization: float = option(0.9, "fraction of GPU memory for weights and KV")
    max_model_len: int | None = option(None, "context length (default: the model's)")
    dtype: str | None = option(
        None,
        "weight and activation dtype (default: bfloat16 on CUDA, float32 on CPU)",
        choices=DTYPES,
    )
    kv_cache_dtype: str = option(
        "auto",
        "dtype of the paged KV cache: auto, the model's (--dtype); bfloat16 under a float32 "
        "model on CPU halves the keys' and values' bytes attention reads and a block's memory "
        "(attention still computes in float32, on keys and values rounded to bfloat16 once: "
        "SmolLM2's logits move by up to ~2e-2 x the largest, greedy chats kept their tokens "
        "on the exact path); CUDA takes the model's dtype only",
        choices=KV_CACHE_DTYPES,
    )
    device: str = option("cpu", "torch device")
    attention_backend: str = option(
        "auto",
        "paged attention kernel (auto: flash_attn on CUDA when importable; on CPU the "
        "compiled paged kernel, cpu, when it builds; else torch, the reference)",
        choices=ATTENTION_BACKENDS,
    )
    fused_cpu_ops: bool = option(
        True,
        "on CPU, run the decoder's RMSNorm (with its residual add), RoPE, SiLU-and-mul and "
        "the greedy argmax as compiled kernels (built once per machine, with "
        "--attention-backend cpu's); --no-fused-cpu-ops runs them as torch ops",
    )
    screened_greedy_head: bool = option(
        True,
        "on CPU, find a greedy row's token by screening every logit approximately and "
        "computing only the candidates exactly: the same token as the full head, ties "
        "included (a GGUF's Q8_0 head on the exact path with int8 activations, from 4 rows, "
        "no copy; a small float32 model's head through a Q8_0 copy about a quarter its size, "
        "both on CPUs with AVX-512 VNNI and VBMI; else in bfloat16 on CPUs with AVX512-BF16, "
        "through a copy half its size); --no-screened-greedy-head computes every logit",
    )
    quantization: str = option(
        "auto",
        "a GGUF file's quantized weights (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K): gguf keeps "
        "their blocks in memory and multiplies "
        "with compiled CPU kernels (logits within 1e-3 of the dequantized model, ~1/4-1/7 of "
        "the float32 memory; CPU and -tp 1 only); gguf-int8 as gguf, with the activations "
        "quantized to int8 per block of 32 as llama.cpp does (integer dot products, AVX-512 "
        "VNNI where the CPU has it: faster at one row; Q8_0 weights on AVX-512 take the float "
        "kernel on the int8-rounded activations, Q5_0/Q5_1 keep float activations; logits "
        "within 5e-2 x the largest logit "
        "of the dequantized model instead of 1e-3); none dequantizes every weight to --dtype; "
        "auto (the default): gguf where it can run, else none",
        choices=QUANTIZATIONS,
    )
    cuda_graphs: bool = option(
        True,
        "on CUDA with flash-attn, run decode-only steps as CUDA graphs captured at start, one "
        "per batch-size bucket up to --cuda-graph-max-batch (--no-cuda-graphs: eager)",
    )
    cuda_graph_max_batch: int = option(64, "the largest decode batch run as a CUDA graph")
    seed: int = option(0, "base random seed")
    worker_id: str | None = option(None, "name of this worker (default: host-pid)")
    tensor_parallel_size: int = option(
        1,
        "processes (ranks) that split a decoder with tensor parallelism and serve as one "
        "worker (gloo on CPU, NCCL on CUDA); embedding models stay single-rank",
        aliases=("-tp",),
    )
