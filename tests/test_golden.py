"""The golden corpus (tests/testdata/golden) through the Python binding.

The Rust test crates/pdp_core/tests/golden.rs runs the same files through the Rust engine.
"""

from __future__ import annotations

import os
import re
import select
import signal
from typing import Any

import pytest

from golden import all_cases, engine_for, expected_response, without_qid
from svc.pdp import Engine, RequestError

CASES = all_cases()
_engines: dict[int, Engine] = {}
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _engine(doc: dict[str, Any]) -> Engine:
    key = id(doc)
    if key not in _engines:
        _engines[key] = engine_for(doc)
    return _engines[key]


def test_corpus_covers_every_rule() -> None:
    names = " ".join(c[0] for c in CASES)
    for needle in [
        "contained",
        "unregistered",
        "nobody present",
        "challenge forbid",
        "challenge permit",
        "required",
        "reasoner score",
        "work item",
        "monitor",
        "inline",
        "template",
        "ambiguous",
    ]:
        assert needle in names, needle
    assert len(CASES) >= 60


@pytest.mark.parametrize(("cid", "doc", "case"), CASES, ids=[c[0] for c in CASES])
def test_golden_case(cid: str, doc: dict[str, Any], case: dict[str, Any]) -> None:
    engine = _engine(doc)
    if "error" in case:
        with pytest.raises(RequestError) as info:
            engine.evaluate(case["request"])
        assert info.value.field == case["error"]["field"]
        assert case["error"]["contains"] in str(info.value)
        assert isinstance(info.value, ValueError)
        return
    resp = engine.evaluate(case["request"])
    assert UUID7.match(resp["qid"]), resp["qid"]
    assert without_qid(resp) == expected_response(case)


def test_evaluate_many_agrees_with_evaluate() -> None:
    by_doc: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for _, doc, case in CASES:
        if "expect" in case:
            by_doc.setdefault(id(doc), (doc, []))[1].append(case)
    for doc, cases in by_doc.values():
        engine = _engine(doc)
        batch = engine.evaluate_many([c["request"] for c in cases])
        assert len(batch) == len(cases)
        for got, case in zip(batch, cases, strict=True):
            assert without_qid(got) == expected_response(case)
        qids = {r["qid"] for r in batch}
        assert len(qids) == len(batch)


