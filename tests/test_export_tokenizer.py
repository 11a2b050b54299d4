"""`kvledger export-tokenizer GGUF DIR` writes a directory transformers' AutoTokenizer loads,
giving the ids, special tokens and chat template the frontend serves from the file; a file it
cannot read is one line and exit status 2."""

from __future__ import annotations

import json

import pytest

from kvledger import cli
from kvledger.gguf_tokenizer import load_gguf_tokenizer
from kvledger.models import smollm2_path

TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs,\n\nnewlines   ",
    "digits 1234567890 and 3.14159",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "emoji 😀 and accents: café naïve",
    "",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    with pytest.raises(SystemExit) as done:
        cli.main(["export-tokenizer", str(smollm2_path()), str(directory)])
    assert done.value.code == 0
    return directory


def test_autotokenizer_loads_the_export_and_agrees_with_the_frontend(exported):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(exported)
    ours = load_gguf_tokenizer(smollm2_path())
    for text in TEXTS:
        assert theirs.encode(text) == ours.tokenizer.encode(text).ids, text
    assert (theirs.eos_token, theirs.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert theirs.chat_template == ours.chat_template
    assert theirs.model_max_length == 8192  # the file's context length
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_a_missing_file_is_one_line_and_status_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["export-tokenizer", str(tmp_path / "none.gguf"), str(tmp_path / "out")])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()
