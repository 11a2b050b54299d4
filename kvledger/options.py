"""Flags and environment variables derived from config dataclasses (the way vLLM derives its
argparse from its config classes).

A service's config dataclass is the one place a setting is declared: its field, default, help
text and choices. Every field declared with `option(...)` is the flag ``--field-name`` and the
environment variable ``KVLEDGER_FIELD_NAME``; a field whose type is itself a config dataclass
(`group(...)`) contributes its fields at that place, flat (``--max-n``, not ``--limits-max-n``).
Fields several services take are declared once in a small base class that each service config
inherits (kvledger/groups.py); they come after the service's own fields, in inheritance order.

The kind of flag follows from the field:

- ``bool`` defaulting to False: a switch ``--x``; defaulting to True: ``--x/--no-x``;
- ``list[...]``: repeatable ``--x a --x b`` (its variable: a comma- or space-separated list,
  taken only when the flag is not given at all);
- anything else (``int``, ``float``, ``str``, optionally ``| None``): ``--x VALUE``.

A number may carry bounds (`ge`, `le`, as pydantic's fields and vLLM's configs do): the flag,
its variable and the dataclass itself (`check_bounds`, from its ``__post_init__``) refuse a
value outside them, so no service checks its settings again.

Reading a flag's value (from its variable, from the command line) and handing it to a child
process: kvledger/flag_values.py. This module knows no service: kvledger/flags.py says which
config each service has.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "KVLEDGER_"
_META = "kvledger.option"


@dataclass(frozen=True)
class _Option:
    help: str
    choices: tuple[Any, ...] | None
    secret: bool
    aliases: tuple[str, ...] = ()
    ge: Any = None
    le: Any = None


def option(
    default: Any = None,
    help: str = "",
    *,
    choices: Iterable[Any] | None = None,
    secret: bool = False,
    aliases: Iterable[str] = (),
    ge: Any = None,
    le: Any = None,
) -> Any:
    """A config field that is also a flag and an environment variable. `secret`: handed to
    child processes in the environment, never in argv, and warned about on a command line.
    `aliases`: other spellings the command line accepts (`-tp`, vLLM's short name); the flag
    handed on to children is always the long name. `ge`/`le`: the least and the greatest value
    accepted (None: unbounded). A list default is copied for each instance."""
    meta = {
        _META: _Option(
            help, tuple(choices) if choices is not None else None, secret, tuple(aliases), ge, le
        )
    }
    if isinstance(default, list):
        items = tuple(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A nested config whose fields are flags at this place (flat names)."""
    return dataclasses.field(default_factory=cls)


def _bounds(ge: Any, le: Any) -> str:
    """The accepted range in words ("" when unbounded): ">= 1", "<= 8", "0 to 1"."""
    if ge is not None and le is not None:
        return f"{ge} to {le}"
    if ge is not None:
        return f">= {ge}"
    return f"<= {le}" if le is not None else ""


def _outside(value: Any, ge: Any, le: Any) -> bool:
    if value is None:
        return False
    return (ge is not None and value < ge) or (le is not None and value > le)


@dataclass(frozen=True)
class Flag:
    name: str  # "--max-num-seqs"
    services: frozenset[str]
    help: str
    type: Any = str
    default: Any = None
    kind: str = "value"  # "value" | "bool" (--x/--no-x) | "switch" (--x) | "list" (repeatable)
    choices: Sequence[Any] | None = None
    secret: bool = False
    path: tuple[str, ...] = ()  # attributes from the service config to the value
    owner: str = ""  # the dataclass that declares the field ("module.Class")
    aliases: tuple[str, ...] = ()  # other command-line spellings ("-tp")
    ge: Any = None  # the least value accepted (None: no bound)
    le: Any = None  # the greatest

    @property
    def bounds(self) -> str:
        return _bounds(self.ge, self.le)

    def out_of_bounds(self, value: Any) -> bool:
        return _outside(value, self.ge, self.le)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _fields_in_order(cls: type) -> Iterator[tuple[type, dataclasses.Field]]:
    """(declaring class, field): the class's own fields first, then each base's in MRO order."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name in inspect.get_annotations(klass):
            if name in by_name and name not in seen:
                seen.add(name)
                yield klass, by_name[name]


def _unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def config_flags(cls: type, services: Iterable[str] = (), path: tuple[str, ...] = ()) -> list[Flag]:
    """The flags of a config dataclass, in help order. Every field is an `option` or a `group`:
    anything else is a mistake and raises TypeError (each field has exactly one flag)."""
    hints = typing.get_type_hints(cls)
    flags: list[Flag] = []
    for owner, f in _fields_in_order(cls):
        hint = _unwrap_optional(hints[f.name])
        meta = f.metadata.get(_META)
        if meta is None:
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                flags += config_flags(hint, services, (*path, f.name))
                continue
            raise TypeError(f"{cls.__name__}.{f.name} is neither an option(...) nor a group(...)")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value_type, kind = hint, "value"
        if hint is bool:
            kind = "bool" if default else "switch"
        elif typing.get_origin(hint) is list:
            kind, (value_type,) = "list", typing.get_args(hint)
            default = None  # the environment's list, or [] (fill_list_defaults)
        flags.append(
            Flag(
                name="--" + f.name.replace("_", "-"),
                services=frozenset(services),
                help=meta.help,
                type=value_type,
                default=default,
                kind=kind,
                choices=meta.choices,
                secret=meta.secret,
                path=(*path, f.name),
                owner=f"{owner.__module__}.{owner.__qualname__}",
                aliases=meta.aliases,
                ge=meta.ge,
                le=meta.le,
            )
        )
    return flags


def from_namespace(cls: type, args: argparse.Namespace | Any) -> Any:
    """The config built from parsed flags (`args.<dest>` for each field, groups recursively)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get(_META) is None:
            values[f.name] = from_namespace(_unwrap_optional(hints[f.name]), args)
        else:
            values[f.name] = getattr(args, f.name)
    return cls(**values)


def check_bounds(config: Any) -> None:
    """Raises ValueError naming the first field of `config` (its own options, not its groups')
    whose value is outside the bounds its `option` declares. Call it from ``__post_init__``."""
    for f in dataclasses.fields(config):
        meta = f.metadata.get(_META)
        value = getattr(config, f.name)
        if meta is not None and _outside(value, meta.ge, meta.le):
            raise ValueError(f"{f.name} must be {_bounds(meta.ge, meta.le)}, got {value}")
