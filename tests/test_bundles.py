"""Bundle loading: Cedar's example apps as they stand, every bundle error with its position,
the constructor from texts, template links and atomic bundle replacement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from svc.pdp import BundleError, Engine, RequestError

TESTDATA = Path(__file__).parent / "testdata"
BAD = sorted(p for p in (TESTDATA / "bad_bundles").iterdir() if p.is_dir())


def _example_requests(app: Path) -> list[tuple[Path, str]]:
    out = []
    for folder, verdict in [("ALLOW", "allow"), ("DENY", "deny")]:
        for f in sorted((app / folder).glob("*.json")) if (app / folder).is_dir() else []:
            out.append((f, verdict))
    return out


def test_every_example_app_loads(cedar_examples: Path) -> None:
    apps = [p for p in sorted(cedar_examples.iterdir()) if p.is_dir()]
    assert len(apps) >= 5
    for app in apps:
        engine = Engine.from_bundle_dir(app)
        assert engine.policy_names, app.name


def test_example_requests_decide_as_their_folder_says(cedar_examples: Path) -> None:
    checked = 0
    for app in sorted(p for p in cedar_examples.iterdir() if p.is_dir()):
        engine = Engine.from_bundle_dir(app)
        for f, verdict in _example_requests(app):
            req = json.loads(f.read_text())
            assert engine.evaluate(req)["verdict"] == verdict, f
            checked += 1
    assert checked >= 20


def test_github_example_keeps_its_schema_warning(cedar_examples: Path) -> None:
    engine = Engine.from_bundle_dir(cedar_examples / "github_example")
    assert any("ancestor" in w for w in engine.warnings)


@pytest.mark.parametrize("case", BAD, ids=[p.name for p in BAD])
def test_bad_bundle_reports_every_error_with_position(case: Path) -> None:
    expect = json.loads((case / "expect.json").read_text())["errors"]
    with pytest.raises(BundleError) as info:
        Engine.from_bundle_dir(case)
    errors = info.value.errors
    assert len(errors) == len(expect), errors
    for got, want in zip(errors, expect, strict=True):
        assert want["contains"] in got["message"], got
        for key in ("file", "line", "column", "policy"):
            if key in want:
                assert got[key] == want[key], (key, got)
        if "line" in want:
            assert isinstance(got["column"], int) and got["column"] >= 1
    assert str(len(expect)) in str(info.value)


SCHEMA = """
entity User in [Team];
entity Team;
entity Doc = { owner: User };
action view appliesTo { principal: [User], resource: [Doc] };
"""


def test_engine_from_texts_with_cedar_and_json_schemas() -> None:
    policies = 'permit (principal, action == Action::"view", resource) when { resource.owner == principal };'
    ents = [
        {
            "uid": {"type": "Doc", "id": "d"},
            "attrs": {"owner": {"__entity": {"type": "User", "id": "u"}}},
            "parents": [],
        }
    ]
    engine = Engine(policies=policies, schema=SCHEMA, entities=ents)
    req = {
        "principal": {"type": "User", "id": "u"},
        "action": "view",
        "resource": {"type": "Doc", "id": "d"},
    }
    assert engine.evaluate(req)["verdict"] == "allow"
    json_schema = {
        "": {
            "entityTypes": {
                "User": {"memberOfTypes": ["Team"]},
                "Team": {},
                "Doc": {
                    "shape": {
                        "type": "Record",
                        "attributes": {"owner": {"type": "Entity", "name": "User"}},
                    }
                },
            },
            "actions": {
                "view": {"appliesTo": {"principalTypes": ["User"], "resourceTypes": ["Doc"]}}
            },
        }
    }
    engine2 = Engine(
        policies={
            "b.cedar": policies,
            "a.cedar": "forbid (principal, action, resource) when { false };",
        },
        schema=json_schema,
        entities=json.dumps(ents),
    )
    assert engine2.evaluate(req) | {"qid": ""} == {
        "qid": "",
        "verdict": "allow",
        "challenges": [],
        "policies": ["policy1"],
        "mode": "enforce",
    }
    assert engine2.policy_names == ["policy0", "policy1"]


def test_engine_without_schema_is_plain_cedar() -> None:
    engine = Engine(
        policies='@id("p") permit (principal in Team::"t", action == Action::"read", resource);'
    )
    engine.upsert_entities(
        [
            {
                "uid": {"type": "User", "id": "u"},
                "attrs": {},
                "parents": [{"type": "Team", "id": "t"}],
            }
        ]
    )
    req = {
        "principal": {"type": "User", "id": "u"},
        "action": "read",
        "resource": {"type": "X", "id": "1"},
    }
    assert engine.evaluate(req)["policies"] == ["p"]
    assert (
        engine.evaluate({**req, "context": {"anything": [1, "two", {"three": True}]}})["verdict"]
        == "allow"
    )


def test_template_links_through_the_api() -> None:
    engine = Engine(
        policies='@id("viewer") permit (principal == ?principal, action == Action::"view", resource == ?resource);',
        schema=SCHEMA,
    )
    req = {
        "principal": {"type": "User", "id": "u"},
        "action": "view",
        "resource": {"type": "Doc", "id": "d"},
    }
    assert engine.evaluate(req)["verdict"] == "deny"
    v0 = engine.versions["policy_version"]
    engine.link_templates(
        [
            {
                "template_id": "viewer",
                "link_id": "u-views-d",
                "args": {"?principal": 'User::"u"', "?resource": {"type": "Doc", "id": "d"}},
            }
        ]
    )
    assert engine.evaluate(req)["policies"] == ["u-views-d"]
    assert engine.versions["policy_version"] == v0 + 1
    with pytest.raises(BundleError, match="unknown template `nope`"):
        engine.link_templates([{"template_id": "nope", "link_id": "x", "args": {}}])
    with pytest.raises(BundleError, match="duplicate policy name"):
        engine.link_templates(
            [
                {
                    "template_id": "viewer",
                    "link_id": "u-views-d",
                    "args": {"?principal": 'User::"u"', "?resource": 'Doc::"d"'},
                }
            ]
        )
    with pytest.raises(RequestError) as info:
        engine.link_templates(
            [{"template_id": "viewer", "link_id": "y", "args": {"?owner": 'User::"u"'}}]
        )
    assert info.value.field == "links[0].args"
    # A link to an entity type the schema rejects fails validation, and nothing is linked.
    with pytest.raises(BundleError):
        engine.link_templates(
            [
                {
                    "template_id": "viewer",
                    "link_id": "ok",
                    "args": {"?principal": 'User::"v"', "?resource": 'Doc::"d"'},
                },
                {
                    "template_id": "viewer",
                    "link_id": "bad",
                    "args": {"?principal": 'Planet::"v"', "?resource": 'Doc::"d"'},
                },
            ]
        )
    assert "ok" not in engine.policy_names


def test_invalid_bundle_keeps_the_old_one_serving(tmp_path: Path) -> None:
    engine = Engine.from_bundle_dir(TESTDATA / "bundles" / "corp")
    v = engine.versions["policy_version"]
    with pytest.raises(BundleError):
        engine.load_bundle_dir(TESTDATA / "bad_bundles" / "parse_error")
    assert engine.versions["policy_version"] == v
    req = {
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    assert engine.evaluate(req)["verdict"] == "allow"
    engine.load_bundle(
        policies='@id("nobody") forbid (principal, action, resource);',
        schema=(TESTDATA / "bundles" / "corp" / "corp.cedarschema").read_text(),
    )
    assert engine.versions["policy_version"] == v + 1
    assert engine.evaluate(req)["policies"] == ["nobody"]


def test_wrong_python_types_are_type_errors() -> None:
    with pytest.raises(TypeError):
        Engine(policies=42)  # type: ignore[arg-type]
    engine = Engine(policies="permit (principal, action, resource);")
    with pytest.raises(TypeError):
        engine.evaluate({"principal": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        engine.evaluate_many("not a list")  # type: ignore[arg-type]


def test_bundle_entity_breaking_the_schema_loads_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "s.cedarschema").write_text(SCHEMA)
    (tmp_path / "p.cedar").write_text(
        "permit (principal, action, resource) when { resource.owner == principal };"
    )
    (tmp_path / "entities.json").write_text(
        json.dumps(
            [
                {
                    "uid": {"type": "Doc", "id": "d"},
                    "attrs": {"owner": {"__entity": {"type": "User", "id": "u"}}, "extra": "x"},
                    "parents": [],
                }
            ]
        )
    )
    engine = Engine.from_bundle_dir(tmp_path)
    assert len(engine.warnings) == 1 and "extra" in engine.warnings[0]
    req = {
        "principal": {"type": "User", "id": "u"},
        "action": "view",
        "resource": {"type": "Doc", "id": "d"},
    }
    assert engine.evaluate(req)["verdict"] == "allow"
    # The engine's own store API stays strict.
    with pytest.raises(RequestError):
        engine.upsert_entities(
            [
                {
                    "uid": {"type": "Doc", "id": "e"},
                    "attrs": {"owner": {"__entity": {"type": "User", "id": "u"}}, "extra": "x"},
                    "parents": [],
                }
            ]
        )
