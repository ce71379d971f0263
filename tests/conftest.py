"""Shared fixtures: paths to the golden corpus and to ../shared/data (present in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CEDAR_EXAMPLES = SHARED_DATA / "cedar-examples"


@pytest.fixture(scope="session")
def cedar_examples() -> Path:
    if not CEDAR_EXAMPLES.is_dir():
        pytest.skip("../shared/data/cedar-examples is not present")
    return CEDAR_EXAMPLES
