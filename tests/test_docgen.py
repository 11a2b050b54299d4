"""docs/configuration.md is generated from the config dataclasses and kept fresh: a flag added,
renamed or re-documented without regenerating the page fails here."""

from __future__ import annotations

from kvledger import docgen
from kvledger.children import SERVE_ONLY_FLAGS
from kvledger.flags import FLAGS


def test_configuration_md_is_fresh():
    """Regenerate with `python -m kvledger.docgen` (or `make docs`)."""
    assert docgen.PAGE.read_text() == docgen.render(), "run python -m kvledger.docgen"


def test_every_flag_has_a_row_with_its_variable_default_and_help():
    page = docgen.render()
    for flag in [*FLAGS, *SERVE_ONLY_FLAGS]:
        [row] = [line for line in page.splitlines() if line.startswith(f"| `{flag.name}`")]
        assert f"`{flag.env_var}`" in row and docgen._cell(flag.help) in row, flag.name


def test_check_fails_on_a_stale_page_and_rewriting_fixes_it(tmp_path, monkeypatch, capsys):
    page = tmp_path / "configuration.md"
    page.write_text(docgen.render().replace("`KVLEDGER_MAX_NUM_SEQS`", "`KVLEDGER_MAX_SEQS`"))
    monkeypatch.setattr(docgen, "PAGE", page)
    assert docgen.main(["--check"]) == 1
    assert "run python -m kvledger.docgen" in capsys.readouterr().err
    assert docgen.main([]) == 0
    assert docgen.main(["--check"]) == 0
