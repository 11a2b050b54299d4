"""Incremental detokenization that never emits half a character.

Decodes a short window of tokens before the new ones so that word-boundary rules of the
tokenizer (spaces, '##' continuations, byte-level pieces) apply exactly as in a full decode.
"""

from __future__ import annotations

from tokenizers import Tokenizer

CONTEXT_TOKENS = 5
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: list[int]) -> str:
        """Adds tokens; returns the text that is now final."""
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end: whatever is pending, even an incomplete character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT) and not final):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return delta
