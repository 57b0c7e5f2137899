"""docs/contracts.md's step tables are the dataclasses, written out: they cannot drift."""

from __future__ import annotations

from ckptflow.contract import STEP_ARGS, specs
from ckptflow.contract.docs import DOC, main, module, updated
from tests.deploy.schemas import contract_step_modules


def test_the_doc_is_what_the_dataclasses_say():
    text = DOC.read_text()
    assert updated(text) == text, "run `python -m ckptflow.contract.docs` and commit the doc"


def test_every_step_and_every_flag_is_in_the_doc():
    text = DOC.read_text()
    assert contract_step_modules() == [module(cls) for cls in STEP_ARGS]
    for cls in STEP_ARGS:
        for s in specs(cls):
            assert f"| `{s.flag}`" in text, s.flag


def test_check_fails_on_a_hand_edited_table_and_the_writer_fixes_it(tmp_path, capsys):
    doc = tmp_path / "contracts.md"
    doc.write_text(DOC.read_text().replace("| `40` |", "| `200` |", 1))
    assert main(["--check", "--path", str(doc)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--path", str(doc)]) == 0
    assert doc.read_text() == DOC.read_text()
    doc.write_text("no markers here\n")
    assert main(["--check", "--path", str(doc)]) == 2
