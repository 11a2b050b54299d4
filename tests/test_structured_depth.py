"""The depth of a constraint through its references (kvledger/structured_depth.py), measured
without recursion: chains, cycles (each weighs its members), anchors, nested grammars, and
the bound that refuses what is deeper, before the engine sees it."""

from __future__ import annotations

import sys
import time

import pytest

from kvledger.structured import StructuredError, StructuredSpec, check_depth, json_schema_spec
from kvledger.structured_depth import heaviest_path, lark_depth, schema_depth


def ref_chain(n: int) -> dict:
    defs = {str(i): {"items": {"$ref": f"#/$defs/{i + 1}"}} for i in range(n)}
    defs[str(n)] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/0"}


def test_a_chain_of_refs_counts_every_level_it_reaches():
    # root -> $defs -> 0 -> items -> (ref) 1 -> items -> ... -> n
    assert schema_depth(ref_chain(1)) == 5
    assert schema_depth(ref_chain(10)) == 2 + 2 * 10 + 1


def test_a_deep_chain_is_measured_without_the_python_stack():
    n = 4 * sys.getrecursionlimit()
    started = time.monotonic()
    assert schema_depth(ref_chain(n)) == 2 + 2 * n + 1
    assert time.monotonic() - started < 5


def test_plain_nesting_is_counted_and_scalars_are_not():
    assert schema_depth({"type": "object", "properties": {"a": {"type": "string"}}}) == 3
    assert schema_depth(True) == 0 and schema_depth({}) == 1


def test_a_cycle_weighs_its_members_once():
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"kids": {"items": {"$ref": "#/$defs/node"}}}}
        },
        "$ref": "#/$defs/node",
    }
    assert schema_depth(tree) == 6  # root, $defs, then node/properties/kids/items once
    ring = {"$defs": {str(i): {"items": {"$ref": f"#/$defs/{(i + 1) % 50}"}} for i in range(50)}}
    ring["$ref"] = "#/$defs/0"
    assert schema_depth(ring) == 2 + 100


def test_anchors_ids_and_escaped_pointers_resolve():
    by_anchor = {"$defs": {"a": {"$anchor": "A", "items": {"items": {}}}}, "x": {"$ref": "#A"}}
    assert schema_depth(by_anchor) == 5  # root, $defs, a, items, items
    escaped = {"$defs": {"a/b": {"items": {"items": {}}}}, "x": {"$ref": "#/$defs/a~1b"}}
    assert schema_depth({"p": {"$ref": "#/$defs/a~1b"}, **escaped}) == 5


def test_heaviest_path_on_a_dag_and_through_components():
    # 0 -> 1 -> 3, 0 -> 2 -> 3 -> 4; 2 <-> 5 a cycle
    edges = [[1, 2], [3], [3, 5], [4], [], [2]]
    assert heaviest_path(edges, 0) == 1 + 2 + 1 + 1  # 0, {2, 5}, 3, 4
    assert heaviest_path(edges, 0, [1, 1, 1, 1, 10, 1]) == 1 + 2 + 1 + 10


def test_lark_rules_chain_and_recursion():
    chain = (
        "start: r0\n" + "\n".join(f'r{i}: "a" r{i + 1} | "b"' for i in range(100)) + '\nr100: "c"'
    )
    assert lark_depth(chain) == 102
    expr = 'start: expr\nexpr: term ("+" term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/'
    assert lark_depth(expr) == 4
    # names inside strings, regexes and comments are no references
    assert lark_depth('start: "r1 r2" /r1|r2/ // r1\nr1: r2\nr2: "x"') == 1


def test_a_schema_inside_a_grammar_adds_its_depth():
    grammar = (
        "start: %json "
        + '{"$defs": {"a": {"items": {"$ref": "#/$defs/b"}}, "b": {}}, "$ref": "#/$defs/a"}'
    )
    assert lark_depth(grammar) == 1 + 5


@pytest.mark.parametrize(
    "spec",
    [
        json_schema_spec(ref_chain(40)),
        StructuredSpec(
            "grammar",
            "start: r0\n" + "\n".join(f"r{i}: r{i + 1}" for i in range(80)) + '\nr80: "x"',
        ),
    ],
)
def test_the_bound_refuses_deeper_specs_naming_the_flag(spec):
    with pytest.raises(StructuredError, match="--max-structured-depth"):
        check_depth(spec, 64)
    check_depth(spec, 200)
