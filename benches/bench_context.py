"""Context service benchmark (docs/context.md, docs/benchmarks.md).

Everything runs against PostgreSQL (``SVC_TEST_POSTGRES_URL``, else
``scripts/dev-postgres.sh start``, as tests/conftest.py does), in a schema of its own dropped at
the end. The context service is a ``svc context serve`` process, as in production: SCIM with the
identity provider's bearer token, the ``/v1`` routes behind JWTs of a local issuer
(docs/auth.md; audience ``svc-context``, caller ``svc-bench``). It is a process of its own so
that the benchmark's clients do not share its interpreter.

What is measured
----------------
(a) SCIM creates: ``POST /scim/v2/Users`` one at a time (``--creates``), then with 8 clients at
    once (``--concurrent``), each user with the enterprise ``department`` and, but for the first
    of a run, a ``manager``; then ``POST /scim/v2/Groups`` with 10 members each
    (``--group-creates``). Reported: p50 and p99 of the request's latency as the client sees
    it, and requests per second.
(b) A snapshot of ``--people`` people (default 100,000) in ``--groups`` groups (10,000), each
    person in 1 to 3 groups, with a department, a title and a manager (a tree, 10 reports each).
    Provisioned in bulk through the service layer: documents validated by scim2-models as a SCIM
    create validates them, rows written by ``ContextService.write()`` transactions of 5,000 people
    (so the changes are numbered as every write numbers them), and a sample of 200 principal
    records checked equal to what the service's own projection (``human_entity``,
    ``group_entity``) makes of the stored rows. Then:
    - ``GET /v1/principals``: p50 of ``--runs`` runs, the body's size;
    - the load into a decision point: ``svc.pdp.context_follower.follow_context`` into an
      ``Engine`` behind a ``Server``, from the start of the request until ``loaded`` is set,
      and entities per second;
    - SCIM reads at that size: ``userName eq``, ``externalId eq``, ``displayName eq`` (groups,
      ``excludedAttributes=members``), the first page and a page deep in ``GET /Users``
      (``startIndex``), ``userName sw`` (its column scanned), one filter only scim2-models
      answers (``name.familyName eq``, every user matched; once), and ``POST /Users`` at that
      size.
(c) Change to applied, with the snapshot of (b) loaded: ``--changes`` SCIM PATCHes in turn
    deactivate, reactivate, add to the group ``readers`` and remove from it one of 4 people; for
    each, the time from the SCIM response until the listener's decision changes, asked over
    HTTP every ``--poll-ms``. Reported: p50, p99, max. Target: p99 under 1 s.

Run: ``.venv/bin/python benches/bench_context.py`` (full size, several minutes), or ``--quick``
(2,000 people, 200 groups). Needs the release build of the extension (``make build``). Benches
report; they do not assert, but for the sanity checks they make on their own setup.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert
from sqlmodel import select

from _support import Schema, ServiceProcess, free_port, pct, postgres_url
from svc.common.auth import LOCAL_ISSUER, LocalIssuer
from svc.context.models import MemberRow, PrincipalRow, ScimGroupRow, ScimUserRow
from svc.context.scim import UserModel, _doc
from svc.context.service import ContextService, group_entity, human_entity
from svc.context.settings import ContextSettings
from svc.pdp import Engine, Server
from svc.pdp.context_follower import BearerToken, follow_context

SCIM_TOKEN = "bench-" + "s" * 40
CALLER = "svc-bench"
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"

#: The base schema's principal types (docs/architecture.md#entities-and-the-base-schema), as
#: tests/test_context_follow.py declares them, and one resource type.
SCHEMA = """
entity Group in [Group];
entity WorkItem;
entity Human in [Group] = {
  active: Bool,
  department: String,
  title: String,
  manager?: Human,
};
entity ServiceAccount in [Group] = {
  owner: Human,
  ai: Bool,
  registered: Bool,
  app: String,
  description?: String,
};
entity Document = { department: String, sensitivity: String };
action read appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
"""

POLICIES = """
@id("inactive-people-denied")
forbid (principal is Human, action, resource) unless { principal.active };

