"""What a request constrains its output to: the frontend builds it, the worker's sampler masks
the logits so that every sampled token keeps the output inside it."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredSpec:
    """`kind` is one of KINDS; `spec` its text: a JSON schema (json), a regular expression
    (regex), a JSON list of strings (choice), a grammar (grammar), empty for json_object."""

    kind: str
    spec: str
