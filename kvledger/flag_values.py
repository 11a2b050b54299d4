"""A flag's value in and out: read from its environment variable, parsed from the command line,
and turned back into a child process's argv or environment (`kvledger serve`).

An environment variable is parsed exactly as its flag would be; a value the flag would refuse
stops startup with one line naming the variable and what it accepts (exit 2, like argparse).
The flags themselves come from the config dataclasses (kvledger/options.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvledger.options import Flag

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


# ---- the environment ----


class EnvValueError(ValueError):
    """An environment variable holds a value its flag would refuse on the command line."""


def _a(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string"}.get(kind, kind)


def env_default(flag: Flag, environ: Mapping[str, str] | None = None) -> Any:
    """The flag's default, or its environment variable parsed exactly as the flag would be.

    A value the flag would refuse stops startup: compose and Kubernetes configure every service
    through the environment, where a typo (`flase`, `lifo`) must not quietly mean something else.
    """
    raw = (os.environ if environ is None else environ).get(flag.env_var)
    if raw is None:
        return flag.default
    if flag.kind in ("bool", "switch"):
        word = raw.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise EnvValueError(
            f"{flag.env_var}={raw!r}: expected a boolean "
            f"({', '.join(TRUE_WORDS)} or {', '.join(w for w in FALSE_WORDS if w)})"
        )
    if flag.kind == "list":
        return [flag.type(item) for item in raw.replace(",", " ").split() if item]
    try:
        value = flag.type(raw.strip())
    except ValueError:
        kind = getattr(flag.type, "__name__", "value")
        raise EnvValueError(f"{flag.env_var}={raw!r}: expected {_a(kind)}") from None
    if flag.choices is not None and value not in flag.choices:
        raise EnvValueError(f"{flag.env_var}={raw!r}: expected one of {', '.join(flag.choices)}")
    if flag.out_of_bounds(value):
        raise EnvValueError(f"{flag.env_var}={raw!r}: expected a value {flag.bounds}")
    return value


def env_errors(flags: Iterable[Flag]) -> list[str]:
    """Every environment variable of these flags whose value the flag would refuse."""
    problems = []
    for flag in flags:
        try:
            env_default(flag)
        except EnvValueError as err:
            problems.append(str(err))
    return problems


def check_env(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Stops startup with one line naming each bad variable and what it accepts (exit 2, as
    argparse does for a bad flag) when an environment variable holds a value its flag would
    refuse."""
    problems = env_errors(flags)
    if problems:
        parser.exit(2, f"{parser.prog}: error: {'; '.join(problems)}\n")


# ---- the command line ----


def _parser_type(flag: Flag) -> Any:
    """The flag's type, refusing a value outside its bounds as argparse refuses a bad type."""
    if flag.ge is None and flag.le is None:
        return flag.type

    def parse(text: str) -> Any:
        value = flag.type(text)
        if flag.out_of_bounds(value):
            raise argparse.ArgumentTypeError(f"must be {flag.bounds}, got {text}")
        return value

    parse.__name__ = flag.type.__name__  # argparse names the type in its "invalid" message
    return parse


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    flags = list(flags)
    check_env(parser, flags)
    for flag in flags:
        default = env_default(flag)
        bounds = f" ({flag.bounds})" if flag.bounds else ""
        help_text = f"{flag.help}{bounds} [env {flag.env_var}]"
        if flag.kind == "bool":
            parser.add_argument(
                flag.name,
                dest=flag.dest,
                default=default,
                help=help_text,
                action=argparse.BooleanOptionalAction,
            )
        elif flag.kind == "switch":
            parser.add_argument(
                flag.name, dest=flag.dest, default=default, help=help_text, action="store_true"
            )
        elif flag.kind == "list":
            parser.add_argument(
                flag.name,
                dest=flag.dest,
                default=None,
                help=help_text,
                type=flag.type,
                action="append",
            )
        else:
            parser.add_argument(
                flag.name,
                *flag.aliases,
                dest=flag.dest,
                default=default,
                help=help_text,
                type=_parser_type(flag),
                choices=flag.choices,
            )


def fill_list_defaults(args: argparse.Namespace, flags: Iterable[Flag]) -> None:
    """Repeatable flags take the environment only when none is given on the command line."""
    for flag in flags:
        if flag.kind == "list" and getattr(args, flag.dest, None) is None:
            setattr(args, flag.dest, env_default(flag) or [])


def warn_secrets_on_command_line(argv: Sequence[str], flags: Iterable[Flag]) -> list[str]:
    """Secret flags given as arguments (`ps` shows every process's argv to every user): each
    is named on stderr with the variable to use instead. Returns the names."""
    found = []
    for flag in flags:
        if flag.secret and any(a == flag.name or a.startswith(flag.name + "=") for a in argv):
            found.append(flag.name)
            print(
                f"warning: {flag.name} on the command line is visible to every user in `ps`; "
                f"prefer {flag.env_var}" + (" or --api-keys-file" if flag.kind == "list" else ""),
                file=sys.stderr,
            )
    return found


def flag_argv(flag: Flag, value: Any) -> list[str]:
    """One flag's value as arguments (nothing for None, an unset switch, an empty list)."""
    if value is None:
        return []
    if flag.kind == "bool":
        return [flag.name if value else "--no-" + flag.name[2:]]
    if flag.kind == "switch":
        return [flag.name] if value else []
    if flag.kind == "list":
        return [a for item in value for a in (flag.name, str(item))]
    return [flag.name, str(value)]


def flag_env(flag: Flag, value: Any) -> dict[str, str]:
    """One flag's value as its environment variable (nothing for an empty value)."""
    if not value:
        return {}
    return {flag.env_var: ",".join(map(str, value)) if flag.kind == "list" else str(value)}
