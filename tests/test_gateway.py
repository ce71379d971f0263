"""The MCP gateway's agent tokens and proxy (docs/gateway.md), against real parts.

A real `svc pdp` process over a bundle with `Tool` and `call` (tests/gwkit.py), a real upstream
MCP server process of the handshake era (tests/gwupstream.py, Streamable HTTP; and the same server
over stdio; both eras: tests/test_gateway_revisions.py), the
issuers' JWK Sets served over HTTPS by a test server whose CA trustme makes, and the gateway
itself on a real port (`GatewayServer`), reached with the `mcp` SDK's client and httpx.

Covered: every token attack is refused with 401 `invalid_token` (`alg: none`, HS256 with the
RSA public key as the secret, an untrusted issuer, another audience, expired, an unknown `kid`,
an app signing for another app's agent, an app signing for a person alone, a JWKS over plain
http); the identities tokens give (RFC 8693 token exchange, client credentials, a person's own
token, `svc_human_present`, `svc_work_item_id`) and that they reach the checks; a rotated key
found by fetching the JWKS again on its unknown `kid`; trusted apps from a file and from the
context service, a new or removed app applying within the refresh; the MCP methods passing
through (tools, resources, prompts) for HTTP and stdio upstreams; an upstream down at start that
comes back; an MCP session bound to the caller that opened it; checks the bundle refuses and
calls that do not name their resource; outage tiers from the policy service and containments
from a file; intake events that never block a call and are dropped past the queue's bound;
what an upstream sends during a call (log messages at the agent's level, sampling) reaching
that call's agent over HTTP and stdio, the relay key written into an upstream's event stream,
resource updates reaching the subscribed agent session; a
request to the client from an upstream with no call in flight answered with an error;
settings checks; a `Host` or `Origin` not the gateway's refused (DNS rebinding protection).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import mcp_types as types
import pytest
from cryptography.hazmat.primitives import serialization
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gwkit import (
    PYTHON,
    TESTS,
    Issuer,
    JwksServer,
    UpstreamProcess,
    agent_session,
    wait_until,
    write_bundle,
)
from svc.common.auth_settings import AuthConfigError
from svc.common.net import tcp_listener
from svc.gateway.app import GatewayServer
from svc.gateway.service import GatewayService
from svc.gateway.settings import GatewaySettings, Upstream
from svc.gateway.tokens import AgentTokenVerifier, TokenError, TrustedApps, parse_trusted_apps
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as ppb
from svc.policy.v1 import policy_pb2_grpc as ppb_grpc
from test_context import Live
from test_pdp_standalone import Pdp

AUD = "svc-gateway"
TOOLS = {
    "read_doc": {"resource_arg": "doc_id", "resource_type": "Document", "read_only": True},
    "write_doc": {"resource_arg": "doc_id", "resource_type": "Document"},
}


@dataclass
class Stack:
    """The parts every test here shares."""

    tmp: Path
    jwks: JwksServer
    pdp: Pdp
    pdp_url: str
    upstream: UpstreamProcess
    copilot: Issuer
    billing: Issuer
    idp: Issuer
    apps_file: Path
    gateway: GatewayServer = field(init=False)

    def settings(self, **overrides: Any) -> GatewaySettings:
        """Gateway settings over this stack's parts."""
        base: dict[str, Any] = {
            "port": 0,
            "pdp_url": self.pdp_url,
            "trusted_apps_file": str(self.apps_file),
            "trust_refresh_secs": 0.2,
            "jwks_ca_file": str(self.jwks.ca_file),
            "person_issuer": self.idp.iss,
            "person_jwks_url": self.jwks.url("idp"),
            "upstreams": {"docs": {"url": self.upstream.url, "tools": TOOLS}},
        }
        return GatewaySettings(**{**base, **overrides})

    @property
    def mcp(self) -> str:
        return f"{self.gateway.url}/mcp/docs"


def _apps(jwks: JwksServer, *issuers: tuple[str, Issuer]) -> list[dict[str, str]]:
    return [
        {"name": name, "iss": i.iss, "jwks_url": jwks.publish(name, i), "aud": AUD}
        for name, i in issuers
    ]


