"""Fuzzing the decision point's listener: nothing a client sends gets a 5xx (docs/api.md).

Every POST route gets arbitrary bytes, arbitrary JSON values and structured-but-wrong requests
(wrong types in every field, huge integers, deep nesting, unicode, NaN-like strings, Cedar
escapes such as ``__entity`` / ``__extn`` with bad content). The answer is always below 500 (the
one designed exception: ``/v1/access/challenge`` answers a *valid* wait with 503 naming the
missing svc-challenge), every 4xx is an RFC 9457 problem, and every 200 is JSON. gRPC Check and
Plan get structured fuzz too and answer OK or INVALID_ARGUMENT, never another status.

Examples per test: env ``SVC_FUZZ_EXAMPLES`` (default 200); ``SVC_FUZZ_EXAMPLES=2000`` for a
longer run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from golden import BUNDLES
from serverkit import PROBLEM, Served, to_struct
from svc.authz.v1 import authz_pb2
from svc.pdp import Engine

settings.register_profile(
    "svc-fuzz",
    max_examples=int(os.environ.get("SVC_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("svc-fuzz")

ROUTES = [
    "/v1/access/evaluation",
    "/v1/access/plan",
    "/v1/access/challenge",
    "/access/v1/evaluation",
    "/access/v1/evaluations",
    "/v1/noop",
]


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    engine = Engine.from_bundle_dir(BUNDLES / "corp")
    engine.register_service_accounts(
        [{"id": "helpdesk.agent", "owner": "alice", "ai": True, "groups": ["engineering"]}]
    )
    engine.upsert_work_items(
        [{"id": "jira:OPS-7", "status": "open", "links": [{"type": "Document", "id": "design"}]}]
    )
    s = Served(engine, max_body_bytes=65536, noop_routes=True)
    yield s
    # Still alive and serving after everything.
    assert s.http.get("/healthz").status_code == 200
    assert s.http.get("/readyz").status_code == 200
    s.close()


def check(r: httpx.Response, path: str) -> None:
    """Below 500; a 4xx is a problem document; a 200 is JSON."""
    ct = r.headers.get("content-type", "")
    if r.status_code == 503 and path == "/v1/access/challenge":
        assert ct.startswith(PROBLEM)
        assert r.json()["type"] == "urn:svc:problem:challenge-service-unavailable"
        return
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        assert ct.startswith(PROBLEM), (r.status_code, ct, r.text)
        body = r.json()
        assert body["status"] == r.status_code
        assert isinstance(body["detail"], str) and body["detail"]
    else:
        assert r.status_code == 200, (r.status_code, r.text)
        assert ct == "application/json"
        assert isinstance(r.json(), dict)


def post(s: Served, path: str, content: bytes, ct: str | None = "application/json") -> None:
    headers = {"content-type": ct} if ct else {}
    check(s.http.post(path, content=content, headers=headers), path)


# ------------------------------------------------------------------------------- strategies

WEIRD_STRINGS = st.sampled_from(
    [
        "",
        "NaN",
        "-NaN",
        "Infinity",
        "-Infinity",
        "1e999",
        "-0",
        "null",
        "true",
        "0x10",
        "\u0000",
        "\ud7ff\ue000",
        "🦀" * 50,
        "a" * 5000,
        'Human::"alice"',
        'Human::"',
        "Action::view",
        'NS::Action::"x"',
        "::",
        '"',
        "\\",
        "Document",
        "__entity",
        "__extn",
        "Human",
        "alice",
        "view",
        "%00",
        "\u202e",
    ]
)
HUGE_INTS = st.sampled_from(
    [2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**64 + 1, 10**30]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    HUGE_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    WEIRD_STRINGS,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=25,
)


def nested(depth: int, leaf: Any) -> Any:
    out = leaf
    for i in range(depth):
        out = [out] if i % 2 else {"a": out}
    return out


DEEP = st.builds(nested, st.integers(min_value=1, max_value=126), SCALARS)

REFS = st.one_of(
    st.sampled_from(
        [
            {"type": "Human", "id": "alice"},
            {"type": "Human", "id": "bob"},
            {"type": "ServiceAccount", "id": "helpdesk.agent"},
            {"type": "Document", "id": "design"},
            {"type": "Ticket", "id": "OPS-1"},
            {"type": "Group", "id": "staff"},
            {"type": "Nope", "id": "x"},
            {"type": "", "id": ""},
            {"type": "Human"},
            {"id": "alice"},
            {"__entity": {"type": "Human", "id": "alice"}},
            {"__entity": "Human::alice"},
            'Human::"alice"',
            'Document::"design"',
            "Human::alice",
        ]
    ),
    st.fixed_dictionaries({"type": WEIRD_STRINGS, "id": st.one_of(WEIRD_STRINGS, SCALARS)}),
)
ACTIONS = st.one_of(
    st.sampled_from(["view", "edit", "delete", "share", "export", "read", "write", "call"]),
    st.sampled_from(['Action::"view"', 'Action::"fly"', "Action::", 'Nope::Action::"view"']),
)
CEDAR_ESCAPES = st.sampled_from(
    [
        {"__entity": {"type": "Human", "id": "alice"}},
        {"__entity": {"type": "ServiceAccount", "id": "helpdesk.agent"}},
        {"__entity": {"type": "Planet", "id": "x"}},
        {"__entity": None},
        {"__extn": {"fn": "ip", "arg": "10.0.0.1"}},
        {"__extn": {"fn": "ip", "arg": "not an ip"}},
        {"__extn": {"fn": "decimal", "arg": "1.23456789"}},
        {"__extn": {"fn": "datetime", "arg": "2025-13-45"}},
        {"__extn": {"fn": "duration", "arg": "99999999999999999d"}},
        {"__extn": {"fn": "nope", "arg": 1}},
        {"__extn": "ip"},
    ]
)
CONTEXT_VALUES = st.one_of(SCALARS, CEDAR_ESCAPES, DEEP, HUGE_INTS, st.lists(SCALARS, max_size=4))
CONTEXTS = st.one_of(
    st.dictionaries(
        st.sampled_from(
            ["risk_score", "human_present", "agent", "work_item", "assigned", "destination", "x"]
        ),
        CONTEXT_VALUES,
        max_size=4,
    ),
    JSON,
)
ENTITY = st.fixed_dictionaries(
    {
        "uid": REFS,
        "attrs": st.one_of(
            st.dictionaries(
                st.sampled_from(["owner", "department", "sensitivity", "tags", "manager", "x"]),
                CONTEXT_VALUES,
                max_size=4,
            ),
            JSON,
        ),
        "parents": st.one_of(st.lists(REFS, max_size=3), JSON),
    },
    optional={"tags": JSON},
)
ENTITIES = st.one_of(st.lists(ENTITY, max_size=3), JSON)


def anything(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: mostly plausible, often of the wrong type or shape."""
    return st.one_of(valid, valid, SCALARS, JSON, DEEP, WEIRD_STRINGS, HUGE_INTS)


