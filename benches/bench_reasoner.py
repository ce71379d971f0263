"""A reasoner cycle over a large synthetic history in chDB (docs/benchmarks.md, "Reasoner").

The history is made by ClickHouse itself (``INSERT ... SELECT`` over ``numbers()``, in chunks)
straight into ``decisions`` and ``events``, so the views fill the resource-ordered copies and
the daily rollups as the loader's inserts do: ``--decisions`` and ``--events`` records over the
last ``--days`` days for ``--principals`` principals (one in twenty a service account acting for
people). Then two cycles' history and scoring steps are timed apart, as ``ReasonerService``
runs them (without the services around them, whose calls do not grow with the history):

* ``settle``: the rollups of the days changed since the last cycle compared with the raw rows
  read with ``FINAL`` (the first cycle: every day; the second: today, after a new batch);
* ``read``: ``read_days`` and ``read_sets`` (the aggregate queries over the rollups), and
  ``read_rare_resources`` (the distinct principal-resource pairs of the raw rows, counted per
  peer group); ``total_without_rare_secs`` is the cycle of the previous design (no rare
  resources), measured in the same run;
* ``score``: ``score_window`` over every principal, peers by department or app;
* ``gate``: the containment gate for every principal.

    python benches/bench_reasoner.py [--principals 100000] [--decisions 30000000]
        [--events 10000000] [--days 30] [--chunk 2000000]
    python benches/bench_reasoner.py --propagation 30000   # scores to a decision point
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta

from svc import history
from svc.history import rollups
from svc.reasoner.gate import evaluate
from svc.reasoner.scoring import Directory, Model, peer_groups, score_window

_DECISIONS = """
INSERT INTO decisions (qid, at, call, transport, principal_type, principal_id,
    on_behalf_of_type, on_behalf_of_id, action, resource_type, resource_id, verdict, mode,
    policies)
SELECT
    toString(generateUUIDv4(number)),
    toDateTime64({end:DateTime}, 3) - toIntervalMillisecond(rand(1) % {span_ms:UInt64}),
    'check', 'http',
    if(p % 20 = 0, 'ServiceAccount', 'Human'),
    if(p % 20 = 0, concat('app', toString(p % 7), '.agent', toString(p)), concat('p', toString(p))),
    if(p % 20 = 0, 'Human', ''),
    if(p % 20 = 0, concat('p', toString((p * 7 + rand(5) % 5) % {n:UInt32})), ''),
    ['view', 'edit', 'share', 'comment'][1 + rand(2) % 4],
    'Document',
    concat('d', toString((p * 13 + rand(3) % 60) % 500000)),
    if(rand(4) % 50 = 0, 'deny', 'allow'),
    'enforce', ['p0']
FROM (SELECT number, (rand(6) % {n:UInt32}) AS p FROM numbers({offset:UInt64}, {count:UInt64}))
"""

_EVENTS = """
INSERT INTO events (ingest_id, at, received_at, system, principal_type, principal_id,
    on_behalf_of_type, on_behalf_of_id, action, resource_type, resource_id, outcome, source_ip,
    attributes, access, row_count, tool)
SELECT
    toString(generateUUIDv4(number)),
    toDateTime64({end:DateTime}, 3) - toIntervalMillisecond(rand(1) % {span_ms:UInt64}) AS t,
    t, 'drive',
    if(p % 20 = 0, 'ServiceAccount', 'Human'),
    if(p % 20 = 0, concat('app', toString(p % 7), '.agent', toString(p)), concat('p', toString(p))),
    if(p % 20 = 0, 'Human', ''),
    if(p % 20 = 0, concat('p', toString((p * 7 + rand(5) % 5) % {n:UInt32})), ''),
    ['view', 'search', 'edit', 'download'][1 + k] AS action,
    'Document',
    if(k = 1, '', concat('d', toString((p * 13 + rand(3) % 60) % 500000))),
    if(rand(7) % 100 = 0, 'failure', 'success'),
    concat('10.', toString(p % 250), '.', toString(intDiv(p, 250) % 250), '.1'),
    '{}',
    ['read', 'listed', 'written', 'read'][1 + k],
    [1 + rand(8) % 20, 10 + rand(8) % 200, 1 + rand(8) % 5, 1][1 + k],
    if(p % 20 = 0, 'docs.search', '')
