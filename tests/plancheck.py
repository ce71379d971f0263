"""Checks a query plan (docs/plans.md) against per-row decisions (docs/decisions.md); shared by
tests/test_plan.py and tests/test_plan_properties.py.

The correctness bar (docs/architecture.md#query-plans), per outcome, for rows of the planned
resource type:

* `always_allowed`: every row's check is `allow`;
* `always_denied`: no row's check is `allow` or `challenge` (not even after a challenge);
* `conditional`: the filter matches a row exactly when its check is `allow`; a row whose check
  is `challenge` needs `challenge_could_widen` and its challenge names in `challenges`;
* `challenge`: no row is `allow` outright, and the filter matches a row exactly when its check
  is `challenge` (passing the challenges then shows it).

A filter with `unknown`/`unmappable` nodes must set `needs_row_checks`. Rows whose answer depends
on those nodes (the superset reading of docs/plans.md and its mirror image, the subset reading,
disagree) are exempt from the equality; for every row, the subset reading matching implies the
check accepts, which implies the superset reading matches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from svc.plan import EntityUid, evaluate, parse_filter

OUTCOMES = ("always_allowed", "always_denied", "challenge", "conditional")
PLAN_FIELDS = {
    "qid",
    "outcome",
    "challenges",
    "challenge_could_widen",
    "needs_row_checks",
    "attributes",
    "policies",
    "mode",
    "policy_version",
    "principals_version",
    "max_age_secs",
    "pinned",
}


def has_residual(tree: Mapping[str, Any]) -> bool:
    """Whether the filter tree has an `unknown` or `unmappable` node."""
    if tree["op"] in ("unknown", "unmappable"):
        return True
    if tree["op"] in ("and", "or"):
        return any(has_residual(a) for a in tree["args"])
    if tree["op"] == "not":
        return has_residual(tree["arg"])
    return False


def subset_reading(tree: Mapping[str, Any], positive: bool = True) -> dict[str, Any]:
    """The tree with each residual node FALSE under an even number of NOTs and TRUE under an odd
    one: it matches only rows that every reading of the residuals matches (the mirror image of
    the superset reading)."""
    if tree["op"] in ("unknown", "unmappable"):
        return {"op": "false" if positive else "true"}
    if tree["op"] in ("and", "or"):
        return {"op": tree["op"], "args": [subset_reading(a, positive) for a in tree["args"]]}
    if tree["op"] == "not":
        return {"op": "not", "arg": subset_reading(tree["arg"], not positive)}
    return dict(tree)


def attr_paths(tree: Mapping[str, Any]) -> set[str]:
    """Dotted attribute paths the tree uses (the plan's `attributes`)."""
    if tree["op"] in ("and", "or"):
        return set().union(*(attr_paths(a) for a in tree["args"]))
    if tree["op"] == "not":
        return attr_paths(tree["arg"])
    return {".".join(tree["attr"])} if "attr" in tree else set()


def row_key(row: Mapping[str, Any]) -> str:
    uid = row["uid"].get("__entity", row["uid"])
    return str(EntityUid(uid["type"], uid["id"]))


def check_plan_rows(
    plan: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    verdicts: Mapping[str, Mapping[str, Any]],
    ancestors: Mapping[EntityUid, Any] | Callable[[EntityUid], Any] | None = None,
) -> tuple[set[str], set[str]]:
    """Asserts the plan agrees with the per-row `verdicts` (responses of `engine.evaluate`,
    keyed by `row_key`). Returns the row keys the filter's subset and superset readings match
    (equal when the filter has no residual node; empty without a filter)."""
    ctx = f"plan={json.dumps(plan, sort_keys=True)}\nverdicts=" + json.dumps(
        {k: [v["verdict"], v["challenges"], v["policies"]] for k, v in verdicts.items()}
    )
    keys = [row_key(r) for r in rows]
    allowed = {k for k in keys if verdicts[k]["verdict"] == "allow"}
    challenged = {k for k in keys if verdicts[k]["verdict"] == "challenge"}
    outcome = plan["outcome"]
    assert PLAN_FIELDS <= set(plan), f"missing fields {PLAN_FIELDS - set(plan)}\n{ctx}"
    assert outcome in OUTCOMES, ctx
    assert ("filter" in plan) == (outcome in ("conditional", "challenge")), f"filter?\n{ctx}"

    if outcome == "always_allowed":
        assert allowed == set(keys), f"always_allowed but not allowed: {set(keys) - allowed}\n{ctx}"
        return set(keys), set(keys)
    if outcome == "always_denied":
        assert not allowed and not challenged, f"always_denied but accepted rows\n{ctx}"
        assert not plan["needs_row_checks"], ctx
        return set(), set()
    if outcome == "challenge":
        assert not allowed, f"challenge outcome but rows allowed outright: {allowed}\n{ctx}"
        assert plan["challenges"], f"challenge outcome without challenge names\n{ctx}"
        target = challenged
    else:
        target = allowed
        if challenged:
            assert plan["challenge_could_widen"], f"challenged rows {challenged} hidden\n{ctx}"
    if outcome == "challenge" or plan["challenge_could_widen"]:
        for k in challenged:
            missing = set(verdicts[k]["challenges"]) - set(plan["challenges"])
            assert not missing, f"row {k}: challenges {missing} not in the plan\n{ctx}"

    tree = plan["filter"]
    parse_filter(tree)
    residual = has_residual(tree)
    assert plan["needs_row_checks"] == residual, f"needs_row_checks ⇔ residual node\n{ctx}"
    assert set(plan["attributes"]) == attr_paths(tree), f"attributes\n{ctx}"
    low_tree = subset_reading(tree)
    high = {row_key(r) for r in rows if evaluate(tree, r, ancestors=ancestors, unknown="superset")}
    low = {row_key(r) for r in rows if evaluate(low_tree, r, ancestors=ancestors)}
    ctx += f"\nsubset={sorted(low)} superset={sorted(high)} target={sorted(target)}"
    assert low <= target, f"filter matches rows the check rejects: {sorted(low - target)}\n{ctx}"
    assert target <= high, f"filter hides rows the check accepts: {sorted(target - high)}\n{ctx}"
    return low, high
