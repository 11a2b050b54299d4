"""Chat templates render here as transformers' apply_chat_template renders them: the same token
ids on the same tokenizer files, for tiny-llama's own template and for real-world ones (Llama 3's
and Qwen2's, kept as fixtures), and one that uses every global and filter transformers sets up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from kvledger.models import resolve_model
from protos import frontend_pb2
from server.chat_prompt import chat_prompt
from server.chat_protocol import ChatMessage, ChatTemplateOptions
from server.chat_template import ChatTemplateError, check_chat_template, load_chat_template
from server.client import ServedModel
from server.errors import APIError

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
TEMPLATES = [None, "llama3.jinja", "qwen2.jinja", "features.jinja"]  # None: the model's own

CONVERSATIONS = [
    [{"role": "user", "content": "Hello,   my NAME is"}],
    [
        {"role": "system", "content": "Answer briefly.  "},
        {"role": "user", "content": "What is a ledger?"},
        {"role": "assistant", "content": "A book of accounts."},
        {"role": "user", "content": "skip me"},
        {"role": "user", "content": "And a block? <b>&amp;</b> ünïcödé"},
    ],
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model("tiny-llama")


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def served(model_dir: Path, template: str | None) -> ServedModel:
    source = None if template is None else str(FIXTURES / template)
    return ServedModel(
        frontend_pb2.ModelInfo(name="m", max_model_len=2048, vocab_size=30522),
        Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        load_chat_template(model_dir, source),
    )


def hf_ids(tokenizer, messages, template: str | None, **kw) -> list[int]:  # noqa: ANN001
    source = None if template is None else (FIXTURES / template).read_text()
    out = tokenizer.apply_chat_template(messages, chat_template=source, tokenize=True, **kw)
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "multi"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_text_and_token_ids_equal_transformers(
    model_dir, hf_tokenizer, template, conversation, add_generation_prompt
):
    """The text too: this tokenizer drops whitespace, so ids alone would miss a newline."""
    model = served(model_dir, template)
    assert model.chat_template is not None
    source = None if template is None else (FIXTURES / template).read_text()
    text = hf_tokenizer.apply_chat_template(
        conversation,
        chat_template=source,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert model.chat_template.render(conversation, add_generation_prompt) == text
    messages = [ChatMessage(**m) for m in conversation]
    options = ChatTemplateOptions(add_generation_prompt=add_generation_prompt)
    ours = chat_prompt(messages, options, model)
    theirs = hf_ids(
        hf_tokenizer, conversation, template, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs


@pytest.mark.parametrize("template", [None, "llama3.jinja", "qwen2.jinja"])
def test_continue_final_message_equals_transformers(model_dir, hf_tokenizer, template):
    conversation = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "The colour is "},
    ]
    model = served(model_dir, template)
    options = ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True)
    ours = chat_prompt([ChatMessage(**m) for m in conversation], options, model)
    theirs = hf_ids(hf_tokenizer, conversation, template, continue_final_message=True)
    assert ours == theirs
    text = hf_tokenizer.apply_chat_template(
        conversation, chat_template=model.chat_template.source, tokenize=False,
        continue_final_message=True,
    )  # fmt: skip
    assert model.chat_template.render(conversation, False, True) == text


def test_text_parts_are_joined_and_other_parts_refused(model_dir):
    model = served(model_dir, None)
    parts = ChatMessage(
        role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    )
    plain = ChatMessage(role="user", content="a\nb")
    options = ChatTemplateOptions()
    assert chat_prompt([parts], options, model) == chat_prompt([plain], options, model)
    image = ChatMessage(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(APIError) as err:
        chat_prompt([image], options, model)
    assert err.value.status == 400 and "image_url" in err.value.message
    untexted = ChatMessage(role="user", content=[{"type": "text"}])
    with pytest.raises(APIError) as err:
        chat_prompt([untexted], options, model)
    assert "a text part has no `text`" in err.value.message  # not "`text` is not supported"


def test_raise_exception_is_a_400_with_the_templates_message(model_dir):
    model = served(model_dir, "features.jinja")
    messages = [ChatMessage(role="user", content="x"), ChatMessage(role="system", content="y")]
    with pytest.raises(APIError) as err:
        chat_prompt(messages, ChatTemplateOptions(), model)
    assert err.value.status == 400
    assert "a system message may only come first" in err.value.message


def test_the_sandbox_refuses_to_reach_python_internals(model_dir, tmp_path):
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    model = served(model_dir, None)
    template = load_chat_template(model_dir, escape)
    assert template is not None
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])
    del model, tmp_path


def test_template_sources(model_dir, tmp_path):
    """The directory's chat_template.jinja wins over tokenizer_config.json; --chat-template
    (a file or the text) over both; without any there is none, and chat says so."""
    copy = tmp_path / "m"
    shutil.copytree(model_dir, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    own = load_chat_template(copy)
    assert own is not None and own.special_tokens["bos_token"] == "[CLS]"
    (copy / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert load_chat_template(copy).render([{"role": "user", "content": "x"}]) == "Jx"
    assert load_chat_template(copy, "T{{ bos_token }}").render([]) == "T[CLS]"
    override = tmp_path / "t.jinja"
    override.write_text("F")
    assert load_chat_template(copy, str(override)).render([]) == "F"
    (copy / "chat_template.jinja").unlink()
    config = (copy / "tokenizer_config.json").read_text()
    (copy / "tokenizer_config.json").write_text(config.replace('"chat_template"', '"x"'))
    assert load_chat_template(copy) is None
    bare = ServedModel(
        frontend_pb2.ModelInfo(name="bare"), Tokenizer.from_file(str(copy / "tokenizer.json"))
    )
    with pytest.raises(APIError) as err:
        chat_prompt([ChatMessage(role="user", content="x")], ChatTemplateOptions(), bare)
    assert err.value.status == 400 and "--chat-template" in err.value.message


def test_an_embedding_model_is_not_sent_to_the_chat_template_flag(model_dir):
    """/tokenize with messages on an embedding model: the flag gives embedding models no
    template, so the 400 names the model, not --chat-template."""
    info = frontend_pb2.ModelInfo(name="e", kind=frontend_pb2.MODEL_KIND_EMBED)
    embedder = ServedModel(info, Tokenizer.from_file(str(model_dir / "tokenizer.json")))
    with pytest.raises(APIError) as err:
        chat_prompt([ChatMessage(role="user", content="x")], ChatTemplateOptions(), embedder)
    assert err.value.status == 400 and err.value.param == "model"
    assert "embedding model" in err.value.message and "--chat-template" not in err.value.message


def test_a_chat_template_flag_that_is_neither_a_file_nor_a_template_is_refused(model_dir, tmp_path):
    """vLLM's rule: with no braces and no newline, the value is a path; one that is not there
    is refused, never rendered as the prompt of every chat request."""
    typo = str(tmp_path / "templates" / "chat.jinja")
    with pytest.raises(ChatTemplateError, match="not a file"):
        check_chat_template(typo)
    with pytest.raises(ChatTemplateError, match="not a file"):
        load_chat_template(model_dir, typo)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        check_chat_template("{% for m in messages %}")
    check_chat_template("plain text\n")  # a newline: the template itself, however plain
    check_chat_template(str(FIXTURES / "llama3.jinja"))


def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them(
    model_dir, hf_tokenizer
):
    """A template's own switches (Qwen3's `enable_thinking`, say) come from
    chat_template_kwargs, rendered as transformers renders them."""
    source = "{% if enable_thinking %}<think>{% endif %}{{ bos_token }}{{ messages[0]['content'] }}"
    model = ServedModel(
        frontend_pb2.ModelInfo(name="m", max_model_len=2048, vocab_size=30522),
        Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        load_chat_template(model_dir, source),
    )
    conversation = [{"role": "user", "content": "hi"}]
    for kwargs in ({}, {"enable_thinking": True}):
        options = ChatTemplateOptions(chat_template_kwargs=kwargs)
        ours = chat_prompt([ChatMessage(**m) for m in conversation], options, model)
        theirs = hf_tokenizer.apply_chat_template(
            conversation, chat_template=source, tokenize=False, **kwargs
        )
        assert model.chat_template.render(conversation, extra=kwargs) == theirs
        assert ours == hf_tokenizer.encode(theirs, add_special_tokens=False)
