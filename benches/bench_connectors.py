"""Connectors benchmark (docs/connectors.md, docs/benchmarks.md).

A ``svc context serve`` process on PostgreSQL (a schema of its own, dropped at the end), the fake
Google Drive and Jira APIs (``svc.demo.fake_drive``, ``svc.demo.fake_jira``) served over HTTP on
127.0.0.1 by this process, and ``svc connectors serve`` as a process of its own, as in
production. ``--people`` people are provisioned over SCIM first (each with an email), a group
per 50 of them.

What is measured
----------------
(a) First sync: ``--files`` Drive files (in folders of 1,000; each owned by one person, shared
    with two more and a group, a tenth of them readable by anyone with the link, a label) and
    ``--issues`` Jira issues (a third closed; each assigned, with a remote link to a file and
    an issue link). From the connectors' start until its ``/readyz`` answers 200 (both
    connectors at the head of their source, everything written); items per second is
    (files + issues) over that time. Also the context service's resources and work items
    counted after.
(b) Change at the source to changed decision, with the connectors at ``--poll-secs`` (default:
    the setting's default, 10 s) and a decision point (an ``Engine`` behind a ``Server``,
    following the context service with ``follow_context``): ``--changes`` times in turn, a file
    is shared with a person who could not read it (Drive) or an issue an agent works on is
    closed (Jira); the time from the change in the fake until the decision point's verdict
    for that person (or agent) flips, asked every ``--probe-ms``. Each change is made a random
    time (0 to one poll interval) after the previous one flipped, so changes land anywhere in
    the poll cycle. Reported: p50, p99, max. Target: under one poll interval plus 1 s.

Run: ``.venv/bin/python benches/bench_connectors.py`` (100,000 files and 20,000 issues), or
``--quick`` (5,000 files, 1,000 issues, 6 changes). Benches report; they do not assert, but for
the sanity checks they make on their own setup.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from _support import Schema, ServiceProcess, free_port, pct, postgres_url
from svc.common.net import tcp_listener
from svc.demo import fake_drive, fake_jira
from svc.pdp import Engine, Server
from svc.pdp.context_follower import follow_context

SCHEMA = """
entity Group in [Group];
entity Folder in [Folder];
entity WorkItem;
entity Ticket;
entity Human in [Group] = { active: Bool, department: String, title: String, manager?: Human };
entity ServiceAccount in [Group] = {
  owner: Human, ai: Bool, registered: Bool, app: String, description?: String,
};
entity Document in [Folder] = {
  owner?: Human, department: String, sensitivity: String, tags: Set<String>,
  shared_with: Set<Human>, shared_with_groups: Set<Group>, link_sharing: String,
  mime_type: String, labels: Set<String>, modified_at: String,
};
type DecisionContext = {
  risk_score?: Long, human_present?: Bool, agent?: ServiceAccount, work_item?: WorkItem,
  assigned?: Bool,
};
action read appliesTo {
  principal: [Human, ServiceAccount], resource: [Document], context: DecisionContext,
};
"""
POLICIES = """
permit (principal is Human, action == Action::"read", resource is Document)
when { resource has owner && resource.owner == principal };
permit (principal is Human, action == Action::"read", resource is Document)
when { resource.shared_with.contains(principal) };
permit (principal is Human, action == Action::"read", resource is Document)
when { principal in resource.shared_with_groups };
permit (principal is Human, action == Action::"read", resource is Document)
when { resource.link_sharing == "anyone" };
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { context has assigned && context.assigned };
"""
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
SCIM_TOKEN = "scim-" + "b" * 40


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 in a thread of this process."""

    def __init__(self, app: Any) -> None:
        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(1024)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


def email(i: int) -> str:
    return f"p{i:05d}@example.com"


