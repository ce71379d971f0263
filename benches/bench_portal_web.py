"""The portal web app's page loads in Chromium over a large history (docs/benchmarks.md,
"Portal web app").

    .venv/bin/python benches/bench_portal_web.py [--rows 1000000] [--loads 9] [--data-dir DIR]

Sets up a chDB history holding `--rows` decisions (bench_portal.py's rows: bench_history.py's
synthetic mix, 5,000 people and 500 agents over the last 7 days, stored with
``svc.history.store``; with `--data-dir` the history is kept there and only the rows it lacks
are stored on the next run) served by the history's own routes (``svc.history.service``,
uvicorn in a thread), and the portal with real services as tests/test_portal_web.py starts them
(``tests/portalkit.World``: the context service on a PostgreSQL schema of its own, the
challenge and policy services, ``svc pdp`` as a process over the bundle with ``PortalArea``,
the demo OpenID Connect provider, the portal serving the built web app and accepting only its
persisted operations). Headless Chromium (Debian's, driven by Playwright) signs in as the
security admin ``ana`` and then loads each page `--loads` times as a first view: a navigation
to the page's URL (a full document load: the app boots, reads the session and the access
checks, then the page's queries), timed until the page's main content is rendered with its
data and no loading state is left in it. The app's files come from the browser's cache after
the first load, as for a person coming back. Prints p50/p99 per page in ms.

The peer, run in the same session on the same data: the history's own answer to the page's
heaviest read (``GET /v1/history/stats`` over 7 days for the overview, a decision search for
the decisions page), so the ratio says what the app adds over the store's answer; and for the
overview the previous design's query too (``decision_stats_raw``: every row of the week read
with ``FINAL``, before the hourly rollups of schema version 7).

Needs the web app built (``make web``) and PostgreSQL (``scripts/dev-postgres.sh``, or
``SVC_TEST_POSTGRES_URL``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _support import REPO, pct
from bench_history import decisions, encode
from bench_portal import serve
from svc import history
from svc.common.auth_settings import HistoryAuthSettings
from svc.history import hourly, queries
from svc.history.service import create_app as history_app
from svc.portal.webapp import MANIFEST, WEB_DIR

CHROMIUM = "/usr/bin/chromium"
#: Nothing in the page's main content is still loading.
SETTLED = "!document.querySelector('main .loading, main [aria-busy=true]')"


def fill(client: Any, rows: int) -> None:
    """Stores the decisions `client`'s history lacks, 200,000 a batch (bench_portal.py's way)."""
    have = int(client.query("SELECT count() FROM decisions").result_rows[0][0])
    t0 = time.perf_counter()
    chunk = 200_000
    for start in range(have - have % chunk, rows, chunk):
        n = min(chunk, rows - start)
        history.store(client, "decisions", encode("svc.decisions.v1", decisions(n, seed=start)))
    if have < rows:
        print(f"stored {rows - have:,} decisions in {time.perf_counter() - t0:.0f} s")
    total = int(client.query("SELECT count() FROM decisions").result_rows[0][0])
    print(f"history: {total:,} decision rows")


def postgres_url() -> str:
    url = os.environ.get("SVC_TEST_POSTGRES_URL")
    if url:
        return url
    script = REPO / "scripts" / "dev-postgres.sh"
    subprocess.run([str(script), "start"], check=True, capture_output=True, timeout=600)
    return subprocess.run(
        [str(script), "url"], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()


def report(label: str, ms: list[float], peer: list[float] | None = None) -> None:
    line = f"  {label}: p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms ({len(ms)} loads)"
    if peer:
        line += (
            f"; the history's answer alone p50 {pct(peer, 0.5):.0f} ms "
            f"(page/answer {pct(ms, 0.5) / max(pct(peer, 0.5), 0.001):.1f}x)"
        )
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--loads", type=int, default=9, help="first views per page")
    ap.add_argument("--data-dir", type=Path, help="keep the history here and reuse it")
    args = ap.parse_args()
    if not (WEB_DIR / "index.html").is_file() or not (WEB_DIR / MANIFEST).is_file():
        sys.exit(f"the web app is not built in {WEB_DIR}: run `make web`")
    import logging

    import httpx
    from playwright.sync_api import sync_playwright

    from portalkit import World, pg_schema

    logging.disable(logging.INFO)
    root = Path(tempfile.mkdtemp(prefix="bench-portal-web-"))
    data = args.data_dir or root / "history"
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    client = history.connect(f"chdb://{data}", create_database=True)
    history.migrate(client)
    fill(client, args.rows)
    # What the loader does within a minute of storing rows (docs/history.md#hourly-rollups).
    settled = hourly.settle(client, margin=0)
    print(f"hourly rollups: {settled.marked} hours settled, {len(settled.rebuilt)} days rebuilt")
    lo, hi = client.query(
        "SELECT toUnixTimestamp64Milli(min(at)), toUnixTimestamp64Milli(max(at)) FROM decisions"
    ).result_rows[0]
    print(
        f"decisions from {datetime.fromtimestamp(lo / 1000, UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(hi / 1000, UTC):%Y-%m-%d %H:%M} UTC"
    )
    # Subjects with decisions in the last day (the principal page shows the last day's).
    day_ago = datetime.fromtimestamp(hi / 1000, UTC) - timedelta(hours=20)
    sample = client.query(
        "SELECT principal_type, principal_id, qid FROM decisions "
        "WHERE call = 'check' AND principal_type = 'Human' AND cityHash64(qid) % 97 = 5 "
        "AND at >= fromUnixTimestamp64Milli({t:Int64}, 'UTC') LIMIT 200",
        parameters={"t": int(day_ago.timestamp() * 1000)},
    ).result_rows
    rnd = random.Random(5)
    hist_server, _, hist_url = serve(history_app(client, auth=HistoryAuthSettings(auth="none")))
    hist = httpx.Client(base_url=hist_url, timeout=120)
    (root / "world").mkdir()
    with pg_schema(postgres_url()) as url:
        world = World(url, root / "world", history_url=hist_url, allow_any_query=False)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                ctx.set_default_timeout(300_000)
                page = ctx.new_page()
                page.goto(world.portal.url + "/")
                page.wait_for_selector("input[name=sub]")
                page.fill("input[name=sub]", "ana")
                page.click("button[type=submit]:has-text('Authorize')")
                page.wait_for_selector("#user:has-text('ana')")
                base = world.portal.url

                def subject() -> tuple[str, str, str]:
                    t, i, q = rnd.choice(sample)
                    return str(t), str(i), str(q)

                def decisions_url() -> str:
                    t, i, _ = subject()
                    return f"/decisions?subject=principal&type={t}&id={i}"

                # (page, its URL per load, what shows it rendered with data, the peer's read)
                now = datetime.now(UTC)
                week = {
                    "since": (now - timedelta(days=7)).isoformat(),
                    "until": now.isoformat(),
                    "bucket": "hour",
                }
                pages: list[tuple[str, Callable[[], str], str, Callable[[], Any] | None]] = [
                    (
                        "overview",
                        lambda: "/",
                        "section[aria-label='Decisions and intake'] figure.chart svg rect",
                        lambda: hist.get("/v1/history/stats", params=week).raise_for_status(),
                    ),
                    (
                        "decisions (one person's, last day)",
                        decisions_url,
                        "[aria-labelledby=results-h] tbody tr",
                        lambda: hist.get(
                            "/v1/history/decisions/search",
                            params={"principal": "::".join(subject()[:2]), "limit": 50},
                        ).raise_for_status(),
                    ),
                    ("a decision", lambda: f"/decisions/{subject()[2]}", "#why-h", None),
                    (
                        "a principal",
                        lambda: "/principals/{}/{}".format(*subject()[:2]),
                        "section[aria-labelledby=rec-h] tbody tr",
                        None,
                    ),
                    ("policies", lambda: "/policies", "#install-mode", None),
                    ("challenges", lambda: "/challenges", "[aria-labelledby=q-h]", None),
                    ("containments", lambda: "/containments", "#list-h", None),
                    ("directory", lambda: "/directory", "#people-h", None),
                    ("investigations", lambda: "/investigations", "[aria-labelledby=inv-h]", None),
                ]
                print(
                    f"first views in Chromium, {args.loads} per page "
                    f"(load average {os.getloadavg()[0]:.1f}):"
                )
                for name, path, ready, peer in pages:
                    ms: list[float] = []
                    peer_ms: list[float] = []
                    for _ in range(args.loads):
                        ms.append(first_view(page, base + path(), ready))
                        if peer is not None:
                            t = time.perf_counter()
                            peer()
                            peer_ms.append((time.perf_counter() - t) * 1000)
                    report(name, ms, peer_ms or None)
                    if name == "overview":
                        overview_peers(client, week, args.loads)
                browser.close()
        finally:
            world.close()
            hist_server.should_exit = True
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


def overview_peers(client: Any, week: dict[str, str], loads: int) -> None:
    """Times the overview's aggregate in process: the rollups' answer (``decision_stats``)
    and the previous design's (``decision_stats_raw``: every row of the week with ``FINAL``)."""
    span = (datetime.fromisoformat(week["since"]), datetime.fromisoformat(week["until"]))
    times: dict[str, list[float]] = {"rollups": [], "raw": []}
    # One after the other, not interleaved: a full scan between two rollup reads would leave
    # each of them the caches the scan left.
    for label, f in (("rollups", queries.decision_stats), ("raw", queries.decision_stats_raw)):
        for _ in range(loads):
            t = time.perf_counter()
            f(client, *span)
            times[label].append((time.perf_counter() - t) * 1000)
    new, old = times["rollups"], times["raw"]
    print(
        f"  overview's aggregate in process: rollups p50 {pct(new, 0.5):.0f} ms, p99 "
        f"{pct(new, 0.99):.0f} ms; the previous design's query (raw rows, FINAL) p50 "
        f"{pct(old, 0.5):.0f} ms, p99 {pct(old, 0.99):.0f} ms "
        f"(previous/rollups {pct(old, 0.5) / max(pct(new, 0.5), 0.001):.1f}x)",
        flush=True,
    )


def first_view(page: Any, url: str, ready: str) -> float:
    """Milliseconds from the navigation to `ready` shown with nothing left loading."""
    page.goto("about:blank")
    t = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_function(
        f"() => !!document.querySelector({json.dumps(ready)}) && {SETTLED}", polling="raf"
    )
    return (time.perf_counter() - t) * 1000


if __name__ == "__main__":
    main()
