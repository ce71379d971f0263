"""Search benchmark: the AuthZEN searches (docs/search.md) against brute force with
``Engine.evaluate_many``, in one run on one engine.

What is measured
----------------
The corp bundle (``tests/testdata/bundles/corp``) with 100,000 ``Document`` rows and 100,000
extra ``Human`` principals in the store (``--size`` changes both), generated from a fixed seed:
each document has one of 10 departments, an owner among the first 1,000 humans and a
sensitivity; each human one of 10 departments. ``view-own-department`` and
``owner-full-access`` make ``view`` conditional on both sides.

* resource search: ``Engine.search_resources`` for ``alice`` / ``view`` / ``Document``: the
  first page of 100, and the whole result (every page at the maximum limit, 1,000);
* subject search: ``Engine.search_subjects`` for ``Human`` / ``view`` / one document: the first
  page of 100 and the whole result;
* subject search by checks: the same with ``configure_search(subject_plans=False)``, one check
  per principal (what subject search does without a schema), for comparison;
* subject search with every principal scored: the same after a risk score (0 to 100, seeded)
  is set for every human, so the search makes one plan per distinct score (101);
* brute force: ``Engine.evaluate_many`` over every candidate (100,000 requests), keeping the
  allowed ones.

Each call is timed alone with ``time.perf_counter_ns`` (request and response conversion
included); first pages 200 samples, whole results and brute force 7 (``--quick``: 40 and 2).
Before timing, every search's whole result is compared with brute force's allowed list.

Targets (docs/search.md): first page of 100 under 5 ms p50; whole search at least 10x faster
than brute force. Misses print as ``MISS``; the script exits 0 (benches report).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from svc.pdp import Engine

CORP = Path(__file__).resolve().parent.parent / "tests" / "testdata" / "bundles" / "corp"
DEPTS = ["engineering", "sales", "ops", "legal", "hr", "finance", "it", "design", "qa", "pm"]


def bundle_ids(kind: str) -> list[str]:
    """Ids of the bundle's own entities of type `kind`."""
    entities = json.loads((CORP / "entities.json").read_text())
    return [x["uid"]["id"] for x in entities if x["uid"]["type"] == kind]


def build(size: int) -> Engine:
    rng = random.Random(29)
    e = Engine.from_bundle_dir(CORP)
    humans = [
        {
            "uid": {"type": "Human", "id": f"h{i:06}"},
            "attrs": {"department": rng.choice(DEPTS)},
            "parents": [],
        }
        for i in range(size)
    ]
    e.upsert_entities(humans)
    docs = [
        {
            "uid": {"type": "Document", "id": f"doc{i:06}"},
            "attrs": {
                "owner": {"__entity": {"type": "Human", "id": f"h{rng.randrange(1000):06}"}},
                "department": rng.choice(DEPTS),
                "sensitivity": rng.choice(["public", "internal", "secret"]),
                "tags": [],
            },
            "parents": [],
        }
        for i in range(size)
    ]
    e.upsert_entities(docs)
    return e


