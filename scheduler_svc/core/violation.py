"""How a broken invariant is reported: a leaf, so every module that checks one imports it and
nothing else (the checks in invariants.py, and whatever asserts a ledger fact on its own)."""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """The ledger disagrees with itself: a bug, never an operational condition."""


def ensure(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)
