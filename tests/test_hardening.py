"""What an attacker sends the decision point cannot crash it, stall it or fool it.

Each class of attack is probed through a real ``svc pdp`` process (a crash there would kill
``svc up`` with intake and history in it) or the in-process listener, over every transport it
reaches, and through the Python API:

* inline entities forming a deep parent chain, or too many of them (docs/decisions.md,
  "Limits"): a 400 naming the limit, and the process keeps serving;
* inline data forging identity or overriding the directory (docs/decisions.md, "Inline
  entities"): ignored, and the decision record says so;
* an AuthZEN batch past ``max_batch_items``: a 400 naming the limit, nothing decided;
* identifiers with control characters: refused on HTTP, AuthZEN, gRPC and the Python API;
* ``X-Request-ID`` bounded, AuthZEN discovery never echoing an unchecked ``Host``, HEAD where
  GET works;
* over-deep hierarchies in entity-store writes and in a bundle's ``entities.json``: refused.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from golden import BUNDLES
from serverkit import assert_problem, check_request, serve, wait_until
from svc._pdp_core import DecisionLog
from svc.pdp import BundleError, Engine, RequestError, set_limits
from test_pdp_standalone import Pdp

EVAL = "/v1/access/evaluation"
CORP = BUNDLES / "corp"


def chain(n: int, bottom: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`n` inline groups, each the parent of the one before, and `bottom` under the first."""
    ents = [
        {
            "uid": {"type": "Group", "id": f"g{i}"},
            "attrs": {},
            "parents": [{"type": "Group", "id": f"g{i + 1}"}],
        }
        for i in range(n)
    ]
    if bottom is not None:
        ents.append(bottom)
    return ents


def folder_chain(n: int) -> list[dict[str, Any]]:
    """A resource in a chain of `n` inline folders (the folders bundle of test_server.py)."""
    ents = [
        {
            "uid": {"type": "Folder", "id": f"f{i}"},
            "attrs": {},
            "parents": [{"type": "Folder", "id": f"f{i + 1}"}],
        }
        for i in range(n)
    ]
    ents.append(
        {
            "uid": {"type": "Doc", "id": "deep"},
            "attrs": {"level": 1},
            "parents": [{"type": "Folder", "id": "f0"}],
        }
    )
    return ents


FOLDERS_SCHEMA = """
entity Human;
entity Folder in [Folder];
entity Doc in [Folder] = { level: Long };
action view appliesTo { principal: [Human], resource: [Doc, Folder] };
"""
FOLDERS_POLICIES = """
@id("top-folder-readers")
permit (principal, action == Action::"view", resource in Folder::"top");
"""
FOLDERS_ENTITIES = [{"uid": {"type": "Human", "id": "ann"}, "attrs": {}, "parents": []}]


@pytest.fixture
def folders(tmp_path: Path) -> Path:
    d = tmp_path / "folders"
    d.mkdir()
    (d / "folders.cedarschema").write_text(FOLDERS_SCHEMA)
    (d / "folders.cedar").write_text(FOLDERS_POLICIES)
    (d / "entities.json").write_text(json.dumps(FOLDERS_ENTITIES))
    return d


def view_deep(n: int) -> dict[str, Any]:
    return {
        "principal": {"type": "Human", "id": "ann"},
        "action": "view",
        "resource": {"type": "Doc", "id": "deep"},
        "entities": folder_chain(n),
    }


# ------------------------------------------------------------------------- 1. deep hierarchies


