"""Tools and tool calls in the prompt. A template that reads `tools` gets them, and the
conversation's calls, as transformers passes them (same ids). One that does not gets the
Hermes format written into its messages: through plain ChatML that is, character for
character, what Qwen2.5's own tool template renders. Client text in tools and calls stays
plain text, and a tool message reaches a template that only knows three roles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from kvledger.config.frontend import Limits
from kvledger.models import resolve_model
from protos import frontend_pb2
from server.chat_prompt import chat_prompt
from server.chat_protocol import ChatMessage, ChatTemplateOptions
from server.chat_template import load_chat_template
from server.client import ServedModel
from server.errors import APIError
from server.tool_prompt import (
    hermes_messages,
    results_as_tool_turns,
    tool_dicts,
    with_parsed_arguments,
)
from server.tool_protocol import ToolDefinition
from server.tools import tool_plan

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
SEP = 102  # tiny-llama's eos, written by its template after each message
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city, now.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
CONVERSATION = [
    {"role": "system", "content": "You help with the weather."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "assistant", "content": "Sunny and noon. Anything else?"},
    {"role": "user", "content": "No."},
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model("tiny-llama")


def served(model_dir: Path, template: str | None = None) -> ServedModel:
    source = None if template is None else str(FIXTURES / template)
    return ServedModel(
        frontend_pb2.ModelInfo(name="m", max_model_len=2048, vocab_size=30522),
        Tokenizer.from_file(str(model_dir / "tokenizer.json")),
        load_chat_template(model_dir, source),
    )


def prompt(model: ServedModel, messages: list[dict], tools: list[dict] | None) -> list[int]:
    plan = tool_plan([ToolDefinition(**t) for t in tools] if tools else None, None, None, Limits())
    messages = [ChatMessage(**m) for m in messages]
    return chat_prompt(messages, ChatTemplateOptions(), model, Limits(), False, plan)


def plain(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def test_a_template_that_reads_tools_renders_as_transformers(model_dir):
    model = served(model_dir, "qwen2_5_tools.jinja")
    assert model.chat_template.reads_tools
    hf = AutoTokenizer.from_pretrained(model_dir)
    source = (FIXTURES / "qwen2_5_tools.jinja").read_text()
    theirs = hf.apply_chat_template(
        with_parsed_arguments(plain(CONVERSATION)),
        tools=TOOLS,
        chat_template=source,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<tools>" in theirs and '"arguments": {"city": "Paris"}' in theirs
    ours = model.chat_template.render(
        with_parsed_arguments(plain(CONVERSATION)), tools=tool_dicts_of(TOOLS)
    )
    assert ours == theirs
    assert prompt(model, CONVERSATION, TOOLS) == hf.encode(theirs, add_special_tokens=False)


def tool_dicts_of(tools: list[dict]) -> list[dict]:
    return tool_dicts(tuple(ToolDefinition(**t).function for t in tools))


def test_hermes_through_plain_chatml_is_qwen25s_own_tool_format(model_dir):
    """Qwen2.5's template, given tools, writes exactly what the Hermes rewrite writes through
    the ChatML of Qwen2 (which knows no tools): the format is the one such models learnt."""
    qwen25 = served(model_dir, "qwen2_5_tools.jinja").chat_template
    chatml = served(model_dir, "qwen2.jinja").chat_template
    assert not chatml.reads_tools
    tools = tool_dicts_of(TOOLS)
    for conversation in (CONVERSATION, CONVERSATION[1:]):
        theirs = qwen25.render(with_parsed_arguments(plain(conversation)), tools=tools)
        ours = chatml.render(hermes_messages(plain(conversation), tools, str))
        if conversation[0]["role"] != "system":  # Qwen2.5 adds its own system text first
            theirs = theirs.replace(
                "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n", ""
            )
        assert ours == theirs


def test_smollm2s_template_gets_the_tools_in_its_system_message():
    from kvledger.models import smollm2_path
    from server.chat_template import load_chat_template

    template = load_chat_template(smollm2_path())
    assert not template.reads_tools and results_as_tool_turns(template)
    text = template.render(
        hermes_messages(plain(CONVERSATION), tool_dicts_of(TOOLS), str, tool_turns=True)
    )
    assert text.startswith("<|im_start|>system\nYou help with the weather.\n\n# Tools\n")
    assert json.dumps(tool_dicts_of(TOOLS)[0]) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n'
        "</tool_call><|im_end|>\n<|im_start|>tool\nsunny, 21 C<|im_end|>\n"
        "<|im_start|>tool\n12:00<|im_end|>\n"
    ) in text  # each result a `tool` turn: SmolLM2 copied a user turn of tags back


def test_only_known_templates_that_render_tool_turns_get_them(model_dir):
    """Qwen2's ChatML renders any role but is not known to want them (Qwen2.5's format is the
    user turn of tags); tiny-llama's refuses the role; a known phrase in a template that
    refuses the role is not enough."""
    from server.chat_template import ChatTemplate
    from server.tool_prompt import TOOL_TURN_TEMPLATES

    assert not results_as_tool_turns(served(model_dir, "qwen2.jinja").chat_template)
    assert not results_as_tool_turns(served(model_dir).chat_template)
    refusing = (
        "{# " + TOOL_TURN_TEMPLATES[0] + " #}{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('no') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert not results_as_tool_turns(ChatTemplate(refusing))


def test_tool_messages_reach_a_template_of_three_roles(model_dir):
    """tiny-llama's template refuses any role but system, user and assistant."""
    model = served(model_dir)
    ids = prompt(model, CONVERSATION, TOOLS)
    assert ids.count(SEP) == 6  # the tool results are one user turn
    assert prompt(model, CONVERSATION, None).count(SEP) == 6


def test_special_token_text_in_tools_and_calls_stays_text(model_dir):
    model = served(model_dir)
    tools = json.loads(json.dumps(TOOLS).replace("The weather", "[SEP] [CLS]"))
    conversation = json.loads(json.dumps(CONVERSATION).replace("Paris", "[SEP]"))
    assert prompt(model, conversation, tools).count(SEP) == 6


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "x"}, "messages.1.tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": CONVERSATION[2]["tool_calls"]},
         "messages.1.tool_calls"),
        ({"role": "tool", "tool_call_id": "c" * 300, "content": "x"}, "tool_call_id"),
    ],
)  # fmt: skip
def test_malformed_tool_messages_are_400s(model_dir, message, param):
    with pytest.raises(APIError) as refused:
        prompt(served(model_dir), [{"role": "user", "content": "hi"}, message], TOOLS)
    assert refused.value.status == 400 and refused.value.param == param


def test_arguments_that_are_no_object_stay_their_text():
    """OpenAI takes any string (a call cut short by max_tokens comes back so)."""
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": '{"a": '}}
    messages = [{"role": "assistant", "tool_calls": [call]}]
    (message,) = hermes_messages(messages, [], str)
    assert (
        message["content"]
        == '<tool_call>\n{"name": "now", "arguments": "{\\"a\\": "}\n</tool_call>'
    )
    assert with_parsed_arguments(messages)[0]["tool_calls"][0]["function"]["arguments"] == '{"a": '