def ready(url: str) -> bool:
    """Whether the gateway at `url` answers ``/readyz`` 200."""
    return httpx.get(f"{url}/readyz", timeout=30).status_code == 200


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("gateway")
    jwks = JwksServer(tmp)
    copilot = Issuer("https://copilot.example.com", "RS256")
    billing = Issuer("https://billing.example.com", "ES256")
    idp = Issuer("https://idp.example.com", "ES256")
    jwks.publish("idp", idp)
    apps_file = tmp / "apps.json"
    apps_file.write_text(json.dumps(_apps(jwks, ("copilot", copilot), ("billing", billing))))
    pdp = Pdp("--bundle", str(write_bundle(tmp / "bundle")), "--port", "0", "--no-watch")
    upstream = UpstreamProcess(era="legacy")
    s = Stack(
        tmp,
        jwks,
        pdp,
        f"http://127.0.0.1:{pdp.port()}",
        upstream,
        copilot,
        billing,
        idp,
        apps_file,
    )
    s.gateway = GatewayServer(s.settings()).start()
    wait_until(lambda: ready(s.gateway.url))
    yield s
    s.gateway.stop()
    upstream.stop()
    assert pdp.stop() == 0, pdp.log
    jwks.close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _forged(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    """A JWS made by hand (what an attacker sends): HS256 over `secret`, or no signature."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    sig = (
        b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    )
    return f"{signing_input}.{_b64(sig)}"


def _claims(iss: str, sub: str, **more: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": iss, "sub": sub, "aud": AUD, "iat": now, "exp": now + 300, **more}


def _initialize(url: str, token: str | None) -> httpx.Response:
    headers = {"accept": "application/json, text/event-stream"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    return httpx.post(url, json=body, headers=headers, timeout=30)


# ---------------------------------------------------------------------------- token attacks


def _attacks(s: Stack) -> dict[str, tuple[str, str]]:
    """Attack name -> (token, a fragment of the refusal's detail)."""
    rsa_public_pem = s.copilot.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    exchange = _claims(s.copilot.iss, "ana", act={"sub": "copilot.assistant"})
    stranger = Issuer("https://stranger.example.com", "ES256")
    rogue_key = Issuer(s.copilot.iss, "RS256")  # the app's iss, a key it never published
    return {
        "alg none": (
            _forged({"alg": "none", "typ": "JWT", "kid": s.copilot.kid}, exchange, None),
            "algorithm `none` is not accepted",
        ),
        "HS256 with the RSA public key as secret": (
            _forged({"alg": "HS256", "typ": "JWT", "kid": s.copilot.kid}, exchange, rsa_public_pem),
            "algorithm `HS256` is not accepted",
        ),
        "untrusted issuer": (
            stranger.mint("ana", AUD, act="copilot.assistant"),
            "is not a trusted app",
        ),
        "wrong audience": (
            s.copilot.mint("ana", "svc-pdp", act="copilot.assistant"),
            "audience (`aud`) does not name `svc-gateway`",
        ),
        "expired": (
            s.copilot.mint("ana", AUD, act="copilot.assistant", lifetime=-3600),
            "has expired",
        ),
        "unknown kid": (
            rogue_key.mint("ana", AUD, act="copilot.assistant"),
            f"no RS256 key with kid `{rogue_key.kid}`",
        ),
        "foreign prefix": (
            s.copilot.mint("ana", AUD, act="billing.bot"),
            "may sign only for service accounts `copilot.*`",
        ),
        "foreign prefix alone": (
            s.copilot.mint("billing.bot", AUD),
            "may sign only for its service accounts `copilot.*`",
        ),
        "person alone": (
            s.copilot.mint("ana", AUD),
            "not for `ana` alone",
        ),
        "no exp": (
            s.copilot.mint("copilot.assistant", AUD, lifetime=0, exp=None),
            "the token has no `exp` claim",
        ),
        "signature of another key": (
            s.copilot.mint("copilot.assistant", AUD)[:-8] + "AAAAAAAA",
            "signature does not verify",
        ),
        "not a JWT": ("not-a-jwt", "is not a JWT"),
    }


ATTACKS = [
    "alg none",
    "HS256 with the RSA public key as secret",
    "untrusted issuer",
    "wrong audience",
    "expired",
    "unknown kid",
    "foreign prefix",
    "foreign prefix alone",
    "person alone",
    "no exp",
    "signature of another key",
    "not a JWT",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_token_attacks_are_refused(stack: Stack, attack: str) -> None:
    token, detail = _attacks(stack)[attack]
    for r in (
        _initialize(stack.mcp, token),
        httpx.get(
            f"{stack.gateway.url}/mcp/challenges/x?wait=0",
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        ),
    ):
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == 'Bearer realm="svc-gateway", error="invalid_token"'
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["type"] == "urn:svc:problem:unauthenticated"
        assert detail in body["detail"], body


def test_no_token_is_refused_without_an_error_code(stack: Stack) -> None:
    r = _initialize(stack.mcp, None)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="svc-gateway"'
    assert "no bearer token" in r.json()["detail"]
    metrics = httpx.get(f"{stack.gateway.url}/metrics", timeout=30).text
    assert "svc_gateway_tokens_refused_total" in metrics


def test_a_jwks_over_plain_http_is_never_trusted(stack: Stack) -> None:
    apps = parse_trusted_apps(
        [
            {
                "name": "plain",
                "iss": "https://plain.example.com",
                "jwks_url": "http://plain.example.com/jwks.json",
                "aud": AUD,
            },
            {
                "name": "copilot",
                "iss": stack.copilot.iss,
                "jwks_url": stack.jwks.url("copilot"),
                "aud": AUD,
            },
        ]
    )
    assert [a.name for a in apps] == ["copilot"]
    with pytest.raises(ValidationError, match="`person_issuer` needs `person_jwks_url`"):
        GatewaySettings(person_issuer="https://idp.example.com")
    with pytest.raises(AuthConfigError, match="https://"):
        AgentTokenVerifier(
            stack.settings(person_jwks_url="http://idp.example.com/jwks.json"), TrustedApps(apps)
        )


# ------------------------------------------------------------------------------- identities


def test_identities_the_tokens_give(stack: Stack) -> None:
    apps = TrustedApps(parse_trusted_apps(json.loads(stack.apps_file.read_text())))
    v = AgentTokenVerifier(stack.settings(), apps)
    exchanged = v.verify(
        stack.copilot.mint(
            "ana",
            AUD,
            act="copilot.assistant",
            svc_human_present=False,
            svc_work_item_id="jira:OPS-7",
        )
    )
    assert exchanged.request_fields() == {
        "principal": {"type": "ServiceAccount", "id": "copilot.assistant"},
        "on_behalf_of": {"type": "Human", "id": "ana"},
        "human_present": False,
        "work_item_id": "jira:OPS-7",
    }
    assert exchanged.issuer == "copilot"
    alone = v.verify(stack.billing.mint("billing.bot", AUD))
    assert alone.request_fields() == {"principal": {"type": "ServiceAccount", "id": "billing.bot"}}
    person = v.verify(stack.idp.mint("ana", AUD))
    assert person.request_fields() == {
        "principal": {"type": "Human", "id": "ana"},
        "human_present": True,
    }
    with pytest.raises(TokenError, match="names the person alone"):
        v.verify(stack.idp.mint("ana", AUD, act="copilot.assistant"))
    with pytest.raises(TokenError, match="`svc_human_present` is not a boolean"):
        v.verify(stack.copilot.mint("copilot.assistant", AUD, svc_human_present="no"))
    with pytest.raises(TokenError, match="`act` has no `sub`"):
        v.verify(stack.copilot.mint("ana", AUD, act={"client_id": "x"}))


def test_a_rotated_key_is_fetched_on_its_unknown_kid(stack: Stack) -> None:
    rotating = Issuer("https://rotating.example.com", "ES256")
    apps = TrustedApps(_parsed(stack, ("rotating", rotating)))
    v = AgentTokenVerifier(stack.settings(), apps)
    assert v.verify(rotating.mint("rotating.agent", AUD)).principal["id"] == "rotating.agent"
    fetched = stack.jwks.fetches["rotating"]
    # The app rotates its key: the new kid is not in the cached set, so the set is fetched again.
    new = Issuer(rotating.iss, "ES256")
    stack.jwks.publish("rotating", new)
    assert v.verify(new.mint("rotating.agent", AUD)).principal["id"] == "rotating.agent"
    assert stack.jwks.fetches["rotating"] == fetched + 1
    # The old key is gone from the set; within the 30 s rate limit no new fetch happens.
    with pytest.raises(TokenError, match="no ES256 key with kid"):
        v.verify(rotating.mint("rotating.agent", AUD))
    assert stack.jwks.fetches["rotating"] == fetched + 1


def _parsed(stack: Stack, *issuers: tuple[str, Issuer]) -> list[Any]:
    return parse_trusted_apps(_apps(stack.jwks, *issuers))


# --------------------------------------------------------------------- trusted app changes


def test_a_trusted_app_from_the_file_applies_and_its_removal_too(stack: Stack) -> None:
    newcomer = Issuer("https://newcomer.example.com", "ES256")
    token = newcomer.mint("newcomer.bot", AUD)
    assert _initialize(stack.mcp, token).status_code == 401
    before = json.loads(stack.apps_file.read_text())
    stack.apps_file.write_text(json.dumps(before + _apps(stack.jwks, ("newcomer", newcomer))))
    try:
        wait_until(lambda: _initialize(stack.mcp, token).status_code == 200)
    finally:
        stack.apps_file.write_text(json.dumps(before))
    # Removed: its verified (cached) token is refused as soon as the removal is read.
    r = wait_until(lambda: (x := _initialize(stack.mcp, token)).status_code == 401 and x)
    assert "is not a trusted app" in r.json()["detail"]


def test_trusted_apps_from_the_context_service(stack: Stack) -> None:
    ctx = Live(f"sqlite:///{stack.tmp / 'context.db'}")
    newcomer = Issuer("https://ctx-app.example.com", "RS256")
    gw = GatewayServer(
        stack.settings(trusted_apps_file=None, context_url=ctx.url, trust_refresh_secs=0.2)
    ).start()
    try:
        wait_until(lambda: ready(gw.url))
        url = f"{gw.url}/mcp/docs"
        token = newcomer.mint("ana", AUD, act="ctxapp.assistant")
        assert _initialize(url, token).status_code == 401
        (app,) = _apps(stack.jwks, ("ctxapp", newcomer))
        r = ctx.http.post("/v1/directory/trusted-apps", json=app)
        assert r.status_code in (200, 201), r.text
        wait_until(lambda: _initialize(url, token).status_code == 200)
        assert ctx.http.delete("/v1/directory/trusted-apps/ctxapp").status_code == 204
        wait_until(lambda: _initialize(url, token).status_code == 401)
    finally:
        gw.stop()
        ctx.stop()


# ------------------------------------------------------------------------------- the proxy


async def _everything(url: str, token: str) -> dict[str, Any]:
    async with agent_session(url, token) as s:
        tools = await s.list_tools()
        templates = await s.list_resource_templates()
        resource = await s.read_resource("doc://plan")
        prompts = await s.list_prompts()
        prompt = await s.get_prompt("summarize", {"doc_id": "plan"})
        called = await s.call_tool("read_doc", {"doc_id": "plan"})
        return {
            "tools": sorted(t.name for t in tools.tools),
            "templates": [t.uri_template for t in templates.resource_templates],
            "resource": resource.contents[0].text,  # type: ignore[union-attr]
            "prompts": [p.name for p in prompts.prompts],
            "prompt": prompt.messages[0].content.text,  # type: ignore[union-attr]
            "called": (called.is_error, called.content[0].text),  # type: ignore[union-attr]
        }


EXPECTED = {
    "tools": [
        "ask_later",
        "ask_now",
        "ask_round",
        "asked",
        "capabilities",
        "change_tools",
        "launch",
        "ping",
        "read_doc",
        "touch",
        "wait_long",
        "waits",
        "write_doc",
    ],
    "templates": ["doc://{name}"],
    "resource": "the plan",
    "prompts": ["summarize"],
    "prompt": "Summarize plan.",
    "called": (False, "the plan"),
}


def test_mcp_methods_pass_through(stack: Stack) -> None:
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    direct = asyncio.run(_everything(stack.upstream.url, token))
    assert direct == EXPECTED
    assert asyncio.run(_everything(stack.mcp, token)) == EXPECTED


def test_a_request_to_the_client_with_no_call_in_flight_gets_an_error(stack: Stack) -> None:
    """docs/gateway.md#relaying: an upstream's sampling request after the call that made it has
    ended is answered with an MCP error by the gateway, not sent to an agent nor left waiting."""
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    sampled: list[Any] = []

    async def sampling(context: Any, params: Any) -> Any:
        sampled.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="no"), model="m"
        )

    async def run() -> list[str]:
        async with agent_session(stack.mcp, token, sampling_callback=sampling) as s:
            started = await s.call_tool("ask_later", {})
            assert started.content[0].text == "asked"  # type: ignore[union-attr]
            for _ in range(600):
                got = await s.call_tool("asked", {})
                answers: list[str] = json.loads(got.content[0].text)  # type: ignore[union-attr]
                if answers:
                    return answers
                await asyncio.sleep(0.05)
            return []

    (answer,) = asyncio.run(run())
    assert answer.startswith("error -32600: sampling/createMessage"), answer
    assert "no agent call in flight" in answer
    assert sampled == []


async def _relayed(url: str, token: str) -> dict[str, Any]:
    """What reaches an agent at warning level that asks (``ask_now``), and a subscriber and a
    non-subscriber of a touched resource."""
    seen: dict[str, list[Any]] = {"logs": [], "sampled": [], "updates": [], "others": []}

    async def sampling(context: Any, params: Any) -> Any:
        seen["sampled"].append(params.messages[0].content.text)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="yes"), model="m"
        )

    async def logging(params: Any) -> None:
        seen["logs"].append((params.level, params.data))

    async def updates(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            seen["updates"].append(str(message.params.uri))

    async def others(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            seen["others"].append(str(message.params.uri))

    async with (
        agent_session(
            url,
            token,
            sampling_callback=sampling,
            logging_callback=logging,
            message_handler=updates,
        ) as a,
        agent_session(url, token, message_handler=others) as b,
    ):
        await a.set_logging_level("warning")
        answer = await a.call_tool("ask_now", {})
        await a.subscribe_resource("doc://plan")
        await b.call_tool("touch", {"uri": "doc://plan"})
        for _ in range(600):
            if seen["updates"]:
                break
            await asyncio.sleep(0.05)
        await a.unsubscribe_resource("doc://plan")
        return {**seen, "answer": answer.content[0].text}


def _changes(seen: list[str]) -> Any:
    """A ``message_handler`` that notes each ``list_changed`` notification's method."""

    async def handler(message: Any) -> None:
        method = getattr(message, "method", "")
        if isinstance(method, str) and method.endswith("/list_changed"):
            seen.append(method)

    return handler


async def _until_seen(seen: list[str], want: set[str]) -> None:
    """Waits (up to 30 s) until `seen` holds every method of `want`."""
    for _ in range(600):
        if want <= set(seen):
            return
        await asyncio.sleep(0.05)


def test_an_upstreams_list_changes_reach_every_agent_session(stack: Stack) -> None:
    """docs/gateway.md#relaying: the upstream's ``notifications/tools/list_changed`` goes to
    every agent session of that upstream (the caller's, on the fast path, and one that made no
    request yet), and the gateway announces ``listChanged``."""
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    a_seen: list[str] = []
    b_seen: list[str] = []

    async def run() -> Any:
        async with (
            agent_session(stack.mcp, token, message_handler=_changes(a_seen)) as a,
            # The second session makes no request: the gateway knows it from its initialization.
            agent_session(stack.mcp, token, message_handler=_changes(b_seen)),
        ):
            changed = await a.call_tool("change_tools", {})
            await _until_seen(a_seen, {"notifications/tools/list_changed"})
            await _until_seen(b_seen, {"notifications/tools/list_changed"})
            return a.server_capabilities, changed

    caps, changed = asyncio.run(run())
    assert changed.content[0].text == "changed"
    assert caps.tools.list_changed and caps.resources.list_changed and caps.prompts.list_changed
    assert a_seen == b_seen == ["notifications/tools/list_changed"]


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_what_an_upstream_sends_during_a_call_reaches_its_agent(stack: Stack) -> None:
    """docs/gateway.md#relaying, over HTTP (tagged streams) and stdio (the one call in flight):
    the agent's level filters the upstream's log messages, its sampling answer goes back, and
    a resource update reaches the subscribed agent session only."""
    expected = {
        "logs": [("warning", "still asking")],
        "sampled": ["hi"],
        "updates": ["doc://plan"],
        "others": [],
        "answer": "yes",
    }
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    assert asyncio.run(_relayed(stack.mcp, token)) == expected
    gw = GatewayServer(
        stack.settings(
            upstreams={
                "local": Upstream(
                    command=[PYTHON, str(TESTS / "gwupstream.py"), "stdio", "legacy"],
                    env={"PYTHONPATH": str(TESTS.parent / "python")},
                )
            }
        )
    ).start()
    try:
        wait_until(lambda: ready(gw.url))
        assert asyncio.run(_relayed(f"{gw.url}/mcp/local", token)) == expected
    finally:
        gw.stop()


def _fast_path(url: str) -> dict[str, float]:
    """The gateway's ``svc_gateway_fast_path_calls_total`` for the ``docs`` upstream, by how."""
    out = {"answered": 0.0, "relayed": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith('svc_gateway_fast_path_calls_total{how="') and 'upstream="docs"' in line:
            out[line.split('how="')[1].split('"')[0]] = float(line.split()[-1])
    return out


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_plain_calls_are_answered_on_the_fast_path_and_relaying_ones_handed_over(
    stack: Stack,
) -> None:
    """docs/gateway.md#fast-path: a call whose result comes first is answered as one JSON body;
    one whose upstream logs and asks first is handed to the SDK's path, which relays both;
    a blocked call is answered on the fast path too. Each is checked once."""
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    before = _fast_path(stack.gateway.url)
    logs: list[Any] = []

    async def sampling(context: Any, params: Any) -> Any:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="yes"), model="m"
        )

    async def logging(params: Any) -> None:
        logs.append((params.level, params.data))

    async def run() -> list[Any]:
        async with agent_session(
            stack.mcp, token, sampling_callback=sampling, logging_callback=logging
        ) as s:
            return [
                await s.call_tool("read_doc", {"doc_id": "plan"}),
                await s.call_tool("ask_now", {}),
                await s.call_tool("read_doc", {}),
            ]

    plain, asked, blocked = asyncio.run(run())
    assert plain.content[0].text == "the plan" and not plain.is_error
    assert asked.content[0].text == "yes"
    assert logs == [("info", "asking"), ("warning", "still asking")]
    assert blocked.is_error and blocked.meta["svc/verdict"] == "deny"
    assert "names no resource" in blocked.content[0].text
    after = _fast_path(stack.gateway.url)
    assert after["answered"] - before["answered"] == 1
    assert after["relayed"] - before["relayed"] == 1


def test_a_call_cancelled_on_the_fast_path_is_cancelled_upstream(stack: Stack) -> None:
    """docs/gateway.md#fast-path: ``notifications/cancelled`` for a call in flight ends it
    without an answer and tells the upstream, whose tool is cancelled."""
    token = stack.billing.mint("billing.bot", AUD)
    sid = _initialize(stack.mcp, token).headers["mcp-session-id"]
    headers = {
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {token}",
        "mcp-session-id": sid,
        "mcp-protocol-version": "2025-11-25",
    }

    def call(rid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        params = {"name": name, "arguments": args}
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    async def run() -> tuple[httpx.Response, list[str]]:
        async with httpx.AsyncClient(headers=headers, timeout=30) as c:
            await c.post(stack.mcp, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            slow = asyncio.create_task(
                c.post(stack.mcp, json=call("w1", "wait_long", {"seconds": 20}))
            )
            await asyncio.sleep(1.0)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "w1"}}  # fmt: skip
            assert (await c.post(stack.mcp, json=cancel)).status_code == 202
            ended = await asyncio.wait_for(slow, 10)
            for _ in range(100):
                got = (await c.post(stack.mcp, json=call("w2", "waits", {}))).json()
                waits: list[str] = json.loads(got["result"]["content"][0]["text"])
                if waits:
                    return ended, waits
                await asyncio.sleep(0.05)
            return ended, []

    ended, waits = asyncio.run(run())
    assert ended.status_code == 200
    assert '"result"' not in ended.text and '"error"' not in ended.text
    assert waits == ["cancelled"]


def test_a_calls_own_stream_is_relayed_until_its_response() -> None:
    """``UpstreamRelays.follow`` (docs/gateway.md#fast-path): progress and log messages go to
    the call's relay, requests to the client are answered (a malformed one with an error, never
    left waiting), other responses are dropped, and the call's response ends it."""
    from svc.gateway.relay import UpstreamRelays

    seen: list[Any] = []

    class Recording:
        async def progress(self, progress: float, total: float | None, message: str | None) -> None:
            seen.append(("progress", progress, total, message))

        async def log(self, params: types.LoggingMessageNotificationParams) -> None:
            seen.append(("log", params.level, params.data))

        async def request(self, request: Any, result_type: Any) -> Any:
            seen.append(("asked", request.method))
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text="ok"), model="m"
            )

    ask = {"role": "user", "content": {"type": "text", "text": "hi"}}
    stream = [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "svc-1", "progress": 1, "total": 2},
        },
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "data": "x"},
        },
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "loud"}},
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "sampling/createMessage",
            "params": {"messages": [ask], "maxTokens": 5},
        },
        {
            "jsonrpc": "2.0",
            "id": 6,
            "method": "sampling/createMessage",
            "params": {"messages": 3},
        },
        {"jsonrpc": "2.0", "id": 7, "method": "ping"},
        {"jsonrpc": "2.0", "id": 8, "method": "roots/list"},
        {"jsonrpc": "2.0", "id": "svc-other", "result": {}},
        {"jsonrpc": "2.0", "id": "svc-1", "result": {"content": []}},
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "data": "late"},
        },
    ]
    answered: list[dict[str, Any]] = []

    async def answer(msg: dict[str, Any]) -> None:
        answered.append(msg)

    async def messages(items: list[dict[str, Any]]) -> Any:
        for item in items:
            yield item

    relays = UpstreamRelays("docs", stdio=False)
    response = asyncio.run(relays.follow("svc-1", messages(stream), Recording(), answer))
    assert response == {"jsonrpc": "2.0", "id": "svc-1", "result": {"content": []}}
    assert seen == [
        ("progress", 1.0, 2.0, None),
        ("log", "info", "x"),
        ("asked", "sampling/createMessage"),
    ]
    by_id = {m["id"]: m for m in answered}
    assert by_id[5]["result"]["content"]["text"] == "ok"
    assert by_id[6]["error"]["code"] == types.INVALID_PARAMS
    assert by_id[7]["result"] == {}
    assert by_id[8]["error"]["code"] == types.METHOD_NOT_FOUND
    with pytest.raises(ConnectionError):
        asyncio.run(relays.follow("svc-1", messages(stream[:2]), Recording(), answer))


