"""Loader for the golden corpus under tests/testdata/golden (shared with the Rust tests).

A golden file is ``{"description", "bundle", "setup", "cases": [...]}``: ``bundle`` names a
directory under tests/testdata/bundles; ``setup`` may hold ``entities``, ``service_accounts``,
``work_items``, ``contained``, ``risk_scores`` and ``mode``; each case has a ``request`` and
either ``expect`` (the response without ``qid``; ``mode`` defaults to ``enforce``) or
``error`` (``{"field", "contains"}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from svc.pdp import Engine

TESTDATA = Path(__file__).parent / "testdata"
GOLDEN = TESTDATA / "golden"
BUNDLES = TESTDATA / "bundles"


def golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def engine_for(doc: dict[str, Any]) -> Engine:
    """Builds the engine a golden file describes, with its setup applied."""
    engine = Engine.from_bundle_dir(BUNDLES / doc["bundle"])
    setup = doc.get("setup", {})
    if "entities" in setup:
        engine.upsert_entities(setup["entities"])
    if "service_accounts" in setup:
        engine.register_service_accounts(setup["service_accounts"])
    if "work_items" in setup:
        engine.upsert_work_items(setup["work_items"])
    if "contained" in setup:
        engine.set_containments(setup["contained"])
    if "risk_scores" in setup:
        engine.set_risk_scores(setup["risk_scores"])
    if "mode" in setup:
        engine.set_mode(setup["mode"])
    return engine


def expected_response(case: dict[str, Any]) -> dict[str, Any]:
    """The full expected response (without ``qid``)."""
    want = dict(case["expect"])
    want.setdefault("mode", "enforce")
    return want


def without_qid(resp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resp.items() if k != "qid"}


def all_cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every case as ``(id, file doc, case)``."""
    out = []
    for f in golden_files():
        doc = load(f)
        for case in doc["cases"]:
            out.append((f"{f.stem}: {case['name']}", doc, case))
    return out
