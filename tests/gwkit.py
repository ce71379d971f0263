"""Helpers of the gateway's tests (tests/test_gateway*.py): real parts on real sockets.

* ``Issuer``: an app's (or the identity provider's) signing key, RS256 or ES256, minting JWTs
  with pyjwt, and its JWK Set (RFC 7517).
* ``JwksServer``: the issuers' JWK Sets over HTTPS, with a test CA made by ``trustme``; the
  sets it serves can change while it runs (key rotation, a new app).
* ``UpstreamProcess``: tests/gwupstream.py as a child process serving Streamable HTTP.
* ``write_bundle``: a bundle with ``Tool`` and ``call``, documents read and written, agents.
* ``agent_session``: the ``mcp`` SDK's ``ClientSession`` over Streamable HTTP with a bearer
  token, as an agent opens it; ``agent_client``: its high-level ``Client`` in a given mode
  (``auto``, ``legacy``, ``2026-07-28``).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import trustme
from cryptography.hazmat.primitives.asymmetric import ec, rsa

TESTS = Path(__file__).resolve().parent
PYTHON = sys.executable

SCHEMA = """
entity Group in [Group];
entity WorkItem;
entity Human in [Group];
entity ServiceAccount in [Group] = { registered: Bool };
entity Tool;
entity Document;
type DecisionContext = {
  risk_score?: Long,
  human_present?: Bool,
  agent?: ServiceAccount,
  work_item?: WorkItem,
  assigned?: Bool,
};
action call appliesTo {
  principal: [Human, ServiceAccount], resource: [Tool], context: DecisionContext,
};
action read, write appliesTo {
  principal: [Human, ServiceAccount], resource: [Document], context: DecisionContext,
};
"""

POLICIES = """
@id("tools-for-everyone")
permit (principal, action == Action::"call", resource is Tool)
unless { resource == Tool::"docs/launch" };

@id("no-ping-for-blocked")
forbid (principal == ServiceAccount::"copilot.blocked", action == Action::"call",
        resource == Tool::"docs/ping");

@id("launch-needs-a-key") @challenge("verification")
permit (principal, action == Action::"call", resource == Tool::"docs/launch");

@id("read-documents")
permit (principal, action == Action::"read", resource is Document);

@id("secret-is-secret")
forbid (principal, action == Action::"read", resource == Document::"secret");

@id("writes-need-a-reason") @challenge("justification")
permit (principal, action == Action::"write", resource is Document);
"""

AGENTS = ["copilot.assistant", "copilot.blocked", "billing.bot"]


def write_bundle(path: Path) -> Path:
    """The tests' bundle directory (module docs) at `path`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "schema.cedarschema").write_text(SCHEMA)
    (path / "policies.cedar").write_text(POLICIES)
    entities = [
        {"uid": {"type": "ServiceAccount", "id": a}, "attrs": {"registered": True}, "parents": []}
        for a in AGENTS
    ]
    (path / "entities.json").write_text(json.dumps(entities))
    return path


class Issuer:
    """A signing key and the tokens it mints.

    Args:
        iss: the ``iss`` of its tokens.
        alg: ``RS256`` or ``ES256``.

    """

    def __init__(self, iss: str, alg: str = "ES256") -> None:
        self.iss = iss
        self.alg = alg
        self.kid = uuid.uuid4().hex[:12]
        if alg == "RS256":
            self.key: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())

    def jwk(self) -> dict[str, Any]:
        """The public key as a JWK with ``kid``, ``alg`` and ``use``."""
        algo = jwt.get_algorithm_by_name(self.alg)
        out: dict[str, Any] = json.loads(algo.to_jwk(self.key.public_key()))
        return {**out, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def mint(
        self,
        sub: str,
        aud: str,
        *,
        act: str | dict[str, Any] | None = None,
        lifetime: int = 300,
        headers: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token for `sub` (``act`` = `act`, or ``{"sub": act}`` for a string), valid `lifetime` s."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": self.iss,
            "sub": sub,
            "aud": aud,
            "iat": now,
            "exp": now + lifetime,
            "jti": uuid.uuid4().hex,
            **claims,
        }
        if act is not None:
            payload["act"] = {"sub": act} if isinstance(act, str) else act
        return jwt.encode(
            payload, self.key, algorithm=self.alg, headers={"kid": self.kid, **(headers or {})}
        )


class JwksServer:
    """JWK Sets over HTTPS (``https://localhost:<port>/<name>.json``) with a trustme CA.

    ``sets[name]`` is the list of JWKs served at ``/<name>.json``; change it at any time.
    ``fetches`` counts the requests per path.
    """

    def __init__(self, tmp: Path) -> None:
        self.ca = trustme.CA()
        cert = self.ca.issue_cert("localhost", "127.0.0.1")
        self.ca_file = tmp / "jwks-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.sets: dict[str, list[dict[str, Any]]] = {}
        self.fetches: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.strip("/").removesuffix(".json")
                outer.fetches[name] = outer.fetches.get(name, 0) + 1
                keys = outer.sets.get(name)
                body = json.dumps({"keys": keys}).encode() if keys is not None else b"{}"
                self.send_response(200 if keys is not None else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(ctx)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        """The https URL of the set `name`."""
        return f"https://localhost:{self.port}/{name}.json"

    def publish(self, name: str, *issuers: Issuer) -> str:
        """Serves the keys of `issuers` as the set `name`; returns its URL."""
        self.sets[name] = [i.jwk() for i in issuers]
        return self.url(name)

    def close(self) -> None:
        """Stops serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


class UpstreamProcess:
    """tests/gwupstream.py serving Streamable HTTP in a child process (on `port`; 0: a free one).

    `era`: ``both`` (the SDK's default), ``legacy`` or ``modern`` (tests/gwupstream.py).
    """

    def __init__(self, port: int = 0, era: str = "both") -> None:
        self.proc = subprocess.Popen(
            [PYTHON, str(TESTS / "gwupstream.py"), "http", str(port), era],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening on "), line
        self.port = int(line.split()[-1])
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        """Terminates the process and waits for it."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@contextlib.asynccontextmanager
async def agent_session(url: str, token: str | None, **callbacks: Any) -> AsyncIterator[Any]:
    """An initialized ``ClientSession`` to the gateway's ``url`` with ``Authorization: Bearer
    <token>`` on every request (`callbacks`: the session's, ``sampling_callback`` ...)."""
    import httpx2
    from mcp.client import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as hc,
        streamable_http_client(url, http_client=hc) as (r, w),
        ClientSession(r, w, **callbacks) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def agent_client(
    url: str, token: str | None, mode: str, **options: Any
) -> AsyncIterator[Any]:
    """The ``mcp`` SDK's high-level ``Client`` to the gateway's ``url`` in `mode` (``auto``:
    ``server/discover`` first, the 2026-07-28 revision when offered; ``legacy``: the initialize
    handshake; ``2026-07-28``: that revision without a probe), with ``Authorization: Bearer
    <token>`` on every request (`options`: the client's, ``sampling_callback`` ...)."""
    import httpx2
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as hc:
        transport = streamable_http_client(url, http_client=hc)
        async with Client(transport, mode=mode, **options) as client:
            yield client


def wait_until(pred: Any, timeout: float = 30.0, every: float = 0.05) -> Any:
    """Polls `pred` until it returns a truthy value (returned); fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(every)
