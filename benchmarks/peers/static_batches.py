"""Hugging Face transformers `generate` on static batches: the peers benchmark's baseline.

Run by benchmarks/peers in a child process (its peak memory is then its own):

    python benchmarks/peers/static_batches.py MODEL_DIR WORKLOAD_JSON C1_WORKLOAD_JSON THREADS \
        [DEVICE [DTYPE]]

DEVICE (default cpu; cuda for a GPU) and DTYPE (default float32) are the model's. A MODEL that
is a `.gguf` file loads as transformers' users load one (`gguf_file=`, dequantized to DTYPE).

Batches of 16 (and of 1 for the concurrency-1 figure) of the workload's token-id prompts (left
padded, masked, where their lengths differ), greedy, exactly max_tokens new tokens each
(min_new_tokens = max_new_tokens). Prints one JSON line: tokens/s per batch size, peak RSS,
and the greedy tokens of the first two prompts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.load import Workload  # noqa: E402


def main() -> None:
    model_dir, wl_json, c1_json, threads = sys.argv[1:5]
    device, dtype = (sys.argv[5:] + ["cpu", "float32"][len(sys.argv[5:]) :])[:2]
    torch.set_num_threads(int(threads))
    model = load(Path(model_dir), getattr(torch, dtype))
    model = model.to(device).eval()
    tok_s, first = {}, []
    for batch_size, wl in (
        (16, Workload(**json.loads(wl_json))),
        (1, Workload(**json.loads(c1_json))),
    ):
        prompts = wl.prompts()
        tokens, start = 0, time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            ids, mask = left_padded(prompts[i : i + batch_size], device)
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=wl.max_tokens,
                    min_new_tokens=wl.max_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
            new = out[:, ids.shape[1] :]
            tokens += new.numel()
            if not first:
                first = new[:2, :16].tolist()
        tok_s[str(batch_size)] = tokens / (time.perf_counter() - start)
    rss = next(
        int(line.split()[1]) / 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    print(json.dumps({"tok_s": tok_s, "memory_mib": {"transformers": rss}, "greedy_tokens": first}))


def load(model: Path, dtype: torch.dtype) -> torch.nn.Module:
    if model.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(model.parent, gguf_file=model.name, dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype)


def left_padded(prompts: list[list[int]], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, shorter prompts padded on the left (generate appends on
    the right, so every row's new tokens start in the same column)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


if __name__ == "__main__":
    main()
