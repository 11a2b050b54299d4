"""Load Hugging Face `*.safetensors` weights, or a GGUF file's (`worker/gguf/`), into a model,
with a progress bar.

Every parameter must be filled exactly once (packed ones shard by shard); anything missing or
unexpected is an error naming the tensors, never a silently random weight.

A module may take only a slice of a checkpoint tensor (`checkpoint_piece`: a tensor-parallel
rank's rows or columns, `worker/layers/parallel.py`); the loader then reads that slice alone
with safetensors' `get_slice`, so no rank materializes the whole tensor.
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from kvledger.gguf_file import is_gguf
from worker.models.stored import StoredTensor

# Buffers some checkpoints carry that the model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def weight_files(model_dir: Path) -> list[Path]:
    """The index's files if there is one, else `model.safetensors`, else every `*.safetensors`.

    Some repositories ship the same weights twice (e.g. `consolidated.safetensors` with other
    names): the index, or the standard single-file name, says which set to read.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def checkpoint_tensors(model_path: Path) -> list[StoredTensor]:
    """A Hugging Face directory's safetensors, or a GGUF file's tensors (worker/gguf/)."""
    if is_gguf(model_path):
        from worker.gguf.load import gguf_tensors  # the gguf package, only for GGUF models

        return gguf_tensors(model_path)
    return [
        StoredTensor(name, partial(_read_safetensors, path, name))
        for path in weight_files(model_path)
        for name in _names(path)
    ]


def _read_safetensors(path: Path, name: str, source: Any) -> torch.Tensor:
    # The file is mapped for one tensor at a time: its pages leave the worker's resident
    # memory when the mapping closes. Mapped for the whole load, they stayed resident beside
    # the copies, and the load's peak was nearly twice the loaded worker's (docs/performance.md,
    # "Memory").
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name) if source is None else f.get_slice(name)[source]


def load_weights(
    model: nn.Module, model_dir: Path, progress: bool = True, skip: AbstractSet[str] = frozenset()
) -> None:
    """`skip`: checkpoint names the model already holds in another form (a GGUF file's
    quantized blocks, `worker/quant/keep.py`)."""
    params = dict(model.named_parameters())
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    filled = dict.fromkeys(params, 0)
    unexpected: list[str] = []
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    # Checkpoint tensors a model deliberately leaves unused (e.g. BERT's pooler head).
    ignored: tuple[str, ...] = tuple(getattr(model, "ignored_weights", ()))
    stored = checkpoint_tensors(Path(model_dir))
    prefix = _checkpoint_prefix(model, params, packed, [t.name for t in stored])
    for item in tqdm(stored, desc="loading weights", unit="tensor", disable=not progress):
        ckpt_name = item.name
        name = ckpt_name.removeprefix(prefix) if prefix else ckpt_name
        if (
            name.endswith(IGNORED_SUFFIXES)
            or name.startswith(ignored)
            or (tied and name == "lm_head.weight")
            or ckpt_name in skip
        ):
            continue
        target, rows, shard = _target(name, packed, model)
        if target not in params:
            unexpected.append(ckpt_name)
            continue
        piece = _piece(model, target, shard)
        tensor = item.read(None if piece is None else piece.source)
        if piece is not None:
            rows = piece.rows or rows
        _copy(params[target], rows, tensor, ckpt_name)
        filled[target] += tensor.shape[0] if shard is not None else 1
    _check_complete(model, params, filled, unexpected)


def _names(path: Path) -> list[str]:
    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def _checkpoint_prefix(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    packed: dict[str, tuple[str, str]],
    names: list[str],
) -> str:
    """The prefix to strip from every checkpoint name, or "".

    A model may name prefixes its weights carry when saved inside a wrapper (`bert.` for
    BertForMaskedLM / BertForPreTraining). One is stripped only when no checkpoint name is one
    of the model's own parameters as it stands, so an unprefixed checkpoint never changes.
    """
    if any(_param_name(name, packed) in params for name in names):
        return ""
    for prefix in getattr(model, "checkpoint_prefixes", ()):
        if any(name.startswith(prefix) for name in names):
            return prefix
    return ""


def _param_name(name: str, packed: dict[str, tuple[str, str]]) -> str:
    for ckpt_module, (our_module, _) in packed.items():
        marker = f".{ckpt_module}."
        if marker in name:
            return name.replace(marker, f".{our_module}.")
    return name


def _target(
    name: str, packed: dict[str, tuple[str, str]], model: nn.Module
) -> tuple[str, slice | None, str | None]:
    """Checkpoint name -> our parameter name, and if the parameter is packed the rows it fills
    and the shard's name."""
    for ckpt_module, (our_module, shard) in packed.items():
        marker = f".{ckpt_module}."
        if marker in name:
            target = name.replace(marker, f".{our_module}.")
            try:
                module = model.get_submodule(target.rsplit(".", 1)[0])
            except AttributeError:
                return name, None, None  # no such module here: reported as unexpected
            return target, module.shards[shard], shard
    return name, None, None


def _piece(model: nn.Module, target: str, shard: str | None) -> Any:
    """The slice of the checkpoint tensor the parameter takes (`Piece`), or None: all of it."""
    module_name, _, attr = target.rpartition(".")
    take = getattr(model.get_submodule(module_name), "checkpoint_piece", None)
    return None if take is None else take(attr, shard)


def _copy(param: torch.Tensor, rows: slice | None, tensor: torch.Tensor, name: str) -> None:
    dest = param.data[rows] if rows is not None else param.data
    if dest.shape != tensor.shape:
        raise ValueError(
            f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, "
            f"the model expects {tuple(dest.shape)}"
        )
    dest.copy_(tensor)


def _check_complete(
    model: nn.Module, params: dict[str, nn.Parameter], filled: dict[str, int], unexpected: list[str]
) -> None:
    if unexpected:
        raise ValueError(f"checkpoint tensors the model does not know: {_few(unexpected)}")
    missing = []
    for name, param in params.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        shards = getattr(module, "shards", None)
        expected = param.shape[0] if shards is not None else 1
        if filled[name] != expected:
            missing.append(name)
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {_few(missing)}")


def _few(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
