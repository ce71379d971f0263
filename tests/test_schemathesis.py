"""schemathesis over every HTTP API of the control plane and the Connect routes (issue 43).

The context service's OpenAPI document (its ``/v1`` routes), the probes of the policy and the
challenge apps, and the unary methods of the
policy and challenge services over Connect's JSON protocol (POST
``/<service>/<Method>``, https://connectrpc.com/docs/protocol/), each served for real on
127.0.0.1 with bearer tokens on and requests carrying a valid one, so every request reaches
past the token check. Every built-in check runs (``apifuzz.load``): no 5xx, answers as
documented (an error is an RFC 9457 problem, or a Connect error ``{code, message}``).

The Connect routes have no OpenAPI document of their own; ``connect_document`` writes one from
the proto descriptors (the request message's fields as protobuf's JSON mapping names them).
Intake and history have their own runs (tests/test_intake.py, tests/test_history.py); the
other HTTP APIs (history with tokens on, reasoner, connectors, reporter, gateway, decision
point, portal) are in tests/test_schemathesis_more.py.

Budget: ``SVC_HARDENING_FUZZ_EXAMPLES`` (default 10) examples per operation and phase, so the
file runs in a few minutes on two cores; raise it for a longer run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import settings

import apifuzz
from svc.challenge.app import ChallengeServer
from svc.challenge.app import health_app as challenge_health
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.challenge.transport import SERVICE_NAME as CHALLENGE
from svc.challenge.transport import ChallengeMetrics
from svc.challenge.v1 import challenge_pb2
from svc.common.auth import LocalIssuer
from svc.common.auth_settings import PolicyAuthSettings
from svc.context.app import create_app as context_app
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.policy.app import PolicyServer
from svc.policy.app import health_app as policy_health
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.transport import SERVICE_NAME as POLICY
from svc.policy.transport import PolicyMetrics
from svc.policy.v1 import policy_pb2

EXAMPLES = int(os.environ.get("SVC_HARDENING_FUZZ_EXAMPLES", "10"))
FUZZ = settings(apifuzz.FUZZ_SETTINGS, max_examples=EXAMPLES)
CALLER = "svc-fuzz-admin"

# One issuer for the module: its JWKS file is what the servers read, its tokens what the
# requests carry.
_ISSUER_DIR = Path(tempfile.mkdtemp(prefix="svc-fuzz-issuer-"))
ISSUER = LocalIssuer(_ISSUER_DIR / "issuer")
TOKEN = ISSUER.mint(CALLER, ["svc-context", "svc-policy", "svc-challenge"], 24 * 3600)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def auth_of(cls: Any) -> Any:
    return cls(auth_issuer=ISSUER.issuer, auth_jwks=ISSUER.jwks_url, auth_callers=[CALLER])


# -- the context service ---------------------------------------------------------------------


def _context(data: Path) -> tuple[ContextService, Any]:
    # Long polls answer at once: a watch's `wait_secs` is the client's to choose.
    settings = ContextSettings(
        database_url=f"sqlite:///{data / 'context.db'}",
        scim_token="scim-" + "f" * 40,
        max_wait_secs=0,
    )
    service = ContextService(settings)
    return service, context_app(service, settings, auth_of(ContextAuthSettings))


@pytest.fixture(scope="module")
def context_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    service, app = _context(tmp_path_factory.mktemp("ctx"))
    with apifuzz.serve(app) as base:
        yield base
    service.close()


_doc_service, _doc_app = _context(Path(tempfile.mkdtemp(prefix="svc-fuzz-ctx-")))
CONTEXT_OPENAPI = _doc_app.openapi()
_doc_service.close()
context_schema = apifuzz.load(CONTEXT_OPENAPI, headers=AUTH)


@context_schema.parametrize()
@FUZZ
def test_context_api_fuzz(case: Any, context_url: str) -> None:
    case.call_and_validate(base_url=context_url)


# -- Connect: the policy and challenge services ----------------------------------------------


def _integer(low: int, high: int) -> dict[str, Any]:
    """An integer field: a number or a decimal string (protobuf's JSON mapping takes both)."""
    return {
        "anyOf": [
            {"type": "integer", "minimum": low, "maximum": high},
            {"type": "string", "pattern": "^-?[0-9]{1,19}$"},
        ]
    }


_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_INT32: _integer(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: _integer(0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: _integer(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: _integer(0, 2**64 - 1),
    FieldDescriptor.TYPE_DOUBLE: {"anyOf": [{"type": "number"}, {"type": "string"}]},
    FieldDescriptor.TYPE_FLOAT: {"anyOf": [{"type": "number"}, {"type": "string"}]},
}

#: A Connect error (https://connectrpc.com/docs/protocol/#error-end-stream).
CONNECT_ERROR = {
    "type": "object",
    "required": ["code"],
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string", "maxLength": 4096},
        "details": {"type": "array"},
    },
}


def message_schema(d: Descriptor, depth: int = 0) -> dict[str, Any]:
    """The JSON Schema of a message in protobuf's JSON mapping (camelCase names accepted)."""
    if d.full_name == "google.protobuf.Timestamp":
        return {"type": "string", "format": "date-time"}
    if d.full_name == "google.protobuf.Struct":
        return {"type": "object"}
    if d.full_name == "google.protobuf.Value":
        return {}
    props: dict[str, Any] = {}
    for f in d.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            entry = f.message_type
            if entry.GetOptions().map_entry:
                value = entry.fields_by_name["value"]
                schema: dict[str, Any] = {
                    "type": "object",
                    "additionalProperties": (
                        message_schema(value.message_type, depth + 1)
                        if value.type == FieldDescriptor.TYPE_MESSAGE
                        else _SCALARS.get(value.type, {})
                    ),
                }
                props[f.json_name] = schema
                continue
            one = message_schema(entry, depth + 1) if depth < 4 else {"type": "object"}
        elif f.type == FieldDescriptor.TYPE_ENUM:
            # A name or a number (protobuf's JSON mapping); Python's parser also reads a JSON
            # boolean as 0 or 1 here, as bool is an int in Python.
            one = {
                "anyOf": [
                    {"type": "string", "enum": [v.name for v in f.enum_type.values]},
                    {"type": ["integer", "boolean"]},
                ]
            }
        else:
            one = _SCALARS.get(f.type, {})
        repeated = f.is_repeated
        field = {"type": "array", "items": one} if repeated else one
        # protobuf's JSON mapping reads null as the field's default, for every field.
        props[f.json_name] = {"anyOf": [field, {"type": "null"}]}
    return {"type": "object", "properties": props}


#: Methods left out: `DryRun` replays recorded decisions from the history store, which is chDB
#: here, and chDB opens one directory per process (tests/test_policy.py runs it in a child).
#: Without a store it answers 503 `unavailable` to a well-formed request.
NOT_FUZZED = frozenset({"DryRun"})


def connect_document(pb: Any, service: str, probes: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.1 document of a service's unary methods over Connect, with its probes."""
    desc = pb.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[-1]]
    paths = dict(probes.get("paths", {}))
    for m in desc.methods:
        if m.server_streaming or m.client_streaming or m.name in NOT_FUZZED:
            continue
        paths[f"/{service}/{m.name}"] = {
            "post": {
                "operationId": m.name,
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": message_schema(m.input_type)}},
                },
                "responses": {
                    "200": {
                        "description": "the response message",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    # connectrpc answers a body that is neither JSON nor protobuf with 415
                    # and `Accept-Post`, no body (the Connect protocol's unsupported codec).
                    "415": {"description": "unsupported content type, no body"},
                    "4XX": {
                        "description": "a Connect error",
                        "content": {"application/json": {"schema": CONNECT_ERROR}},
                    },
                },
            }
        }
    components = probes.get("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {"title": service, "version": "1"},
        "paths": paths,
        "components": components,
    }


def _probes(make: Any, service: Any, metrics: Any) -> dict[str, Any]:
    app = make(service, metrics)
    from svc.common.limits import PROBE_MAX_BODY_BYTES, harden

    harden(app, max_body_bytes=PROBE_MAX_BODY_BYTES, setting="fuzz")
    return dict(app.openapi())


@pytest.fixture(scope="module")
def policy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("pol")
    settings = PolicySettings(port=0, data_dir=data, database_url=f"sqlite:///{data / 'p.db'}")
    srv = PolicyServer(settings, auth=auth_of(PolicyAuthSettings)).start()
    yield srv.url
    srv.stop()
    srv.service.close()


@pytest.fixture(scope="module")
def challenge_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("chal")
    settings = ChallengeSettings(
        port=0,
        database_url=f"sqlite:///{data / 'c.db'}",
        link_key_file=str(data / "link.key"),
    )
    srv = ChallengeServer(settings, auth=auth_of(ChallengeAuthSettings), outbox=False).start()
    yield srv.url
    srv.stop()
    srv.service.close()


def _documents() -> tuple[dict[str, Any], dict[str, Any]]:
    d = Path(tempfile.mkdtemp(prefix="svc-fuzz-docs-"))
    pol = PolicyService(PolicySettings(data_dir=d, database_url=f"sqlite:///{d / 'p.db'}"))
    chal = ChallengeService(
        ChallengeSettings(database_url=f"sqlite:///{d / 'c.db'}", link_key_file=str(d / "k"))
    )
    try:
        return (
            connect_document(policy_pb2, POLICY, _probes(policy_health, pol, PolicyMetrics())),
            connect_document(
                challenge_pb2, CHALLENGE, _probes(challenge_health, chal, ChallengeMetrics())
            ),
        )
    finally:
        pol.close()
        chal.close()


POLICY_DOC, CHALLENGE_DOC = _documents()
policy_schema = apifuzz.load(POLICY_DOC, headers=AUTH)
challenge_schema = apifuzz.load(CHALLENGE_DOC, headers=AUTH)


@policy_schema.parametrize()
@FUZZ
def test_policy_connect_fuzz(case: Any, policy_url: str) -> None:
    case.call_and_validate(base_url=policy_url)


@challenge_schema.parametrize()
@FUZZ
def test_challenge_connect_fuzz(case: Any, challenge_url: str) -> None:
    case.call_and_validate(base_url=challenge_url)
