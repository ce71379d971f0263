"""The decision core's policy outlines from Python, and the values the portal puts beside them.

``svc._pdp_core.outline_policies`` (crates/pdp_core/src/outline.rs; its own unit tests run with
``cargo test -p pdp_core outline``) is checked here through the binding: names as a bundle
gives them across files, text and lines as written, scope, whole attribute paths, entity
literals, Cedar's syntax errors at their line and column, and the answer against its
``TypedDict`` (``svc.pdp.outline_shapes``). Then ``svc.portal.reads.read_values`` over real
outlines and a decision record: the values the decision record keeps (``context.risk_score``),
a bundle's entities followed through entity-valued attributes, absent attributes and what svc
cannot know. The directory's values are covered against a real context service in
tests/test_portal_decisions.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from typeguard import CollectionCheckStrategy, check_type

from svc._pdp_core import BundleError, outline_policies
from svc.pdp.outline_shapes import PolicyOutline
from svc.portal.reads import EntityLookup, bundle_entities, read_values

FIRST = """// owners and their managers
@id("managers-read")
permit (
  principal in Group::"staff",
  action in [Action::"read", Action::"view"],
  resource is Document
)
when {
  resource.owner.manager == principal &&
  principal has department && principal.department == "Finance" &&
  context.risk_score < 50
};

forbid (principal, action == Action::"write", resource)
unless { context has ticket.id && Team::"ops".lead == principal };
"""

SECOND = """permit (principal == ?principal, action, resource in ?resource);