def whole(search: Callable[[dict[str, Any]], dict[str, Any]], body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    token = ""
    while True:
        page = search({**body, "page": {"limit": 1000, "token": token}})
        out += [r["id"] for r in page["results"]]
        token = page["page"]["next_token"]
        if not token:
            return out


def brute(e: Engine, requests: list[dict[str, Any]], key: str) -> list[str]:
    decisions = e.evaluate_many(requests)
    return sorted(
        r[key]["id"] for r, d in zip(requests, decisions, strict=True) if d["verdict"] == "allow"
    )


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    fn()
    out = []
    gc.disable()
    try:
        for _ in range(n):
            t = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t) / 1e6)
    finally:
        gc.enable()
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    first_n, whole_n = (40, 2) if a.quick else (200, 7)
    t = time.perf_counter()
    e = build(a.size)
    print(
        f"store: {a.size:,} documents and {a.size:,} humans, "
        f"built in {time.perf_counter() - t:.1f} s"
    )

    rbody = {
        "subject": {"type": "Human", "id": "alice"},
        "action": {"name": "view"},
        "resource": {"type": "Document"},
    }
    sbody = {
        "subject": {"type": "Human"},
        "action": {"name": "view"},
        "resource": {"type": "Document", "id": "doc000007"},
    }
    rreqs = [
        {
            "principal": {"type": "Human", "id": "alice"},
            "action": "view",
            "resource": {"type": "Document", "id": d},
        }
        for d in [*(f"doc{i:06}" for i in range(a.size)), *bundle_ids("Document")]
    ]
    humans = [*(f"h{i:06}" for i in range(a.size)), *bundle_ids("Human")]
    sreqs = [
        {
            "principal": {"type": "Human", "id": h},
            "action": "view",
            "resource": {"type": "Document", "id": "doc000007"},
        }
        for h in humans
    ]
    t = time.perf_counter()
    r_all = whole(e.search_resources, rbody)
    print(f"first resource search (builds the index by type): {time.perf_counter() - t:.2f} s")
    assert r_all == brute(e, rreqs, "resource"), "resource search differs from brute force"
    s_all = whole(e.search_subjects, sbody)
    assert s_all == brute(e, sreqs, "principal"), "subject search differs from brute force"
    print(
        f"checked: resource search {len(r_all):,} results, "
        f"subject search {len(s_all):,} results, both equal brute force"
    )

    rows = []

    def run(
        name: str,
        search: Callable[[dict[str, Any]], dict[str, Any]],
        body: dict[str, Any],
        reqs: list[dict[str, Any]],
        key: str,
    ) -> None:
        first = timed(lambda: search({**body, "page": {"limit": 100}}), first_n)
        all_ = timed(lambda: whole(search, body), whole_n)
        bf = timed(lambda: brute(e, reqs, key), whole_n)
        rows.append((name, first, all_, bf))

    run("resource search", e.search_resources, rbody, rreqs, "resource")
    run("subject search", e.search_subjects, sbody, sreqs, "principal")
    e.configure_search(subject_plans=False)
    assert whole(e.search_subjects, sbody) == s_all, "subject search by checks differs"
    run("subject (checks)", e.search_subjects, sbody, sreqs, "principal")
    e.configure_search(subject_plans=True)
    rng = random.Random(7)
    e.set_risk_scores(
        [{"principal": {"type": "Human", "id": h}, "score": rng.randrange(101)} for h in humans]
    )
    scored = whole(e.search_subjects, sbody)
    assert scored == brute(e, sreqs, "principal"), "scored subject search differs"
    run("subject (scored)", e.search_subjects, sbody, sreqs, "principal")

    print()
    print(
        f"{'search':17} {'first 100 p50':>13} {'p99':>8} {'whole p50':>10} {'p99':>8} "
        f"{'brute p50':>10} {'p99':>8} {'speedup':>8}"
    )
    print("-" * 90)
    for name, first, all_, bf in rows:
        speed = statistics.median(bf) / statistics.median(all_)
        print(
            f"{name:17} {statistics.median(first):13.2f} {pct(first, 0.99):8.2f} "
            f"{statistics.median(all_):10.1f} {pct(all_, 0.99):8.1f} "
            f"{statistics.median(bf):10.1f} {pct(bf, 0.99):8.1f} {speed:7.1f}x"
        )
    print("(milliseconds)")
    print()
    for name, first, all_, bf in rows:
        p50 = statistics.median(first)
        speed = statistics.median(bf) / statistics.median(all_)
        if name.endswith("(checks)"):
            print(f"{name}: {speed:.1f}x brute force (for comparison, no target)")
            continue
        print(
            f"{name}: first page p50 {p50:.2f} ms < 5 ms: {'ok' if p50 < 5 else 'MISS'}; "
            f"whole search {speed:.1f}x brute force >= 10x: {'ok' if speed >= 10 else 'MISS'}"
        )


if __name__ == "__main__":
    main()
