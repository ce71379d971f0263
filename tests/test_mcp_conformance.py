"""The MCP conformance suite (npm ``@modelcontextprotocol/conformance``, on Node 22 from the npm
registry: scripts/dev-node.sh) against an upstream MCP server directly, and through
``svc gateway`` with a permissive policy: the gateway passes every scenario the upstream passes
(docs/gateway.md).

The suite tests a server by connecting to its Streamable HTTP URL as a client and running each
server scenario (``conformance list``); the upstream is tests/conformance_server.py, written
from the scenarios' descriptions. Results are read from the suite's ``checks.json`` files.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mcpkit import free_port, python, serving

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().parent / "conformance_server.py"

#: Scenarios that fail against the upstream directly, with why. None today: the server
#: provides every tool, resource and prompt the active scenarios call for.
DIRECT_FAILURES: dict[str, str] = {}

#: The fewest scenarios a run has (the suite's active server scenarios, 0.1.16: 30).
MIN_SCENARIOS = 30


def suite() -> tuple[str, str]:
    """(node, the suite's entry point), installed by scripts/dev-node.sh when missing."""
    script = str(ROOT / "scripts" / "dev-node.sh")
    subprocess.run([script, "install"], check=True, capture_output=True, text=True)
    node = subprocess.run([script, "node"], check=True, capture_output=True, text=True)
    entry = subprocess.run([script, "conformance"], check=True, capture_output=True, text=True)
    return node.stdout.strip(), entry.stdout.strip()


def run_suite(url: str, out: Path) -> dict[str, list[str]]:
    """Runs every active server scenario against `url`.

    Returns scenario -> the messages of its failed checks (empty when it passed). The suite
    writes one ``server-<scenario>-<time>/checks.json`` per scenario under `out`.
    """
    node, entry = suite()
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [node, entry, "server", "--url", url, "-o", str(out)],
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
    assert len(results) >= MIN_SCENARIOS, (done.returncode, done.stdout[-3000:], done.stderr)
    return results


def test_upstream_directly(tmp_path: Path) -> None:
    port = free_port()
    with serving(python(str(SERVER), str(port)), port) as base:
        results = run_suite(f"{base}/mcp", tmp_path / "direct")
    failed = {s: why for s, why in results.items() if why}
    assert set(failed) == set(DIRECT_FAILURES), failed
    assert "tools-call-simple-text" in results
    assert "dns-rebinding-protection" in results