def request_of(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Requests with any subset of `fields` (each with `anything`), plus a stray member now and
    then."""
    return st.builds(
        lambda chosen, extra: {**chosen, **extra},
        st.fixed_dictionaries({}, optional={k: anything(v) for k, v in fields.items()}),
        st.dictionaries(WEIRD_STRINGS, SCALARS, max_size=1),
    )


AZ_ENTITY = st.builds(
    lambda ref, props: (
        {**ref, "properties": props} if props is not None and isinstance(ref, dict) else ref
    ),
    REFS,
    st.one_of(st.none(), st.dictionaries(st.text(max_size=10), CONTEXT_VALUES, max_size=3), JSON),
)
AZ_ACTION = st.one_of(st.builds(lambda n: {"name": n}, anything(ACTIONS)), JSON)
AZ_FIELDS = {
    "subject": AZ_ENTITY,
    "action": AZ_ACTION,
    "resource": AZ_ENTITY,
    "context": CONTEXTS,
}
STRUCTURED: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/v1/access/evaluation": request_of(
        {
            "principal": REFS,
            "action": ACTIONS,
            "resource": REFS,
            "context": CONTEXTS,
            "on_behalf_of": REFS,
            "human_present": st.booleans(),
            "work_item_id": st.sampled_from(["jira:OPS-7", "jira:OPS-8", ""]),
            "entities": ENTITIES,
        }
    ),
    "/v1/access/plan": request_of(
        {
            "principal": REFS,
            "action": ACTIONS,
            "resource_type": st.sampled_from(["Document", "Ticket", "Human", "Nope", ""]),
            "context": CONTEXTS,
            "on_behalf_of": REFS,
            "plan_qid": st.sampled_from(["", "nope", "01a202b3-e183-730f-b9ee-51e49dfc56dc"]),
        }
    ),
    "/v1/access/challenge": request_of(
        {
            "challenge_qid": st.sampled_from(["q", "", "01a202b3-e183-730f-b9ee-51e49dfc56dc"]),
            "principal": REFS,
            "on_behalf_of": REFS,
            "wait_secs": st.integers(min_value=-5, max_value=30),
        }
    ),
    "/access/v1/evaluation": request_of(AZ_FIELDS),
    "/access/v1/evaluations": request_of(
        {
            **AZ_FIELDS,
            "evaluations": st.lists(
                st.one_of(request_of(AZ_FIELDS), st.fixed_dictionaries({}, optional=AZ_FIELDS)),
                max_size=4,
            ),
            "options": st.fixed_dictionaries(
                {},
                optional={
                    "evaluations_semantic": st.one_of(
                        st.sampled_from(
                            ["execute_all", "deny_on_first_deny", "permit_on_first_permit"]
                        ),
                        SCALARS,
                    )
                },
            ),
        }
    ),
    "/v1/noop": request_of({"principal": REFS, "action": ACTIONS}),
}


# ------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(body=st.binary(max_size=2000), with_ct=st.booleans())
def test_arbitrary_bytes(srv: Served, path: str, body: bytes, with_ct: bool) -> None:
    post(srv, path, body, "application/json" if with_ct else None)


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(value=JSON)
def test_arbitrary_json(srv: Served, path: str, value: Any) -> None:
    post(srv, path, json.dumps(value).encode())


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(data=st.data())
def test_structured_but_wrong(srv: Served, path: str, data: st.DataObject) -> None:
    body = data.draw(STRUCTURED[path])
    post(srv, path, json.dumps(body).encode())


@pytest.mark.parametrize("path", ROUTES)
@FUZZ
@given(
    text=st.sampled_from(
        [
            '{"context": {"risk_score": NaN}}',
            '{"context": {"risk_score": Infinity}}',
            '{"context": {"risk_score": -Infinity}}',
            '{"context": {"risk_score": 1e999}}',
            '{"context": {"risk_score": 123456789012345678901234567890}}',
            '{"context": {"risk_score": -0.0}}',
            '{"principal": {"type": "Human", "id": "alice", "id": "bob"}}',
            '{"a": 1}{"b": 2}',
            '{"a": "\\ud800"}',
            '{"a": "\\u0000"}',
            "\ufeff{}",
            "[" * 100_000,
            '{"a":' * 10_000 + "1" + "}" * 10_000,
            "[" * 127 + "]" * 127,
            "[" * 129 + "]" * 129,
        ]
    ),
    ct=st.sampled_from(
        [
            "application/json",
            "application/json; charset=latin-1",
            "APPLICATION/JSON",
            "application/problem+json",
            "text/json",
            "application/json\u0000",
            ";",
            "",
        ]
    ),
)
def test_nasty_texts_and_content_types(srv: Served, path: str, text: str, ct: str) -> None:
    try:
        headers = {"content-type": ct}
        r = srv.http.post(path, content=text.encode("utf-8", "surrogatepass"), headers=headers)
    except (httpx.LocalProtocolError, UnicodeEncodeError):
        return  # the client refuses to send that header; nothing reached the server
    check(r, path)
    if r.status_code == 413:
        assert len(text.encode()) > 65536


def test_deep_nesting_in_every_field(srv: Served) -> None:
    """Nesting up to serde_json's limit (128) reaches the engine; deeper is malformed JSON."""
    base = {
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    for depth in [10, 60, 120, 125, 200]:
        deep = nested(depth, 1)
        for path in ROUTES:
            for key in ["principal", "action", "resource", "context", "entities", "subject", "x"]:
                post(srv, path, json.dumps({**base, key: deep}).encode())
            inline = [
                {
                    "uid": {"type": "Document", "id": "design"},
                    "attrs": {"tags": deep},
                    "parents": [],
                }
            ]
            post(srv, path, json.dumps({**base, "entities": inline}).encode())


# ------------------------------------------------------------------------------- gRPC

GRPC_TEXT = st.one_of(WEIRD_STRINGS, st.text(max_size=20))
GRPC_CONTEXT_VALUES = st.one_of(
    CONTEXT_VALUES, st.floats(allow_nan=True, allow_infinity=True), st.just(math.nan)
)


def _grpc_ok(call: Any, message: Any) -> None:
    try:
        call(message, timeout=30)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        assert e.details()


def _ref(data: st.DataObject) -> authz_pb2.EntityRef:
    return authz_pb2.EntityRef(
        type=data.draw(
            st.one_of(st.sampled_from(["Human", "ServiceAccount", "Document", "Ticket"]), GRPC_TEXT)
        ),
        id=data.draw(st.one_of(st.sampled_from(["alice", "helpdesk.agent", "design"]), GRPC_TEXT)),
    )


def _context(data: st.DataObject) -> Any:
    ctx = data.draw(
        st.dictionaries(
            st.one_of(
                st.sampled_from(["risk_score", "agent", "destination", "assigned"]),
                st.text(max_size=5),
            ),
            GRPC_CONTEXT_VALUES,
            max_size=4,
        )
    )
    s = to_struct({})
    s.update(ctx)  # NaN and infinities too: a Struct carries any double
    return s


@FUZZ
@given(data=st.data())
def test_grpc_check_and_plan_fuzz(srv: Served, data: st.DataObject) -> None:
    check_req = authz_pb2.CheckRequest(
        action=data.draw(st.one_of(ACTIONS, GRPC_TEXT)), work_item_id=data.draw(GRPC_TEXT)
    )
    for field in ["principal", "resource", "on_behalf_of"]:
        if data.draw(st.booleans()):
            getattr(check_req, field).CopyFrom(_ref(data))
    if data.draw(st.booleans()):
        check_req.context.CopyFrom(_context(data))
    if data.draw(st.booleans()):
        check_req.human_present = data.draw(st.booleans())
    _grpc_ok(srv.stub.Check, check_req)
    plan_req = authz_pb2.PlanRequest(
        action=data.draw(st.one_of(ACTIONS, GRPC_TEXT)),
        resource_type=data.draw(st.one_of(st.sampled_from(["Document", "Ticket"]), GRPC_TEXT)),
        plan_qid=data.draw(GRPC_TEXT),
    )
    for field in ["principal", "on_behalf_of"]:
        if data.draw(st.booleans()):
            getattr(plan_req, field).CopyFrom(_ref(data))
    if data.draw(st.booleans()):
        plan_req.context.CopyFrom(_context(data))
    _grpc_ok(srv.stub.Plan, plan_req)
