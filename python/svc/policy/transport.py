"""The gRPC face of the policy service: ``svc.policy.v1.PolicyService`` through connectrpc.

Only translation lives here (docs/architecture.md#code-layout-and-conventions): protobuf
messages to ``PolicyService`` calls and back, ``PolicyError`` to a gRPC status with a
``google.rpc.BadRequest`` of field violations, and the ``WatchActive`` stream. The service's
blocking calls run in worker threads, never on the event loop.

connectrpc serves gRPC (and the Connect and gRPC-Web protocols) as an ASGI app, which
``svc.policy.app`` mounts beside the health routes on one port (docs/dependencies.md says why).
Callers (docs/auth.md): with a ``Verifier``, a metadata interceptor (``BearerInterceptor``) checks
the ``authorization`` entry of every call before its message is read: ``UNAUTHENTICATED`` without
a valid bearer token, ``PERMISSION_DENIED`` for a caller not listed.

The endpoints are made from the service's descriptor (``svc.common.connect.endpoints``); a
method without a handler is an error at start, never a silent gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
from google.protobuf import json_format, struct_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge

from svc.common.auth import Verifier, author_of
from svc.common.connect import ServiceApp, ServiceHandlers, status_error, timestamp
from svc.policy import service as svc_service
from svc.policy.policytests import whole_numbers
from svc.policy.service import BundleInfo, PolicyError, PolicyService
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.wire import mode_name, mode_value

__all__ = [
    "SERVICE_NAME",
    "PolicyConnectApp",
    "PolicyMetrics",
    "bundle_message",
    "mode_name",
    "mode_value",
    "policy_test_message",
    "tests_message",
]

log = logging.getLogger("svc.policy")

SERVICE_NAME = "svc.policy.v1.PolicyService"

_STATES: dict[str, Any] = {
    "draft": pb.BUNDLE_STATE_DRAFT,
    "active": pb.BUNDLE_STATE_ACTIVE,
    "superseded": pb.BUNDLE_STATE_SUPERSEDED,
}
_SCOPES: dict[str, Any] = {
    "install": pb.MODE_SCOPE_INSTALL,
    "containment": pb.MODE_SCOPE_CONTAINMENT,
}
_TIERS: dict[str, Any] = {
    "fail_closed": pb.OUTAGE_TIER_FAIL_CLOSED,
    "cached": pb.OUTAGE_TIER_CACHED,
    "fail_open": pb.OUTAGE_TIER_FAIL_OPEN,
}


def _name(table: Mapping[str, Any], value: int) -> str:
    return {v: k for k, v in table.items()}.get(value, "")


def bundle_message(info: BundleInfo) -> pb.Bundle:
    """A ``BundleInfo`` as the ``Bundle`` message (files sorted by name)."""
    return pb.Bundle(
        version=info.version,
        state=_STATES[info.state],
        author=info.author,
        created_at=timestamp(info.created_at),
        published_at=timestamp(info.published_at),
        files=[pb.BundleFile(name=n, content=info.files[n]) for n in sorted(info.files)],
        digest=info.digest,
        signature=info.signature,
        key_id=info.key_id,
        comment=info.comment,
        policies=info.policies,
        warnings=info.warnings,
    )


def _enforcement(e: svc_service.Enforcement) -> pb.Enforcement:
    return pb.Enforcement(mode=mode_value(e.mode), containment_mode=mode_value(e.containment_mode))


def _change(c: svc_service.EnforcementChange) -> pb.EnforcementChange:
    return pb.EnforcementChange(
        id=c.id,
        at=timestamp(c.at),
        author=c.author,
        scope=_SCOPES[c.scope],
        from_mode=mode_value(c.from_mode),
        to_mode=mode_value(c.to_mode),
        reason=c.reason,
    )


def _fallback(f: svc_service.OutageFallback) -> pb.OutageFallback:
    return pb.OutageFallback(
        tool=f.tool,
        tier=_TIERS[f.tier],
        author=f.author,
        updated_at=timestamp(f.updated_at),
        reason=f.reason,
    )


def _struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def _ref_dict(ref: pb.EntityRef) -> dict[str, str]:
    return {"type": ref.type, "id": ref.id}


def policy_test_message(t: svc_service.PolicyTest) -> pb.PolicyTest:
    """A ``PolicyTest`` as its message (entities and context as ``Struct``s)."""
    req = t.request
    request = pb.TestRequest(
        principal=pb.EntityRef(**req["principal"]),
        action=req["action"],
        resource=pb.EntityRef(**req["resource"]),
        context=_struct(req.get("context") or {}),
    )
    if req.get("on_behalf_of"):
        request.on_behalf_of.CopyFrom(pb.EntityRef(**req["on_behalf_of"]))
    return pb.PolicyTest(
        name=t.name,
        request=request,
        entities=[_struct(e) for e in t.entities],
        expect=t.expect,
        saved_by=t.saved_by,
        from_decision=t.from_decision,
        created_at=timestamp(t.created_at),
        contained=[pb.EntityRef(**c) for c in t.contained],
        risk_scores=[
            pb.TestRiskScore(principal=pb.EntityRef(**r["principal"]), score=r["score"])
            for r in t.risk_scores
        ],
    )


def _result(r: svc_service.TestResult) -> pb.TestResult:
    return pb.TestResult(
        name=r.name,
        passed=r.passed,
        expected=r.expected,
        got=r.got,
        policies=r.policies,
        error=r.error,
        notes=r.notes,
    )


def tests_message(run: svc_service.TestRun) -> pb.TestRun:
    """A ``TestRun`` as its message."""
    return pb.TestRun(
        version=run.version,
        passed=run.passed,
        failed=len(run.failed),
        results=[_result(r) for r in run.results],
    )


class PolicyMetrics:
    """The service's Prometheus metrics (docs/policy.md#metrics), on a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "svc_policy_calls",
            "gRPC calls answered, by method and status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.watchers = Gauge(
            "svc_policy_watchers", "Open WatchActive streams", registry=self.registry
        )
        self.active_version = Gauge(
            "svc_policy_active_version",
            "The active bundle version (0 before the first publish)",
            registry=self.registry,
        )


