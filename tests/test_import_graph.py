"""The import graph keeps each part in its room (docs/design.md, "Layout"): the ledger's core
imports only the standard library and itself, the shared package imports no service, the
settings import nothing beyond the standard library and kvledger, and no service imports
another's code (they talk over gRPC)."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import Rule, cycles, imports_of, violations

REPO = Path(__file__).resolve().parent.parent
SERVICES = ("server", "scheduler_svc", "worker")
PACKAGES = ("kvledger", *SERVICES, "benchmarks", "tools", "deploy")

RULES = [
    Rule(
        "scheduler_svc.core",
        "the core is pure: the standard library and itself only",
        only=True,
        allowed=("scheduler_svc.core",),
    ),
    Rule("kvledger", "the shared package imports no service", forbidden=SERVICES),
    Rule(
        "kvledger.config",
        "the settings load without torch, gRPC or the web framework",
        only=True,
        allowed=("kvledger",),
    ),
    Rule("server", "the frontend never imports the worker or the scheduler", ("worker",)),
    Rule("server", "the frontend talks to the scheduler over gRPC", ("scheduler_svc",)),
    Rule("scheduler_svc", "the scheduler talks to workers over gRPC", ("worker", "server")),
    Rule("worker", "the worker talks to the scheduler over gRPC", ("scheduler_svc", "server")),
]


def test_the_repository_keeps_every_import_rule():
    assert violations(REPO, RULES) == []


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_violation_of_each_rule_is_caught(tmp_path):
    """The same rules over a small tree with one bad import of each kind (absolute, relative,
    `from package import module`, and one inside a function)."""
    _plant(
        tmp_path,
        {
            "scheduler_svc/__init__.py": "",
            "scheduler_svc/worker_link.py": "from worker.runner import batch\n",
            "scheduler_svc/core/__init__.py": "",
            "scheduler_svc/core/ok.py": "import dataclasses\nfrom . import bad\n",
            "scheduler_svc/core/bad.py": "def f():\n    import grpc\n",
            "kvledger/__init__.py": "",
            "kvledger/flags.py": "from server.settings import Settings\n",
            "kvledger/config/__init__.py": "",
            "kvledger/config/worker.py": "from ..options import option\nimport torch\n",
            "kvledger/options.py": "",
            "server/__init__.py": "",
            "server/settings.py": "",
            "server/app.py": "import worker.runner.model_runner\n",
            "worker/__init__.py": "",
            "worker/runner/__init__.py": "",
            "worker/runner/batch.py": "",
            "worker/runner/model_runner.py": "from scheduler_svc.core import ok\n",
        },
    )
    found = violations(tmp_path, RULES)
    assert [line.split(": ")[0] for line in found] == [
        "scheduler_svc/core/bad.py:2 imports grpc",
        "kvledger/flags.py:1 imports server.settings",
        "kvledger/config/worker.py:2 imports torch",
        "server/app.py:1 imports worker.runner.model_runner",
        "scheduler_svc/worker_link.py:1 imports worker.runner.batch",
        "worker/runner/model_runner.py:1 imports scheduler_svc.core.ok",
    ]


def test_relative_imports_resolve_to_the_module_they_name(tmp_path):
    _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from . import sub\n",
            "pkg/sub/__init__.py": "from .. import other\nfrom .leaf import x\n",
            "pkg/sub/leaf.py": "",
            "pkg/other.py": "",
        },
    )
    targets = {
        name: [i.target for i in imports_of(tmp_path, tmp_path / name)]
        for name in ("pkg/__init__.py", "pkg/sub/__init__.py")
    }
    assert targets == {
        "pkg/__init__.py": ["pkg.sub"],
        "pkg/sub/__init__.py": ["pkg.other", "pkg.sub.leaf"],
    }


def test_no_modules_import_one_another_in_a_circle():
    """A circle means two modules are one idea split in two, or that what both need belongs
    in a leaf below them; imports inside functions count (they only hide the circle)."""
    assert cycles(REPO, PACKAGES) == []


def test_a_planted_circle_is_found_even_through_a_lazy_import(tmp_path):
    _plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import x\n",
            "pkg/b.py": "def f():\n    from pkg import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/leaf.py": "",
            "pkg/d.py": "from pkg import leaf\n",
        },
    )
    assert cycles(tmp_path, ("pkg",)) == [["pkg.a", "pkg.b", "pkg.c"]]
