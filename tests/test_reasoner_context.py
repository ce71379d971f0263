"""The context service's side of the reasoner: scores with their factors, investigations with
their evidence (docs/context.md#risk-scores), on PostgreSQL, over HTTP."""

from __future__ import annotations

from typing import Any

from test_context import Live, database_url, live  # noqa: F401  (fixtures)

FACTOR = {
    "name": "moved_out",
    "family": "b",
    "observed": 5000.0,
    "baseline": 12.0,
    "peers": 3.0,
    "contribution": 60.0,
    "day": "2026-11-22",
}


def score(pid: str, value: int, ptype: str = "Human", **extra: Any) -> dict[str, Any]:
    return {"principal": {"type": ptype, "id": pid}, "score": value, **extra}


def test_scores_keep_their_factors_and_are_read_back(live: Live) -> None:  # noqa: F811
    r = live.http.post(
        "/v1/risk",
        json={
            "scores": [
                score("alice", 80, factors=[FACTOR], details={"learning": False}),
                score("copilot.assistant/eu", 30, "ServiceAccount"),
                score("bob", 0),
            ]
        },
    )
    assert r.status_code == 200, r.text
    listed = live.http.get("/v1/risk").json()["scores"]
    assert [(s["principal"]["id"], s["score"]) for s in listed] == [
        ("alice", 80),
        ("copilot.assistant/eu", 30),
        ("bob", 0),
    ]
    assert listed[0]["factors"] == [FACTOR] and listed[0]["details"] == {"learning": False}
    assert [
        s["principal"]["id"] for s in live.http.get("/v1/risk?min_score=30").json()["scores"]
    ] == [
        "alice",
        "copilot.assistant/eu",
    ]
    one = live.http.get("/v1/risk/ServiceAccount/copilot.assistant/eu")
    assert one.status_code == 200 and one.json()["score"] == 30 and one.json()["factors"] == []
    assert live.http.get("/v1/risk/Human/nobody").status_code == 404
    # A rescore replaces the factors.
    live.http.post("/v1/risk", json={"scores": [score("alice", 10)]}).raise_for_status()
    assert live.http.get("/v1/risk/Human/alice").json()["factors"] == []


def test_a_bad_score_names_every_bad_item_and_stores_nothing(live: Live) -> None:  # noqa: F811
    bad = live.http.post(
        "/v1/risk",
        json={
            "scores": [
                score("alice", 50, factors=[{**FACTOR, "contribution": -1}]),
                score("bob", 50, factors=[FACTOR] * 21),
                score("carol", 50, factors=[{**FACTOR, "colour": "red"}]),
                score("dan", 50, details={"blob": "x" * 300_000}),
                score("erin", 50),
            ]
        },
    )
    assert bad.status_code == 400, bad.text
    fields = {(e["index"], e["field"].split(".")[0]) for e in bad.json()["errors"]}
    assert fields == {(0, "factors"), (1, "factors"), (2, "factors"), (3, "details")}
    assert live.http.get("/v1/risk").json()["scores"] == []


def test_one_cycle_of_scores_goes_in_one_request_beyond_the_batch_limit(
    live: Live,  # noqa: F811
) -> None:
    before = live.http.get("/v1/feeds").json()["principals"]
    n = live.settings.max_batch_items + 500
    r = live.http.post("/v1/risk", json={"scores": [score(f"u{i}", i % 101) for i in range(n)]})
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == n
    assert r.json()["principals_version"] == before + n
    assert len(live.http.get("/v1/risk").json()["scores"]) == n
    too_many = live.settings.max_risk_scores + 1
    r = live.http.post("/v1/risk", json={"scores": [score("x", 1)] * too_many})
    assert r.status_code == 400 and "SVC_CONTEXT_MAX_RISK_SCORES" in r.text


def test_investigations_keep_their_kind_evidence_and_summary(live: Live) -> None:  # noqa: F811
    evidence = {"factors": [FACTOR], "window": ["2026-10-24", "2026-11-22"], "decisions": ["q1"]}
    r = live.http.post(
        "/v1/investigations",
        json={
            "principal": {"type": "Human", "id": "alice"},
            "reason": "moved out 5000 rows",
            "opened_by": "svc-reasoner",
            "kind": "would_contain",
            "evidence": evidence,
            "summary": "Alice exported 5000 rows.",
            "summary_by": "deterministic",
        },
    )
    assert r.status_code == 201, r.text
    inv = r.json()
    assert (inv["kind"], inv["evidence"], inv["summary_by"]) == (
        "would_contain",
        evidence,
        "deterministic",
    )
    live.http.post(
        "/v1/investigations",
        json={"principal": {"type": "Human", "id": "bob"}, "reason": "r", "opened_by": "sec"},
    ).raise_for_status()
    kinds = live.http.get("/v1/investigations", params={"kind": "would_contain"}).json()
    assert [i["id"] for i in kinds["investigations"]] == [inv["id"]]
    manual = live.http.get("/v1/investigations", params={"kind": "manual"}).json()
    assert [i["principal"] for i in manual["investigations"]] == ['Human::"bob"']
    assert live.http.get("/v1/investigations", params={"kind": "other"}).status_code == 400
    big = live.http.post(
        "/v1/investigations",
        json={
            "principal": {"type": "Human", "id": "alice"},
            "reason": "r",
            "opened_by": "svc-reasoner",
            "kind": "maybe",
            "evidence": {"blob": "x" * 300_000},
        },
    )
    assert big.status_code == 400
    assert {e["field"] for e in big.json()["errors"]} == {"kind"}
