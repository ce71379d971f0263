"""docs/quickstart.md, run as a newcomer would: against a fresh `svc up` with the demo company.

Each example block is marked ``<!-- doc-check ... -->``; tests/doccheck.py says how a block is run
and its output compared. The page's order matters: the history's totals count the decision and
the events of the examples before them, Ctrl-C stops the install, and `make demo` runs after it
on the same data directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from doccheck import MARK, ROOT, Page, examples
from uphelp import Up, start_up

QUICKSTART = ROOT / "docs" / "quickstart.md"


@pytest.fixture(scope="module")
def quickstart_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("quickstart-up"))
    yield up
    code, _, err = up.stop()  # the page's Ctrl-C stopped it already; the same answer
    assert code == 0, err


def test_every_example_block_of_the_quickstart_is_checked() -> None:
    lines = QUICKSTART.read_text().splitlines()
    fences = [i for i, line in enumerate(lines) if re.fullmatch(r"```(console|sh|python)", line)]
    assert fences
    unmarked = [i + 1 for i in fences if not MARK.match(lines[i - 1].strip())]
    assert unmarked == [], f"docs/quickstart.md lines {unmarked}: example blocks not checked"
    kinds = {e.kind for e in examples(QUICKSTART.read_text())}
    assert kinds == {"banner", "shell", "stop", "make"}


def test_quickstart_examples_answer_as_shown(quickstart_up: Up, tmp_path: Path) -> None:
    Page(QUICKSTART, quickstart_up, tmp_path).run()