def provision(url: str, people: int) -> None:
    """People over SCIM (4 clients), then a group per 50 of them."""
    scim = httpx.Client(
        base_url=f"{url}/scim/v2", headers={"authorization": f"Bearer {SCIM_TOKEN}"}, timeout=60
    )
    ids: list[str] = [""] * people

    def make(part: range) -> None:
        with httpx.Client(
            base_url=f"{url}/scim/v2",
            headers={"authorization": f"Bearer {SCIM_TOKEN}"},
            timeout=60,
        ) as c:
            for i in part:
                r = c.post(
                    "/Users",
                    json={
                        "schemas": [USER],
                        "userName": email(i),
                        "emails": [{"value": email(i), "primary": True, "type": "work"}],
                        "active": True,
                    },
                )
                assert r.status_code == 201, r.text
                ids[i] = r.json()["id"]

    threads = [threading.Thread(target=make, args=(range(k, people, 4),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g in range(0, people, 50):
        members = [{"value": ids[i]} for i in range(g, min(g + 50, people))]
        r = scim.post(
            "/Groups",
            json={"schemas": [GROUP], "displayName": f"team{g // 50}", "members": members},
        )
        assert r.status_code == 201, r.text
    scim.close()


def seed(
    drive: fake_drive.FakeDrive, jira: fake_jira.FakeJira, files: int, issues: int, people: int
) -> None:
    rng = random.Random(42)
    for f in range(max(1, files // 1000)):
        drive.put_file(
            f"folder{f}", f"folder {f}", owner=email(0), mime_type=fake_drive.FOLDER_MIME
        )
    for i in range(files):
        owner = rng.randrange(people)
        readers = rng.sample(range(people), 2)
        perms: list[dict[str, Any]] = [
            {"type": "user", "role": "owner", "emailAddress": email(owner)}
        ]
        perms += [{"type": "user", "role": "reader", "emailAddress": email(r)} for r in readers]
        perms.append(
            {
                "type": "group",
                "role": "reader",
                "emailAddress": f"team{rng.randrange(people // 50 or 1)}@example.com",
            }
        )
        if i % 10 == 0:
            perms.append({"type": "anyone", "role": "reader"})
        drive.put_file(
            f"file{i:06d}",
            f"file {i}",
            owner=email(owner),
            parents=[f"folder{i // 1000}"],
            permissions=perms,
            labels=[
                {
                    "id": "cls",
                    "fields": {"level": {"valueType": "selection", "selection": ["internal"]}},
                }
            ],
        )
    for i in range(issues):
        jira.put_issue(
            f"OPS-{i + 1}",
            summary=f"issue {i}",
            category=("new", "indeterminate", "done")[i % 3],
            assignee=email(rng.randrange(people)),
            links=[("relates to", "outward", f"OPS-{rng.randrange(issues) + 1}")],
            remote_links=[f"https://drive.google.com/file/d/file{rng.randrange(files):06d}/view"],
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--issues", type=int, default=20_000)
    ap.add_argument("--people", type=int, default=500)
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--poll-secs", type=float, default=10.0)
    ap.add_argument("--probe-ms", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.files, args.issues, args.changes = 5_000, 1_000, 6

    tmp = Path(tempfile.mkdtemp(prefix="bench-connectors-"))
    schema = Schema(postgres_url(), "bench_conn")
    drive = fake_drive.FakeDrive(token="bench-drive-token")
    jira = fake_jira.FakeJira()
    t0 = time.perf_counter()
    seed(drive, jira, args.files, args.issues, args.people)
    print(f"seeded {args.files} files, {args.issues} issues in {time.perf_counter() - t0:.1f} s")
    drive_srv = Served(fake_drive.create_app(drive))
    jira_srv = Served(fake_jira.create_app(jira))
    (tmp / "drive.token").write_text("bench-drive-token")
    (tmp / "jira.token").write_text(jira.api_token)
    cport = free_port()
    context = ServiceProcess(
        [
            "context",
            "serve",
            "--port",
            str(cport),
            "--database-url",
            schema.url_text,
            "--auth",
            "none",
        ],
        cport,
        env={"SVC_CONTEXT_SCIM_TOKEN": SCIM_TOKEN},
    )
    procs: list[ServiceProcess] = [context]
    pdp_server: Server | None = None
    follower = None
    try:
        t0 = time.perf_counter()
        provision(context.url, args.people)
        print(f"provisioned {args.people} people in {time.perf_counter() - t0:.1f} s")
        ctx = httpx.Client(base_url=context.url, timeout=60)
        r = ctx.post(
            "/v1/service-accounts",
            json={"service_accounts": [{"id": "copilot.bot", "owner": email(0), "ai": True}]},
        )
        assert r.status_code == 200, r.text

        # (a) the first sync
        port = free_port()
        env = {
            "SVC_CONNECTORS_PORT": str(port),
            "SVC_CONNECTORS_CONTEXT_URL": context.url,
            "SVC_CONNECTORS_STATE_PATH": str(tmp / "state.db"),
            "SVC_CONNECTORS_POLL_SECS": str(args.poll_secs),
            "SVC_CONNECTORS_DRIVE_URL": drive_srv.url,
            "SVC_CONNECTORS_DRIVE_TOKEN_FILE": str(tmp / "drive.token"),
            "SVC_CONNECTORS_DRIVE_SENSITIVITY_FIELD": "cls.level",
            "SVC_CONNECTORS_JIRA_URL": jira_srv.url,
            "SVC_CONNECTORS_JIRA_EMAIL": jira.email,
            "SVC_CONNECTORS_JIRA_API_TOKEN_FILE": str(tmp / "jira.token"),
            "SVC_CONNECTORS_JIRA_PAGE_SIZE": "1000",
        }
        t0 = time.perf_counter()
        connectors = ServiceProcess(["connectors", "serve"], port, env=env)
        took = time.perf_counter() - t0
        procs.append(connectors)
        rows = ctx.get("/metrics").text
        counts = {
            line.split('"')[1]: float(line.split()[-1])
            for line in rows.splitlines()
            if line.startswith("svc_context_rows{")
        }
        items = args.files + args.files // 1000 + args.issues
        print(
            f"(a) first sync: {args.files} files + {max(1, args.files // 1000)} folders + "
            f"{args.issues} issues in {took:.1f} s = {items / took:.0f} items/s "
            f"(context rows: {counts})"
        )

        # (b) change to decision
        engine = Engine(POLICIES, SCHEMA)
        pdp_server = Server(engine, port=0, workers=1, await_principals=True)
        pdp_server.start()
        pdp_server.set_ready(bundle=True, containments=True)
        follower = follow_context(
            engine, pdp_server, context.url, wait_secs=5, fetch_timeout_ms=30_000
        )
        follower.loaded.wait()
        pdp = httpx.Client(base_url=f"http://127.0.0.1:{pdp_server.port}", timeout=60)

        def verdict(principal: dict[str, str], doc: str, **extra: Any) -> str:
            r = pdp.post(
                "/v1/access/evaluation",
                json={
                    "principal": principal,
                    "action": "read",
                    "resource": {"type": "Document", "id": doc},
                    **extra,
                },
            )
            assert r.status_code == 200, r.text
            return str(r.json()["verdict"])

        rng = random.Random(7)
        lat: list[float] = []
        for k in range(args.changes):
            # A change lands anywhere in the poll cycle, not right after the previous one.
            time.sleep(rng.uniform(0, args.poll_secs))
            if k % 2 == 0:  # share a file with someone new
                while True:
                    i = rng.randrange(args.files)
                    if i % 10:
                        break
                fid = f"file{i:06d}"
                perms = drive.permissions[fid]
                holders = {str(p.get("emailAddress")) for p in perms}
                team = next(str(p["emailAddress"]) for p in perms if p["type"] == "group")
                person = next(
                    email(j)
                    for j in rng.sample(range(args.people), args.people)
                    if email(j) not in holders and f"team{j // 50}@example.com" != team
                )
                who = {"type": "Human", "id": person}
                assert verdict(who, f"gdrive:{fid}") == "deny"
                new = [{n: v for n, v in p.items() if n not in ("kind", "id")} for p in perms]
                new.append({"type": "user", "role": "reader", "emailAddress": person})
                start = time.perf_counter()
                drive.set_permissions(fid, new)
                while verdict(who, f"gdrive:{fid}") != "allow":
                    time.sleep(args.probe_ms / 1000)
            else:  # close an open issue an agent works on
                while True:
                    i = rng.randrange(args.issues)
                    if i % 3 != 2:
                        break
                key = f"OPS-{i + 1}"
                link = jira.remote_links[key][0]["object"]["url"].split("/")[-2]
                agent = {"type": "ServiceAccount", "id": "copilot.bot"}
                wid = f"jira:{key}"
                if verdict(agent, f"gdrive:{link}", work_item_id=wid) != "allow":
                    continue
                issue = jira.issues[key]
                start = time.perf_counter()
                jira.put_issue(
                    key,
                    category="done",
                    assignee=issue["fields"]["assignee"]["emailAddress"],
                )
                while verdict(agent, f"gdrive:{link}", work_item_id=wid) != "deny":
                    time.sleep(args.probe_ms / 1000)
            lat.append(time.perf_counter() - start)
            print(f"  change {len(lat)} ({'drive' if k % 2 == 0 else 'jira'}): {lat[-1]:.2f} s")
        print(
            f"(b) change to decision, poll {args.poll_secs:g} s, {len(lat)} changes: "
            f"p50 {pct(lat, 0.5):.2f} s, p99 {pct(lat, 0.99):.2f} s, max {max(lat):.2f} s "
            f"(target under {args.poll_secs + 1:g} s)"
        )
        pdp.close()
        ctx.close()
    finally:
        if follower is not None:
            follower.stop()
        if pdp_server is not None:
            pdp_server.stop()
        for p in reversed(procs):
            p.stop()
        drive_srv.stop()
        jira_srv.stop()
        schema.drop()


if __name__ == "__main__":
    main()
