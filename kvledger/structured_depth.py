"""How deep a structured-output constraint goes once its references are followed, measured
without recursion, before the grammar engine sees it.

Why: the engine (llguidance) compiles a JSON schema by following each `$ref` into its target,
and a Lark grammar by following each rule into the rules it names, on the native stack. A
schema of 1,200 `$defs` each referring to the next is only four levels of JSON, well inside
the frontend's nesting bound, yet it overflowed the stack of the process that compiled it
(signal 11). So the depth that matters is the longest path through nesting *and* references:
measured here iteratively, it refuses such a spec with a message naming the bound, and nothing
native runs.

How: the spec becomes a graph (JSON containers with edges to their children and to the target
of each local `$ref`; Lark rules and terminals with edges to the names in their bodies). A cycle
(a recursive schema: a tree's node holding a list of nodes) is legitimate and costs the engine
one visit per member, so each strongly connected component weighs its size and the depth is the
heaviest path through the components, from the root. The measure bounds what the engine can
recurse through from above; for a graph without cycles it is exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# Identifier of a Lark rule (lowercase) or terminal (uppercase); `?rule` and `!rule` inline or
# keep a rule; `rule.2` gives it a priority.
_DEFINITION = re.compile(r"^\s*[?!]?([A-Za-z_][A-Za-z0-9_]*)\s*(?:\.\s*-?\d+\s*)?:", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def schema_depth(schema: Any) -> int:
    """Containers (objects and arrays) on the heaviest path from the schema's root, through
    nesting and through every `$ref` that resolves inside the schema (JSON pointers from `#`,
    `$anchor`s and `$id`s); a cycle weighs its size."""
    nodes: list[Any] = []
    index: dict[int, int] = {}
    edges: list[list[int]] = []
    refs: list[tuple[int, str]] = []
    names: dict[str, int] = {}  # `$anchor` / `$id` -> node
    stack = [schema]
    while stack:
        value = stack.pop()
        if not isinstance(value, dict | list) or id(value) in index:
            continue
        index[id(value)] = len(nodes)
        nodes.append(value)
        edges.append([])
        children = value.values() if isinstance(value, dict) else value
        stack.extend(c for c in children if isinstance(c, dict | list))
    for n, value in enumerate(nodes):
        children = value.values() if isinstance(value, dict) else value
        edges[n].extend(index[id(c)] for c in children if isinstance(c, dict | list))
        if isinstance(value, dict):
            for key in ("$anchor", "$dynamicAnchor", "$id"):
                if isinstance(value.get(key), str):
                    names[value[key]] = n
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                if isinstance(value.get(key), str):
                    refs.append((n, value[key]))
    for n, ref in refs:
        target = _resolve(schema, ref, names)
        if target is not None and id(target) in index:
            edges[n].append(index[id(target)])
        elif ref in names or ref.lstrip("#") in names:
            edges[n].append(names.get(ref, names.get(ref.lstrip("#"), 0)))
    return heaviest_path(edges, 0) if nodes else 0


def _resolve(root: Any, ref: str, names: dict[str, int]) -> Any:
    """The value a local JSON pointer (`#`, `#/$defs/a`) names, or None."""
    if not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
        return None
    value = root
    for part in ref[2:].split("/") if len(ref) > 1 else []:
        part = part.replace("%25", "%").replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def lark_depth(text: str) -> int:
    """Rules and terminals on the heaviest path of a Lark grammar (from `start` when it has
    one), with each inline `%json {...}` schema's own depth added to the rule that holds it; a
    cycle (recursive rules: an expression holding expressions) weighs its size."""
    bodies = dict(_definitions(text))
    order = {name: i for i, name in enumerate(bodies)}
    edges: list[list[int]] = [[] for _ in order]
    weights = [1] * len(order)
    for name, body in bodies.items():
        plain, schemas = _strip(body)
        weights[order[name]] += max((schema_depth(s) for s in schemas), default=0)
        edges[order[name]] = [order[w] for w in _NAME.findall(plain) if w in order]
    if not order:
        return 0
    return max(
        heaviest_path(edges, order[r], weights)
        for r in ([n for n in ("start",) if n in order] or order)
    )


def _definitions(text: str) -> Iterator[tuple[str, str]]:
    """(name, body) of each rule and terminal, in order; a name defined twice (alternatives
    given twice) keeps both bodies."""
    found = list(_DEFINITION.finditer(text))
    seen: dict[str, str] = {}
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        name = match.group(1)
        seen[name] = seen.get(name, "") + "\n" + text[match.end() : end]
    yield from seen.items()


def _strip(body: str) -> tuple[str, list[Any]]:
    """A rule's body without its string literals, regexes, comments and `%json` blocks (which
    name no rule), and the schemas of those blocks."""
    out: list[str] = []
    schemas: list[Any] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c in "\"'/" and not body.startswith("//", i):
            i = _literal_end(body, i)
            out.append(" ")
        elif body.startswith("//", i) or c == "#":
            i = body.find("\n", i) if "\n" in body[i:] else n
        elif body.startswith("%json", i):
            start = body.find("{", i)
            try:
                schema, end = (
                    json.JSONDecoder().raw_decode(body, start) if start >= 0 else (None, i)
                )
            except (ValueError, RecursionError):
                schema, end = None, i + 5
            if schema is not None:
                schemas.append(schema)
            i = max(end, i + 5)
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out), schemas


def _literal_end(text: str, start: int) -> int:
    """The index after the string or regex literal opened at `start` (escapes skipped)."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote and text[i] != "\n":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def heaviest_path(edges: list[list[int]], root: int, weights: list[int] | None = None) -> int:
    """The heaviest path from `root` in a directed graph whose strongly connected components
    weigh the sum of their members' weights (1 each by default). Tarjan's algorithm with an
    explicit stack: it emits each component after every component it reaches, so one pass in
    emission order sums the path."""
    weight = weights or [1] * len(edges)
    order = [-1] * len(edges)
    low = [0] * len(edges)
    on_stack = [False] * len(edges)
    component = [-1] * len(edges)
    heaviest: list[int] = []  # per component, in emission order
    stack: list[int] = []
    work = [(root, 0)]
    counter = 0
    while work:
        v, i = work.pop()
        if i == 0:
            order[v] = low[v] = counter
            counter += 1
            stack.append(v)
            on_stack[v] = True
        for j in range(i, len(edges[v])):
            w = edges[v][j]
            if order[w] == -1:
                work += [(v, j + 1), (w, 0)]
                break
            if on_stack[w]:
                low[v] = min(low[v], order[w])
        else:
            if low[v] == order[v]:
                heaviest.append(
                    _close(v, stack, on_stack, component, len(heaviest), edges, weight, heaviest)
                )
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return heaviest[component[root]]


def _close(
    v: int,
    stack: list[int],
    on_stack: list[bool],
    component: list[int],
    number: int,
    edges: list[list[int]],
    weight: list[int],
    heaviest: list[int],
) -> int:
    """Pops the component rooted at `v`; returns its weight plus its heaviest successor's."""
    members = []
    while True:
        w = stack.pop()
        on_stack[w] = False
        component[w] = number
        members.append(w)
        if w == v:
            break
    after = (component[w] for m in members for w in edges[m] if component[w] != number)
    return sum(weight[m] for m in members) + max((heaviest[c] for c in after), default=0)
