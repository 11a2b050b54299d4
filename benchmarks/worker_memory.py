"""What a worker's memory is made of, stage by stage, loading a model as the worker does.

    .venv/bin/python benchmarks/worker_memory.py [--model smollm2|tiny-llama|PATH]
        [--quantization auto] [--kv-cache-memory-bytes N] [--prompt-len 436]

Builds a `ModelRunner` in this process with the worker's defaults (16-token blocks, the CPU KV
budget of kvledger/config/worker.py unless given), runs one prefill of --prompt-len tokens and
a few decode steps, and prints after each stage the resident set (`/proc/self/smaps_rollup`:
anonymous and file-backed) and the peak (`VmHWM`). Then the model's tensors by kind and dtype
(quantized blocks, float parameters, buffers), the KV pool, and the resident pages of the
model file's mapping and of the shared libraries: the parts the memory rule
`1.3 x (file + KV pool) + 350 MiB` (docs/performance.md, "Memory") is made of.
"""

from __future__ import annotations

import argparse
import gc
from collections import defaultdict
from pathlib import Path

MIB = 2**20


def rollup() -> dict[str, int]:
    """Rss, Anonymous and the file-backed rest of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


def peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def mapped(match: str) -> int:
    """Resident bytes of every mapping whose path contains `match`."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = len(head) >= 6 and match in head[-1]
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def stage(name: str) -> None:
    r = rollup()
    file_backed = r.get("Rss", 0) - r.get("Anonymous", 0)
    print(
        f"{name:34s} rss {r.get('Rss', 0) / MIB:7.1f}  anon {r.get('Anonymous', 0) / MIB:7.1f}"
        f"  file {file_backed / MIB:6.1f}  peak {peak() / MIB:7.1f} MiB"
    )


def tensors_by_kind(model) -> dict[str, int]:  # noqa: ANN001 - an nn.Module
    """Bytes by dtype and owner (`QuantizedLinear.blocks`, ...), each storage counted once."""
    kinds: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    for module in model.modules():
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, t in own:
            if t is None or t.untyped_storage().data_ptr() in seen:
                continue
            seen.add(t.untyped_storage().data_ptr())
            kind = f"{str(t.dtype).removeprefix('torch.')} {type(module).__name__}.{name}"
            kinds[kind] += t.untyped_storage().nbytes()
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=436)
    args = ap.parse_args()
    stage("python")
    import torch

    stage("import torch")
    from kvledger.config.worker import CPU_KV_CACHE_BYTES
    from kvledger.models import ensure_tiny_llama, smollm2_path
    from worker.runner.batch import SeqChunk
    from worker.runner.config import RunnerConfig
    from worker.runner.model_runner import ModelRunner

    stage("import worker")
    path = {"smollm2": smollm2_path, "tiny-llama": ensure_tiny_llama}.get(args.model)
    model_path = path() if path else Path(args.model)
    runner = ModelRunner(
        RunnerConfig(
            model_path,
            block_size=16,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES,
            progress=False,
            quantization=args.quantization,
            attention_backend="auto",
        )
    )
    gc.collect()
    stage("model runner built")
    ids = torch.randint(1000, runner.vocab_size, (args.prompt_len + 8,)).tolist()
    blocks = list(range(-(-(len(ids)) // 16)))
    runner.execute([SeqChunk("a", ids[: args.prompt_len], 0, blocks, True)])
    stage(f"prefill of {args.prompt_len}")
    for i in range(8):
        pos = args.prompt_len + i
        runner.execute([SeqChunk("a", [ids[pos]], pos, blocks, True)])
    stage("8 decode steps")

    kv_bytes = runner.kv_cache.k[0].untyped_storage().nbytes()  # one storage for all layers
    pool = f"{runner.num_blocks} blocks of {runner.block_size} tokens"
    print(f"\nKV pool: {pool}, {kv_bytes / MIB:.1f} MiB")
    file_bytes = model_path.stat().st_size if model_path.is_file() else 0
    if file_bytes:
        rule = (1.3 * (file_bytes + kv_bytes) + 350 * MIB) / MIB
        print(f"model file {file_bytes / MIB:.1f} MiB; 1.3 x (file + KV) + 350 MiB = {rule:.0f}")
        print(f"model file's mapping resident: {mapped(model_path.name) / MIB:.1f} MiB")
    print("\nmodel tensors (one storage counted once):")
    for kind, n in tensors_by_kind(runner.model).items():
        if n >= MIB / 4:
            print(f"  {n / MIB:8.1f} MiB  {kind}")
    so, torch_so = mapped(".so") / MIB, mapped("libtorch_cpu") / MIB
    print(f"shared libraries resident: {so:.1f} MiB (libtorch_cpu {torch_so:.1f} MiB)")


if __name__ == "__main__":
    main()
