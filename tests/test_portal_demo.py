"""The demo bundle's portal policies (python/svc/demo/bundle/80-portal.cedar), decided by the
real engine over the demo company (docs/portal.md#authorization, docs/demo.md).

The security team administers every portal area, auditors view every area, and everyone else
sees and answers only their own challenges and keys (`context.own`); a leaver, a contained
person and a high-risk person are refused before these policies, as for any other action.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from svc.demo.company import Company, generate, provision, write_bundle
from svc.pdp import Engine
from svc.portal.service import AREAS


@pytest.fixture(scope="module")
def company() -> Company:
    return generate()


@pytest.fixture(scope="module")
def engine(company: Company, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    d: Path = tmp_path_factory.mktemp("demo-portal")
    write_bundle(company, d)
    e = Engine.from_bundle_dir(d)
    provision(e, company)
    return e


def decide(engine: Engine, user: str, action: str, area: str, own: bool = False) -> Any:
    req: dict[str, Any] = {
        "principal": {"type": "Human", "id": user},
        "action": action,
        "resource": {"type": "PortalArea", "id": area},
    }
    if own:
        req["context"] = {"own": True}
    return dict(engine.evaluate(req))


def ordinary(company: Company, group: str | None) -> str:
    """An active, uncontained, unscored person in `group` (None: in neither portal group)."""
    for p in company.people:
        if not p.active or p.user_name in company.contained or p.user_name in company.risk_scores:
            continue
        groups = set(p.groups)
        if group is None and not groups & {"security", "auditors"}:
            return p.user_name
        if (
            group is not None
            and group in groups
            and not groups & ({"security", "auditors"} - {group})
        ):
            return p.user_name
    raise AssertionError(f"no one in {group}")


def test_security_administers_auditors_view_others_only_their_own(
    company: Company, engine: Engine
) -> None:
    sec, aud, other = (
        ordinary(company, "security"),
        ordinary(company, "auditors"),
        ordinary(company, None),
    )
    for area in AREAS:
        for action in ("view", "administer"):
            d = decide(engine, sec, action, area)
            assert d["verdict"] == "allow" and d["policies"] == ["portal-security-administers"], d
        assert decide(engine, aud, "view", area)["policies"] == ["portal-auditors-view"]
        assert decide(engine, aud, "administer", area)["verdict"] == "deny"
        for action in ("view", "administer"):
            d = decide(engine, other, action, area)
            assert d["verdict"] == "deny" and d["policies"] == [], d
            mine = decide(engine, other, action, area, own=True)
            expected = "allow" if area in ("challenges", "keys") else "deny"
            assert mine["verdict"] == expected, (area, action, mine)


def test_leavers_contained_and_risky_people_are_refused(company: Company, engine: Engine) -> None:
    leaver = next(p.user_name for p in company.people if not p.active)
    d = decide(engine, leaver, "view", "challenges", own=True)
    assert d["verdict"] == "deny" and "inactive-people-denied" in d["policies"]
    contained = sorted(company.contained)[0]
    d = decide(engine, contained, "view", "keys", own=True)
    assert d["verdict"] == "deny" and d["policies"] == ["svc:contained"]
    risky = [u for u, s in company.risk_scores.items() if s >= 90 and u not in company.contained]
    assert risky, "the demo company scores someone 90 or more"
    d = decide(engine, risky[0], "view", "keys", own=True)
    assert d["verdict"] == "deny" and "high-risk-denied" in d["policies"]
    elevated = [u for u, s in company.risk_scores.items() if 70 <= s < 90]
    assert elevated, "the demo company scores someone from 70 to 89"
    d = decide(engine, elevated[0], "view", "keys", own=True)
    assert d["verdict"] == "challenge" and d["challenges"] == ["verification"], d


def test_an_ai_agent_sees_no_more_than_its_person(company: Company, engine: Engine) -> None:
    ai = next(a.id for a in company.service_accounts if a.ai and a.registered)
    plain = next(a.id for a in company.service_accounts if not a.ai and a.registered)
    aud, other = ordinary(company, "auditors"), ordinary(company, None)

    def through(agent: str, person: str, action: str, area: str) -> Any:
        return dict(
            engine.evaluate(
                {
                    "principal": {"type": "ServiceAccount", "id": agent},
                    "on_behalf_of": {"type": "Human", "id": person},
                    "action": action,
                    "resource": {"type": "PortalArea", "id": area},
                }
            )
        )

    assert through(ai, aud, "view", "decisions")["verdict"] == "allow"
    assert through(ai, other, "view", "decisions")["verdict"] == "deny"  # the person may not
    assert through(plain, aud, "view", "decisions")["verdict"] == "deny"  # not an AI agent
    assert through(ai, aud, "administer", "containments")["verdict"] == "deny"
    sec = ordinary(company, "security")
    assert through(ai, sec, "administer", "policies")["verdict"] == "allow"  # drafts
    assert through(ai, sec, "administer", "containments")["verdict"] == "deny"
