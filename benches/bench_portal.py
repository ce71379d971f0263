"""The portal's decision search and GraphQL throughput (docs/benchmarks.md, "Portal").

    .venv/bin/python benches/bench_portal.py [--rows 1000000] [--searches 200] [--requests 2000]
        [--data-dir DIR]

Sets up, in this process: a chDB history holding `--rows` decisions (bench_history.py's
synthetic mix: 5,000 people and 500 agents over 7 days, 100,000 resources of 4 types, stored
with ``svc.history.store`` as the loader stores them) served by the history's own routes
(``svc.history.service``, uvicorn in a thread); ``svc pdp`` as a process over a bundle with
``PortalArea`` (tests/portalkit.py's) in which the bench's person is an auditor; and the
portal's service layer and app (uvicorn in a thread). With `--data-dir` the history is kept
there and reused by the next run (only the rows it lacks are stored; ``migrate`` brings an
older schema up to date and its time is printed). Then measures, p50/p99 in ms:

* **the history's route alone** (``GET /v1/history/decisions`` of one principal, 51 rows,
  ``FINAL``), the read the previous search design made;
* **decision searches, first page and next page of 50**, one random subject at a time, each
  through the portal (``PortalService.decisions``: the portal's check at the decision point,
  then the history's search route) and, where it could answer, through **the previous design**
  run in the same process on the same data (``old_search``: the history's per-principal or
  per-resource route read with ``FINAL`` in growing chunks, the filters applied in Python),
  the two alternating so the machine's load falls on both alike: by principal (whole 7 days),
  by resource (whole 7 days), by principal with ``verdict: deny``, ``verdict: deny`` over a
  random day with no subject, and a policy (one of 40) over the whole 7 days with no subject
  (the previous design needed a subject for both);
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _support import SVC, free_port, pct
from bench_history import POLICIES, decisions, encode
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


def report(label: str, ms: list[float], cpu: list[float] | None = None) -> None:
    line = f"  {label}: p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms"
    if cpu:
        line += f"; CPU p50 {pct(cpu, 0.5):.1f} ms, p99 {pct(cpu, 0.99):.1f} ms"
    print(f"{line} ({len(ms)} runs)")


def old_search(
    hist: HistoryClient,
    kw: dict[str, Any],
    since: datetime,
    until: datetime,
    after: tuple[int, str] | None = None,
    first: int = 50,
) -> tuple[tuple[int, str] | None, list[dict[str, Any]]]:
    """A page as the previous design read it (the portal's search before the history's search
    route): the per-principal or per-resource route (``FINAL``) from the cursor on, in chunks
    of ``first + 1`` rows (four times that when filtered) that double, the filters applied here,
    at most 50,000 rows per page. Returns the next page's position (None: no more) and the page.
    """
    subject = kw.get("principal") or kw["resource"]
    key = "principal" if "principal" in kw else "resource"
    base = {key: f"{subject['type']}::{subject['id']}", "until": until.isoformat()}
    verdict = kw.get("verdict")
    start = since if after is None else datetime.fromtimestamp(after[0] / 1000, UTC)
    chunk = min(10_000, 4 * (first + 1) if verdict else first + 1)
    found: list[dict[str, Any]] = []
    scanned, last, exhausted = 0, after, False
    while len(found) <= first and scanned < 50_000:
        rows = hist.decisions(**base, since=start.isoformat(), limit=chunk)
        moved = False
        for row in rows:
            at = int(datetime.fromisoformat(row["at"]).timestamp() * 1000)
            pos = (at, str(row["qid"]))
            if last is not None and pos <= last:
                continue
            moved, last = True, pos
            scanned += 1
            if verdict is None or verdict in (row.get("verdict"), row.get("outcome")):
                found.append(row)
                if len(found) > first:
                    break
        if len(rows) < chunk:
            exhausted = True
            break
        if not moved and last is not None:
            last = (last[0], "\uffff")
        assert last is not None
        start = datetime.fromtimestamp(last[0] / 1000, UTC)
        chunk = min(10_000, chunk * 2)
    page = found[:first]
    if len(found) > first:
        at = int(datetime.fromisoformat(page[-1]["at"]).timestamp() * 1000)
        return (at, str(page[-1]["qid"])), page
    return (None if exhausted else last), page


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--searches", type=int, default=300)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--data-dir", type=Path, help="keep the history here and reuse it")
    args = ap.parse_args()
    import logging
    import subprocess

    logging.disable(logging.INFO)  # the clients' request lines

    root = Path(tempfile.mkdtemp(prefix="bench-portal-"))
    data = args.data_dir or root / "history"
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    client = history.connect(f"chdb://{data}", create_database=True)
    t0 = time.perf_counter()
    applied = history.migrate(client)
    print(f"migrate: versions {applied} in {time.perf_counter() - t0:.1f} s")
    have = int(client.query("SELECT count() FROM decisions").result_rows[0][0])
    t0 = time.perf_counter()
    chunk = 200_000
    for start in range(have - have % chunk, args.rows, chunk):
        n = min(chunk, args.rows - start)
        # Each chunk spreads over the same 7 days: every principal's rows cover the range.
        history.store(client, "decisions", encode("svc.decisions.v1", decisions(n, seed=start)))
    if have < args.rows:
        print(f"stored {args.rows - have:,} decisions in {time.perf_counter() - t0:.0f} s")
    total = int(client.query("SELECT count() FROM decisions").result_rows[0][0])
    parts = client.query(
        "SELECT count() FROM system.parts WHERE active AND table = 'decisions' "
        "AND database = currentDatabase()"
    ).result_rows[0][0]
    print(f"history: {total:,} decision rows in {parts} parts")
    lo, hi = client.query(
        "SELECT toUnixTimestamp64Milli(min(at)), toUnixTimestamp64Milli(max(at)) FROM decisions"
    ).result_rows[0]
    sample = client.query(
        "SELECT principal_type, principal_id, resource_type, resource_id, qid FROM decisions "
        "WHERE call = 'check' AND cityHash64(qid) % 1000 = 7 LIMIT 500"
    ).result_rows
    principals = [{"type": r[0], "id": r[1]} for r in sample]
    resources = [{"type": r[2], "id": r[3]} for r in sample]
    qids = [r[4] for r in sample[:100]]
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
    since = datetime.fromtimestamp(lo / 1000, UTC)
    until = datetime.fromtimestamp((hi + 1) / 1000, UTC)
    try:
        hist = HistoryClient(hist_url)

        def history_alone() -> None:
            p = rnd.choice(principals)
            hist.decisions(
                principal=f"{p['type']}::{p['id']}",
                since=since.isoformat(),
                until=until.isoformat(),
                limit=51,
            )

        for _ in range(20):
            history_alone()
        report("the history route alone (FINAL, 51 rows)", timed(history_alone, args.searches))
        day = 86_400_000
        shapes: list[tuple[str, Any]] = [
            ("by principal", lambda: {"principal": rnd.choice(principals)}),
            ("by resource", lambda: {"resource": rnd.choice(resources)}),
            (
                "by principal, verdict deny",
                lambda: {"principal": rnd.choice(principals), "verdict": "deny"},
            ),
            ("verdict deny over one day, no subject", lambda: day_window({"verdict": "deny"})),
            ("a policy, no subject", lambda: {"policy": rnd.choice(POLICIES)}),
        ]

        def day_window(kw: dict[str, Any]) -> dict[str, Any]:
            t = rnd.randrange(lo, hi - day)
            s = datetime.fromtimestamp(t / 1000, UTC)
            return {**kw, "since": s, "until": s + timedelta(days=1)}

        def new_search(kw: dict[str, Any], after: str | None = None) -> dict[str, Any]:
            kw = {"since": since, "until": until, **kw}
            return service.decisions(PERSON, first=50, after=after, **kw)

        print(
            f"decision search over {total:,} rows, 7 days, pages of 50 "
            "(new: the portal and the history's search route; old: the previous design):"
        )
        for label, make in shapes:
            for _ in range(5):
                new_search(make())
            old_ok = "principal" in make() or "resource" in make()
            runs: dict[str, list[float]] = {k: [] for k in ("new1", "new2", "old1", "old2")}
            # The process's CPU time per call (every thread: the portal, the history route,
            # chDB; not svc pdp's process): what the call costs whatever the machine's load.
            cpu: dict[str, list[float]] = {k: [] for k in runs}

            def measure(key: str, fn: Any, runs: Any = runs, cpu: Any = cpu) -> Any:
                t, c = time.perf_counter(), time.process_time()
                out = fn()
                runs[key].append((time.perf_counter() - t) * 1000)
                cpu[key].append((time.process_time() - c) * 1000)
                return out

            rows = 0
            for _ in range(args.searches):
                kw = make()
                got = measure("new1", lambda kw=kw: new_search(kw))
                rows += len(got["decisions"])
                if got["has_next_page"]:
                    measure("new2", lambda kw=kw, a=got["end_cursor"]: new_search(kw, a))
                if old_ok:
                    pos, _ = measure("old1", lambda kw=kw: old_search(hist, kw, since, until))
                    if pos is not None:
                        measure("old2", lambda kw=kw, p=pos: old_search(hist, kw, since, until, p))
            print(f"  {label} ({rows / args.searches:.0f} rows per first page on average):")
            for key, what in (
                ("new1", "new, first page"),
                ("new2", "new, next page"),
                ("old1", "old, first page"),
                ("old2", "old, next page"),
            ):
                if runs[key]:
                    report(what, runs[key], cpu[key])
            if runs["old1"]:
                r50 = pct(runs["old1"], 0.5) / pct(runs["new1"], 0.5)
                r99 = pct(runs["old1"], 0.99) / pct(runs["new1"], 0.99)
                print(f"    first page, old / new: {r50:.1f}x at p50, {r99:.1f}x at p99")
            print(f"    load average: {os.getloadavg()[0]:.1f}")
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
