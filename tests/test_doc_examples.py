"""The console examples of docs/api.md, docs/auth.md, docs/bundles.md and docs/plans.md, run
against a fresh `svc up` serving tests/testdata/bundles/corp (the bundle those pages use).

Each checked block is marked ``<!-- doc-check ... -->``; tests/doccheck.py says how a block is run
and its output compared. docs/quickstart.md has its own test (tests/test_quickstart.py), the
README too (tests/test_readme.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doccheck import ROOT, Page, examples
from uphelp import Up, start_up

CORP = ROOT / "tests" / "testdata" / "bundles" / "corp"
PAGES = ["api.md", "auth.md", "bundles.md", "plans.md"]


@pytest.fixture(scope="module")
def corp_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("docs-up"), "--bundle", str(CORP))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_answer_as_shown(page: str, corp_up: Up, tmp_path: Path) -> None:
    doc = Page(ROOT / "docs" / page, corp_up, tmp_path)
    assert doc.examples, f"docs/{page}: no checked example"
    doc.run()


def test_refusals_in_the_docs_are_checked_with_their_exit_code() -> None:
    codes = {
        page: [e.exit_code for e in examples((ROOT / "docs" / page).read_text())] for page in PAGES
    }
    assert codes == {"api.md": [0], "auth.md": [2], "bundles.md": [2], "plans.md": [0]}