FROM (
    SELECT number, (rand(6) % {n:UInt32}) AS p,
        multiIf(rand(9) % 100 < 45, 0, rand(9) % 100 < 80, 1, rand(9) % 100 < 97, 2, 3) AS k
    FROM numbers({offset:UInt64}, {count:UInt64})
)
"""


def fill(client: object, table: str, sql: str, total: int, chunk: int, params: dict) -> float:
    """Inserts `total` rows in chunks; returns the seconds taken."""
    t0 = time.perf_counter()
    done = 0
    while done < total:
        n = min(chunk, total - done)
        client.command(  # type: ignore[attr-defined]
            sql,
            parameters={**params, "offset": done, "count": n},
            settings={"optimize_on_insert": 0, "max_partitions_per_insert_block": 1000},
        )
        done += n
        print(f"  {table}: {done:,} of {total:,} in {time.perf_counter() - t0:.0f} s", flush=True)
    return time.perf_counter() - t0


def cycle(
    client: object, now: datetime, model: Model, directory: Directory, since: datetime | None
) -> dict[str, float]:
    """One cycle's history and scoring steps, timed apart."""
    today = now.date()
    first = today - timedelta(days=model.window_days - 1)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    days = [d for d in rollups.changed_days(client, since) if first <= d <= today]  # type: ignore[arg-type]
    rebuilt = rollups.settle(client, days)  # type: ignore[arg-type]
    out["settle_secs"] = time.perf_counter() - t0
    out["days_checked"] = len(days)
    out["days_rebuilt"] = len(rebuilt)
    t0 = time.perf_counter()
    rows = rollups.read_days(client, first, today)  # type: ignore[arg-type]
    out["read_days_secs"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    sets = rollups.read_sets(client, first, today, today - timedelta(days=model.recent_days - 1))  # type: ignore[arg-type]
    out["read_sets_secs"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    recent = today - timedelta(days=model.recent_days - 1)
    rare = rollups.read_rare_resources(
        client,  # type: ignore[arg-type]
        first,
        today,
        recent,
        peer_groups(rows, directory, model),
    )
    out["read_rare_secs"] = time.perf_counter() - t1
    out["read_secs"] = time.perf_counter() - t0
    # The previous design, in the same run: scored without the rare resources' query.
    t0 = time.perf_counter()
    score_window(rows, sets, directory, model)
    out["score_without_rare_secs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scores = score_window(rows, sets, directory, model, rare)
    out["score_secs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    passed = sum(1 for s in scores if evaluate(s, rows.days).passed)
    out["gate_secs"] = time.perf_counter() - t0
    out["principals"] = len(scores)
    out["principals_with_rare"] = len(rare)
    out["gate_passed"] = passed
    out["total_secs"] = out["settle_secs"] + out["read_secs"] + out["score_secs"] + out["gate_secs"]
    out["total_without_rare_secs"] = (
        out["settle_secs"]
        + out["read_secs"]
        - out["read_rare_secs"]
        + out["score_without_rare_secs"]
        + out["gate_secs"]
    )
    out["principals_per_sec"] = len(scores) / out["total_secs"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def propagation(n: int) -> dict[str, float]:
    """From a cycle's ``POST /v1/risk`` of `n` scores to a decision point having applied them.

    A context service on PostgreSQL (a fresh schema) served by uvicorn, and an in-process
    engine following it (``svc.pdp.context_follower``) as ``svc pdp --context`` does.
    """
    import threading

    import httpx
    import uvicorn

    from _support import Schema, postgres_url
    from svc.common.net import tcp_listener
    from svc.context.app import create_app
    from svc.context.service import ContextService
    from svc.context.settings import ContextAuthSettings, ContextSettings
    from svc.pdp import Engine
    from svc.pdp.context_follower import follow_context

    schema = Schema(postgres_url(), "reasoner_prop")
    settings = ContextSettings(database_url=schema.url_text, port=0)
    service = ContextService(settings)
    app = create_app(service, settings, ContextAuthSettings(auth="none"))
    sock = tcp_listener("127.0.0.1", 0)
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    engine = Engine(
        '@id("all") permit (principal, action, resource);',
        "entity Human; entity Document; action view appliesTo "
        "{ principal: [Human], resource: [Document] };",
    )
    follower = follow_context(engine, None, url, wait_secs=5)
    out: dict[str, float] = {}
    try:
        follower.loaded.wait(60)
        scores = [
            {"principal": {"type": "Human", "id": f"p{k}"}, "score": k % 101} for k in range(n)
        ]
        with httpx.Client(base_url=url, timeout=600) as http:
            t0 = time.perf_counter()
            r = http.post("/v1/risk", json={"scores": scores})
            r.raise_for_status()
            posted = time.perf_counter()
            version = int(r.json()["principals_version"])
            follower.wait_for(lambda st: st.principals_version >= version)
            applied = time.perf_counter()
        out = {
            "scores": n,
            "post_secs": round(posted - t0, 3),
            "posted_to_applied_secs": round(applied - posted, 3),
            "cycle_end_to_applied_secs": round(applied - t0, 3),
        }
    finally:
        follower.stop()
        server.should_exit = True
        thread.join(30)
        sock.close()
        service.close()
        schema.drop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--principals", type=int, default=100_000)
    p.add_argument("--decisions", type=int, default=30_000_000)
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--chunk", type=int, default=2_000_000)
    p.add_argument(
        "--propagation",
        type=int,
        default=0,
        help="only measure a POST /v1/risk of this many scores until a decision point applied it",
    )
    args = p.parse_args()
    if args.propagation:
        print(json.dumps(propagation(args.propagation)))
        return
    end = datetime.now(UTC).replace(microsecond=0)
    params = {
        "end": end.replace(tzinfo=None),
        "span_ms": args.days * 86_400_000,
        "n": args.principals,
    }
    with tempfile.TemporaryDirectory() as tmp:
        client = history.connect(f"chdb://{tmp}?database=bench", create_database=True)
        history.migrate(client)
        print(f"filling {args.decisions:,} decisions and {args.events:,} events", flush=True)
        load_d = fill(client, "decisions", _DECISIONS, args.decisions, args.chunk, params)
        load_e = fill(client, "events", _EVENTS, args.events, args.chunk, params)
        directory = Directory(
            {
                ("Human", f"p{k}"): [f"department:d{k % 500}"]
                for k in range(args.principals)
                if k % 20
            }
            | {
                ("ServiceAccount", f"app{k % 7}.agent{k}"): [f"app:app{k % 7}"]
                for k in range(0, args.principals, 20)
            }
        )
        model = Model(window_days=args.days)
        first = cycle(client, end, model, directory, None)
        # A new batch today, then the next cycle settles today only.
        mark = datetime.now(UTC) - timedelta(seconds=2)
        since_midnight = end - end.replace(hour=0, minute=0, second=0)
        today_ms = max(1000, int(since_midnight.total_seconds() * 1000))
        fill(client, "events", _EVENTS, 100_000, 100_000, {**params, "span_ms": today_ms})
        second = cycle(client, end + timedelta(minutes=15), model, directory, mark)
        rollup_rows = client.query("SELECT count() FROM principal_daily").result_rows[0][0]
        print(
            json.dumps(
                {
                    "principals": args.principals,
                    "decisions": args.decisions,
                    "events": args.events,
                    "days": args.days,
                    "load_decisions_secs": round(load_d, 1),
                    "load_events_secs": round(load_e, 1),
                    "rollup_rows": int(rollup_rows),
                    "first_cycle": first,
                    "next_cycle": second,
                }
            )
        )


if __name__ == "__main__":
    main()
