"""The gateway's check transport: gRPC ``Check`` against HTTP evaluation (docs/gateway.md).

The gateway checks each tool call twice (``call`` on the tool, ``read``/``write`` on the
resource), from asyncio. This measures one check from an asyncio client against a real
``svc pdp`` process, over the two transports the decision point serves on one port:

* ``grpc``: ``svc.authz.v1.Authorizer/Check`` over one ``grpc.aio`` channel (the transport
  ``svc.gateway.service.PdpClient`` used until it sent each check as an HTTP evaluation over
  ``aiohttp``, which is quicker than both: docs/gateway.md#checks);
* ``http``: ``POST /v1/access/evaluation`` over one keep-alive ``httpx.AsyncClient``.

Each transport runs ``--calls`` sequential checks after a warm-up, twice, interleaved; reported:
p50 and p99 per run.

Then a tool call's pair of checks (``call`` on the tool, ``read`` on the document), the ways the
gateway could send them:

* ``pair-gather``: two ``Check`` calls at once (``asyncio.gather``) on the channel;
* ``pair-batch``: one ``BatchCheck`` carrying both (what ``PdpClient.evaluate`` sent);
* ``pair-aiohttp``: two ``POST /v1/access/evaluation`` at once over one ``aiohttp`` session
  (what ``PdpClient.evaluate`` sends now);

each back to back and with ``--gap`` ms idle before every pair (the gateway between calls at a
modest rate: the processes sleep, and waking them is part of the time).

Run: ``.venv/bin/python benches/bench_gateway_check.py`` (about a minute).
Benches report; they do not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import httpx

from _support import ServiceProcess, free_port, pct
from svc.authz.v1 import authz_pb2, authz_pb2_grpc

SCHEMA = """
entity Human;
entity ServiceAccount = { registered: Bool };
entity Document;
entity Tool;
action read appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
action call appliesTo { principal: [Human, ServiceAccount], resource: [Tool] };
"""
POLICIES = (
    '@id("read")\npermit (principal, action == Action::"read", resource is Document);\n'
    '@id("call")\npermit (principal, action == Action::"call", resource is Tool);\n'
)
AGENT = {"type": "ServiceAccount", "id": "copilot.assistant"}
PERSON = {"type": "Human", "id": "ana"}
REQUEST = {
    "principal": AGENT,
    "on_behalf_of": PERSON,
    "action": "read",
    "resource": {"type": "Document", "id": "plan"},
}


#: The tool of a call's first check (``call`` on it).
TOOL = {"type": "Tool", "id": "docs/read"}


def bundle(path: Path) -> Path:
    """A one-policy bundle with the agent registered."""
    path.mkdir()
    (path / "schema.cedarschema").write_text(SCHEMA)
    (path / "policies.cedar").write_text(POLICIES)
    entities = [{"uid": AGENT, "attrs": {"registered": True}, "parents": []}]
    (path / "entities.json").write_text(json.dumps(entities))
    return path


async def timed(call: Callable[[], Awaitable[object]], calls: int) -> list[float]:
    """Seconds of each of `calls` sequential calls, after 200 for warm-up."""
    for _ in range(200):
        await call()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
    return out


async def over_grpc(port: int, calls: int) -> list[float]:
    """Checks over one ``grpc.aio`` channel."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = authz_pb2_grpc.AuthorizerStub(channel)  # type: ignore[no-untyped-call]
        msg = authz_pb2.CheckRequest(
            principal=authz_pb2.EntityRef(**AGENT),
            on_behalf_of=authz_pb2.EntityRef(**PERSON),
            action="read",
            resource=authz_pb2.EntityRef(type="Document", id="plan"),
        )
        return await timed(lambda: stub.Check(msg, timeout=10), calls)


def _messages() -> tuple[authz_pb2.CheckRequest, authz_pb2.CheckRequest]:
    """A tool call's two checks: ``call`` on the tool, ``read`` on the document."""
    who = {"principal": authz_pb2.EntityRef(**AGENT), "on_behalf_of": authz_pb2.EntityRef(**PERSON)}
    tool = authz_pb2.CheckRequest(
        **who, action="call", resource=authz_pb2.EntityRef(type="Tool", id="docs/read")
    )
    doc = authz_pb2.CheckRequest(
        **who, action="read", resource=authz_pb2.EntityRef(type="Document", id="plan")
    )
    return tool, doc


async def pairs(port: int, calls: int, gap_ms: float) -> dict[str, list[float]]:
    """Each way of sending a pair, interleaved, `gap_ms` idle before each pair."""
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session,
    ):
        stub = authz_pb2_grpc.AuthorizerStub(channel)  # type: ignore[no-untyped-call]
        tool, doc = _messages()
        batch = authz_pb2.BatchCheckRequest(checks=[tool, doc])

        async def gather() -> object:
            return await asyncio.gather(stub.Check(tool, timeout=10), stub.Check(doc, timeout=10))

        async def batched() -> object:
            return await stub.BatchCheck(batch, timeout=10)

        bodies = [
            json.dumps(
                {**REQUEST, "action": "call", "resource": {"type": "Tool", "id": "docs/read"}}
            ),
            json.dumps(REQUEST),
        ]

        async def one(body: str) -> bytes:
            headers = {"content-type": "application/json"}
            async with session.post("/v1/access/evaluation", data=body, headers=headers) as r:
                return await r.read()

        async def over_aiohttp() -> object:
            return await asyncio.gather(*(one(b) for b in bodies))

        ways: dict[str, Callable[[], Awaitable[object]]] = {
            "pair-gather": gather,
            "pair-batch": batched,
            "pair-aiohttp": over_aiohttp,
        }
        out: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(200):
            for way in ways.values():
                await way()
        for _ in range(calls):
            for name, way in ways.items():
                if gap_ms:
                    await asyncio.sleep(gap_ms / 1000)
                t = time.perf_counter()
                await way()
                out[name].append(time.perf_counter() - t)
        return out


async def over_http(port: int, calls: int) -> list[float]:
    """Checks over one keep-alive ``httpx.AsyncClient``."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        return await timed(lambda: client.post("/v1/access/evaluation", json=REQUEST), calls)


def main() -> None:
    """Runs the measurement (module docs) and prints one line per run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--gap", type=float, default=10.0, help="ms idle before each pair")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        pdp = ServiceProcess(
            ["pdp", "--bundle", str(bundle(Path(tmp) / "b")), "--port", str(port), "--no-watch"],
            port,
        )
        try:
            for name, run in [("grpc", over_grpc), ("http", over_http)] * 2:
                ts = asyncio.run(run(port, args.calls))
                print(f"{name}: p50 {pct(ts, 0.5) * 1e6:.0f} us, p99 {pct(ts, 0.99) * 1e6:.0f} us")
            for gap in (0.0, args.gap):
                for name, ts in asyncio.run(pairs(port, args.calls, gap)).items():
                    print(
                        f"{name}, {gap:g} ms idle before: p50 {pct(ts, 0.5) * 1e6:.0f} us, "
                        f"p99 {pct(ts, 0.99) * 1e6:.0f} us"
                    )
        finally:
            pdp.stop()


if __name__ == "__main__":
    main()
