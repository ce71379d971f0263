"""The MCP gateway's added time: a tool call through ``svc gateway`` against the same call made
directly to the upstream, in the same run (docs/benchmarks.md#mcp-gateway).

Processes, each its own: the upstream (the demo company's tools server,
``python -m svc.demo.tools_server --http``), a decision point (``svc pdp --bundle DIR`` on the
demo company's bundle) and the gateway (``svc gateway``, the upstream by URL, the demo apps
trusted from a file, their JWK Sets served over HTTPS by ``svc.demo.token_issuer`` in this
process). The client is the ``mcp`` SDK's ``ClientSession`` over Streamable HTTP, one per
path, opened before timing, in each protocol era (docs/gateway.md#protocol-revisions): the
handshake era (``initialize``, an MCP session, ``2025-11-25``) and the 2026-07-28 revision
(``server/discover``, then one stateless POST per call with the ``_meta`` envelope and the
``Mcp-Method``/``Mcp-Name`` headers). The gateway speaks 2026-07-28 to the upstream, the newest
revision it offers, whichever era the agent speaks.

With ``--peer REV``, a second gateway runs the code of commit ``REV`` (the previous design: its
``python/`` tree from ``git archive``, with the generated files git ignores, the gRPC stubs and
the decision point's extension, taken from this tree) beside the current one, against the same
upstream and decision point, and its paths take turns with the others in part 1 (in the eras of
``--peer-eras``): the two designs compared at the same moment on a shared machine.

1. **Latency at a steady rate**: ``--calls`` calls per path of ``read_document``
   (``copilot.assistant`` for ``alan.hughes`` on ``doc-0317``: the gateway checks ``call`` on
   the tool and ``read`` on the document, both allowed, then forwards), the four paths (each
   era direct and through the gateway) taking turns, one call at a time, started every
   ``1/--rate`` s. Printed per era: p50, p90, p99 of each path and the added time (through
   minus direct) at each.
2. **Calls per second**: per era, ``--concurrency`` clients call directly, then through the
   gateway, as fast as answered for ``--seconds``; printed: calls/s, the gateway process's CPU
   seconds over that time (``/proc/<pid>/stat``), and calls per CPU-second of the gateway
   (what one core does; the gateway is one asyncio process).

    .venv/bin/python benches/bench_gateway.py                    # about 130 s
    .venv/bin/python benches/bench_gateway.py --calls 200 --seconds 3   # a smoke run
    .venv/bin/python benches/bench_gateway.py --peer 52c32b0           # beside that commit
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from mcp.client import ClientSession
from mcp.client.streamable_http import streamable_http_client

from _support import ServiceProcess, free_port, pct
from svc.demo.company import generate, write_bundle
from svc.demo.token_issuer import DevTokenIssuer
from svc.demo.tools_server import TOOLS

AGENT, PERSON, TOOL, ARGS = "copilot.assistant", "alan.hughes", "read_document", "doc-0317"


#: The protocol eras an agent may speak: the handshake era and the 2026-07-28 revision.
ERAS = ("2025-11-25", "2026-07-28")


@asynccontextmanager
async def session(url: str, token: str | None, era: str) -> AsyncIterator[ClientSession]:
    """An MCP client session to `url` in `era`, with a bearer token when given.

    The handshake era: ``initialize``; 2026-07-28: ``server/discover`` (the SDK's ``Client`` in
    mode ``auto`` does the same against a server of the revision).
    """
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
        streamable_http_client(url, http_client=http) as (r, w),
        ClientSession(r, w) as s,
    ):
        if era == ERAS[0]:
            await s.initialize()
        else:
            await s.discover()
        if s.protocol_version != era:
            raise RuntimeError(f"{url} speaks {s.protocol_version}, not {era}")
        yield s


async def one_call(s: ClientSession) -> float:
    """One ``read_document`` call; returns its time in ms. Raises when it was blocked."""
    t0 = time.perf_counter()
    r = await s.call_tool(TOOL, {"document_id": ARGS})
    ms = (time.perf_counter() - t0) * 1000
    if r.is_error:
        raise RuntimeError(f"the call failed: {r.meta} {r.content}")
    return ms


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def steady(
    paths: dict[str, list[tuple[str, str, str | None]]], calls: int, rate: float
) -> dict[tuple[str, str], list[float]]:
    """Part 1 (module docs): the latencies in ms of each path, by ``(era, path)``.

    `paths` gives each era's paths as ``(name, url, bearer token or None)``.
    """
    out: dict[tuple[str, str], list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        sessions: list[tuple[tuple[str, str], ClientSession]] = []
        for era, era_paths in paths.items():
            for path, url, tok in era_paths:
                s = await stack.enter_async_context(session(url, tok, era))
                sessions.append(((era, path), s))
                out[(era, path)] = []
        for _, s in sessions:  # warm every path: connections, the gateway's JWKS and checks
            for _ in range(50):
                await one_call(s)
        start = time.perf_counter()
        for i in range(len(sessions) * calls):
            due = start + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            key, s = sessions[i % len(sessions)]
            out[key].append(await one_call(s))
    return out


async def saturate(url: str, token: str | None, era: str, concurrency: int, seconds: float) -> int:
    """Part 2 (module docs): calls to `url` in `era` completed in `seconds`."""
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        async with session(url, token, era) as s:
            await one_call(s)
            while time.perf_counter() < stop:
                await one_call(s)
                done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def peer_tree(rev: str, into: Path) -> Path:
    """The ``python/`` tree of commit `rev` under `into`, runnable with this tree's build outputs.

    ``git archive`` gives the commit's files; the files git ignores under ``python/`` (the gRPC
    stubs ``make proto`` generates, the decision point's extension) are copied from this tree,
    which fits a commit whose protos and extension match this tree's.

    Raises:
        subprocess.CalledProcessError: `rev` is not a commit of this repository.

    """
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "archive", rev, "python"], cwd=repo, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    built = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "python"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in built:
        target = into / name
        if "__pycache__" not in name and target.parent.is_dir() and not target.exists():
            shutil.copy2(repo / name, target)
    return into / "python"


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Waits until 127.0.0.1:`port` accepts connections; raises when `proc` exits first."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the upstream exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)


def print_waits(metrics: str) -> None:
    """Prints where part 1's calls through the gateway waited, from its histograms' means.

    ``svc_gateway_check_seconds`` (the checks at the decision point) and
    ``svc_gateway_upstream_seconds`` (forwarded until the upstream's first message back), both
    eras together: what is left of the added time is the gateway's own work and the extra hop.
    """
    sums: dict[str, float] = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{", 1)[0]
        if base.endswith(("_sum", "_count")):
            sums[base] = sums.get(base, 0.0) + float(value)
    for name, what in (
        ("svc_gateway_check_seconds", "the checks at the decision point"),
        ("svc_gateway_upstream_seconds", "the upstream's answer"),
    ):
        if sums.get(f"{name}_count"):
            mean = 1000 * sums[f"{name}_sum"] / sums[f"{name}_count"]
            print(f"part 1 through the gateway, mean wait for {what}: {mean:.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per path at the steady rate")
    p.add_argument("--rate", type=float, default=100.0, help="calls per second, both paths")
    p.add_argument("--concurrency", type=int, default=8, help="sessions in part 2")
    p.add_argument("--seconds", type=float, default=10.0, help="length of part 2")
    p.add_argument("--peer", metavar="REV", help="also run the gateway of this commit (part 1)")
    p.add_argument(
        "--peer-eras",
        default=ERAS[0],
        help="the eras the peer serves, comma-separated (default: the handshake era only)",
    )
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    company = generate()
    write_bundle(company, tmp / "bundle")
    issuer = DevTokenIssuer(tmp / "issuer").start()
    (tmp / "apps.json").write_text(json.dumps(issuer.trusted_apps()))
    (tmp / "containments.json").write_text("[]")
    up_port, pdp_port, gw_port = free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{up_port}/mcp"
    tools = {
        n: {"resource_arg": t.argument, "resource_type": t.type, "read_only": t.read_only}
        for n, t in TOOLS.items()
        if t.argument is not None
    }
    (tmp / "upstreams.json").write_text(json.dumps({"demo": {"url": upstream_url, "tools": tools}}))
    upstream = subprocess.Popen(
        [sys.executable, "-m", "svc.demo.tools_server", "--http", "--port", str(up_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs: list[ServiceProcess] = []
    try:
        wait_port(up_port, upstream)
        procs.append(
            ServiceProcess(
                ["pdp", "--bundle", str(tmp / "bundle"), "--port", str(pdp_port)], pdp_port
            )
        )

        def gateway_args(port: int) -> list[str]:
            return [
                "gateway",
                "--port", str(port),
                "--upstreams-file", str(tmp / "upstreams.json"),
                "--pdp-url", f"http://127.0.0.1:{pdp_port}",
                "--trusted-apps-file", str(tmp / "apps.json"),
                "--jwks-ca-file", str(issuer.ca_file),
                "--containments-file", str(tmp / "containments.json"),
            ]  # fmt: skip

        gateway = ServiceProcess(gateway_args(gw_port), gw_port)
        procs.append(gateway)
        token = issuer.mint(AGENT, PERSON, lifetime_secs=3600)
        through = f"http://127.0.0.1:{gw_port}/mcp/demo"
        paths: dict[str, list[tuple[str, str, str | None]]] = {
            era: [("direct", upstream_url, None), ("gateway", through, token)] for era in ERAS
        }
        if a.peer:
            peer_port = free_port()
            peer_python = peer_tree(a.peer, Path(tempfile.mkdtemp(prefix="bench-gateway-peer-")))
            procs.append(
                ServiceProcess(
                    gateway_args(peer_port), peer_port, env={"PYTHONPATH": str(peer_python)}
                )
            )
            for era in a.peer_eras.split(","):
                paths[era].append(("peer", f"http://127.0.0.1:{peer_port}/mcp/demo", token))

        lat = asyncio.run(steady(paths, a.calls, a.rate))
        count = sum(len(p) for p in paths.values())
        print(
            f"steady rate: {a.calls} calls per path at {a.rate:g} calls/s in all, "
            f"the {count} paths taking turns" + (f" (peer: commit {a.peer})" if a.peer else "")
        )
        print(f"{'':22} {'p50':>9} {'p90':>9} {'p99':>9}  (ms)")
        for era, era_paths in paths.items():
            for path, _, _ in era_paths:
                qs = [pct(lat[(era, path)], q) for q in (0.5, 0.9, 0.99)]
                print(f"{era} {path:11} " + " ".join(f"{v:9.3f}" for v in qs))
            for path, label in (("gateway", "added"), ("peer", "peer added")):
                if (era, path) in lat:
                    added = [
                        pct(lat[(era, path)], q) - pct(lat[(era, "direct")], q)
                        for q in (0.5, 0.9, 0.99)
                    ]
                    print(f"{era} {label:11} " + " ".join(f"{v:9.3f}" for v in added))
        print_waits(httpx2.get(f"http://127.0.0.1:{gw_port}/metrics", timeout=10).text)

        for era in ERAS:
            t0 = time.perf_counter()
            done = asyncio.run(saturate(upstream_url, None, era, a.concurrency, a.seconds))
            wall = time.perf_counter() - t0
            print(
                f"{era} saturated, direct: {a.concurrency} clients, {done} calls in "
                f"{wall:.1f} s = {done / wall:,.0f} calls/s"
            )
            cpu0, t0 = cpu_seconds(gateway.pid), time.perf_counter()
            done = asyncio.run(saturate(through, token, era, a.concurrency, a.seconds))
            cpu, wall = cpu_seconds(gateway.pid) - cpu0, time.perf_counter() - t0
            print(
                f"{era} saturated, through the gateway: {a.concurrency} clients, {done} calls "
                f"in {wall:.1f} s = {done / wall:,.0f} calls/s; gateway CPU {cpu:.1f} s "
                f"({100 * cpu / wall:.0f} % of a core) = {done / cpu:,.0f} calls per gateway "
                "CPU-second"
            )
        # Which path the calls took, and the revision each agent spoke, as an operator sees it.
        metrics = httpx2.get(f"http://127.0.0.1:{gw_port}/metrics", timeout=10).text
        for line in metrics.splitlines():
            if line.startswith(
                ("svc_gateway_fast_path_calls_total", "svc_gateway_agent_requests_total")
            ):
                print(line)
    finally:
        for proc in reversed(procs):
            proc.stop()
        upstream.terminate()
        upstream.wait()
        issuer.stop()


if __name__ == "__main__":
    main()