def test_a_deep_inline_chain_is_a_400_and_the_process_keeps_serving(folders: Path) -> None:
    """20,000 levels killed the process (Cedar's closure recursed once per level): now a 400.

    The body and count limits are raised so that the depth limit is the one that answers.
    """
    pdp = Pdp(
        "--bundle",
        str(folders),
        "--port",
        "0",
        "--no-watch",
        "--max-body-bytes",
        "8000000",
        "--max-inline-entities",
        "100000",
    )
    try:
        url = f"http://127.0.0.1:{pdp.port()}"
        with httpx.Client(base_url=url, timeout=60) as http:
            for n in (20_000, 65):
                body = assert_problem(http.post(EVAL, json=view_deep(n)), 400)
                assert "max_entity_depth" in body["detail"] and "64" in body["detail"], body
                assert body["field"].startswith("entities["), body
            # At the limit it is decided as Cedar would.
            # Doc -> f0 -> ... -> f62 -> top: 64 links.
            top = {
                "uid": {"type": "Folder", "id": "f62"},
                "attrs": {},
                "parents": [{"type": "Folder", "id": "top"}],
            }
            ok = http.post(EVAL, json=view_deep(62) | {"entities": [*folder_chain(62), top]})
            assert ok.status_code == 200, ok.text
            assert ok.json()["verdict"] == "allow"
            assert http.get("/healthz").status_code == 200
        assert pdp.proc.poll() is None, pdp.log
    finally:
        pdp.stop()


def test_too_many_inline_entities_is_a_400_naming_the_limit(folders: Path) -> None:
    pdp = Pdp("--bundle", str(folders), "--port", "0", "--no-watch", "--max-inline-entities", "10")
    try:
        url = f"http://127.0.0.1:{pdp.port()}"
        with httpx.Client(base_url=url, timeout=60) as http:
            body = assert_problem(http.post(EVAL, json=view_deep(10)), 400, "entities")
            assert "max_inline_entities" in body["detail"], body
            assert http.post(EVAL, json=view_deep(9)).status_code == 200
    finally:
        pdp.stop()


