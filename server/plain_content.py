"""Special-token text inside chat message content is tokenized as plain text.

The rule. A chat prompt's control tokens (`<|im_start|>`, `<|im_end|>`, `[SEP]` ...) come from
the chat template alone. Text a client puts in a message's content (or a string of its
chat_template_kwargs) that spells a special token is tokenized as the characters it is, never
as that token: untrusted text pasted into a message cannot close its turn and forge a system
or assistant turn. OpenAI's API behaves so; vLLM and transformers tokenize such text into the
control tokens. `--special-tokens-in-content` restores that. Completions' raw prompts are the
client's own prompt format and keep their special tokens.

How. Before rendering, each special-token text in the content is replaced by a marker (three
private-use characters that no tokenizer maps to a special token, carrying the text's index);
the template renders as usual (its filters and tests see the markers); the markers are then
put back and the prompt is tokenized whole, with offsets. A special token whose characters lie
inside put-back text is replaced by that text's plain tokenization (the tokenizer's own,
with special tokens encoded as text). Everything else keeps exactly the ids the tokenizer
gives: a prompt without such text is tokenized as before, as transformers would.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

MARK = "\U000f0000"
DIGIT0 = 0x100000  # supplementary private use area B: two digits, base DIGITS
DIGITS = 0xFFFE
# What content may not hold as itself: the marker alphabet (put back as plain characters).
_ALPHABET = "\U000f0000\U00100000-\U0010fffd"
_MARKER = re.compile(f"{MARK}([\U00100000-\U0010fffd])([\U00100000-\U0010fffd])")


class MarkerError(ValueError):
    """The rendered text holds a broken marker (the template cut or changed one)."""


@dataclass
class SpecialTexts:
    """A tokenizer's special tokens as text, and a copy of it that encodes them as text."""

    pattern: re.Pattern[str]
    special_ids: frozenset[int]
    plain: Tokenizer

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> SpecialTexts:
        added = tokenizer.get_added_tokens_decoder()
        specials = {i: t.content for i, t in added.items() if t.special and t.content}
        texts = sorted(set(specials.values()), key=len, reverse=True)  # longest match first
        alternatives = [re.escape(t) for t in texts] + [f"[{_ALPHABET}]"]
        plain = Tokenizer.from_str(tokenizer.to_str())
        plain.encode_special_tokens = True
        plain.no_padding()
        plain.no_truncation()
        return cls(re.compile("|".join(alternatives)), frozenset(specials), plain)


@dataclass
class Escaper:
    """Replaces special-token text (and marker characters) by markers, remembering each."""

    specials: SpecialTexts
    texts: list[str] = field(default_factory=list)

    def escape(self, value: Any) -> Any:
        """A string, or the strings inside lists and dicts (not their keys), escaped."""
        if isinstance(value, str):
            return self.specials.pattern.sub(self._marker, value)
        if isinstance(value, list):
            return [self.escape(v) for v in value]
        if isinstance(value, dict):
            return {k: self.escape(v) for k, v in value.items()}
        return value

    def _marker(self, match: re.Match[str]) -> str:
        index = len(self.texts)
        if index >= DIGITS * DIGITS:
            raise MarkerError("too many special-token texts in the messages")
        self.texts.append(match.group(0))
        high, low = divmod(index, DIGITS)
        return MARK + chr(DIGIT0 + high) + chr(DIGIT0 + low)

    def restore(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The text with each marker put back, and where put-back text now lies."""
        if not self.texts:
            if MARK in text:
                raise MarkerError("the rendered prompt holds a broken marker")
            return text, []
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        length = last = 0
        for match in _MARKER.finditer(text):
            index = (ord(match.group(1)) - DIGIT0) * DIGITS + ord(match.group(2)) - DIGIT0
            if index >= len(self.texts):
                raise MarkerError("the rendered prompt holds a broken marker")
            before = text[last : match.start()]
            out += [before, self.texts[index]]
            length += len(before)
            spans.append((length, length + len(self.texts[index])))
            length += len(self.texts[index])
            last = match.end()
        out.append(text[last:])
        restored = "".join(out)
        if any(MARK in piece for piece in out[::2]):  # text between markers, and the tail
            raise MarkerError("the rendered prompt holds a broken marker")
        return restored, spans


def encode_plain_spans(
    tokenizer: Tokenizer,
    specials: SpecialTexts,
    text: str,
    spans: list[tuple[int, int]],
    add_special_tokens: bool,
) -> list[int]:
    """`text` tokenized whole; each special token inside one of `spans` replaced by the plain
    tokenization of its characters."""
    encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not spans:
        return encoding.ids
    starts = [a for a, _ in spans]
    ids: list[int] = []
    for token, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        if token in specials.special_ids and end > start and _inside(starts, spans, start, end):
            ids += specials.plain.encode(text[start:end], add_special_tokens=False).ids
        else:
            ids.append(token)
    return ids


def _inside(starts: list[int], spans: list[tuple[int, int]], start: int, end: int) -> bool:
    at = bisect.bisect_right(starts, start) - 1
    return at >= 0 and spans[at][0] <= start and end <= spans[at][1]
