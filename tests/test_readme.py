"""The README's copy-paste examples, run against a fresh `svc up` (issue: svc up, item 3).

The README marks each checked block with ``<!-- readme-check -->``; tests/doccheck.py says how
a block is run and its output compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doccheck import ROOT, Page, examples
from uphelp import Up, start_up

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def readme_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("readme-up"))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


def test_readme_has_checked_examples() -> None:
    found = examples(README.read_text())
    kinds = {e.kind for e in found}
    assert kinds == {"banner", "shell", "python", "server"}
    text = " ".join(e.code for e in found)
    for route in ("/v1/access/evaluation", "/v1/access/plan", "/access/v1/evaluation"):
        assert route in text
    assert "grpc" in text.lower()


def test_readme_examples_answer_as_shown(readme_up: Up, tmp_path: Path) -> None:
    Page(README, readme_up, tmp_path).run()
