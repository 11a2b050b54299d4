"""The dtype and KV block size a worker runs with when its flags leave them out, per device.

On CPU: float32 and 16-token blocks, as always. On CUDA with `--attention-backend auto`,
flash-attn is what the worker is for, so the defaults are the ones its paged kernel accepts:
bfloat16 (it runs half types only) and 256-token blocks (upstream refuses a paged block size
that is not a multiple of 256). What the operator gives explicitly wins; when that rules
flash-attn out (`--dtype float32`, `--block-size 16`, no flash-attn package), `auto` runs the
torch backend and `reason` says why, for the startup log. Whether the GPU itself can run
flash-attn (Ampere or newer) is checked later, by `worker.attention.get_backend`, which falls
back to torch the same way, saying so.

Torch-free (`find_spec` only), so the choice can be made and tested without loading a model.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

CPU_DTYPE = "float32"
CUDA_DTYPE = "bfloat16"
CPU_BLOCK_SIZE = 16
FLASH_BLOCK_SIZE = 256  # worker/attention/flash_attn_backend.py: BLOCK_MULTIPLE
HALF = ("bfloat16", "float16")


@dataclass(frozen=True)
class DeviceDefaults:
    dtype: str
    block_size: int
    # what `auto` is expected to pick on this device, and why (for the startup log)
    attention: str
    reason: str


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def choose(
    device: str,
    dtype: str | None,
    block_size: int | None,
    attention_backend: str,
    flash_installed: bool | None = None,
) -> DeviceDefaults:
    """Fill in the dtype and block size the flags left out (None)."""
    if not device.startswith("cuda"):
        return DeviceDefaults(
            dtype or CPU_DTYPE, block_size or CPU_BLOCK_SIZE, attention_backend, ""
        )
    dtype = dtype or CUDA_DTYPE
    wants_flash = attention_backend in ("auto", "flash_attn")
    if not wants_flash:
        return DeviceDefaults(dtype, block_size or CPU_BLOCK_SIZE, attention_backend, "as asked")
    if attention_backend == "flash_attn":
        return DeviceDefaults(dtype, block_size or FLASH_BLOCK_SIZE, "flash_attn", "as asked")
    installed = flash_attn_installed() if flash_installed is None else flash_installed
    problem = None
    if not installed:
        problem = "the flash-attn package is not installed (pip install 'kvledger[cuda]')"
    elif dtype not in HALF:
        problem = f"flash-attn runs bfloat16 and float16 only, and --dtype {dtype} was given"
    elif block_size is not None and block_size % FLASH_BLOCK_SIZE:
        problem = (
            f"--block-size {block_size} was given, and flash-attn's paged kernel needs a "
            f"multiple of {FLASH_BLOCK_SIZE}"
        )
    if problem:
        return DeviceDefaults(dtype, block_size or CPU_BLOCK_SIZE, "torch", problem)
    return DeviceDefaults(
        dtype,
        block_size or FLASH_BLOCK_SIZE,
        "flash_attn",
        f"flash-attn is installed; {dtype}, and KV blocks of {block_size or FLASH_BLOCK_SIZE} "
        f"tokens (its paged kernel needs a multiple of {FLASH_BLOCK_SIZE})",
    )