@id("tags")
permit (principal, action, resource) when { resource.hasTag("k") && resource.getTag("k") == "v" };
"""

ENTITIES = """[
  {"uid": {"type": "Document", "id": "plan"},
   "attrs": {"owner": {"__entity": {"type": "User", "id": "dana"}}}, "parents": []},
  {"uid": {"__entity": {"type": "User", "id": "dana"}}, "attrs": {"name": "Dana"}, "parents": []},
  {"uid": {"type": "Team", "id": "ops"}, "attrs": {}, "parents": []}
]"""


def test_policies_are_outlined_from_cedars_parse() -> None:
    first = outline_policies(FIRST, "10-first.cedar")
    second = outline_policies(SECOND, "20-second.cedar", len(first))
    check_type(
        first + second,
        list[PolicyOutline],
        collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS,
    )
    assert [p["name"] for p in first + second] == ["managers-read", "policy1", "policy2", "tags"]
    managers, unnamed = first
    assert managers["effect"] == "permit" and unnamed["effect"] == "forbid"
    assert managers["text"].startswith('@id("managers-read")\npermit (')
    assert managers["text"].endswith("context.risk_score < 50\n};")
    assert managers["text"] in FIRST
    assert (managers["start_line"], managers["end_line"]) == (2, 12)
    assert (unnamed["start_line"], unnamed["end_line"]) == (14, 15)
    assert [(r["path"], r["read"], r["has"], r["lines"]) for r in managers["reads"]] == [
        ("resource.owner.manager", True, False, [9]),
        ("principal.department", True, True, [10]),
        ("context.risk_score", True, False, [11]),
    ]
    assert managers["reads"][0]["attrs"] == ["owner", "manager"]
    assert managers["entities"] == ['Group::"staff"', 'Action::"read"', 'Action::"view"']
    assert managers["scope"]["principal"] == {
        "op": "in", "entities": ['Group::"staff"'], "entity_type": None, "slot": None
    }  # fmt: skip
    assert managers["scope"]["resource"]["op"] == "is"
    assert managers["scope"]["resource"]["entity_type"] == "Document"
    # `has` on a dotted path is the whole path; an attribute of an entity literal names it.
    assert [(r["path"], r["has"]) for r in unnamed["reads"]] == [
        ("context.ticket.id", True),
        ('Team::"ops".lead', False),
    ]
    assert unnamed["reads"][1]["root_entity"] == {"type": "Team", "id": "ops"}
    template, tags = second
    assert template["template"] and template["scope"]["principal"]["slot"] == "?principal"
    assert (template["start_line"], tags["start_line"]) == (1, 3)
    assert [(r["path"], r["tag"]) for r in tags["reads"]] == [('resource.getTag("k")', "k")]


def test_a_syntax_error_is_cedars_with_line_and_column() -> None:
    with pytest.raises(BundleError) as e:
        outline_policies(
            '@id("a")\npermit (principal, action, resource)\nwhen { 1 + };\n', "bad.cedar"
        )
    (err, *_) = e.value.errors
    assert (err["file"], err["line"], err["column"]) == ("bad.cedar", 3, 12)
    assert "unexpected token" in err["message"]
    assert outline_policies("// nothing here\n") == []


def test_values_from_the_record_and_the_bundle() -> None:
    first = outline_policies(FIRST, "policies.cedar")
    at = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    now = datetime(2026, 11, 28, 13, 0, tzinfo=UTC)
    row: dict[str, Any] = {
        "qid": "q",
        "at": at.isoformat(),
        "principal": {"type": "User", "id": "dana"},
        "resource": {"type": "Document", "id": "plan"},
        "risk_score": 20,
        "work_item": None,
        "assigned": False,
    }
    lookup = EntityLookup(None, bundle_entities(ENTITIES), now)
    owner, department, risk = read_values(first[0]["reads"], row, lookup)
    # resource.owner is followed into the bundle's User::"dana", who has no manager.
    assert owner["status"] == "absent" and owner["source"] == "bundle"
    assert owner["as_of"] == now.isoformat() and "manager" in (owner["note"] or "")
    assert department["status"] == "absent" and department["has"]
    assert risk == {
        "path": "context.risk_score", "read": True, "has": False, "lines": [11],
        "status": "value", "value": 20, "source": "decision", "as_of": at.isoformat(),
        "note": None,
    }  # fmt: skip
    # No recorded score: the caller's context is not recorded.
    (_, _, unrecorded) = read_values(first[0]["reads"], {**row, "risk_score": None}, lookup)
    assert unrecorded["status"] == "unknown" and unrecorded["value"] is None
    assert "context" in (unrecorded["note"] or "")
    ticket, lead = read_values(first[1]["reads"], row, lookup)
    assert ticket["status"] == "unknown"
    assert lead["status"] == "absent" and lead["source"] == "bundle"
    # An entity neither the directory nor the bundle holds: unknown, said why.
    (gone,) = read_values(
        outline_policies('permit (principal, action, resource) when { Team::"x".lead == 1 };')[0][
            "reads"
        ],
        row,
        lookup,
    )
    assert gone["status"] == "unknown" and 'Team::"x"' in (gone["note"] or "")
    # A value found through an entity-valued attribute.
    (name,) = read_values(
        outline_policies("permit (principal, action, resource) when { resource.owner.name == 1 };")[
            0
        ]["reads"],
        row,
        lookup,
    )
    assert (name["status"], name["value"], name["source"]) == ("value", "Dana", "bundle")


def test_the_work_item_the_decision_point_filled_in() -> None:
    (policy,) = outline_policies(
        "permit (principal, action, resource) when "
        '{ context.assigned && context.work_item.status == "open" && context.human_present };'
    )
    at = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    row: dict[str, Any] = {
        "at": at,
        "principal": {"type": "Acme::Human", "id": "dana"},
        "resource": {"type": "Acme::Doc", "id": "d"},
        "risk_score": None,
        "work_item": "jira:OPS-1",
        "assigned": True,
    }
    lookup = EntityLookup(None, {}, at)
    assigned, status, present = read_values(policy["reads"], row, lookup)
    assert (assigned["status"], assigned["value"], assigned["source"]) == (
        "value",
        True,
        "decision",
    )
    assert assigned["as_of"] == at.isoformat()
    # The item is followed as an entity of the principal's namespace, which nothing holds here.
    assert status["status"] == "unknown"
    assert 'Acme::WorkItem::"jira:OPS-1"' in (status["note"] or "")
    assert present["status"] == "unknown"
    # Not assigned: whether the named item was open is not recorded.
    (_, unsure, _) = read_values(policy["reads"], {**row, "assigned": False}, lookup)
    assert unsure["status"] == "unknown" and "open" in (unsure["note"] or "")