class _Handlers(ServiceHandlers):
    """One coroutine per method of the proto, each calling ``PolicyService`` in a thread."""

    def __init__(self, service: PolicyService, metrics: PolicyMetrics) -> None:
        super().__init__(metrics.calls)
        self.service = service
        self.metrics = metrics

    async def CreateDraft(self, req: pb.CreateDraftRequest) -> pb.CreateDraftResponse:
        files: dict[str, str] = {}
        dup = []
        for f in req.files:
            if f.name in files:
                dup.append(f.name)
            files[f.name] = f.content
        if dup:
            raise status_error(
                PolicyError(
                    "invalid_argument",
                    "duplicate file names",
                    [svc_service.Violation("files", f"`{n}` appears twice") for n in dup],
                )
            )
        author = author_of(req.author)
        info = await self._call(
            "CreateDraft", lambda: self.service.create_draft(files, author, req.comment)
        )
        return pb.CreateDraftResponse(bundle=bundle_message(info))

    async def Publish(self, req: pb.PublishRequest) -> pb.PublishResponse:
        author = author_of(req.author)
        accepted = list(req.accept_failing_tests)
        info, run = await self._call(
            "Publish", lambda: self.service.publish_tested(req.version, author, accepted)
        )
        self.metrics.active_version.set(info.version)
        out = pb.PublishResponse(bundle=bundle_message(info))
        if run is not None:
            out.tests.CopyFrom(tests_message(run))
        return out

    async def SaveTest(self, req: pb.SaveTestRequest) -> pb.SaveTestResponse:
        t = req.test
        request: dict[str, Any] = {
            "principal": _ref_dict(t.request.principal),
            "action": t.request.action,
            "resource": _ref_dict(t.request.resource),
            "context": whole_numbers(json_format.MessageToDict(t.request.context)),
        }
        if t.request.HasField("on_behalf_of"):
            request["on_behalf_of"] = _ref_dict(t.request.on_behalf_of)
        entities = [whole_numbers(json_format.MessageToDict(e)) for e in t.entities]
        contained = [_ref_dict(c) for c in t.contained]
        scores = [{"principal": _ref_dict(r.principal), "score": r.score} for r in t.risk_scores]
        saved_by = author_of(req.author)
        test, active = await self._call(
            "SaveTest",
            lambda: self.service.save_test(
                t.name,
                request,
                entities,
                t.expect,
                saved_by,
                t.from_decision,
                contained,
                scores,
            ),
        )
        out = pb.SaveTestResponse(test=policy_test_message(test))
        if active is not None:
            out.active.CopyFrom(_result(active))
        return out

    async def ListTests(self, req: pb.ListTestsRequest) -> pb.ListTestsResponse:
        tests = await self._call("ListTests", self.service.list_tests)
        return pb.ListTestsResponse(tests=[policy_test_message(t) for t in tests])

    async def DeleteTest(self, req: pb.DeleteTestRequest) -> pb.DeleteTestResponse:
        author = author_of(req.author)
        await self._call("DeleteTest", lambda: self.service.delete_test(req.name, author))
        return pb.DeleteTestResponse()

    async def RunTests(self, req: pb.RunTestsRequest) -> pb.RunTestsResponse:
        run = await self._call("RunTests", lambda: self.service.run_tests(req.version))
        return pb.RunTestsResponse(tests=tests_message(run))

    async def GetActive(self, req: pb.GetActiveRequest) -> pb.GetActiveResponse:
        def get() -> BundleInfo:
            info = self.service.get_active()
            if info is None:
                raise PolicyError("not_found", "nothing is published yet")
            return info

        return pb.GetActiveResponse(bundle=bundle_message(await self._call("GetActive", get)))

    async def ListBundles(self, req: pb.ListBundlesRequest) -> pb.ListBundlesResponse:
        infos = await self._call("ListBundles", lambda: self.service.list_bundles(req.limit))
        return pb.ListBundlesResponse(bundles=[bundle_message(i) for i in infos])

    async def GetBundle(self, req: pb.GetBundleRequest) -> pb.GetBundleResponse:
        info = await self._call("GetBundle", lambda: self.service.get_bundle(req.version))
        return pb.GetBundleResponse(bundle=bundle_message(info))

    async def GetEnforcement(self, req: pb.GetEnforcementRequest) -> pb.GetEnforcementResponse:
        e = await self._call("GetEnforcement", self.service.get_enforcement)
        return pb.GetEnforcementResponse(enforcement=_enforcement(e))

    async def SetEnforcement(self, req: pb.SetEnforcementRequest) -> pb.SetEnforcementResponse:
        scope = _name(_SCOPES, req.scope) or f"#{req.scope}"
        mode = mode_name(req.mode) or f"#{req.mode}"
        author = author_of(req.author)
        e, change = await self._call(
            "SetEnforcement",
            lambda: self.service.set_enforcement(scope, mode, author, req.reason),
        )
        out = pb.SetEnforcementResponse(enforcement=_enforcement(e))
        if change is not None:
            out.change.CopyFrom(_change(change))
        return out

    async def ListEnforcementChanges(
        self, req: pb.ListEnforcementChangesRequest
    ) -> pb.ListEnforcementChangesResponse:
        changes = await self._call(
            "ListEnforcementChanges", lambda: self.service.list_enforcement_changes(req.limit)
        )
        return pb.ListEnforcementChangesResponse(changes=[_change(c) for c in changes])

    async def GetOutageFallback(
        self, req: pb.GetOutageFallbackRequest
    ) -> pb.GetOutageFallbackResponse:
        got = await self._call(
            "GetOutageFallback", lambda: self.service.get_outage_fallback(req.tool)
        )
        return pb.GetOutageFallbackResponse(fallbacks=[_fallback(f) for f in got])

    async def SetOutageFallback(
        self, req: pb.SetOutageFallbackRequest
    ) -> pb.SetOutageFallbackResponse:
        tier = _name(_TIERS, req.tier) or f"#{req.tier}"
        author = author_of(req.author)
        f = await self._call(
            "SetOutageFallback",
            lambda: self.service.set_outage_fallback(req.tool, tier, author, req.reason),
        )
        return pb.SetOutageFallbackResponse(fallback=_fallback(f))

    async def BreakGlassRollback(
        self, req: pb.BreakGlassRollbackRequest
    ) -> pb.BreakGlassRollbackResponse:
        info, before = await self._call(
            "BreakGlassRollback",
            lambda: self.service.break_glass_rollback(
                req.version, req.admin, req.nonce, req.issued_at, req.reason, req.signature
            ),
        )
        self.metrics.active_version.set(info.version)
        return pb.BreakGlassRollbackResponse(bundle=bundle_message(info), from_version=before)

    async def DryRun(self, req: pb.DryRunRequest) -> pb.DryRunResponse:
        if not req.HasField("since"):
            raise status_error(
                PolicyError(
                    "invalid_argument",
                    "`since` is required",
                    [svc_service.Violation("since", "required")],
                )
            )
        since = req.since.ToDatetime(tzinfo=UTC)
        until = req.until.ToDatetime(tzinfo=UTC) if req.HasField("until") else None
        r = await self._call(
            "DryRun",
            lambda: self.service.dry_run(req.version, since, until, req.sample, req.limit),
        )
        return pb.DryRunResponse(
            version=r.version,
            decisions=r.decisions,
            unchanged=r.unchanged,
            allow_to_deny=r.allow_to_deny,
            deny_to_allow=r.deny_to_allow,
            to_challenge=r.to_challenge,
            from_challenge=r.from_challenge,
            errors=r.errors,
            truncated=r.truncated,
            sample=[
                pb.ChangedDecision(
                    qid=c.qid,
                    at=timestamp(c.at),
                    principal=c.principal,
                    action=c.action,
                    resource=c.resource,
                    recorded=c.recorded,
                    draft=c.draft,
                    error=c.error,
                )
                for c in r.sample
            ],
            tests=tests_message(r.tests) if r.tests is not None else None,
            entities=r.entities,
            directory_version=r.directory_version,
            notes=r.notes,
        )

    async def WatchActive(
        self, req: pb.WatchActiveRequest
    ) -> AsyncIterator[pb.WatchActiveResponse]:
        """The active state now, then on every change, with heartbeats (docs/policy.md)."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        settings = self.service.settings

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        unsubscribe = self.service.subscribe(wake)
        self.metrics.watchers.inc()
        self.metrics.calls.labels("WatchActive", "ok").inc()
        try:
            last: tuple[int, str, str] | None = None
            next_beat = loop.time() + settings.heartbeat_secs
            while True:
                changed.clear()
                token = await anyio.to_thread.run_sync(self.service.state_token)
                if token != last:
                    bundle, enforcement = await anyio.to_thread.run_sync(self.service.state)
                    last = (
                        bundle.version if bundle else 0,
                        enforcement.mode,
                        enforcement.containment_mode,
                    )
                    active = pb.ActiveState(enforcement=_enforcement(enforcement))
                    if bundle is not None:
                        active.bundle.CopyFrom(bundle_message(bundle))
                    yield pb.WatchActiveResponse(active=active)
                    next_beat = loop.time() + settings.heartbeat_secs
                elif loop.time() >= next_beat:
                    yield pb.WatchActiveResponse(
                        heartbeat=pb.Heartbeat(at=timestamp(datetime.now(UTC)), version=last[0])
                    )
                    next_beat = loop.time() + settings.heartbeat_secs
                wait = max(0.0, min(settings.watch_poll_secs, next_beat - loop.time()))
                try:
                    await asyncio.wait_for(changed.wait(), wait)
                except TimeoutError:
                    pass
        finally:
            unsubscribe()
            self.metrics.watchers.dec()


class PolicyConnectApp(ServiceApp[_Handlers]):
    """The ASGI app serving ``svc.policy.v1.PolicyService`` (gRPC, gRPC-Web and Connect).

    Args:
        service: the service layer.
        metrics: where calls and watchers are counted.
        max_message_bytes: largest request message (a bundle of ``max_bundle_bytes`` plus its
            framing).
        verifier: checks every call's bearer token (``BearerInterceptor``); None admits every
            caller (a loopback bind only, ``svc.policy.app.serve``).

    """

    def __init__(
        self,
        service: PolicyService,
        metrics: PolicyMetrics,
        max_message_bytes: int,
        verifier: Verifier | None = None,
    ) -> None:
        super().__init__(_Handlers(service, metrics), pb, SERVICE_NAME, max_message_bytes, verifier)
