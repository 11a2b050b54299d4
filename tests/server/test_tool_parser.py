"""Tool calls read from a reply's text: the Hermes parser of tool_choice auto (tags split
anywhere, several calls, lists, malformed JSON and unknown functions left as content, the
content's whitespace) and the readers of forced calls (a named function's arguments, the
array of `required`). Fed in any pieces, the parts add up to the text fed whole."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from server.tool_forced import NamedCall, RequiredCalls
from server.tool_output import Message, stream_parts, whole
from server.tool_parser import HermesParser

NAMES = frozenset({"get_weather", "add"})
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def read(decoder, pieces: list[str]) -> Message:  # noqa: ANN001
    parts = []
    for piece in pieces:
        parts += decoder.feed(piece)
    return whole(parts + decoder.finish())


def hermes(text: str, parallel: bool = True) -> Message:
    return read(HermesParser(NAMES, parallel), [text])


def calls(message: Message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_a_call_between_texts():
    out = hermes(f"Let me check. <tool_call>\n{WEATHER}\n</tool_call> Done.")
    assert calls(out) == [("get_weather", {"city": "Paris"})]
    assert out.content == "Let me check.  Done."
    assert out.tool_calls[0].id.startswith("call_") and out.tool_calls[0].type == "function"


def test_only_calls_leave_content_null():
    out = hermes(f"\n<tool_call>{WEATHER}</tool_call>\n<tool_call>{WEATHER}</tool_call>\n")
    assert out.content is None
    assert len(calls(out)) == 2
    assert out.tool_calls[0].id != out.tool_calls[1].id


def test_a_list_in_one_tag_is_several_calls():
    body = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, ' + WEATHER + "]"
    assert calls(hermes(f"<tool_call>{body}</tool_call>")) == [
        ("add", {"a": 1, "b": 2}),
        ("get_weather", {"city": "Paris"}),
    ]


def test_arguments_as_json_text_and_parameters_are_read():
    text = '<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>'
    assert calls(hermes(text)) == [("add", {"a": 1})]
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert calls(hermes(text)) == [("add", {"a": 1})]
    assert calls(hermes('<tool_call>{"name": "add"}</tool_call>')) == [("add", {})]


def test_what_is_not_a_call_stays_content():
    for body in (
        "{not json",
        '{"name": "unknown_function", "arguments": {}}',
        '{"name": ["get_weather"], "arguments": {}}',
        '{"name": "add", "arguments": [1, 2]}',
        '{"name": "add", "arguments": "not json"}',
        "[]",
        "[" * 5000 + "]" * 5000,
    ):
        text = f"<tool_call>{body}</tool_call>"
        out = hermes(f"a {text} b")
        assert out.tool_calls is None and out.content == f"a {text} b", body


def test_a_tag_left_open_is_a_call_when_its_text_is_one():
    assert calls(hermes(f"<tool_call>\n{WEATHER}\n")) == [("get_weather", {"city": "Paris"})]
    out = hermes('x <tool_call>{"name": "get_wea')
    assert out.tool_calls is None and out.content == 'x <tool_call>{"name": "get_wea'


def test_text_that_only_looks_like_a_tag_is_content():
    assert hermes("a <tool_ b <tool").content == "a <tool_ b <tool"
    assert hermes("</tool_call> <tool_calls>").content == "</tool_call> <tool_calls>"


def test_without_parallel_calls_one_call_counts():
    text = f"<tool_call>{WEATHER}</tool_call> <tool_call>{WEATHER}</tool_call>"
    out = hermes(text, parallel=False)
    assert len(calls(out)) == 1 and out.content == f"<tool_call>{WEATHER}</tool_call>"
    pair = f"<tool_call>[{WEATHER}, {WEATHER}]</tool_call>"
    assert hermes(pair, parallel=False).tool_calls is None


def test_content_whitespace_is_trimmed_at_both_ends_only():
    assert hermes("  hello  world \n").content == "hello  world"
    assert hermes(f"  a \n<tool_call>{WEATHER}</tool_call>\n b  ").content == "a \n\n b"


def pieces_of(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=12).map(sorted)
    return cuts.map(lambda c: [text[i:j] for i, j in zip([0, *c], [*c, len(text)], strict=True)])


SAMPLES = [
    f"Sure. <tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>[{WEATHER}]</tool_call> bye ",
    "<tool_call>{broken</tool_call> text <tool_ca",
    f" x\n <tool_call>{WEATHER}",
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES).flatmap(lambda t: st.tuples(st.just(t), pieces_of(t))))
def test_hermes_in_pieces_equals_whole(case):
    text, pieces = case
    assert _shape(read(HermesParser(NAMES), pieces)) == _shape(hermes(text))


def _shape(message: Message) -> tuple:
    """A message without its call ids (new for every call)."""
    return message.content, calls(message)


def test_named_call_arguments_are_the_text():
    out = read(NamedCall("add"), ['{"a"', "", ": 1}"])
    assert out.content is None and calls(out) == [("add", {"a": 1})]
    assert out.tool_calls[0].function.arguments == '{"a": 1}'
    # nothing generated: still one call, its arguments empty (finish_reason says why)
    assert read(NamedCall("add"), []).tool_calls[0].function.arguments == ""


REQUIRED = (
    '[{"name": "get_weather", "arguments": {"city": "Pa\\"ris [x]", "days": [1, {"n": 2}]}}, '
    '{"arguments": {"a": -1.5e3, "b": true}, "name": "add"}]'
)


def test_required_calls_keep_the_models_text():
    out = read(RequiredCalls(), [REQUIRED])
    assert out.content is None
    assert calls(out) == [(c["name"], c["arguments"]) for c in json.loads(REQUIRED)]
    assert out.tool_calls[0].function.arguments == (
        '{"city": "Pa\\"ris [x]", "days": [1, {"n": 2}]}'
    )


@settings(max_examples=200, deadline=None)
@given(pieces_of(REQUIRED))
def test_required_in_pieces_equals_whole(pieces):
    assert _shape(read(RequiredCalls(), pieces)) == _shape(read(RequiredCalls(), [REQUIRED]))


def test_required_text_without_a_call_is_content():
    assert read(RequiredCalls(), ["not json"]).content == "not json"
    cut = read(RequiredCalls(), ['[{"name": "add", "arguments": {"a": 1'])
    assert cut.content is None and cut.tool_calls[0].function.arguments == '{"a": 1'


def test_stream_parts_open_each_call_once_then_add_arguments():
    decoder = RequiredCalls()
    first = stream_parts(decoder.feed('[{"name": "add", "arguments": {"a"'))
    (opened,) = first.calls
    assert opened.index == 0 and opened.id and opened.type == "function"
    assert opened.function.name == "add" and opened.function.arguments == '{"a"'
    more = stream_parts(decoder.feed(': 1}}, {"name": "get_weather", "arguments": {}}]'))
    assert [(d.index, d.id is None) for d in more.calls] == [(0, True), (1, False)]
    assert more.calls[0].model_dump() == {"index": 0, "function": {"arguments": ": 1}"}}
