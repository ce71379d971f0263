"""Entity-store memory benchmark: the decision point's resident memory per stored entity.

What is measured
----------------
A synthetic directory snapshot in the demo company's shape (``svc.demo``'s schema): N ``Human``
principals (100,000 by default, ``--people N``) in N/10 ``Group`` entities. Every person has the
attributes ``department`` and ``title`` (strings drawn from the demo company's departments and
job words), ``active`` (a boolean) and ``manager`` (a reference to another person, one manager
for every 8 people), and is a member of 1 to 3 groups. The schema is the demo company's, with
``level`` made optional, as the snapshot does not carry it.

In a fresh subprocess per size, so that nothing another size allocated stays resident:

1. the snapshot is built as Python objects and an ``Engine`` with one policy and the schema is
   made; the cyclic garbage collector runs; RSS is read (``/proc/self/statm``): "before";
2. ``Engine.replace_entities(snapshot)`` loads it (timed with ``time.perf_counter``): the load
   time and entities per second;
3. RSS is read right after the load ("loaded"): it still holds what the load freed but the
   Rust allocator (mimalloc) has not yet given back, such as the snapshot's JSON form
   (about 3 KB per entity while the binding converts it). mimalloc returns freed memory once
   it has been free for its purge delay (1 s) and the allocator collects its heap, which the
   binding has it do every 100,000 allocations; so the script waits 1.5 s and then decides
   5,000 requests (what a serving decision point does in well under a second anyway);
4. RSS is read again, with the snapshot's Python objects still alive: "after". The difference
   "after" - "before" over the entities loaded (people plus groups) is the figure reported as
   bytes per entity: what the engine keeps, plus allocator slack, and nothing Python freed.
   (Reading RSS after dropping the Python objects instead would subtract what Python gives
   back, which is about as much as the engine keeps.)

Target (issue "Directory scale", item 6): under 1,000 bytes per entity, so that a million
people fit in a gigabyte. A miss is printed as ``MISS``; the script exits 0 (benches report,
they do not assert).

Run: ``.venv/bin/python benches/bench_entity_memory.py`` (100,000 people, about 10 seconds),
``--people N`` for another size, ``--million`` to add the 1,000,000-people figure (a few
minutes and about 3 GB of memory while the snapshot's Python objects are alive).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "python" / "svc" / "demo" / "bundle" / "company.cedarschema"
POLICY = "permit(principal, action, resource) when { principal is Human && principal.active };"
DEPARTMENTS = (
    ("Engineering", "Engineer"),
    ("Sales", "Account Executive"),
    ("Support", "Support Specialist"),
    ("Finance", "Analyst"),
    ("Product", "Product Manager"),
    ("Marketing", "Marketer"),
    ("HR", "People Partner"),
    ("Legal", "Counsel"),
)
TEAM = 8  # people per manager
TARGET_BYTES = 1_000
SETTLE_S = 1.5  # longer than mimalloc's purge delay (1 s)
DECISIONS = 5_000  # decided after the pause, before RSS is read

Json = dict[str, Any]


def snapshot(people: int) -> list[Json]:
    """The directory snapshot: ``people // 10`` groups (at least 1), then ``people`` humans."""
    groups = max(1, people // 10)
    out: list[Json] = [
        {"uid": {"type": "Group", "id": f"g{i}"}, "attrs": {}, "parents": []} for i in range(groups)
    ]
    for i in range(people):
        dept, title = DEPARTMENTS[i % len(DEPARTMENTS)]
        member_of = sorted({(i * k) % groups for k in (1, 7, 13)[: 1 + i % 3]})
        out.append(
            {
                "uid": {"type": "Human", "id": f"user{i}@example.com"},
                "attrs": {
                    "department": dept,
                    "title": title,
                    "active": i % 10 != 0,
                    "manager": {
                        "__entity": {"type": "Human", "id": f"user{(i // TEAM) * TEAM}@example.com"}
                    },
                },
                "parents": [{"type": "Group", "id": f"g{g}"} for g in member_of],
            }
        )
    return out


def rss_bytes() -> int:
    """This process's resident set size, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(people: int) -> Json:
    """Loads a snapshot of ``people`` into a fresh engine in this process; the figures."""
    from svc._pdp_core import Engine

    schema = SCHEMA.read_text().replace("level: Long,", "level?: Long,")
    engine = Engine(policies=POLICY, schema=schema)
    ents = snapshot(people)
    n = len(ents)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    engine.replace_entities(ents)
    load_s = time.perf_counter() - t0
    loaded = rss_bytes()
    time.sleep(SETTLE_S)
    for i in range(DECISIONS):
        engine.evaluate(
            {
                "principal": {"type": "Human", "id": f"user{i * 97 % people}@example.com"},
                "action": {"type": "Action", "id": "read"},
                "resource": {"type": "Document", "id": "d"},
            }
        )
    after = rss_bytes()
    assert engine.store_size == n
    return {
        "people": people,
        "entities": n,
        "rss_before": before,
        "rss_loaded": loaded,
        "rss_after": after,
        "bytes_per_entity": (after - before) / n,
        "load_s": load_s,
        "entities_per_s": n / load_s,
    }


def run(people: int) -> Json:
    """Runs :func:`child` in a fresh interpreter and returns its figures."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--people", str(people)],
        check=True,
        capture_output=True,
        text=True,
    )
    figures: Json = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def report(f: Json) -> None:
    """Prints one size's figures."""
    mib = 1024 * 1024
    per = f["bytes_per_entity"]
    verdict = "ok" if per < TARGET_BYTES else "MISS"
    print(
        f"{f['people']:>9,} people + {f['entities'] - f['people']:,} groups: "
        f"RSS {f['rss_before'] / mib:,.0f} -> {f['rss_after'] / mib:,.0f} MiB "
        f"({f['rss_loaded'] / mib:,.0f} right after the load), "
        f"{per:,.0f} bytes/entity ({verdict}: target < {TARGET_BYTES:,}), "
        f"load {f['load_s']:.2f} s ({f['entities_per_s']:,.0f} entities/s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--people", type=int, default=100_000, help="people in the snapshot")
    ap.add_argument("--million", action="store_true", help="also measure 1,000,000 people")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.people)))
        return
    sizes = [args.people] + ([1_000_000] if args.million and args.people != 1_000_000 else [])
    for people in sizes:
        report(run(people))


if __name__ == "__main__":
    main()