def test_the_python_api_bounds_inline_chains_and_counts() -> None:
    engine = Engine.from_bundle_dir(CORP)
    bottom = {"uid": {"type": "Ticket", "id": "x"}, "attrs": {"status": "open"}, "parents": []}
    req = {
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    # Inline groups are ignored (directory type), so a chain of them cannot be deep.
    assert engine.evaluate(req | {"entities": chain(900, bottom)})["verdict"] == "allow"
    before = set_limits()
    try:
        set_limits(max_inline_entities=3)
        with pytest.raises(RequestError, match="max_inline_entities"):
            engine.evaluate(req | {"entities": chain(3, bottom)})
    finally:
        set_limits(*before)


def test_store_writes_and_bundles_refuse_over_deep_hierarchies(tmp_path: Path) -> None:
    engine = Engine.from_bundle_dir(CORP)
    stored = engine.store_size
    deep = chain(
        100,
        {
            "uid": {"type": "Human", "id": "deep"},
            "attrs": {"department": "x"},
            "parents": [{"type": "Group", "id": "g0"}],
        },
    )
    with pytest.raises(RequestError, match="max_entity_depth"):
        engine.upsert_entities(deep)
    with pytest.raises(RequestError, match="max_entity_depth"):
        engine.replace_entities(deep)
    # Nothing of the refused writes is stored.
    assert engine.store_size == stored
    # A chain built up write by write is refused at the write that makes it too deep.
    engine.upsert_entities(chain(60))
    with pytest.raises(RequestError, match="max_entity_depth"):
        engine.upsert_entities(
            [
                {
                    "uid": {"type": "Group", "id": f"g{i}"},
                    "attrs": {},
                    "parents": [{"type": "Group", "id": f"g{i + 1}"}],
                }
                for i in range(60, 70)
            ]
        )
    bundle = tmp_path / "deep"
    shutil.copytree(CORP, bundle)
    (bundle / "entities.json").write_text(json.dumps(deep))
    with pytest.raises(BundleError, match="max_entity_depth"):
        Engine.from_bundle_dir(bundle)
    # A store that is deep on its own refuses a bundle that would make the hierarchy too deep.
    with pytest.raises(BundleError, match="max_entity_depth"):
        engine.load_bundle_dir(bundle)


# ------------------------------------------------------------------- 2. inline data never forges


def logged(log: DecisionLog, n: int) -> list[dict[str, Any]]:
    """The first `n` records of the decision log (each answered check has its record)."""
    recs: list[tuple[bytes, bytes]] = []
    wait_until(lambda: recs.extend(log.read(100, 0.2)[0]) or len(recs) >= n, timeout=10)
    return [json.loads(v) for _, v in recs]


def test_inline_data_cannot_forge_a_principal_or_override_the_store(tmp_path: Path) -> None:
    """A made-up Human in Group::admins, a stored document sent as public: both ignored."""
    engine = Engine.from_bundle_dir(CORP)
    log = DecisionLog(tmp_path / "spool")
    forged_human = {
        "uid": {"type": "Human", "id": "mallory"},
        "attrs": {"department": "engineering"},
        "parents": [{"type": "Group", "id": "partner-managers"}],
    }
    forged_doc = {
        "uid": {"type": "Document", "id": "payroll"},
        "attrs": {
            "owner": {"__entity": {"type": "Human", "id": "mallory"}},
            "department": "engineering",
            "sensitivity": "public",
            "tags": [],
        },
        "parents": [],
    }
    with serve(engine, decision_log=log) as s:
        r = s.post(
            EVAL,
            {
                "principal": {"type": "Human", "id": "mallory"},
                "action": "share",
                "resource": {"type": "Document", "id": "payroll"},
                "entities": [forged_human, forged_doc],
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["verdict"] == "deny", r.json()
        # The same forgery through AuthZEN properties.
        az = s.post(
            "/access/v1/evaluation",
            {
                "subject": {
                    "type": "Human",
                    "id": "mallory",
                    "properties": {"department": "engineering"},
                },
                "action": {"name": "view"},
                "resource": {
                    "type": "Document",
                    "id": "payroll",
                    "properties": {
                        "owner": {"type": "Human", "id": "mallory"},
                        "department": "engineering",
                        "sensitivity": "public",
                        "tags": [],
                    },
                },
            },
        )
        assert az.status_code == 200, az.text
        assert az.json()["decision"] is False, az.json()
        recs = logged(log, 2)
    mallory = {"type": "Human", "id": "mallory"}
    payroll = {"type": "Document", "id": "payroll"}
    assert [r["not_in_directory"] for r in recs] == [[mallory], [mallory]], recs
    assert [sorted(map(json.dumps, r["inline_ignored"])) for r in recs] == [
        sorted(map(json.dumps, [mallory, payroll]))
    ] * 2, recs
    # The Python API applies the same rule.
    got = engine.evaluate(
        {
            "principal": mallory,
            "action": "share",
            "resource": payroll,
            "entities": [forged_human, forged_doc],
        }
    )
    assert got["verdict"] == "deny"


def test_an_inline_resource_the_store_does_not_hold_is_still_used() -> None:
    engine = Engine.from_bundle_dir(CORP)
    got = engine.evaluate(
        {
            "principal": {"type": "Human", "id": "bob"},
            "action": "view",
            "resource": {"type": "Document", "id": "brief"},
            "entities": [
                {
                    "uid": {"type": "Document", "id": "brief"},
                    "attrs": {
                        "owner": {"__entity": {"type": "Human", "id": "carol"}},
                        "department": "sales",
                        "sensitivity": "internal",
                        "tags": [],
                    },
                    "parents": [],
                }
            ],
        }
    )
    assert got["verdict"] == "allow" and got["policies"] == ["view-own-department"], got


# ------------------------------------------------------------------------ 3. bounded batches


def test_an_authzen_batch_past_the_limit_is_a_400_and_nothing_is_decided(tmp_path: Path) -> None:
    engine = Engine.from_bundle_dir(CORP)
    log = DecisionLog(tmp_path / "spool")
    with serve(engine, decision_log=log, max_batch_items=50) as s:
        batch = {
            "subject": {"type": "Human", "id": "alice"},
            "action": {"name": "view"},
            "resource": {"type": "Document", "id": "design"},
        }
        body = assert_problem(
            s.post("/access/v1/evaluations", batch | {"evaluations": [{}] * 51}), 400, "evaluations"
        )
        assert "max_batch_items" in body["detail"] and "50" in body["detail"], body
        assert log.read(100, 0.2)[0] == []
        ok = s.post("/access/v1/evaluations", batch | {"evaluations": [{}] * 50})
        assert ok.status_code == 200 and len(ok.json()["evaluations"]) == 50


# ---------------------------------------------------------------- 5. control characters, headers


@pytest.mark.parametrize("bad", ["al\x00ice", "al\nice", "\x7f", "a\u0085b"])
def test_identifiers_with_control_characters_are_refused_everywhere(bad: str) -> None:
    engine = Engine.from_bundle_dir(CORP)
    req = {
        "principal": {"type": "Human", "id": bad},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    with pytest.raises(RequestError, match="control character"):
        engine.evaluate(req)
    with pytest.raises(RequestError, match="control character"):
        engine.evaluate(req | {"principal": {"type": "Human", "id": "alice"}, "action": "vi" + bad})
    with pytest.raises(RequestError, match="control character"):
        engine.upsert_entities(
            [
                {
                    "uid": {"type": "Document", "id": bad},
                    "attrs": {
                        "owner": {"__entity": {"type": "Human", "id": "alice"}},
                        "department": "x",
                        "sensitivity": "x",
                        "tags": [],
                    },
                    "parents": [],
                }
            ]
        )
    with serve(engine) as s:
        assert_problem(s.post(EVAL, req), 400, "principal.id")
        assert_problem(
            s.post(
                EVAL,
                req
                | {"principal": 'Human::"' + bad.replace("\n", "\\n").replace("\x00", "\\0") + '"'},
            ),
            400,
        )
        assert_problem(
            s.post(
                EVAL,
                {
                    "principal": {"type": "Human", "id": "alice"},
                    "action": "view",
                    "resource": {"type": "Document", "id": "x"},
                    "entities": [
                        {
                            "uid": {"type": "Document", "id": "x"},
                            "attrs": {},
                            "parents": [{"type": "Folder", "id": bad}],
                        }
                    ],
                },
            ),
            400,
        )
        az = s.post(
            "/access/v1/evaluation",
            {
                "subject": {"type": "Human", "id": bad},
                "action": {"name": "view"},
                "resource": {"type": "Document", "id": "design"},
            },
        )
        assert_problem(az, 400)
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Check(check_request(req))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "control character" in (e.value.details() or "")


def test_request_ids_are_bounded_and_replaced_when_unsafe() -> None:
    engine = Engine.from_bundle_dir(CORP)
    with serve(engine) as s:
        good = "01a20351-5fb1-71fe-982c-e4c3cb520be2"
        assert (
            s.http.get("/healthz", headers={"x-request-id": good}).headers["x-request-id"] == good
        )
        for bad in ("x" * 129, "a b", "<script>", "id\t1"):
            got = s.http.get("/healthz", headers={"x-request-id": bad}).headers["x-request-id"]
            assert got != bad and 0 < len(got) <= 128, got
        fresh = s.http.get("/healthz").headers["x-request-id"]
        assert len(fresh) == 36, fresh


def raw_get(port: int, path: str, host: bytes) -> tuple[int, bytes]:
    """A GET with exactly this `Host` header (httpx would normalise it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"GET "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + host
            + b"\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_authzen_discovery_never_echoes_an_unchecked_host() -> None:
    engine = Engine.from_bundle_dir(CORP)
    path = "/.well-known/authzen-configuration"
    with serve(engine) as s:
        status, body = raw_get(s.port, path, b"pdp.example.com:8443")
        assert status == 200
        assert json.loads(body)["policy_decision_point"] == "http://pdp.example.com:8443"
        for bad in (
            b"evil.com/phish?",
            b'a"b',
            b"user@host",
            b"host:99999",
            b"<x>",
            b"ev il.example",
            b"[::1]evil.com",
        ):
            status, body = raw_get(s.port, path, bad)
            assert status == 400, (bad, body)
            assert bad not in body
    with serve(engine, public_url="https://pdp.corp.example") as s:
        status, body = raw_get(s.port, path, b"evil.com")
        assert status == 200
        assert (
            json.loads(body)["access_evaluation_endpoint"]
            == "https://pdp.corp.example/access/v1/evaluation"
        )


def test_head_works_where_get_does() -> None:
    engine = Engine.from_bundle_dir(CORP)
    with serve(engine) as s:
        for path in (
            "/healthz",
            "/readyz",
            "/version",
            "/metrics",
            "/.well-known/authzen-configuration",
        ):
            get = s.http.get(path)
            head = s.http.head(path)
            assert head.status_code == get.status_code == 200, path
            assert head.content == b""
