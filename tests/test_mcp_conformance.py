"""The MCP conformance suite (npm ``@modelcontextprotocol/conformance``, on Node 22 from the npm
registry: scripts/dev-node.sh) against an upstream MCP server directly, and through
``svc gateway`` with a permissive policy: the gateway passes every scenario the upstream passes
(docs/gateway.md).

The suite tests a server by connecting to its Streamable HTTP URL as a client and running each
server scenario (``conformance list``); the upstream is tests/conformance_server.py, written
from the scenarios' descriptions. Results are read from the suite's ``checks.json`` files.
Directly, every active scenario passes (``DIRECT_FAILURES`` is empty). Through the gateway the
suite talks to a small reverse proxy that adds the agent's bearer token (the suite sends none;
``conformance_server.bearer_proxy``; its address is the gateway's ``allowed_hosts``); what
fails there is ``GATEWAY_GAPS``, with why.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from mcpkit import free_port, python, serving, wait_ready

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().parent / "conformance_server.py"

#: Scenarios that fail against the upstream directly, with why. None today: the server
#: provides every tool, resource and prompt the active scenarios call for.
DIRECT_FAILURES: dict[str, str] = {}

#: Scenarios that pass directly but fail through the gateway today, with why: the known gaps of
#: ``svc gateway``'s pass-through (docs/gateway.md), kept as the suite's own "expected
#: failures" baseline is kept: a scenario that starts passing through the gateway fails this
#: test until its entry is removed, and a new failure fails it too. None today: DNS rebinding
#: protection, progress, logging, sampling, elicitation and subscriptions pass through
#: (docs/gateway.md#relaying).
GATEWAY_GAPS: dict[str, str] = {}

#: The fewest scenarios a run has (the suite's active server scenarios, 0.1.16: 30).
MIN_SCENARIOS = 30


#: The 2026-07-28 revision's scenarios: the suite's prerelease (scripts/dev-node.sh
#: ``conformance-next``, 0.2.0-alpha.12), run as ``--requirements 2026-07-28`` (exactly the
#: scenarios the revision requires, and the extensions' and pending ones it runs beside them).
#: Directly, the upstream (tests/conformance_server.py, both eras) passes all but the tasks
#: extension's (not served) and the pending header scenarios the SDK does not pass yet; every
#: one it passes passes through the gateway (``server-stateless``, the input-required rounds,
#: caching, the agent's capabilities), but for ``GATEWAY_GAPS_2026``.
NEXT_ARGS = ("--requirements", "2026-07-28")
#: Scenarios of the 2026-07-28 run that pass directly but fail through the gateway, with why.
GATEWAY_GAPS_2026: dict[str, str] = {}
#: The fewest scenarios a 2026-07-28 run has (0.2.0-alpha.12: 49).
MIN_SCENARIOS_2026 = 40


def suite(which: str = "conformance") -> tuple[str, str]:
    """(node, the suite's entry point), installed by scripts/dev-node.sh when missing.

    `which`: ``conformance`` (the release) or ``conformance-next`` (the prerelease with the
    2026-07-28 scenarios).
    """
    script = str(ROOT / "scripts" / "dev-node.sh")
    subprocess.run([script, "install"], check=True, capture_output=True, text=True)
    node = subprocess.run([script, "node"], check=True, capture_output=True, text=True)
    entry = subprocess.run([script, which], check=True, capture_output=True, text=True)
    return node.stdout.strip(), entry.stdout.strip()


def run_suite(
    url: str,
    out: Path,
    which: str = "conformance",
    args: tuple[str, ...] = (),
    least: int = MIN_SCENARIOS,
) -> dict[str, list[str]]:
    """Runs the server scenarios against `url` (every active one, or as `args` select).

    Returns scenario -> the messages of its failed checks (empty when it passed). The suite
    writes one ``server-<scenario>-<time>/checks.json`` per scenario under `out`; fewer than
    `least` scenarios fail the test.
    """
    node, entry = suite(which)
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [node, entry, "server", "--url", url, "-o", str(out), *args],
        cwd=out,
        capture_output=True,
        text=True,
    )
    results: dict[str, list[str]] = {}
    for checks in sorted(out.glob("server-*/checks.json")):
        scenario = checks.parent.name.removeprefix("server-").rsplit("-", 6)[0]
        failed = [
            f"{c['id']}: {c.get('errorMessage', '')}"
            for c in json.loads(checks.read_text())
            if c["status"] == "FAILURE"
        ]
        results[scenario] = failed
    assert len(results) >= least, (done.returncode, done.stdout[-3000:], done.stderr)
    return results


def test_upstream_directly(tmp_path: Path) -> None:
    port = free_port()
    with serving(python(str(SERVER), str(port), "legacy"), port) as base:
        results = run_suite(f"{base}/mcp", tmp_path / "direct")
    failed = {s: why for s, why in results.items() if why}
    assert set(failed) == set(DIRECT_FAILURES), failed
    assert "tools-call-simple-text" in results
    assert "dns-rebinding-protection" in results


#: The suite's agent (a registered service account) and the person it acts for.
AGENT, PERSON = "copilot.assistant", "ana"

#: A bundle that allows everything: the gateway's checks pass every call, so what the suite
#: sees is what the gateway passes through (docs/gateway.md#checks: `Tool` and `call` declared).
PERMISSIVE_SCHEMA = """
entity Group in [Group];
entity WorkItem;
entity Human in [Group];
entity ServiceAccount in [Group];
entity Tool;
type DecisionContext = {
  risk_score?: Long, human_present?: Bool, agent?: ServiceAccount, work_item?: WorkItem,
  assigned?: Bool,
};
action call appliesTo {
  principal: [Human, ServiceAccount], resource: [Tool], context: DecisionContext,
};
"""
PERMISSIVE_POLICY = '@id("everything")\npermit (principal, action, resource);\n'


def _direct_and_through(
    tmp_path: Path, which: str, args: tuple[str, ...], least: int, era: str
) -> tuple[dict[str, list[str]], dict[str, list[str]], str]:
    """The suite run directly against the upstream and through ``svc gateway`` (a permissive
    policy, a real decision point, agent tokens of a trusted app over HTTPS).

    `era`: what the upstream serves (``both``, or ``legacy``: the handshake era only, so the
    gateway speaks that era to it too).

    Returns:
        ``(direct, through, metrics)``: each run's results (``run_suite``) and the gateway's
        ``/metrics`` after it.

    """
    from svc.demo.token_issuer import DevTokenIssuer
    from svc.gateway.app import GatewayServer
    from svc.gateway.settings import GatewaySettings, Upstream
    from svc.pdp import Engine, Server

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "schema.cedarschema").write_text(PERMISSIVE_SCHEMA)
    (bundle / "policies.cedar").write_text(PERMISSIVE_POLICY)
    engine = Engine.from_bundle_dir(bundle)
    # The suite's agent is a registered service account: an unregistered one is denied
    # everything (`svc:unregistered`), and a denial's text would pass the text-only scenarios.
    engine.register_service_accounts(
        [{"id": AGENT, "owner": PERSON, "ai": True, "groups": [], "description": "the suite"}]
    )
    pdp = Server(engine, port=0)
    pdp_port = pdp.start()
    pdp.set_ready(bundle=True, containments=True)
    issuer = DevTokenIssuer(tmp_path / "issuer").start()
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps(issuer.trusted_apps()))
    containments = tmp_path / "containments.json"
    containments.write_text("[]")
    token = tmp_path / "agent.token"
    token.write_text(issuer.mint(AGENT, PERSON, human_present=True))
    upstream_port, proxy_port = free_port(), free_port()
    try:
        upstream_argv = python(str(SERVER), str(upstream_port), era)
        with serving(upstream_argv, upstream_port) as upstream:
            direct = run_suite(f"{upstream}/mcp", tmp_path / "direct", which, args, least)
            gateway = GatewayServer(
                GatewaySettings(
                    port=0,
                    upstreams={"conformance": Upstream(url=f"{upstream}/mcp")},
                    pdp_url=f"http://127.0.0.1:{pdp_port}",
                    trusted_apps_file=str(apps),
                    jwks_ca_file=str(issuer.ca_file),
                    containments_file=str(containments),
                    # The suite reaches the gateway through the bearer proxy, which passes the
                    # Host and Origin it was sent: the proxy's address is the gateway's name.
                    allowed_hosts=[f"127.0.0.1:{proxy_port}"],
                    allowed_origins=[f"http://127.0.0.1:{proxy_port}"],
                )
            ).start()
            try:
                wait_ready(gateway.url)
                proxy = python(
                    str(SERVER), "proxy", str(proxy_port), gateway.url, str(token)
                )  # fmt: skip
                with serving(proxy, proxy_port) as base:
                    through = run_suite(
                        f"{base}/mcp/conformance", tmp_path / "gateway", which, args, least
                    )
                metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
            finally:
                gateway.stop()
    finally:
        issuer.stop()
        pdp.stop(grace_secs=2)
    return direct, through, metrics


def _compare(
    direct: dict[str, list[str]],
    through: dict[str, list[str]],
    metrics: str,
    gaps: dict[str, str],
) -> None:
    """Every scenario that passes directly passes through the gateway, but for `gaps` (which
    must still fail), and every tool call through it was checked and forwarded."""
    # Every tool call was checked and forwarded: none blocked.
    calls = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("svc_gateway_tool_calls_total{")
    }
    forwarded = sum(n for labels, n in calls.items() if '"forwarded"' in labels)
    assert forwarded > 0 and forwarded == sum(calls.values()), calls
    passed_directly = {s for s, why in direct.items() if not why}
    failed_through = {
        s: through.get(s, ["not run"]) for s in passed_directly if through.get(s) != []
    }
    unexpected = {s: why for s, why in failed_through.items() if s not in gaps}
    assert unexpected == {}, "\n".join(f"{s}: {why}" for s, why in unexpected.items())
    fixed = set(gaps) - set(failed_through)
    assert fixed == set(), f"passing through the gateway now, remove from the gaps: {fixed}"
    assert set(through) == set(direct)


def test_through_the_gateway_passes_what_the_upstream_passes(tmp_path: Path) -> None:
    """The suite's release (the handshake era's scenarios) through ``svc gateway`` passes
    every scenario it passes directly, but for the gateway's known gaps (``GATEWAY_GAPS``).

    The upstream serves the handshake era only, so the gateway speaks it end to end: an
    upstream that offers 2026-07-28 is spoken to in that revision (docs/gateway.md#protocol-
    revisions), where a tool cannot ask the client during the call nor a client subscribe, as
    the revision has it.
    """
    direct, through, metrics = _direct_and_through(
        tmp_path, "conformance", (), MIN_SCENARIOS, "legacy"
    )
    _compare(direct, through, metrics, GATEWAY_GAPS)


def test_the_2026_07_28_scenarios_through_the_gateway(tmp_path: Path) -> None:
    """The suite's 2026-07-28 scenarios (``NEXT_ARGS``) through ``svc gateway`` pass wherever
    they pass directly, but for ``GATEWAY_GAPS_2026`` (docs/gateway.md#protocol-revisions)."""
    direct, through, metrics = _direct_and_through(
        tmp_path, "conformance-next", NEXT_ARGS, MIN_SCENARIOS_2026, "both"
    )
    passed = {s for s, why in direct.items() if not why}
    assert {"server-stateless", "caching", "tools-call-simple-text"} & passed, direct
    _compare(direct, through, metrics, GATEWAY_GAPS_2026)