def test_the_relay_key_is_written_into_an_event_streams_requests_and_notifications() -> None:
    """``TaggedEvents`` (docs/gateway.md#relaying): requests and notifications get the key,
    responses pass as they are, whatever the line ends and however the chunks are cut."""
    import httpx2

    from svc.gateway.relay import RELAY_META, TaggedEvents

    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "é"}}
    ask = {"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {"_meta": {"a": 1}}}  # fmt: skip
    answer = {"jsonrpc": "2.0", "id": 1, "result": {}}
    raw = (
        f"event: message\r\nid: 1\r\ndata: {json.dumps(note, ensure_ascii=False)}\r\n\r\n"
        f"event: message\rdata: {json.dumps(ask)}\r\r"
        f"event: message\ndata: {json.dumps(answer)}\n\n"
    ).encode()

    class Chunks(httpx2.AsyncByteStream):
        def __init__(self, *parts: bytes) -> None:
            self.parts = parts

        async def __aiter__(self) -> Any:
            for part in self.parts:
                yield part

    async def read(*parts: bytes) -> list[Any]:
        out = b""
        async for part in TaggedEvents(Chunks(*parts), "k"):
            out += part
        return [json.loads(x[5:]) for x in out.decode().split("\n") if x.startswith("data:")]

    expected = [
        {**note, "params": {"data": "é", "_meta": {RELAY_META: "k"}}},
        {**ask, "params": {"_meta": {"a": 1, RELAY_META: "k"}}},
        answer,
    ]
    # One chunk, and every cut of the stream in two (between a CR and its LF, inside a UTF-8
    # character).
    assert asyncio.run(read(raw)) == expected
    for cut in range(1, len(raw)):
        assert asyncio.run(read(raw[:cut], raw[cut:])) == expected, cut


def test_a_stdio_upstream(stack: Stack) -> None:
    settings = stack.settings(
        upstreams={
            "local": Upstream(
                command=[PYTHON, str(TESTS / "gwupstream.py"), "stdio", "legacy"],
                env={"PYTHONPATH": str(TESTS.parent / "python")},
                tools=TOOLS,
            )
        }
    )
    gw = GatewayServer(settings).start()
    try:
        wait_until(lambda: ready(gw.url))
        token = stack.billing.mint("billing.bot", AUD)
        assert asyncio.run(_everything(f"{gw.url}/mcp/local", token)) == EXPECTED
    finally:
        gw.stop()


def test_an_upstream_that_is_down_then_comes_back(stack: Stack) -> None:
    with tcp_listener("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
    gw = GatewayServer(
        stack.settings(upstreams={"late": {"url": f"http://127.0.0.1:{port}/mcp", "tools": TOOLS}})
    ).start()
    upstream = None
    token = stack.billing.mint("billing.bot", AUD)

    async def ping() -> Any:
        async with agent_session(f"{gw.url}/mcp/late", token) as s:
            try:
                return await s.call_tool("ping", {})
            except MCPError as e:
                return e

    seen: list[str] = []

    async def across_a_restart() -> Any:
        """A call on a session opened before the upstream restarts, and what it was told."""
        nonlocal upstream
        async with agent_session(f"{gw.url}/mcp/late", token, message_handler=_changes(seen)) as s:
            await s.list_tools()
            assert upstream is not None
            upstream.stop()
            upstream = UpstreamProcess(port, era="legacy")
            again = await s.call_tool("ping", {})
            await _until_seen(
                seen,
                {
                    "notifications/tools/list_changed",
                    "notifications/resources/list_changed",
                    "notifications/prompts/list_changed",
                },
            )
            return again

    try:
        r = httpx.get(f"{gw.url}/readyz", timeout=30)
        assert r.status_code == 503
        assert "upstream `late` is not connected" in r.json()["detail"]
        error = asyncio.run(ping())
        assert isinstance(error, MCPError)
        assert "upstream `late` cannot be reached" in error.message
        upstream = UpstreamProcess(port, era="legacy")
        wait_until(lambda: ready(gw.url))
        assert asyncio.run(ping()).content[0].text == "pong"
        # Restarted, the upstream no longer knows the gateway's session: the call the fast
        # path forwards gets its 404, the gateway opens a new session at once (not at the next
        # ping, 15 s on) and sends the call again on it. The agent's session, opened before,
        # is told that every list may have changed.
        again = asyncio.run(across_a_restart())
        assert not isinstance(again, MCPError), again
        assert again.content[0].text == "pong"
        assert sorted(seen) == [
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
            "notifications/tools/list_changed",
        ]
    finally:
        gw.stop()
        if upstream is not None:
            upstream.stop()


def test_an_mcp_session_belongs_to_the_caller_that_opened_it(stack: Stack) -> None:
    mine = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    theirs = stack.billing.mint("billing.bot", AUD)
    r = _initialize(stack.mcp, mine)
    assert r.status_code == 200
    sid = r.headers["mcp-session-id"]
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-session-id": sid,
        "mcp-protocol-version": "2025-11-25",
    }
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    other = httpx.post(
        stack.mcp, json=body, timeout=30, headers={**headers, "authorization": f"Bearer {theirs}"}
    )
    assert other.status_code == 404
    # A tools/call, which the fast path would serve on an owner's session, too.
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "ping"}}
    other = httpx.post(
        stack.mcp, json=call, timeout=30, headers={**headers, "authorization": f"Bearer {theirs}"}
    )
    assert other.status_code == 404
    # A fresh token of the same caller keeps the session.
    again = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    assert again != mine
    httpx.post(
        stack.mcp,
        timeout=30,
        headers={**headers, "authorization": f"Bearer {again}"},
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    same = httpx.post(
        stack.mcp, json=body, timeout=30, headers={**headers, "authorization": f"Bearer {again}"}
    )
    assert same.status_code == 200, same.text
    assert "read_doc" in same.text


def test_events_never_block_a_call_and_are_dropped_past_the_bound(stack: Stack) -> None:
    # The intake is down (nothing listens there): each call is answered all the same; the
    # batcher holds one event, the queue two more, and the rest are dropped and counted.
    with tcp_listener("127.0.0.1", 0) as sock:
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gw = GatewayServer(
        stack.settings(intake_url=nowhere, intake_queue_bound=2, intake_batch_max=1)
    ).start()
    try:
        wait_until(lambda: ready(gw.url))
        token = stack.billing.mint("billing.bot", AUD)

        async def calls() -> list[Any]:
            async with agent_session(f"{gw.url}/mcp/docs", token) as s:
                return [await s.call_tool("ping", {}) for _ in range(6)]

        assert [r.content[0].text for r in asyncio.run(calls())] == ["pong"] * 6
        metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
        dropped = [
            ln for ln in metrics.splitlines() if ln.startswith("svc_gateway_events_dropped_total")
        ]
        assert dropped and float(dropped[0].split()[-1]) >= 3, dropped
    finally:
        gw.stop()


def test_what_the_checks_carry_and_what_they_refuse(stack: Stack) -> None:
    settings = stack.settings(
        upstreams={
            "docs": {"url": stack.upstream.url, "tools": TOOLS},
            "other": {
                "url": stack.upstream.url,
                "tools": {"read_doc": {"resource_arg": "doc_id", "resource_type": "Ticket"}},
            },
        }
    )
    gw = GatewayServer(settings).start()
    try:
        wait_until(lambda: ready(gw.url))

        async def calls(token: str) -> dict[str, Any]:
            async with (
                agent_session(f"{gw.url}/mcp/docs", token) as docs,
                agent_session(f"{gw.url}/mcp/other", token) as other,
            ):
                return {
                    "launch": await docs.call_tool("launch", {}),
                    "no resource": await docs.call_tool("read_doc", {}),
                    "unknown type": await other.call_tool("read_doc", {"doc_id": "plan"}),
                    "blocked agent": await docs.call_tool("ping", {}),
                }

        away = asyncio.run(
            calls(stack.copilot.mint("ana", AUD, act="copilot.blocked", svc_human_present=False))
        )
        here = asyncio.run(calls(stack.copilot.mint("ana", AUD, act="copilot.assistant")))
    finally:
        gw.stop()
    # svc_human_present false reaches the decision point: nobody can touch a key now.
    assert away["launch"].meta["svc/verdict"] == "deny"
    assert "svc:human_not_present" in away["launch"].content[0].text
    # With a person present it is a challenge; without a challenge service there is no
    # challenge to wait for, and the text says to retry shortly.
    assert here["launch"].meta["svc/verdict"] == "challenge"
    assert "svc/challenge_qid" not in here["launch"].meta
    assert "no challenge could be opened" in here["launch"].content[0].text
    for got in (away, here):
        assert got["no resource"].meta == {"svc/verdict": "deny"}
        assert "argument `doc_id` must be a non-empty string" in got["no resource"].content[0].text
        assert got["unknown type"].meta == {"svc/verdict": "deny"}
        assert "the decision point refused to decide `other/read_doc`" in (
            got["unknown type"].content[0].text
        )
    # The agent in act.sub is the principal checked.
    assert away["blocked agent"].meta["svc/verdict"] == "deny"
    assert "no-ping-for-blocked" in away["blocked agent"].content[0].text
    assert here["blocked agent"].content[0].text == "pong"


def test_the_checks_are_the_decision_points_http_evaluations(stack: Stack) -> None:
    """A call's checks go as ``POST /v1/access/evaluation`` at once (docs/gateway.md#checks):
    each decision is the one the decision point gives that request; a request it refuses (400,
    a type the bundle's schema lacks) raises ``PdpRefused`` with its problem, and a decision
    point that cannot be reached raises ``PdpUnreachable``."""
    from svc.gateway.service import PdpClient, PdpRefused, PdpUnreachable

    who = {
        "principal": {"type": "ServiceAccount", "id": "copilot.assistant"},
        "on_behalf_of": {"type": "Human", "id": "ana"},
    }
    requests = [
        {**who, "action": "call", "resource": {"type": "Tool", "id": "docs/read_doc"}},
        {**who, "action": "read", "resource": {"type": "Document", "id": "plan"}},
    ]
    bad = {**who, "action": "read", "resource": {"type": "NoSuchType", "id": "x"}}

    async def run(nowhere: str) -> tuple[list[dict[str, Any]], BaseException, BaseException]:
        pdp = PdpClient(stack.pdp_url, lambda: None, 10.0)
        gone = PdpClient(nowhere, lambda: None, 2.0)
        try:
            got = await pdp.evaluate(requests)
            try:
                await pdp.evaluate([requests[0], bad])
            except PdpRefused as e:
                refused: BaseException = e
            try:
                await gone.evaluate(requests)
            except PdpUnreachable as e:
                unreachable: BaseException = e
        finally:
            await pdp.aclose()
            await gone.aclose()
        return got, refused, unreachable

    with tcp_listener("127.0.0.1", 0) as sock:  # bound, not listening: connections refused
        got, refused, unreachable = asyncio.run(run(f"http://127.0.0.1:{sock.getsockname()[1]}"))
    want = [
        httpx.post(f"{stack.pdp_url}/v1/access/evaluation", json=r, timeout=10).json()
        for r in requests
    ]

    def view(ds: list[dict[str, Any]]) -> list[tuple[str, list[str], str]]:
        return [(d["verdict"], d["policies"], d["mode"]) for d in ds]

    assert view(got) == view(want)
    assert [d["verdict"] for d in got] == ["allow", "allow"], got
    assert all(d["qid"] for d in got) and got[0]["qid"] != want[0]["qid"]
    assert isinstance(refused, PdpRefused) and refused.status == 400
    assert "NoSuchType" in json.dumps(refused.body)
    assert isinstance(unreachable, PdpUnreachable)


def test_tiers_from_the_policy_service_and_containments_from_a_file(stack: Stack) -> None:
    policy_settings = PolicySettings(
        port=0, data_dir=stack.tmp / "policy", database_url=f"sqlite:///{stack.tmp / 'p.db'}"
    )
    policy = PolicyServer(policy_settings, PolicyService(policy_settings)).start()
    channel = grpc.insecure_channel(policy.target)
    stub = ppb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
    stub.SetOutageFallback(
        ppb.SetOutageFallbackRequest(
            tool="docs/ping", tier=ppb.OUTAGE_TIER_FAIL_OPEN, author="secops", reason="harmless"
        )
    )
    contained = stack.tmp / "contained.json"
    contained.write_text("[]")
    with tcp_listener("127.0.0.1", 0) as sock:  # no decision point listens there
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gw = GatewayServer(
        stack.settings(
            pdp_url=nowhere,
            policy_url=policy.url,
            fallback_refresh_secs=0.2,
            containments_file=str(contained),
        )
    ).start()
    token = stack.billing.mint("billing.bot", AUD)

    async def calls() -> list[Any]:
        async with agent_session(f"{gw.url}/mcp/docs", token) as s:
            return [
                await s.call_tool("ping", {}),
                await s.call_tool("read_doc", {"doc_id": "plan"}),
            ]

    try:
        wait_until(lambda: ready(gw.url))
        ping, read = asyncio.run(calls())
        assert ping.content[0].text == "pong"
        assert read.meta == {"svc/verdict": "unavailable"}
        contained.write_text(json.dumps([{"type": "ServiceAccount", "id": "billing.bot"}]))
        wait_until(lambda: asyncio.run(calls())[0].meta == {"svc/verdict": "unavailable"})
        stub.SetOutageFallback(
            ppb.SetOutageFallbackRequest(
                tool="docs/*", tier=ppb.OUTAGE_TIER_FAIL_OPEN, author="secops", reason="all"
            )
        )
        contained.write_text("[]")
        wait_until(lambda: [r.is_error for r in asyncio.run(calls())] == [False, False])
    finally:
        gw.stop()
        channel.close()
        policy.stop()


def test_unknown_upstreams_and_routes(stack: Stack) -> None:
    # The agent token comes before the path and the body, an unknown upstream's too (issue 43):
    # a deep or oversized body without a valid token is 401, never 400 or 413.
    for body in (b"[" * 10_000 + b"]" * 10_000, b"[" * (1 << 20)):
        for headers in ({}, {"authorization": "Bearer not-a-jwt"}):
            r = httpx.post(
                f"{stack.gateway.url}/mcp/nope",
                content=body,
                headers={"content-type": "application/json", **headers},
                timeout=30,
            )
            assert r.status_code == 401, (headers, r.status_code, r.text[:200])
            assert r.headers["www-authenticate"].startswith("Bearer")
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    auth = {"authorization": f"Bearer {token}"}
    r = httpx.post(f"{stack.gateway.url}/mcp/nope", json={}, headers=auth, timeout=30)
    assert r.status_code == 404
    assert r.json()["type"] == "urn:svc:problem:not-found"
    v = httpx.get(f"{stack.gateway.url}/version", timeout=30).json()
    assert v["component"] == "svc-gateway"


def test_a_host_or_origin_not_the_gateways_is_refused(stack: Stack) -> None:
    """DNS rebinding protection (docs/gateway.md#dns-rebinding-protection): before the token."""
    token = stack.copilot.mint("ana", AUD, act="copilot.assistant")
    port = stack.gateway.url.rsplit(":", 1)[1]
    refused = {
        "evil host": ({"host": "evil.example.com"}, 421, "misdirected-request"),
        "evil origin": ({"origin": "http://evil.example.com"}, 403, "origin-not-allowed"),
        "loopback, another port": ({"origin": "http://localhost:1"}, 403, "origin-not-allowed"),
    }
    for name, (headers, status, slug) in refused.items():
        for r in (
            httpx.post(stack.mcp, json={}, headers={**headers, "authorization": f"Bearer {token}"}),
            httpx.get(f"{stack.gateway.url}/mcp/challenges/x?wait=0", headers=headers),
        ):
            assert r.status_code == status, (name, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            body = r.json()
            assert body["type"] == f"urn:svc:problem:{slug}", body
            assert body["status"] == status
            assert "evil.example.com" in body["detail"] or "localhost:1" in body["detail"]
    # The gateway's own names pass the check (and then need a token).
    for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
        r = httpx.post(stack.mcp, json={}, headers={"host": host, "origin": f"http://{host}"})
        assert r.status_code == 401, (host, r.text)
    # Listed names pass too; the probes are never checked.
    gw = GatewayServer(
        stack.settings(
            allowed_hosts=["mcp.example.com:*"], allowed_origins=["https://app.example.com"]
        )
    ).start()
    try:
        ok = {"host": "mcp.example.com:443", "origin": "https://app.example.com"}
        assert httpx.post(f"{gw.url}/mcp/docs", json={}, headers=ok).status_code == 401
        assert httpx.get(f"{gw.url}/version", headers={"host": "evil.example.com"}).is_success
    finally:
        gw.stop()


def test_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="exactly one of `url`"):
        GatewaySettings(upstreams={"a": {"url": "http://x/mcp", "command": ["x"]}})
    with pytest.raises(ValidationError, match="upstream name"):
        GatewaySettings(upstreams={"Bad/Name": {"url": "http://x/mcp"}})
    with pytest.raises(ValidationError, match="upstream name"):
        GatewaySettings(upstreams={"challenges": {"url": "http://x/mcp"}})
    with pytest.raises(ValidationError, match="given together"):
        GatewaySettings(
            upstreams={"a": {"url": "http://x/mcp", "tools": {"t": {"resource_arg": "id"}}}}
        )
    with pytest.raises(ValidationError, match="http:// or https://"):
        GatewaySettings(upstreams={"a": {"url": "ftp://x/mcp"}})
    s = GatewaySettings(upstreams={"a": {"url": "http://x/mcp", "tools": TOOLS}})
    assert s.upstreams["a"].tools["read_doc"].action == "read"
    assert s.upstreams["a"].tools["write_doc"].action == "write"
    assert GatewayService(s).tiers.tier("a/read_doc") == "fail_closed"