@id("readers-read-public")
permit (principal in Group::"readers", action == Action::"read", resource is Document)
when { resource.sensitivity == "public" };

@id("own-department")
permit (principal is Human, action == Action::"read", resource is Document)
when { principal.department == resource.department };
"""

DEPARTMENTS = [f"dept-{i:02d}" for i in range(50)]
TITLES = ["Engineer", "Analyst", "Manager", "Designer", "Recruiter", "Accountant"]
PROBES = 4


class ContextProcess(ServiceProcess):
    """``svc context serve`` on a free port, JWT auth from `issuer`; ``url`` once ready."""

    def __init__(self, database_url: str, issuer: LocalIssuer) -> None:
        port = free_port()
        env = {
            "SVC_CONTEXT_SCIM_TOKEN": SCIM_TOKEN,
            "SVC_CONTEXT_AUTH_ISSUER": LOCAL_ISSUER,
            "SVC_CONTEXT_AUTH_JWKS": issuer.jwks_url,
            "SVC_CONTEXT_AUTH_CALLERS": CALLER,
        }
        args = ["context", "serve", "--port", str(port), "--database-url", database_url]
        super().__init__(args, port, env)


def person_doc(i: int, manager_id: str | None, scim_base: str, tag: str = "p") -> dict[str, Any]:
    """The SCIM document of person `i`, as an identity provider sends it."""
    name = f"{tag}{i:06d}@bench.example"
    ext: dict[str, Any] = {"department": DEPARTMENTS[i % len(DEPARTMENTS)]}
    if manager_id is not None:
        ext["manager"] = {"value": manager_id, "$ref": f"{scim_base}/Users/{manager_id}"}
    return {
        "schemas": [USER, ENTERPRISE],
        "userName": name,
        "externalId": f"ext-{tag}{i:06d}",
        "name": {"givenName": f"{tag.upper()}{i}", "familyName": "Bench"},
        "displayName": f"{tag.upper()}{i} Bench",
        "title": TITLES[i % len(TITLES)],
        "active": True,
        "emails": [{"primary": True, "value": name, "type": "work"}],
        ENTERPRISE: ext,
    }


def timed(
    fn: Callable[[int], httpx.Response], n: int, threads: int = 1
) -> tuple[list[float], float]:
    """Calls ``fn(k)`` for k in 0..n-1 on `threads` threads; latencies (ms) and wall seconds.

    Each call must answer 201 (created); anything else stops the benchmark.
    """
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []

    def run(ks: range) -> None:
        mine = []
        for k in ks:
            t0 = time.perf_counter()
            r = fn(k)
            mine.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 201:
                errors.append(f"{r.status_code} {r.text[:300]}")
                return
        with lock:
            latencies.extend(mine)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=run, args=(range(t, n, threads),)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a create failed: {errors[0]}")
    return latencies, wall


def report(label: str, ms: list[float], wall: float) -> None:
    print(
        f"    {label}: {len(ms):,} requests, p50 {pct(ms, 0.5):.1f} ms, "
        f"p99 {pct(ms, 0.99):.1f} ms, {len(ms) / wall:,.0f}/s"
    )


def scim_creates(ctx: ContextProcess, creates: int, concurrent: int, group_creates: int) -> None:
    print("(a) SCIM creates")
    headers = {"Authorization": f"Bearer {SCIM_TOKEN}"}
    base = f"{ctx.url}/scim/v2"
    clients = [httpx.Client(base_url=base, headers=headers, timeout=60) for _ in range(8)]
    ids: list[str] = []
    try:

        def make(offset: int, threads: int) -> Callable[[int], httpx.Response]:
            def create(k: int) -> httpx.Response:
                first = ids[0] if ids else None
                doc = person_doc(offset + k, first, base, tag="a")
                r = clients[k % threads].post("/Users", json=doc)
                if r.status_code == 201 and len(ids) < 1000:
                    ids.append(r.json()["id"])
                return r

            return create

        ms, wall = timed(make(0, 1), creates)
        report("POST /Users, 1 client ", ms, wall)
        ms, wall = timed(make(creates, 8), concurrent, threads=8)
        report("POST /Users, 8 clients", ms, wall)

        def group(k: int) -> httpx.Response:
            members = [{"value": ids[(k * 10 + j) % len(ids)]} for j in range(10)]
            body = {"schemas": [GROUP], "displayName": f"a-group-{k}", "members": members}
            return clients[0].post("/Groups", json=body)

        ms, wall = timed(group, group_creates)
        report("POST /Groups (10 members), 1 client", ms, wall)
    finally:
        for c in clients:
            c.close()


class Directory:
    """What (b) provisioned: SCIM ids of people by index, of groups by name."""

    def __init__(self) -> None:
        self.people: list[str] = []
        self.groups: dict[str, str] = {}
        self.probes: list[str] = []


def provision(service: ContextService, scim_base: str, people: int, groups: int) -> Directory:
    """Writes the (b) directory in bulk through the service layer (module docs)."""
    rng = random.Random(25)
    now = datetime.now(UTC)
    out = Directory()
    out.people = [uuid.uuid4().hex for _ in range(people)]
    names = [f"grp-{g:05d}" for g in range(groups)] + ["readers"]
    out.groups = {n: uuid.uuid4().hex for n in names}
    member_of: list[list[int]] = [
        sorted(rng.sample(range(groups), rng.randint(1, 3))) for _ in range(people)
    ]
    t0 = time.perf_counter()
    chunk = 5_000
    for start in range(0, people, chunk):
        users, principals = [], []
        for i in range(start, min(people, start + chunk)):
            manager = out.people[(i - 1) // 10] if i > 0 else None
            doc = _doc(UserModel.model_validate(person_doc(i, manager, scim_base)))
            t = now + timedelta(microseconds=i)
            users.append(
                {
                    "id": out.people[i],
                    "user_name": doc["userName"],
                    "user_name_key": doc["userName"].casefold(),
                    "external_id": doc["externalId"],
                    "active": True,
                    "manager_id": manager,
                    "removed_at": None,
                    "doc": doc,
                    "version": 1,
                    "created_at": t,
                    "updated_at": t,
                }
            )
            attrs: dict[str, Any] = {
                "active": True,
                "department": doc[ENTERPRISE]["department"],
                "title": doc["title"],
            }
            if manager is not None:
                mname = f"p{(i - 1) // 10:06d}@bench.example"
                attrs["manager"] = {"__entity": {"type": "Human", "id": mname}}
            entity = {
                "uid": {"type": "Human", "id": doc["userName"]},
                "attrs": attrs,
                "parents": [{"type": "Group", "id": names[g]} for g in member_of[i]],
            }
            principals.append((doc["userName"], entity))
        with service.write() as tx:
            tx.session.execute(insert(ScimUserRow), users)
            tx.session.execute(
                insert(PrincipalRow),
                [{"kind": "Human", "id": n, "value": v, "removed": False} for n, v in principals],
            )
            for n, v in principals:
                tx.emit("principals", "Human", n, v)
    members: dict[str, list[int]] = {n: [] for n in names}
    for i, gs in enumerate(member_of):
        for g in gs:
            members[names[g]].append(i)
    for start in range(0, len(names), chunk):
        rows, mrows, principals = [], [], []
        for k, name in enumerate(names[start : start + chunk]):
            gid = out.groups[name]
            ms = sorted((out.people[i], i) for i in members[name])
            gdoc: dict[str, Any] = {"schemas": [GROUP], "displayName": name}
            if ms:
                gdoc["members"] = [{"value": mid, "type": "User"} for mid, _ in ms]
            t = now + timedelta(seconds=1, microseconds=start + k)
            rows.append(
                {
                    "id": gid,
                    "display_name": name,
                    "display_name_key": name.casefold(),
                    "external_id": None,
                    "doc": gdoc,
                    "version": 1,
                    "created_at": t,
                    "updated_at": t,
                }
            )
            mrows += [{"group_id": gid, "member_id": mid, "member_type": "User"} for mid, _ in ms]
            entity = {"uid": {"type": "Group", "id": name}, "attrs": {}, "parents": []}
            principals.append((name, entity))
        with service.write() as tx:
            tx.session.execute(insert(ScimGroupRow), rows)
            if mrows:
                tx.session.execute(insert(MemberRow), mrows)
            tx.session.execute(
                insert(PrincipalRow),
                [{"kind": "Group", "id": n, "value": v, "removed": False} for n, v in principals],
            )
            for n, v in principals:
                tx.emit("principals", "Group", n, v)
    secs = time.perf_counter() - t0
    # The records written equal the service's projection of the rows.
    with service.read() as s:
        for i in rng.sample(range(people), min(people, 150)):
            row = s.get(ScimUserRow, out.people[i])
            assert row is not None
            rec = s.get(PrincipalRow, ("Human", row.user_name))
            assert rec is not None and rec.value == human_entity(s, row), row.user_name
        for name in rng.sample(names, min(len(names), 50)):
            grow = s.exec(select(ScimGroupRow).where(ScimGroupRow.display_name == name)).one()
            rec = s.get(PrincipalRow, ("Group", name))
            assert rec is not None and rec.value == group_entity(s, grow), name
    print(
        f"    provisioned {people:,} people in {groups:,} groups "
        f"({sum(len(g) for g in member_of):,} memberships) in bulk in {secs:.1f} s"
    )
    return out


class Scim:
    """The SCIM client of (b) and (c)."""

    def __init__(self, ctx: ContextProcess) -> None:
        self.base = f"{ctx.url}/scim/v2"
        self.http = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {SCIM_TOKEN}"}, timeout=600
        )

    def ok(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = self.http.request(method, path, **kw)
        if r.status_code not in (200, 201, 204):
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r


def timed_get(
    client: httpx.Client, path: str, runs: int, **params: Any
) -> tuple[float, httpx.Response]:
    """p50 (ms) of `runs` GETs of `path`, and the last answer."""
    ms = []
    r = None
    for _ in range(runs):
        t0 = time.perf_counter()
        r = client.get(path, params=params)
        ms.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
    assert r is not None
    return statistics.median(ms), r


def scim_reads(scim: Scim, people: int, runs: int) -> None:
    mid = people // 2
    name = f"p{mid:06d}@bench.example"
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("userName eq", "/Users", {"filter": f'userName eq "{name.upper()}"'}, 1),
        ("externalId eq", "/Users", {"filter": f'externalId eq "ext-p{mid:06d}"'}, 1),
        (
            "displayName eq, excludedAttributes=members",
            "/Groups",
            {"filter": 'displayName eq "grp-00042"', "excludedAttributes": "members"},
            1,
        ),
        ("first page", "/Users", {}, -1),
        ("page at startIndex people/2", "/Users", {"startIndex": mid + 1, "count": 100}, 100),
    ]
    for label, path, params, expect in cases:
        ms, r = timed_get(scim.http, path, runs, **params)
        body = r.json()
        got = len(body.get("Resources", []))
        assert expect < 0 or got == expect, (label, got, body.get("totalResults"))
        print(
            f"    GET {path} {label}: p50 {ms:.1f} ms (totalResults {body['totalResults']:,}, "
            f"{got} returned)"
        )
    prefix = f"p{mid // 100:04d}"
    ms, r = timed_get(scim.http, "/Users", runs, filter=f'userName sw "{prefix}"', count=200)
    print(
        f"    GET /Users userName sw (its column scanned): p50 {ms:,.0f} ms "
        f"(totalResults {r.json()['totalResults']:,})"
    )
    ms, r = timed_get(scim.http, "/Users", 1, filter='name.familyName eq "Nobody"', count=200)
    print(
        f"    GET /Users name.familyName eq (every user matched by scim2-models; once): "
        f"{ms:,.0f} ms (totalResults {r.json()['totalResults']:,})"
    )


class Listener:
    """A decision point: an ``Engine`` behind a real ``Server``, following the service."""

    def __init__(self) -> None:
        self.engine = Engine(POLICIES, SCHEMA)
        self.server = Server(self.engine, port=0, workers=1)
        self.server.start()
        self.server.set_ready(containments=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=60)

    def verdict(self, user_name: str, doc: str) -> str:
        r = self.http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "Human", "id": user_name},
                "action": "read",
                "resource": {"type": "Document", "id": doc},
            },
        )
        r.raise_for_status()
        return str(r.json()["verdict"])

    def wait_verdict(self, user_name: str, doc: str, want: str, poll: float) -> float:
        """Asks until the verdict is `want`; returns ``perf_counter()`` of that answer."""
        while True:
            v = self.verdict(user_name, doc)
            t = time.perf_counter()
            if v == want:
                return t
            time.sleep(poll)

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


def snapshot_and_changes(
    ctx: ContextProcess,
    issuer: LocalIssuer,
    service: ContextService,
    people: int,
    groups: int,
    runs: int,
    changes: int,
    poll_ms: float,
) -> None:
    print(f"(b) snapshot of {people:,} people in {groups:,} groups")
    scim = Scim(ctx)
    directory = provision(service, scim.base, people, groups)
    # The subjects of (c): people of their own department, and the two documents.
    for k in range(PROBES):
        doc = person_doc(k, None, scim.base, tag="probe")
        doc[ENTERPRISE]["department"] = "probe"
        directory.probes.append(scim.ok("POST", "/Users", json=doc).json()["id"])
    auth = BearerToken.from_issuer(issuer, CALLER)
    api = httpx.Client(base_url=ctx.url, auth=auth, timeout=600)
    docs = [
        {
            "type": "Document",
            "id": "probe-doc",
            "attrs": {"department": "probe", "sensitivity": "x"},
        },
        {
            "type": "Document",
            "id": "public-doc",
            "attrs": {"department": "-", "sensitivity": "public"},
        },
    ]
    r = api.post("/v1/resources", json={"resources": docs})
    r.raise_for_status()

    ms, r = timed_get(api, "/v1/principals", runs)
    snap = r.json()
    entities = sum(1 for p in snap["principals"] if p["kind"] in ("Human", "Group"))
    print(
        f"    GET /v1/principals: p50 {ms:,.0f} ms over {runs} runs, "
        f"{len(r.content) / 2**20:,.1f} MiB, {len(snap['principals']):,} records "
        f"(principals_version {snap['principals_version']:,})"
    )
    del snap, r
    scim_reads(scim, people, runs)
    more = max(runs * 40, 100)

    def create(k: int) -> httpx.Response:
        doc = person_doc(k, directory.people[k], scim.base, tag="late")
        return scim.http.post("/Users", json=doc)

    late, wall = timed(create, more)
    report(f"POST /Users at {people:,} people, 1 client", late, wall)

    listener = Listener()
    try:
        t0 = time.perf_counter()
        follower = follow_context(listener.engine, listener.server, ctx.url, auth, wait_secs=10)
        try:
            follower.loaded.wait()
            secs = time.perf_counter() - t0
            print(
                f"    load into a decision point (follow_context, request to applied): "
                f"{secs:.2f} s, {entities / secs:,.0f} entities/s "
                f"(refused {follower.status.refused})"
            )
            follower.wait_for(lambda s: s.resources_version > 0)
            change_latency(scim, listener, directory, changes, poll_ms)
        finally:
            follower.stop()
    finally:
        listener.stop()
        api.close()
        scim.http.close()


def change_latency(
    scim: Scim, listener: Listener, directory: Directory, changes: int, poll_ms: float
) -> None:
    print(f"(c) change to applied, {changes} SCIM PATCHes, listener asked every {poll_ms:g} ms")
    readers = directory.groups["readers"]
    poll = poll_ms / 1000
    for k in range(PROBES):
        name = f"probe{k:06d}@bench.example"
        assert listener.verdict(name, "probe-doc") == "allow", name
        assert listener.verdict(name, "public-doc") == "deny", name
    latencies: dict[str, list[float]] = {
        "deactivate": [],
        "reactivate": [],
        "add": [],
        "remove": [],
    }
    patch_ms: list[float] = []
    for n in range(changes):
        step = n % 4
        k = (n // 4) % PROBES
        uid = directory.probes[k]
        name = f"probe{k:06d}@bench.example"
        if step in (0, 1):
            active = step == 1
            path = f"/Users/{uid}"
            ops: list[dict[str, Any]] = [{"op": "replace", "value": {"active": active}}]
            doc, want, kind = (
                "probe-doc",
                "allow" if active else "deny",
                ("reactivate" if active else "deactivate"),
            )
        elif step == 2:
            path = f"/Groups/{readers}"
            ops = [{"op": "add", "path": "members", "value": [{"value": uid}]}]
            doc, want, kind = "public-doc", "allow", "add"
        else:
            path = f"/Groups/{readers}"
            ops = [{"op": "remove", "path": f'members[value eq "{uid}"]'}]
            doc, want, kind = "public-doc", "deny", "remove"
        t0 = time.perf_counter()
        scim.ok("PATCH", path, json={"schemas": [PATCH], "Operations": ops})
        t1 = time.perf_counter()
        seen = listener.wait_verdict(name, doc, want, poll)
        patch_ms.append((t1 - t0) * 1000)
        latencies[kind].append((seen - t1) * 1000)
    every = [x for v in latencies.values() for x in v]
    print(
        f"    SCIM response to decision changed: p50 {pct(every, 0.5):.1f} ms, "
        f"p99 {pct(every, 0.99):.1f} ms, max {max(every):.1f} ms; target p99 < 1000 ms: "
        f"{'met' if pct(every, 0.99) < 1000 else 'MISS'}"
    )
    for kind, v in latencies.items():
        if v:
            print(f"      {kind:10} p50 {pct(v, 0.5):.1f} ms, p99 {pct(v, 0.99):.1f} ms")
    print(
        f"    the PATCH itself: p50 {pct(patch_ms, 0.5):.1f} ms, p99 {pct(patch_ms, 0.99):.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--creates", type=int, default=1000, help="(a): sequential user creates")
    ap.add_argument("--concurrent", type=int, default=2000, help="(a): creates by 8 clients")
    ap.add_argument("--group-creates", type=int, default=200, help="(a): group creates")
    ap.add_argument("--people", type=int, default=100_000, help="(b): people in the snapshot")
    ap.add_argument("--groups", type=int, default=10_000, help="(b): groups in the snapshot")
    ap.add_argument("--runs", type=int, default=5, help="(b): GETs timed per route")
    ap.add_argument("--changes", type=int, default=200, help="(c): SCIM PATCHes timed")
    ap.add_argument("--poll-ms", type=float, default=2.0, help="(c): the listener's asking")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--skip", default="", help="parts to leave out, e.g. `a`")
    args = ap.parse_args()
    if args.quick:
        args.creates, args.concurrent, args.group_creates = 100, 200, 20
        args.people, args.groups, args.runs, args.changes = 2_000, 200, 3, 40
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    schema = Schema(postgres_url(), "ctxbench")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-context-") as tmp:
            issuer = LocalIssuer(Path(tmp) / "issuer")
            if "a" not in args.skip:
                sub = Schema(postgres_url(), "ctxbench")
                ctx = ContextProcess(sub.url_text, issuer)
                try:
                    scim_creates(ctx, args.creates, args.concurrent, args.group_creates)
                finally:
                    ctx.stop()
                    sub.drop()
            if "b" not in args.skip:
                ctx = ContextProcess(schema.url_text, issuer)
                service = ContextService(ContextSettings(database_url=schema.url_text))
                try:
                    snapshot_and_changes(
                        ctx,
                        issuer,
                        service,
                        args.people,
                        args.groups,
                        args.runs,
                        args.changes,
                        args.poll_ms,
                    )
                finally:
                    service.close()
                    ctx.stop()
    finally:
        schema.drop()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
