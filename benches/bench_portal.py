"""The portal's decision search and GraphQL throughput (docs/benchmarks.md, "Portal").

    .venv/bin/python benches/bench_portal.py [--rows 1000000] [--searches 300] [--requests 2000]

Sets up, in this process: a chDB history holding `--rows` decisions (bench_history.py's
synthetic mix: 5,000 people and 500 agents over the last 7 days, stored with
``svc.history.store`` as the loader stores them) served by the history's own routes
(``svc.history.service``, uvicorn in a thread); ``svc pdp`` as a process over a bundle with
``PortalArea`` (tests/portalkit.py's) in which the bench's person is an auditor; and the
portal's service layer and app (uvicorn in a thread). Then measures:

* **the history's route alone** (``GET /v1/history/decisions`` of one principal, 51 rows), to
  tell the store's share from the portal's;
* **first page of a decision search** (``PortalService.decisions``: the portal's check at the
  decision point, then the history read), one random principal at a time, over the whole 7
  days: unfiltered, and filtered to ``verdict: deny`` (about 15% of rows, so the portal reads
  more rows per page); p50/p99 in ms;
* **an explanation** (``PortalService.explain``: the check and the history read by qid);
* **GraphQL requests per second** for a typical page's query (the decisions page: ``me`` and a
  50-row page of one principal's decisions) over HTTP with a session and its CSRF token,
  sequential (p50/p99) and from 4 client threads at once (requests/s).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _support import SVC, free_port, pct
from bench_history import NOW, decisions, encode
from svc import history
from svc.common.auth_settings import HistoryAuthSettings
from svc.common.net import tcp_listener
from svc.history.service import create_app as history_app
from svc.portal.app import create_app as portal_app
from svc.portal.clients import ContextClient, HistoryClient, PdpClient
from svc.portal.service import PortalService
from svc.portal.settings import PortalSettings

PERSON = "bench-auditor"
PAGE_QUERY = """
query($p: EntityRefInput!, $since: DateTime!) {
  me { user }
  decisions(principal: $p, since: $since, first: 50) {
    decisions { qid at verdict action policies resource { type id } principal { type id } }
    endCursor hasNextPage
  }
}
"""


def serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = tcp_listener("127.0.0.1", 0)
    sock.listen(256)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", http="httptools")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return server, thread, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not start")
        time.sleep(0.1)


def write_bundle(path: Path) -> None:
    import json

    from portalkit import POLICIES, SCHEMA

    path.mkdir(parents=True, exist_ok=True)
    (path / "schema.cedarschema").write_text(SCHEMA)
    (path / "policies.cedar").write_text(POLICIES)
    person = {
        "uid": {"type": "Human", "id": PERSON},
        "attrs": {"active": True, "department": "audit", "title": "Auditor"},
        "parents": [{"type": "Group", "id": "auditors"}],
    }
    group = {"uid": {"type": "Group", "id": "auditors"}, "attrs": {}, "parents": []}
    (path / "entities.json").write_text(json.dumps([group, person]))


def timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def report(label: str, ms: list[float]) -> None:
    print(f"  {label}: p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms ({len(ms)} runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--searches", type=int, default=300)
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    import logging
    import subprocess

    logging.disable(logging.INFO)  # the clients' request lines

    root = Path(tempfile.mkdtemp(prefix="bench-portal-"))
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    client = history.connect(f"chdb://{root / 'history'}", create_database=True)
    history.migrate(client)
    t0 = time.perf_counter()
    principals: list[dict[str, str]] = []
    qids: list[str] = []
    chunk = 200_000
    for start in range(0, args.rows, chunk):
        n = min(chunk, args.rows - start)
        recs = decisions(n, seed=start)
        principals += [r["principal"] for r in recs[:200]]
        qids += [r["qid"] for r in recs[:50]]
        # Spread each chunk over the same 7 days: every principal's rows cover the range.
        history.store(client, "decisions", encode("svc.decisions.v1", recs))
    print(f"stored {args.rows:,} decisions in {time.perf_counter() - t0:.0f} s")
    hist_server, hist_thread, hist_url = serve(
        history_app(client, auth=HistoryAuthSettings(auth="none"))
    )
    write_bundle(root / "bundle")
    pdp_port = free_port()
    pdp = subprocess.Popen(
        [str(SVC), "pdp", "--bundle", str(root / "bundle"), "--port", str(pdp_port), "--no-watch"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pdp_url = f"http://127.0.0.1:{pdp_port}"
    for _ in range(300):
        try:
            if httpx.get(f"{pdp_url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    settings = PortalSettings(
        port=0,
        pdp_url=pdp_url,
        history_url=hist_url,
        context_url="http://127.0.0.1:9",  # not called by what is measured
        policy_url=None,
        challenge_url=None,
        allow_any_query=True,  # its own page query, not the web app's persisted one
    )
    service = PortalService(
        settings,
        PdpClient(pdp_url),
        ContextClient(settings.context_url),
        history=HistoryClient(hist_url),
    )
    rnd = random.Random(11)
    since = NOW - timedelta(days=8)
    try:
        print(f"decision search over {args.rows:,} rows, 7 days, first page of 50:")

        def first_page(verdict: str | None = None) -> None:
            p = rnd.choice(principals)
            out = service.decisions(PERSON, principal=p, verdict=verdict, since=since, first=50)
            assert out["decisions"] or out["scanned"] == 0

        for _ in range(20):
            first_page()
        hist = HistoryClient(hist_url)

        def history_alone() -> None:
            p = rnd.choice(principals)
            hist.decisions(principal=f"{p['type']}::{p['id']}", since=since.isoformat(), limit=51)

        report("the history route alone (51 rows)", timed(history_alone, args.searches))
        report("unfiltered", timed(first_page, args.searches))
        report("verdict deny", timed(lambda: first_page("deny"), args.searches))
        report(
            "explanation",
            timed(lambda: service.explain(PERSON, rnd.choice(qids)), args.searches),
        )

        app = portal_app(settings, service)
        srv, thread, url = serve(app)
        session, cookie = app.state.sessions.create(PERSON)
        headers = {"x-csrf-token": session.csrf}
        http = httpx.Client(base_url=url, cookies={"svc_portal_session": cookie}, timeout=60)

        def page() -> None:
            r = http.post(
                "/graphql",
                json={
                    "query": PAGE_QUERY,
                    "variables": {"p": rnd.choice(principals), "since": since.isoformat()},
                },
                headers=headers,
            )
            assert r.status_code == 200 and "errors" not in r.json(), r.text

        for _ in range(20):
            page()
        print("GraphQL, the decisions page's query over HTTP:")
        seq = timed(page, args.requests // 4)
        report("sequential", seq)
        done = [0]
        lock = threading.Lock()

        def worker(n: int) -> None:
            c = httpx.Client(base_url=url, cookies={"svc_portal_session": cookie}, timeout=60)
            for _ in range(n):
                r = c.post(
                    "/graphql",
                    json={
                        "query": PAGE_QUERY,
                        "variables": {"p": rnd.choice(principals), "since": since.isoformat()},
                    },
                    headers=headers,
                )
                assert r.status_code == 200 and "errors" not in r.json(), r.text
                with lock:
                    done[0] += 1
            c.close()

        threads = [threading.Thread(target=worker, args=(args.requests // 4,)) for _ in range(4)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        took = time.perf_counter() - t
        print(f"  4 clients: {done[0] / took:.0f} requests/s ({done[0]} requests)")
        http.close()
        srv.should_exit = True
        thread.join(10)
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        service.close()
        pdp.terminate()
        pdp.wait(20)
        hist_server.should_exit = True
        hist_thread.join(10)


if __name__ == "__main__":
    main()
