"""Dry runs with the directory against the bundle alone (docs/policy.md#dry-runs).

What is measured
----------------
``PolicyService.dry_run`` over N recorded checks (chDB, in this process) of 1,000 people
(provisioned over SCIM into a real ``svc context serve`` process on PostgreSQL from
``scripts/dev-postgres.sh``, in 20 groups, with departments) reading 1,000 documents (stored
through ``/v1/resources``, each with a department and a sensitivity). The checks were decided
as the decision point decides them, with the directory's records. The draft adds a policy no
recorded check meets, so a faithful dry run shows no change.

Two ways, alternately in one process, ``--runs`` each:

* **directory** (now): the policy service given the context service (``context_url``): one
  principals snapshot per dry run plus the records' resources read by id in batches of 500;
* **bundle** (the peer, the previous design): the same service without a context service, the
  bundle's own entities alone.

Reported per way: p50 and max seconds, decisions re-decided per second, and the counts
(the bundle alone shows the noise the directory removes). Load average at start and end.

Run: ``.venv/bin/python benches/bench_policy_dry_run.py [--decisions 10000] [--runs 5]``.
Benches report; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from _support import Schema, postgres_url
from bench_context import CALLER, GROUP, POLICIES, SCHEMA, SCIM_TOKEN, ContextProcess, person_doc
from svc import history
from svc.common.auth import LocalIssuer
from svc.policy.directory import DirectoryClient
from svc.policy.service import DryRunResult, PolicyService, bundle_engine
from svc.policy.settings import PolicySettings

PEOPLE = 1000
DOCS = 1000
GROUPS = 20
SENSITIVITY = ["public", "internal", "secret"]
DEPARTMENTS = [f"dept-{i:02d}" for i in range(50)]


def provision(ctx: ContextProcess, api: httpx.Client) -> list[str]:
    """1,000 people over SCIM, every fifth reader in one of 20 groups; 1,000 documents."""
    scim = httpx.Client(
        base_url=f"{ctx.url}/scim/v2",
        headers={"Authorization": f"Bearer {SCIM_TOKEN}"},
        timeout=60,
    )
    names, ids = [], []
    for i in range(PEOPLE):
        r = scim.post("/Users", json=person_doc(i, None, f"{ctx.url}/scim/v2"))
        r.raise_for_status()
        ids.append(r.json()["id"])
        names.append(r.json()["userName"])
    for g in range(GROUPS):
        name = "readers" if g == 0 else f"team-{g:02d}"
        members = [{"value": ids[i]} for i in range(g, PEOPLE, GROUPS)]
        body = {"schemas": [GROUP], "displayName": name, "members": members}
        scim.post("/Groups", json=body).raise_for_status()
    scim.close()
    docs = [
        {
            "type": "Document",
            "id": f"doc-{j:05d}",
            "attrs": {
                "department": DEPARTMENTS[j % len(DEPARTMENTS)],
                "sensitivity": SENSITIVITY[j % len(SENSITIVITY)],
            },
        }
        for j in range(DOCS)
    ]
    for k in range(0, DOCS, 500):
        api.post("/v1/resources", json={"resources": docs[k : k + 500]}).raise_for_status()
    return names


def record(dsn: str, api: httpx.Client, names: list[str], n: int) -> None:
    """Decides n checks as the decision point would (the directory's records) and stores them."""
    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    engine = bundle_engine({"schema.cedarschema": SCHEMA, "policies.cedar": POLICIES})
    snap = api.get("/v1/principals").json()
    engine.upsert_entities(
        [p["value"] for p in snap["principals"] if p["kind"] in ("Human", "Group") and p["value"]]
    )
    refs = [{"type": "Document", "id": f"doc-{j:05d}"} for j in range(DOCS)]
    for k in range(0, DOCS, 500):
        found = api.post("/v1/resources/get", json={"resources": refs[k : k + 500]}).json()
        engine.upsert_entities(found["resources"])
    batch: list[Any] = []
    allowed = 0
    for i in range(n):
        who = names[i % PEOPLE]
        rec = engine.decide(
            {
                "principal": {"type": "Human", "id": who},
                "action": "read",
                "resource": {"type": "Document", "id": f"doc-{(i * 7919) % DOCS:05d}"},
            }
        )
        allowed += rec["verdict"] == "allow"
        batch.append(("d", 0, i, f"Human::{who}".encode(), json.dumps(rec).encode()))
        if len(batch) == 50_000:
            history.store(client, "decisions", batch)
            batch = []
    if batch:
        history.store(client, "decisions", batch)
    print(f"  {n:,} checks recorded ({allowed:,} allowed)")


def line(way: str, secs: list[float], r: DryRunResult) -> str:
    p50 = statistics.median(secs)
    return (
        f"  {way:9s} p50 {p50:.2f} s, max {max(secs):.2f} s, {r.decisions / p50:,.0f} "
        f"decisions/s; entities {r.entities}; unchanged {r.unchanged:,}, allow->deny "
        f"{r.allow_to_deny:,}, deny->allow {r.deny_to_allow:,}, errors {r.errors}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decisions", type=int, default=10_000, help="recorded checks")
    ap.add_argument("--runs", type=int, default=5, help="dry runs per way")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    schema = Schema(postgres_url(), "dryrunbench")
    with tempfile.TemporaryDirectory(prefix="bench-dry-run-") as tmp:
        root = Path(tmp)
        issuer = LocalIssuer(root / "issuer")
        ctx = ContextProcess(schema.url_text, issuer)
        api = httpx.Client(
            base_url=ctx.url,
            headers={"Authorization": f"Bearer {issuer.mint(CALLER, 'svc-context', 7200)}"},
            timeout=120,
        )
        try:
            t0 = time.perf_counter()
            names = provision(ctx, api)
            print(
                f"  {PEOPLE:,} people, {GROUPS} groups, {DOCS:,} documents provisioned in "
                f"{time.perf_counter() - t0:.1f} s"
            )
            dsn = f"chdb://{root / 'chdb'}?database=bench_dry_dir"
            record(dsn, api, names, args.decisions)
            draft = {
                "schema.cedarschema": SCHEMA,
                "policies.cedar": POLICIES
                + '\n@id("nobody-reads-drafts")\nforbid (principal, action, resource) '
                'when { resource has sensitivity && resource.sensitivity == "draft" };\n',
            }
            base = {"port": 0, "data_dir": root, "history_dsn": dsn}
            settings = PolicySettings(database_url=f"sqlite:///{root / 'p.db'}", **base)
            with_dir = PolicyService(
                settings,
                directory=DirectoryClient(ctx.url, lambda: issuer.mint(CALLER, "svc-context", 600)),
            )
            bundle_only = PolicyService(settings)
            v = with_dir.create_draft(draft, "bench").version
            since = datetime.now(UTC) - timedelta(hours=1)
            secs: dict[str, list[float]] = {"directory": [], "bundle": []}
            last: dict[str, DryRunResult] = {}
            for _ in range(args.runs):
                for way, service in (("directory", with_dir), ("bundle", bundle_only)):
                    t0 = time.perf_counter()
                    last[way] = service.dry_run(v, since, limit=args.decisions)
                    secs[way].append(time.perf_counter() - t0)
            print(f"dry run over {args.decisions:,} recorded checks, {args.runs} runs per way:")
            for way in ("directory", "bundle"):
                print(line(way, secs[way], last[way]))
            ratio = statistics.median(secs["directory"]) / statistics.median(secs["bundle"])
            print(f"  directory / bundle at p50: {ratio:.2f}x")
            with_dir.close()
            bundle_only.close()
        finally:
            api.close()
            ctx.stop()
            schema.drop()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