def _corp_good_and_bad() -> tuple[Engine, dict[str, Any], dict[str, Any]]:
    """The corp bundle's engine, a request it allows, and one whose context breaks the schema."""
    doc = next(d for _, d, c in CASES if d["bundle"] == "corp")
    good = {
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    return _engine(doc), good, {**good, "context": {"risk_score": "high"}}


def test_evaluate_many_names_the_bad_request() -> None:
    engine, good, bad = _corp_good_and_bad()
    with pytest.raises(RequestError) as info:
        engine.evaluate_many([good, good, bad])
    assert info.value.field == "requests[2].context"


def test_large_batches_run_in_parallel_and_agree_with_evaluate() -> None:
    """Batches of 64 or more are pipelined over the cores (helpers decide while the calling
    thread reads requests and builds responses); the answers and their order do not change."""
    doc = next(d for _, d, c in CASES if d["bundle"] == "corp")
    engine = _engine(doc)
    requests = [c["request"] for _, d, c in CASES if d is doc and "expect" in c] * 25
    assert len(requests) >= 64
    batch = engine.evaluate_many(requests)
    assert [without_qid(r) for r in batch] == [without_qid(engine.evaluate(r)) for r in requests]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_large_batches_still_run_in_a_forked_child() -> None:
    """The helpers that decide a large batch persist between batches; a child forked after the
    parent used them inherits none of their threads, and its batches must still finish (and
    agree with its own single checks) rather than wait for threads that do not exist."""
    doc = next(d for _, d, c in CASES if d["bundle"] == "corp")
    engine = _engine(doc)
    requests = [c["request"] for _, d, c in CASES if d is doc and "expect" in c] * 25
    assert len(requests) >= 64
    expected = [without_qid(r) for r in engine.evaluate_many(requests)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            got = [without_qid(r) for r in engine.evaluate_many(requests)]
            single = [without_qid(engine.evaluate(r)) for r in requests]
            code = 0 if got == expected == single else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 120)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("evaluate_many in a forked child did not finish within 120 s")
    assert os.read(read, 1) == bytes([0])
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_large_batches_name_the_first_bad_request() -> None:
    engine, good, bad = _corp_good_and_bad()

    def failing_field(batch: list[Any]) -> str:
        with pytest.raises(RequestError) as info:
            engine.evaluate_many(batch)
        return info.value.field

    batch: list[Any] = [good] * 300
    batch[250] = bad
    assert failing_field(batch) == "requests[250].context"
    batch[90] = bad
    assert failing_field(batch) == "requests[90].context"
    # A request that is not a request at all: still the first failing index wins.
    batch[200] = {"principal": 7}
    assert failing_field(batch) == "requests[90].context"
    batch[90] = good
    assert failing_field(batch).startswith("requests[200]")
    # The engine still answers afterwards.
    assert engine.evaluate_many([good] * 100)[99]["verdict"] == "allow"


def test_decide_returns_the_decision_log_record() -> None:
    doc = next(d for cid, d, c in CASES if cid.startswith("agents"))
    engine = _engine(doc)
    rec = engine.decide(
        {
            "principal": {"type": "ServiceAccount", "id": "helpdesk.agent"},
            "action": "edit",
            "resource": {"type": "Document", "id": "design"},
            "work_item_id": "jira:OPS-7",
        }
    )
    assert rec["verdict"] == "allow"
    assert rec["work_item"] == "jira:OPS-7"
    assert rec["assigned"] is True
    assert rec["principal"] == {"type": "ServiceAccount", "id": "helpdesk.agent"}
    assert rec["resource"] == {"type": "Document", "id": "design"}
    assert rec["action"] == "edit"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", rec["at"])
    assert rec["policy_version"] >= 1 and rec["principals_version"] >= 1
    assert rec["latency_us"] >= 0
    for key in [
        "qid",
        "challenges",
        "policies",
        "mode",
        "challenge_qid",
        "risk_score",
        "pdp",
        "on_behalf_of",
    ]:
        assert key in rec
    closed = engine.decide(
        {
            "principal": {"type": "ServiceAccount", "id": "helpdesk.agent"},
            "action": "edit",
            "resource": {"type": "Document", "id": "design"},
            "work_item_id": "jira:OPS-8",
        }
    )
    assert closed["work_item"] == "jira:OPS-8" and closed["assigned"] is False


def test_golden_cases_decide_the_same_without_slice_pruning() -> None:
    """Slice pruning (``configure_checks``) only leaves out entities no policy reads through."""
    for cid, doc, case in CASES:
        if "expect" not in case:
            continue
        engine = _engine(doc)
        engine.configure_checks(prune_slices=False)
        try:
            got = without_qid(engine.evaluate(case["request"]))
        finally:
            engine.configure_checks(prune_slices=True)
        assert got == expected_response(case), cid


ANCESTOR_READS = """
@id("open-admins")
permit (principal, action == Action::"view", resource)
when { Group::"admins".open && principal in Group::"admins" };

@id("team-lead")
permit (principal, action == Action::"edit", resource)
when { context.team.lead == principal };
"""


@pytest.mark.parametrize("prune", [True, False])
def test_ancestors_read_through_literals_and_context_stay_in_the_slice(prune: bool) -> None:
    """A policy that reads an ancestor's attributes through an entity literal or a context value
    decides as plain Cedar over the whole store (docs/decisions.md, "which entities a slice
    keeps"): the ancestor is not a root nor a followed attribute, but it is in the slice."""
    entities: list[dict[str, Any]] = [
        {
            "uid": {"type": "User", "id": "alice"},
            "attrs": {},
            "parents": [{"type": "Group", "id": "staff"}],
        },
        {
            "uid": {"type": "Group", "id": "staff"},
            "attrs": {"lead": {"__entity": {"type": "User", "id": "alice"}}},
            "parents": [{"type": "Group", "id": "admins"}],
        },
        {"uid": {"type": "Group", "id": "admins"}, "attrs": {"open": True}, "parents": []},
    ]
    engine = Engine(policies=ANCESTOR_READS, entities=entities)
    engine.configure_checks(prune_slices=prune)
    alice = {"type": "User", "id": "alice"}
    doc = {"type": "Doc", "id": "d"}
    view = engine.evaluate({"principal": alice, "action": "view", "resource": doc})
    assert (view["verdict"], view["policies"]) == ("allow", ["open-admins"])
    edit = engine.evaluate(
        {
            "principal": alice,
            "action": "edit",
            "resource": doc,
            "context": {"team": {"__entity": {"type": "Group", "id": "staff"}}},
        }
    )
    assert (edit["verdict"], edit["policies"]) == ("allow", ["team-lead"])
