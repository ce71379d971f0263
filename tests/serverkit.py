"""Shared helpers for the decision point's server tests (tests/test_server*.py,
tests/test_pdp_standalone.py).

Everything here talks to a real ``svc._pdp_core.Server`` over real sockets on 127.0.0.1: HTTP
with httpx, gRPC with grpcio and the stubs `make proto` generates from
proto/svc/authz/v1/authz.proto. It also maps the HTTP API's JSON requests to their gRPC and
AuthZEN equivalents (raising `Unmappable` for what has no equivalent) and gRPC responses back to
the HTTP JSON, so every transport can be compared with ``Engine.evaluate`` / ``Engine.plan``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import httpx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.pdp import Engine, Server

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
PROBLEM = "application/problem+json"
# Whole numbers travel as doubles in a google.protobuf.Struct: exact only up to 2**53.
MAX_EXACT_DOUBLE = 2**53


class Unmappable(Exception):
    """A request field that has no equivalent on the target transport (the reason says why)."""


# -------------------------------------------------------------------------------- serving


class Served:
    """A started server over `engine`, with an httpx client and a gRPC channel to it."""

    def __init__(self, engine: Engine, ready: bool = True, **kwargs: Any) -> None:
        self.engine = engine
        self.server = Server(engine, port=0, **kwargs)
        self.port = self.server.start()
        if ready:
            self.server.set_ready(bundle=True, containments=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = authz_pb2_grpc.AuthorizerStub(self.channel)

    def close(self) -> None:
        self.http.close()
        self.channel.close()
        self.server.stop(grace_secs=2)

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, json=body, **kwargs)

    def metrics(self) -> str:
        r = self.http.get("/metrics")
        assert r.status_code == 200
        return r.text


@contextmanager
def serve(engine: Engine, ready: bool = True, **kwargs: Any) -> Iterator[Served]:
    s = Served(engine, ready=ready, **kwargs)
    try:
        yield s
    finally:
        s.close()


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    """Polls `pred` until it returns something truthy (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(every)


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """Asserts an RFC 9457 problem with `status` (and `field`), returns its body."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers["content-type"]
    body = r.json()
    assert body["status"] == status, body
    assert body["type"].startswith("urn:svc:problem:"), body
    assert isinstance(body["title"], str) and body["title"], body
    assert isinstance(body["detail"], str) and body["detail"], body
    if field is not None:
        assert body.get("field") == field, body
    return body


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        series, _, rest = head.partition("{")
        if series != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
        if all(got.get(k) == v for k, v in labels.items()) and len(got) == len(labels):
            return float(value)
    return 0.0


# -------------------------------------------------------------------------------- refs


def parse_ref(raw: Any) -> dict[str, str]:
    """An entity reference as ``{type, id}``: from ``{type, id}``, ``{"__entity": ...}`` or a
    Cedar literal ``Type::"id"``. Raises `Unmappable` for anything else."""
    if isinstance(raw, str):
        ty, sep, rest = raw.rpartition("::")
        if sep and ty:
            try:
                eid = json.loads(rest)
            except json.JSONDecodeError:
                eid = None
            if isinstance(eid, str):
                return {"type": ty, "id": eid}
        raise Unmappable(f"`{raw}` is not a Cedar entity literal")
    if isinstance(raw, dict):
        inner = raw.get("__entity", raw) if set(raw) == {"__entity"} else raw
        if (
            isinstance(inner, dict)
            and set(inner) == {"type", "id"}
            and all(isinstance(v, str) for v in inner.values())
        ):
            return {"type": inner["type"], "id": inner["id"]}
    raise Unmappable(f"{raw!r} is not an entity reference")


# -------------------------------------------------------------------------------- gRPC mapping


def _check_exact(v: Any) -> None:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return
    if isinstance(v, float) and v.is_integer():
        raise Unmappable("a protobuf Struct cannot tell 5.0 from 5 (both become Long 5)")
    if isinstance(v, int | float):
        if abs(v) > MAX_EXACT_DOUBLE:
            raise Unmappable("a number beyond 2**53 is not exact in a protobuf Struct")
        return
    if isinstance(v, list):
        for x in v:
            _check_exact(x)
        return
    if isinstance(v, dict):
        for x in v.values():
            _check_exact(x)
        return
    raise Unmappable(f"{v!r} is not JSON")


def to_struct(obj: Any) -> struct_pb2.Struct:
    if not isinstance(obj, dict):
        raise Unmappable("a google.protobuf.Struct holds only an object")
    _check_exact(obj)
    s = struct_pb2.Struct()
    s.update(obj)
    return s


def _ref_pb(raw: Any) -> authz_pb2.EntityRef:
    return authz_pb2.EntityRef(**parse_ref(raw))


def check_request(req: Any) -> authz_pb2.CheckRequest:
    """The gRPC ``CheckRequest`` of an HTTP evaluation request.

    Raises `Unmappable` for what the typed proto cannot carry: inline ``entities`` (HTTP only,
    docs/decisions.md#inline-entities), fields of the wrong JSON type, unknown fields, an absent
    ``id`` (proto3 strings cannot be absent, only empty) and numbers beyond 2**53.
    """
    if not isinstance(req, dict):
        raise Unmappable("a gRPC request is always a message, never another JSON value")
    out = authz_pb2.CheckRequest()
    for k, v in req.items():
        if k == "principal":
            out.principal.CopyFrom(_ref_pb(v))
        elif k == "resource":
            out.resource.CopyFrom(_ref_pb(v))
        elif k == "on_behalf_of":
            out.on_behalf_of.CopyFrom(_ref_pb(v))
        elif k == "action":
            if not isinstance(v, str):
                raise Unmappable("action is a proto string")
            out.action = v
        elif k == "context":
            out.context.CopyFrom(to_struct(v))
        elif k == "human_present":
            if not isinstance(v, bool):
                raise Unmappable("human_present is a proto bool")
            out.human_present = v
        elif k == "work_item_id":
            if not isinstance(v, str):
                raise Unmappable("work_item_id is a proto string")
            out.work_item_id = v
        elif k == "entities":
            raise Unmappable("inline entities are HTTP only (docs/decisions.md#inline-entities)")
        else:
            raise Unmappable(f"a proto message has no unknown field `{k}`")
    return out


def _verdict(v: int) -> str:
    return authz_pb2.Verdict.Name(v).removeprefix("VERDICT_").lower()


def _mode(v: int) -> str:
    return authz_pb2.Mode.Name(v).removeprefix("MODE_").lower()


def check_json(resp: authz_pb2.CheckResponse) -> dict[str, Any]:
    """A ``CheckResponse`` as the HTTP response JSON (with ``qid``)."""
    out: dict[str, Any] = {
        "qid": resp.decision_qid,
        "verdict": _verdict(resp.verdict),
        "challenges": list(resp.challenges),
        "policies": list(resp.policies),
    }
    if resp.HasField("on_behalf_of"):
        o = resp.on_behalf_of
        out["on_behalf_of"] = {
            "verdict": _verdict(o.verdict),
            "challenges": list(o.challenges),
            "policies": list(o.policies),
        }
    out["mode"] = _mode(resp.mode)
    return out


def plan_request(req: dict[str, Any]) -> authz_pb2.PlanRequest:
    """The gRPC ``PlanRequest`` of an HTTP plan request."""
    out = authz_pb2.PlanRequest()
    for k, v in req.items():
        if k == "principal":
            out.principal.CopyFrom(_ref_pb(v))
        elif k == "on_behalf_of":
            out.on_behalf_of.CopyFrom(_ref_pb(v))
        elif k in ("action", "resource_type", "plan_qid"):
            setattr(out, k, v)
        elif k == "context":
            out.context.CopyFrom(to_struct(v))
        else:
            raise Unmappable(f"a PlanRequest has no field `{k}`")
    return out


def value_json(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return {k: value_json(x) for k, x in v.struct_value.fields.items()}
    if kind == "list_value":
        return [value_json(x) for x in v.list_value.values]
    if kind == "number_value":
        n = v.number_value
        return int(n) if n.is_integer() else n
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    return None


def filter_json(n: authz_pb2.FilterNode) -> dict[str, Any]:
    """A ``FilterNode`` as the filter JSON of docs/plans.md (each op with its own fields)."""
    out: dict[str, Any] = {"op": n.op}
    op = n.op
    if op in ("and", "or"):
        out["args"] = [filter_json(a) for a in n.args]
    elif op == "not":
        out["arg"] = filter_json(n.arg)
    elif op in ("in", "is"):
        out["entity"] = {"type": n.entity.type, "id": n.entity.id}
    elif op in ("unknown", "unmappable"):
        if n.detail:
            out["detail"] = n.detail
    elif op not in ("true", "false"):
        out["attr"] = list(n.attr)
        if op == "compare":
            out["cmp"] = n.cmp
            out["value"] = value_json(n.value)
        elif op == "contains":
            out["value"] = value_json(n.value)
        elif op in ("contains_any", "contains_all"):
            out["values"] = [value_json(x) for x in n.values]
        elif op == "like":
            out["pattern"] = n.pattern
    return out


def plan_json(resp: authz_pb2.PlanResponse) -> dict[str, Any]:
    """A ``PlanResponse`` as the HTTP plan JSON (with ``qid``)."""
    out: dict[str, Any] = {
        "qid": resp.qid,
        "outcome": authz_pb2.PlanOutcome.Name(resp.outcome).removeprefix("PLAN_OUTCOME_").lower(),
        "challenges": list(resp.challenges),
        "challenge_could_widen": resp.challenge_could_widen,
        "needs_row_checks": resp.needs_row_checks,
        "attributes": list(resp.attributes),
        "policies": list(resp.policies),
        "mode": _mode(resp.mode),
        "policy_version": resp.policy_version,
        "principals_version": resp.principals_version,
        "max_age_secs": resp.max_age_secs,
        "pinned": resp.pinned,
    }
    if resp.HasField("filter"):
        out["filter"] = filter_json(resp.filter)
    return out


def _status_classes() -> tuple[Any, Any]:
    """Message classes for ``google.rpc.Status`` and ``google.rpc.BadRequest`` (the
    ``grpc-status-details-bin`` trailer of tonic-types' rich errors), built in a private pool
    since googleapis-common-protos is not a dependency. ``Any`` is declared by its wire shape."""
    f = descriptor_pb2.FileDescriptorProto(
        name="svc_tests/rpc_status.proto", package="svc_tests.rpc", syntax="proto3"
    )
    t = descriptor_pb2.FieldDescriptorProto

    def msg(name: str, fields: list[tuple[str, int, int, str | None, bool]]) -> None:
        m = f.message_type.add(name=name)
        for fname, num, ftype, tname, repeated in fields:
            fd = m.field.add(name=fname, number=num, type=ftype)
            fd.label = t.LABEL_REPEATED if repeated else t.LABEL_OPTIONAL
            if tname:
                fd.type_name = tname

    msg(
        "Any",
        [("type_url", 1, t.TYPE_STRING, None, False), ("value", 2, t.TYPE_BYTES, None, False)],
    )
    msg(
        "Status",
        [
            ("code", 1, t.TYPE_INT32, None, False),
            ("message", 2, t.TYPE_STRING, None, False),
            ("details", 3, t.TYPE_MESSAGE, ".svc_tests.rpc.Any", True),
        ],
    )
    msg(
        "FieldViolation",
        [("field", 1, t.TYPE_STRING, None, False), ("description", 2, t.TYPE_STRING, None, False)],
    )
    msg(
        "BadRequest",
        [("field_violations", 1, t.TYPE_MESSAGE, ".svc_tests.rpc.FieldViolation", True)],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    status = message_factory.GetMessageClass(pool.FindMessageTypeByName("svc_tests.rpc.Status"))
    bad = message_factory.GetMessageClass(pool.FindMessageTypeByName("svc_tests.rpc.BadRequest"))
    return status, bad


_STATUS, _BAD_REQUEST = _status_classes()


def bad_request_fields(err: grpc.RpcError) -> list[str]:
    """The fields named by the ``google.rpc.BadRequest`` details of a gRPC error."""
    trailers = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    raw = trailers.get("grpc-status-details-bin")
    if raw is None:
        return []
    st = _STATUS.FromString(raw)
    out = []
    for d in st.details:
        if d.type_url.endswith("google.rpc.BadRequest"):
            out.extend(v.field for v in _BAD_REQUEST.FromString(d.value).field_violations)
    return out


# -------------------------------------------------------------------------------- AuthZEN


def _az_entity(raw: Any) -> Any:
    try:
        return parse_ref(raw)
    except Unmappable:
        return raw  # malformed on both APIs: passed on as it is


def authzen_request(req: Any) -> tuple[Any, list[str]]:
    """The AuthZEN evaluation of an HTTP evaluation request, and which AuthZEN entity
    (``subject`` / ``resource``) each inline entity became (for mapping error fields).

    Raises `Unmappable` for ``on_behalf_of``, ``human_present`` and ``work_item_id`` (AuthZEN
    has no agent-for-a-person, presence or work-item members), and for inline entities AuthZEN
    cannot express: ``properties`` carry the attributes of the subject or the resource only, so
    an inline entity that is neither, or that names ``parents``, has no equivalent.
    """
    if not isinstance(req, dict):
        return req, []
    out: dict[str, Any] = {}
    for k, v in req.items():
        if k == "principal":
            out["subject"] = _az_entity(v)
        elif k == "resource":
            out["resource"] = _az_entity(v)
        elif k == "action":
            out["action"] = {"name": v}
        elif k == "context":
            out["context"] = v
        elif k in ("on_behalf_of", "human_present", "work_item_id"):
            raise Unmappable(f"AuthZEN has no equivalent of `{k}`")
        elif k == "entities":
            continue
        else:
            out[k] = v  # unknown members: refused by both APIs
    order: list[str] = []
    for ent in req.get("entities", []):
        if not isinstance(ent, dict) or ent.get("parents"):
            raise Unmappable("AuthZEN properties cannot name parents")
        uid = parse_ref(ent.get("uid"))
        for name in ("subject", "resource"):
            if out.get(name) == uid and name not in order:
                attrs = ent.get("attrs", {})
                out[name] = {**uid, "properties": attrs}
                order.append(name)
                break
        else:
            raise Unmappable("an inline entity that is neither subject nor resource")
    return out, order


def authzen_field(field: str, order: list[str]) -> str:
    """The AuthZEN name of an HTTP request field (``principal`` -> ``subject``...)."""
    if field.startswith("principal"):
        return "subject" + field.removeprefix("principal")
    if field == "action":
        return "action.name"
    m = re.match(r"^entities\[(\d+)\](.*)$", field)
    if m and int(m.group(1)) < len(order):
        return f"{order[int(m.group(1))]}.properties{m.group(2).replace('.attrs', '', 1)}"
    return field


def authzen_view(resp: dict[str, Any]) -> dict[str, Any]:
    """What an AuthZEN decision must agree on with ``Engine.evaluate``'s response."""
    return {
        "decision": resp["verdict"] == "allow" or resp["mode"] == "monitor",
        "verdict": resp["verdict"],
        "challenges": resp["challenges"],
        "policies": resp["policies"],
        "mode": resp["mode"],
    }


def authzen_got(resp: dict[str, Any]) -> dict[str, Any]:
    ctx = resp["context"]
    return {
        "decision": resp["decision"],
        "verdict": ctx["verdict"],
        "challenges": ctx["challenges"],
        "policies": ctx["policies"],
        "mode": ctx["mode"],
    }
