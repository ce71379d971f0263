"""Demo traffic: checks, plans, list reports and app events for the demo company, over HTTP.

``scenarios`` turns a company into the requests to send, deterministically for a seed: first a
showcase (one or more checks and plans per rule of docs/decisions.md and docs/plans.md, each named
by ``scenario``), then routine traffic of people, agents acting for people and agents alone.
``drive`` sends them to a running decision point and intake, the way enforcement points and apps
would (docs/api.md, docs/intake.md#routes, docs/architecture.md#how-records-flow):

* checks on ``POST /v1/access/evaluation``, some on AuthZEN ``/access/v1/evaluation`` and
  ``/access/v1/evaluations``;
* plans on ``POST /v1/access/plan``, paged with ``plan_qid`` (the next pages come back
  ``pinned``), rows found with ``svc.plan.evaluate`` over the company's resources, and rows
  under ``unknown`` nodes checked one by one with an evaluation (``needs_row_checks``);
* a list report per page to intake: ``access: listed`` (``exported`` for a bulk export),
  ``count`` = rows shown, ``attributes.plan_qid`` = the plan's qid
  (docs/architecture.md#query-plans);
* an app event per allowed check (``read``, ``written``, ``exported``; ``download`` and
  ``export`` actions move data out) and for some refused ones (``outcome: failure``); agents'
  events carry ``on_behalf_of``, ``tool`` and ``action_class``.

Events go to ``POST /v1/events`` in batches of 500 with the intake token.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx

from svc.demo.company import Company, Resource
from svc.plan import evaluate, parse_filter

__all__ = [
    "EVENT_BATCH",
    "PAGE_SIZE",
    "AuthzenBatch",
    "CheckCase",
    "DriveReport",
    "PlanCase",
    "Step",
    "Traffic",
    "TrafficError",
    "drive",
    "scenarios",
]

Json = dict[str, Any]

#: Events per intake request (1 to 1,000 allowed, docs/intake.md#limits).
EVENT_BATCH = 500
#: Rows per page of a listing made from a plan.
PAGE_SIZE = 25

#: (resource type, action) -> (app, the app's own action word, kind of access).
_APP: dict[tuple[str, str], tuple[str, str, str | None]] = {
    ("Document", "read"): ("docs", "view", "read"),
    ("Document", "write"): ("docs", "edit", "written"),
    ("Document", "share"): ("docs", "share", None),
    ("Document", "delete"): ("docs", "delete", "written"),
    ("Document", "download"): ("docs", "download", "exported"),
    ("Document", "export"): ("docs", "export", "exported"),
    ("Ticket", "read"): ("helpdesk", "view_ticket", "read"),
    ("Ticket", "write"): ("helpdesk", "update_ticket", "written"),
    ("Customer", "read"): ("crm", "view_account", "read"),
    ("Customer", "write"): ("crm", "update_account", "written"),
    ("Customer", "export"): ("crm", "export", "exported"),
}


class TrafficError(RuntimeError):
    """The decision point or the intake refused a request the demo expected to succeed."""


@dataclass(frozen=True)
class CheckCase:
    """One check: ``request`` is the body of ``POST /v1/access/evaluation`` (docs/api.md).

    ``route`` ``authzen`` sends it as an AuthZEN evaluation instead (only for requests without
    ``on_behalf_of``, ``human_present`` or ``work_item_id``, which AuthZEN cannot carry).
    ``scenario`` names what it demonstrates (``routine`` for the bulk of traffic).
    """

    request: Json
    scenario: str
    route: Literal["evaluation", "authzen"] = "evaluation"


@dataclass(frozen=True)
class AuthzenBatch:
    """Checks of one subject sent together on ``/access/v1/evaluations`` (``execute_all``)."""

    cases: tuple[CheckCase, ...]


@dataclass(frozen=True)
class PlanCase:
    """One listing: ``request`` is the body of ``POST /v1/access/plan`` (docs/plans.md).

    The listing shows up to ``max_pages`` pages of ``PAGE_SIZE`` rows and reports each page
    to intake with ``access`` (``listed``, or ``exported`` for a bulk export).
    """

    request: Json
    scenario: str
    access: Literal["listed", "exported"] = "listed"
    max_pages: int = 3


Step = CheckCase | AuthzenBatch | PlanCase


@dataclass
class Traffic:
    """What ``drive`` sends, in order (``steps``)."""

    steps: list[Step]

    def checks(self) -> list[CheckCase]:
        """Every check, AuthZEN batches flattened, in sending order (row checks excluded)."""
        out: list[CheckCase] = []
        for s in self.steps:
            if isinstance(s, CheckCase):
                out.append(s)
            elif isinstance(s, AuthzenBatch):
                out.extend(s.cases)
        return out

    def plans(self) -> list[PlanCase]:
        """Every plan, in sending order."""
        return [s for s in self.steps if isinstance(s, PlanCase)]


def _h(user: str | None) -> Json | None:
    return None if user is None else {"type": "Human", "id": user}


def _sa(sa_id: str) -> Json:
    return {"type": "ServiceAccount", "id": sa_id}


def _ref(t: str, i: str) -> Json:
    return {"type": t, "id": i}


class _Picker:
    """Random choices over a company, from one ``random.Random``."""

    def __init__(self, company: Company, rng: random.Random) -> None:
        self.c = company
        self.rng = rng
        held = {*company.contained, *(u for u, s in company.risk_scores.items() if s >= 70)}
        self.normal = [p for p in company.people if p.active and p.user_name not in held]

    def people(self, group: str | None = None, *, exclude: str = "contractors") -> list[str]:
        """Active, uncontained, unscored people (in ``group``, not in ``exclude``)."""
        return [
            p.user_name
            for p in self.normal
            if (group is None or group in p.groups) and exclude not in p.groups
        ]

    def person(self, group: str | None = None, *, exclude: str = "contractors") -> str | None:
        """One of ``people(group, exclude=exclude)``, or None when there is none."""
        pool = self.people(group, exclude=exclude)
        return self.rng.choice(pool) if pool else None

    def doc(self, sens: str | None = None, **where: str | None) -> Resource | None:
        """A document of sensitivity ``sens`` whose attributes match ``where``.

        ``where`` keys are ``owner``, ``department`` and ``tag``, each optionally prefixed
        ``not_``; a None value matches nothing (the caller had no candidate).
        """
        if None in where.values():
            return None
        pool = [
            d
            for d in self.c.documents
            if (sens is None or d.attrs["sensitivity"] == sens)
            and all(_doc_has(d, k, v) for k, v in where.items())
        ]
        return self.rng.choice(pool) if pool else None

    def near(self, user: str, type_: str) -> Resource:
        """A resource the person is likely to use: owned, assigned or their department's.

        Customers count as the sales department's.
        """
        dept, me = self.c.person(user).department, {"__entity": _ref("Human", user)}
        pool = [
            r
            for r in self.c.resources(type_)
            if r.attrs.get("department", "sales") == dept
            or me in (r.attrs["owner"], r.attrs.get("assignee"))
        ]
        return self.rng.choice(pool or self.c.resources(type_))


def _doc_has(d: Resource, key: str, value: str | None) -> bool:
    _, neg, attr = key.rpartition("not_")
    got = (
        d.owner == value
        if attr == "owner"
        else value in d.attrs["tags"]
        if attr == "tag"
        else d.attrs[attr] == value
    )
    return got != bool(neg)


def _showcase(pick: _Picker) -> list[Step]:
    """One case per rule the bundle demonstrates (docs/demo.md); skips rules with no candidate."""
    c, rng, doc = pick.c, pick.rng, pick.doc
    steps: list[Step] = []

    def add(scenario: str, who: Json | None, action: str, res: Any, **extra: Any) -> None:
        if who is not None and res is not None:
            ref = res.ref if isinstance(res, Resource) else res
            steps.append(
                CheckCase({"principal": who, "action": action, "resource": ref, **extra}, scenario)
            )

    def plan(scenario: str, who: Json | None, action: str, type_: str, **extra: Any) -> None:
        access = extra.pop("access", "listed")
        if who is not None:
            req = {"principal": who, "action": action, "resource_type": type_, **extra}
            steps.append(PlanCase(req, scenario, access))

    owners = {d.owner for d in c.documents if d.attrs["sensitivity"] == "confidential"}
    user = rng.choice([u for u in pick.people() if u in owners] or pick.people())
    me, dept = _h(user), c.person(user).department
    mine = doc("internal", owner=user) or doc("public", owner=user)
    near = doc("internal", department=dept)
    add("department-read", me, "read", near)
    add(
        "cross-department-denied",
        me,
        "read",
        doc("confidential", not_department=dept, not_tag=dept, not_owner=user),
    )
    add("delete-step-up", me, "delete", mine)
    add("delete-nobody-present", me, "delete", mine, human_present=False)
    add("risk-step-up", me, "read", near, context={"risk_score": 80})
    add("risk-denied", me, "read", near, context={"risk_score": 95})
    add("export-approval", me, "export", doc("confidential", owner=user))
    add("secret-denied", _h(pick.person(exclude="security")), "read", doc("secret"))
    for p in c.people:
        if not p.active:
            add("leaver-denied", _h(p.user_name), "read", pick.near(p.user_name, "Document"))
    add(
        "contractor-download-denied",
        _h(pick.person("contractors", exclude="")),
        "download",
        doc("public"),
    )
    partner = pick.person("partner-managers")
    add("partner-share-justification", _h(partner), "share", doc("internal", not_owner=partner))
    restricted = [x for x in c.customers if x.attrs["sensitivity"] == "restricted"]
    plain = [x for x in c.customers if x.attrs["sensitivity"] != "restricted"]
    if restricted and plain:
        x = rng.choice(restricted)
        add("customer-export-approval", _h(x.owner), "export", x)
        add("billing-export-approval", _sa("billing.exporter"), "export", x)
        add("billing-export", _sa("billing.exporter"), "export", rng.choice(plain))
    for u, score in c.risk_scores.items():  # the reasoner's score replaces the one sent
        scenario = "contained" if u in c.contained else f"reasoner-score-{score}"
        add(scenario, _h(u), "read", pick.near(u, "Ticket"), context={"risk_score": 5})
        plan(f"{scenario}-listing", _h(u), "read", "Ticket")
    for sa in c.service_accounts:
        if not sa.registered:
            add("unregistered-agent", _sa(sa.id), "read", doc("public"))
            plan("unregistered-agent-listing", _sa(sa.id), "read", "Document")
    add("agent-for-person-read", _sa("copilot.assistant"), "read", near, on_behalf_of=me)
    secret = [
        d
        for d in c.documents
        if d.attrs["sensitivity"] == "secret" and c.person(d.owner) in pick.normal
    ]
    if secret:
        d = rng.choice(secret)
        add("agent-secret-stricter", _sa("copilot.assistant"), "read", d, on_behalf_of=_h(d.owner))
    auditor = pick.person("auditors")
    add("auditor-finance", _h(auditor), "read", doc("internal", department="finance"))
    bosses = {p.user_name: c.person(p.manager) for p in c.people if p.manager is not None}
    managed = [
        d
        for d in c.documents
        if d.attrs["sensitivity"] == "internal" and d.owner in bosses and bosses[d.owner].active
    ]
    d = rng.choice(  # prefer a manager in another department: only their policy allows
        [d for d in managed if bosses[d.owner].department != d.attrs["department"]] or managed
    )
    add("manager-reads-report", _h(bosses[d.owner].user_name), "read", d)
    for u, doc_id in c.grants[:3]:
        add("template-grant", _h(u), "read", _ref("Document", doc_id))
    add("indexer-read", _sa("docs.indexer"), "read", doc("internal"))
    # Agents on tracker tasks (the ``svc_work_item_id`` claim, docs/architecture.md#agent-tokens;
    # ``assigned``, docs/decisions.md#context-the-decision-point-fills-in).
    items = {(w.id.split("-")[0], w.status): w for w in reversed(c.work_items)}
    ops, crm, docs = (items.get((k, "open")) for k in ("jira:OPS", "jira:CRM", "jira:DOC"))
    closed = next((w for w in c.work_items if w.status == "closed"), None)
    helpdesk = _sa("helpdesk.triage")
    if ops is not None:
        link, wid = _ref(*ops.links[0]), {"work_item_id": ops.id}
        add("agent-assigned-write", helpdesk, "write", link, on_behalf_of=_h(ops.assignee), **wid)
        add(
            "agent-for-intern-stricter",
            helpdesk,
            "write",
            link,
            on_behalf_of=_h(pick.person("interns")),
            **wid,
        )
        other = next(t for t in c.tickets if ("Ticket", t.id) not in ops.links)
        add("agent-unlinked", helpdesk, "write", other, on_behalf_of=_h(ops.assignee), **wid)
        add(
            "agent-unknown-item",
            helpdesk,
            "write",
            link,
            on_behalf_of=_h(ops.assignee),
            work_item_id="jira:OPS-99999",
        )
    if closed is not None:
        add(
            "agent-closed-item",
            helpdesk,
            "write",
            _ref(*closed.links[0]),
            on_behalf_of=_h(closed.assignee),
            work_item_id=closed.id,
        )
    if crm is not None:
        ok = [x for x in plain if ("Customer", x.id) in crm.links]
        wid = {"work_item_id": crm.id}
        crm_bot = _sa("crm.summarizer")
        add(
            "agent-customer-write",
            crm_bot,
            "write",
            ok[0] if ok else None,
            on_behalf_of=_h(crm.assignee),
            **wid,
        )
        add("agent-alone-customer-write", crm_bot, "write", ok[0] if ok else None, **wid)
    if docs is not None:
        link, wid = _ref(*docs.links[0]), {"work_item_id": docs.id}
        add(
            "agent-nobody-present-delete",
            _sa("backup.sync"),
            "delete",
            link,
            on_behalf_of=_h(docs.assignee),
            human_present=False,
            **wid,
        )
        add(
            "agent-assigned-edit",
            _sa("docs.writer"),
            "write",
            link,
            on_behalf_of=_h(docs.assignee),
            **wid,
        )
    # Plans with every outcome; filters with `in`, `is` and `unknown` nodes; agents.
    plan("tickets-for-staff", me, "read", "Ticket")
    plan("documents-for-person", me, "read", "Document")
    plan("documents-to-delete", me, "delete", "Document")
    plan(
        "agent-for-person-documents", _sa("copilot.assistant"), "read", "Document", on_behalf_of=me
    )
    plan("high-risk-listing", me, "read", "Customer", context={"risk_score": 91})
    plan("documents-for-manager", _h(pick.person("managers")), "read", "Document")
    plan("documents-for-auditor", _h(auditor), "read", "Document")
    plan(
        "downloads-for-contractor",
        _h(pick.person("contractors", exclude="")),
        "download",
        "Document",
    )
    for u, _ in c.grants[:2]:
        plan("documents-granted", _h(u), "read", "Document")
    plan("sales-bulk-export", _h(pick.person("sales")), "export", "Customer", access="exported")
    plan("billing-bulk-export", _sa("billing.exporter"), "export", "Customer", access="exported")
    return steps


def _context(rng: random.Random) -> Json:
    """A caller-sent context: usually a low ``risk_score``, sometimes a high one, or none."""
    roll = rng.random()
    if roll < 0.3:
        return {}
    if roll < 0.93:
        return {"risk_score": rng.randint(0, 45)}
    if roll < 0.98:
        return {"risk_score": rng.randint(70, 89)}
    return {"risk_score": rng.randint(90, 99)}


def _routine(pick: _Picker) -> Iterator[Step]:
    """An endless stream of ordinary checks, AuthZEN batches and plans."""
    c, rng = pick.c, pick.rng
    assistants = [s.id for s in c.service_accounts if "assistants" in s.groups]
    automation = [s.id for s in c.service_accounts if "automation" in s.groups]
    types = ("Document", "Ticket", "Customer")
    for n in itertools.count(1):
        user = rng.choice(c.people).user_name
        if n % 12 == 0:  # an app listing rows, now and then through an agent
            req: Json = {
                "principal": _h(user),
                "action": "read",
                "resource_type": rng.choices(types, (60, 25, 15))[0],
                "context": _context(rng),
            }
            if rng.random() < 0.15:
                req.update(principal=_sa(rng.choice(assistants)), on_behalf_of=_h(user))
            yield PlanCase(req, "routine")
            continue
        action = rng.choices(
            ("read", "write", "download", "share", "export", "delete"), (60, 14, 10, 5, 6, 5)
        )[0]
        type_ = {
            "read": rng.choices(types, (50, 30, 20))[0],
            "write": rng.choices(types, (50, 30, 20))[0],
            "export": rng.choice(("Document", "Customer", "Customer")),
        }.get(action, "Document")
        res = pick.near(user, type_) if rng.random() < 0.7 else rng.choice(c.resources(type_))
        req = {
            "principal": _h(user),
            "action": action,
            "resource": res.ref,
            "context": _context(rng),
        }
        roll = rng.random()
        if roll < 0.2:  # an agent, for the person (most) or alone, sometimes on a task
            agent = rng.choice(assistants if rng.random() < 0.75 else automation)
            req["principal"] = _sa(agent)
            if roll >= 0.06:
                req["on_behalf_of"] = _h(user)
            if rng.random() < 0.35:
                w = rng.choice(c.work_items)
                req.update(
                    work_item_id=w.id,
                    resource=_ref(*rng.choice(w.links)),
                    action=rng.choice(("read", "write")),
                )
                if "on_behalf_of" in req:
                    req["on_behalf_of"] = _h(w.assignee)
            if rng.random() < 0.05:
                req["human_present"] = False
            yield CheckCase(req, "routine")
        elif roll < 0.32:  # an app speaking AuthZEN
            yield CheckCase(req, "routine", "authzen")
        elif roll < 0.38:  # an app asking about several rows at once
            more = [
                {**req, "action": "read", "resource": pick.near(user, "Document").ref}
                for _ in range(rng.randint(1, 4))
            ]
            yield AuthzenBatch(tuple(CheckCase(r, "routine", "authzen") for r in [req, *more]))
        else:
            if rng.random() < 0.03:
                req["human_present"] = False
            yield CheckCase(req, "routine")


def scenarios(company: Company, *, checks: int = 2000, seed: int = 7) -> Traffic:
    """The requests ``drive`` sends, deterministic for a company and seed.

    Args:
        company: from ``svc.demo.company.generate``.
        checks: how many checks (AuthZEN batch items count one each; row checks made for
            plans with ``needs_row_checks`` come on top). The showcase is always sent whole,
            even when it alone has more. One routine step in twelve is a listing (a plan).
        seed: the seed of the choices (``random.Random(seed)``).

    Returns:
        The ``Traffic``: showcase first, then routine steps.

    """
    pick = _Picker(company, random.Random(seed))
    steps = _showcase(pick)
    total = sum(1 if isinstance(s, CheckCase) else 0 for s in steps)
    for s in _routine(pick):
        if total >= checks:
            break
        n = len(s.cases) if isinstance(s, AuthzenBatch) else int(isinstance(s, CheckCase))
        if isinstance(s, AuthzenBatch) and total + n > checks:
            continue
        steps.append(s)
        total += n
    return Traffic(steps)


@dataclass
class DriveReport:
    """What ``drive`` sent and what the decision point answered.

    Attributes:
        checks: decisions over the check routes (each AuthZEN item and row check counts one).
        verdicts: checks by verdict (``allow``, ``deny``, ``challenge``).
        challenges: challenge verdicts by kind (``verification``, ``approval``,
            ``justification``); a check with two kinds counts under both.
        challenge_qids: the challenges those verdicts named (``challenge_qid``, present when
            the decision point resolves challenges with the challenge service), each with the
            ``principal`` and ``on_behalf_of`` of its check (what a wait must name).
        challenge_outcomes: what became of those challenges by the end of the drive
            (``pending``, ``passed``, ``rejected``, ``expired``, from a wait with
            ``wait_secs`` 0; ``unknown`` when the wait answered an error), each qid once.
        reasons: built-in denials by reason (``svc:contained``, ``svc:unregistered``,
            ``svc:human_not_present``).
        routes: checks by route (``evaluation``, ``authzen``, ``authzen-batch``, ``row-check``).
        on_behalf_of: checks of an agent acting for a person.
        plans: plan requests (every page's).
        plan_outcomes: plan requests by outcome.
        pinned: plan requests answered with an earlier plan (``pinned: true``).
        plan_qids: distinct plan ids.
        events_sent: events intake accepted (list reports included).
        events_by_access: those events by ``access`` (``none`` when omitted).
        failures: events sent with ``outcome: failure``.
        list_reports: events reporting a plan's rows (``attributes.plan_qid``).
        rows_listed: rows those reports showed (``count``).
        principals: every principal that made a request (``Type::id``).
        started_at, finished_at: the wall-clock time of the drive.
        events_from, events_to: the earliest and latest event ``at`` sent.

    """

    checks: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    challenges: Counter[str] = field(default_factory=Counter)
    challenge_qids: dict[str, Json] = field(default_factory=dict)
    challenge_outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    on_behalf_of: int = 0
    plans: int = 0
    plan_outcomes: Counter[str] = field(default_factory=Counter)
    pinned: int = 0
    plan_qids: set[str] = field(default_factory=set)
    events_sent: int = 0
    events_by_access: Counter[str] = field(default_factory=Counter)
    failures: int = 0
    list_reports: int = 0
    rows_listed: int = 0
    principals: set[str] = field(default_factory=set)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    events_from: datetime | None = None
    events_to: datetime | None = None

    @property
    def decisions_sent(self) -> int:
        """Decision records the drive caused: checks plus plan requests (every page's).

        The history holds exactly this many decision rows for the drive once the loader caught
        up: pages of one plan share its qid but are at least 2 ms apart (the history's key is
        principal, time, qid).
        """
        return self.checks + self.plans

    def window(self) -> tuple[datetime, datetime]:
        """``[start, end)`` covering every decision and event of the drive (a second of slack).

        Raises:
            ValueError: the drive has not run.

        """
        if self.started_at is None or self.finished_at is None:
            raise ValueError("the drive has not run")
        times = [
            t
            for t in (self.started_at, self.finished_at, self.events_from, self.events_to)
            if t is not None
        ]
        return min(times) - timedelta(seconds=1), max(times) + timedelta(seconds=1)

    def to_dict(self) -> Json:
        """The report as JSON-ready values (times RFC 3339, sets sorted)."""
        out: Json = {}
        for k, v in self.__dict__.items():
            if isinstance(v, datetime):
                out[k] = v.isoformat()
            elif isinstance(v, set):
                out[k] = sorted(v)
            elif isinstance(v, Counter):
                out[k] = dict(v)
            else:
                out[k] = v
        return out

    @classmethod
    def from_dict(cls, data: Json) -> DriveReport:
        """The report ``to_dict`` wrote. Raises KeyError or ValueError on other data."""
        r = cls()
        for k, v in data.items():
            cur = getattr(r, k)
            if isinstance(cur, Counter):
                setattr(r, k, Counter(v))
            elif isinstance(cur, set):
                setattr(r, k, set(v))
            elif k.endswith(("_at", "_from", "_to")):
                setattr(r, k, None if v is None else datetime.fromisoformat(v))
            else:
                setattr(r, k, v)
        return r

    def record_check(self, request: Json, response: Json, route: str) -> None:
        """Counts one check's answer (the HTTP response shape of docs/api.md#http-routes)."""
        self.checks += 1
        self.routes[route] += 1
        self.verdicts[response["verdict"]] += 1
        if response["verdict"] == "challenge":
            self.challenges.update(response["challenges"])
        qid = response.get("challenge_qid")
        if qid and qid not in self.challenge_qids:
            self.challenge_qids[qid] = {
                k: request[k] for k in ("principal", "on_behalf_of") if request.get(k)
            }
        self.reasons.update(p for p in response["policies"] if p.startswith("svc:"))
        if isinstance(response.get("on_behalf_of"), dict):
            self.reasons.update(
                p for p in response["on_behalf_of"]["policies"] if p.startswith("svc:")
            )
        self._principal(request)
        if request.get("on_behalf_of"):
            self.on_behalf_of += 1

    def _principal(self, request: Json) -> None:
        p = request["principal"]
        self.principals.add(f"{p['type']}::{p['id']}")


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Driver:
    """One drive: an httpx client, the event buffer and the report."""

    def __init__(
        self,
        company: Company,
        http: httpx.Client,
        pdp_url: str,
        intake_url: str,
        token: str,
        seed: int,
        now: datetime | None,
        pdp_token: str | None = None,
    ) -> None:
        self.c = company
        self.http = http
        self.pdp = pdp_url.rstrip("/")
        self.intake = intake_url.rstrip("/")
        self.auth = {"Authorization": f"Bearer {token}"}
        self.pdp_auth = {"Authorization": f"Bearer {pdp_token}"} if pdp_token else {}
        self.rng = random.Random(seed + 1)
        started = datetime.now(UTC)
        self.report = DriveReport(started_at=started)
        self.base = now or started
        self.t0 = time.monotonic()
        self.buffer: list[Json] = []
        # A fixed address per principal: people on 10.1.0.0/16, agents on 10.9.0.0/24.
        self.ips = {
            f"Human::{p.user_name}": f"10.1.{i // 200}.{i % 200 + 10}"
            for i, p in enumerate(company.people)
        }
        self.ips.update(
            (f"ServiceAccount::{s.id}", f"10.9.0.{i + 10}")
            for i, s in enumerate(company.service_accounts)
        )

    def post(self, url: str, body: Json) -> Json:
        r = self.http.post(url, json=body, headers=self.pdp_auth)
        if r.status_code != 200:
            raise TrafficError(f"POST {url}: {r.status_code} {r.text[:500]}")
        out: Json = r.json()
        return out

    def check(self, case: CheckCase, route: str) -> Json:
        resp = self.post(f"{self.pdp}/v1/access/evaluation", case.request)
        self.report.record_check(case.request, resp, route)
        return resp

    def authzen(self, cases: tuple[CheckCase, ...]) -> list[Json]:
        def item(req: Json) -> Json:
            return {
                "action": {"name": req["action"]},
                "resource": req["resource"],
                "context": req.get("context", {}),
            }

        subject = cases[0].request["principal"]
        if len(cases) == 1:
            body = {"subject": subject, **item(cases[0].request)}
            answers = [self.post(f"{self.pdp}/access/v1/evaluation", body)]
            route = "authzen"
        else:
            body = {
                "subject": subject,
                "evaluations": [item(c.request) for c in cases],
                "options": {"evaluations_semantic": "execute_all"},
            }
            answers = self.post(f"{self.pdp}/access/v1/evaluations", body)["evaluations"]
            route = "authzen-batch"
        out = []
        for case, a in zip(cases, answers, strict=True):
            ctx = a["context"]
            if "error" in ctx:
                raise TrafficError(f"AuthZEN refused {case.request}: {ctx['error']}")
            resp = {k: ctx[k] for k in ("qid", "verdict", "challenges", "policies", "mode")}
            qid = ctx.get("challenge_qid")
            if qid:
                resp["challenge_qid"] = qid
            self.report.record_check(case.request, resp, route)
            if qid:  # AuthZEN sends no on_behalf_of: the challenge is the subject's alone
                self.report.challenge_qids[qid] = {"principal": subject}
            out.append(resp)
        return out

    def at(self) -> str:
        t = self.base + timedelta(seconds=time.monotonic() - self.t0)
        r = self.report
        r.events_from = t if r.events_from is None else min(r.events_from, t)
        r.events_to = t if r.events_to is None else max(r.events_to, t)
        return _rfc3339(t)

    def send(self, request: Json, ev: Json) -> None:
        """Buffers one event of ``request``'s principal; flushes a full batch."""
        principal = request["principal"]
        key = f"{principal['type']}::{principal['id']}"
        ev = {"at": self.at(), "principal": principal, **ev, "source_ip": self.ips[key]}
        if request.get("on_behalf_of"):
            ev["on_behalf_of"] = request["on_behalf_of"]
        kind = ev.get("access")
        if principal["type"] == "ServiceAccount":
            ev["tool"] = f"{ev['system']}.{ev['action']}"
            classes = {"read": "read", "listed": "read", "written": "write"}
            ev["action_class"] = classes.get(kind or "", ev["action"])
        self.buffer.append(ev)
        r = self.report
        r.events_sent += 1
        r.events_by_access[kind or "none"] += 1
        r.failures += ev["outcome"] == "failure"
        if len(self.buffer) >= EVENT_BATCH:
            self.flush()

    def after_check(self, request: Json, resp: Json) -> None:
        """The app's event for a check: the access when allowed, sometimes a refused attempt."""
        allowed = resp["verdict"] == "allow"
        if not allowed and not (resp["verdict"] == "deny" and self.rng.random() < 0.4):
            return
        resource = request["resource"]
        system, word, kind = _APP[(resource["type"], request["action"])]
        ev: Json = {
            "system": system,
            "action": word,
            "resource": resource,
            "outcome": "success" if allowed else "failure",
            "attributes": {"decision_qid": resp["qid"]},
        }
        if kind is not None:
            ev.update(access=kind, count=1)
        self.send(request, ev)

    def flush(self) -> None:
        """Sends the buffered events; retries a 503 after its ``Retry-After`` (docs/intake.md)."""
        if not self.buffer:
            return
        body = {"events": self.buffer}
        for _ in range(20):
            r = self.http.post(f"{self.intake}/v1/events", json=body, headers=self.auth)
            if r.status_code == 202:
                self.buffer = []
                return
            if r.status_code != 503:
                raise TrafficError(f"POST {self.intake}/v1/events: {r.status_code} {r.text[:1000]}")
            time.sleep(min(5.0, float(r.headers.get("retry-after", "1"))))
        raise TrafficError("intake kept answering 503 (broker unavailable)")

    def plan(self, case: PlanCase) -> None:
        """A listing: plan, rows, row checks, pages with ``plan_qid``, one report per page."""
        req = case.request
        type_ = req["resource_type"]
        first = self.planned(req)
        qid = first["qid"]
        # Rows under `unknown` nodes are checked one by one: such a listing shows one page.
        most = PAGE_SIZE * (1 if first["needs_row_checks"] else case.max_pages)
        rows: list[Resource] = []
        if first["outcome"] == "always_allowed":
            rows = self.c.resources(type_)[:most]
        elif first["outcome"] == "conditional":  # the rows the app's query would return
            node = parse_filter(first["filter"])
            matching = (
                r for r in self.c.resources(type_) if evaluate(node, r.entity(), unknown="superset")
            )
            rows = list(itertools.islice(matching, most))
        pages = [rows[i : i + PAGE_SIZE] for i in range(0, len(rows), PAGE_SIZE)]
        for n, page in enumerate(pages or [[]]):
            if n > 0:  # the user turns the page
                time.sleep(0.002)
                again = self.planned({**req, "plan_qid": qid})
                qid = again["qid"]
            shown = page
            if first["needs_row_checks"]:
                shown = [r for r in page if self.row_check(req, r)]
            self.report.list_reports += 1
            self.report.rows_listed += len(shown)
            system, word, _ = _APP[(type_, req["action"])]
            ev = {
                "system": system,
                "action": "list" if case.access == "listed" else word,
                "resource": {"type": type_, "id": ""},
                "outcome": "success",
                "access": case.access,
                "count": len(shown),
                "attributes": {"plan_qid": qid, "page": n + 1},
            }
            self.send(req, ev)

    def planned(self, req: Json) -> Json:
        resp = self.post(f"{self.pdp}/v1/access/plan", req)
        r = self.report
        r.plans += 1
        r.plan_outcomes[resp["outcome"]] += 1
        r.pinned += bool(resp["pinned"])
        r.plan_qids.add(resp["qid"])
        r._principal(req)
        return resp

    def challenge_outcomes(self) -> None:
        """Asks what became of every challenge the drive was named (docs/api.md#challenge-waits).

        One ``POST /v1/access/challenge`` with ``wait_secs`` 0 per qid, as the principal (and
        on_behalf_of) of its check; counts the outcomes into ``report.challenge_outcomes``
        (``unknown`` for an answer other than 200).
        """
        for qid, who in self.report.challenge_qids.items():
            r = self.http.post(
                f"{self.pdp}/v1/access/challenge",
                json={"challenge_qid": qid, **who, "wait_secs": 0},
                headers=self.pdp_auth,
            )
            outcome = r.json().get("outcome", "unknown") if r.status_code == 200 else "unknown"
            self.report.challenge_outcomes[str(outcome)] += 1

    def row_check(self, plan_req: Json, row: Resource) -> bool:
        req = {k: v for k, v in plan_req.items() if k != "resource_type"}
        req["resource"] = row.ref
        return bool(self.check(CheckCase(req, "row-check"), "row-check")["verdict"] == "allow")


def drive(
    company: Company,
    pdp_url: str,
    intake_url: str,
    intake_token: str,
    *,
    pdp_token: str | None = None,
    checks: int = 2000,
    seed: int = 7,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> DriveReport:
    """Sends the demo traffic to a decision point and an intake (docs/demo.md#the-traffic).

    Args:
        company: the company whose bundle (and ``provision`` data) the decision point serves.
        pdp_url: base URL of the decision point's HTTP API (``http://127.0.0.1:8080``).
        intake_url: base URL of the intake.
        intake_token: the intake token (``Authorization: Bearer``, docs/intake.md#routes).
        pdp_token: a bearer JWT for the decision point when it checks callers (docs/auth.md);
            None sends none.
        checks: how many checks to send (see ``scenarios``).
        seed: the seed of ``scenarios`` and of the apps' choices (which refusals they report).
        now: the time of the first event (later ones follow the monotonic clock); default the
            wall clock. The intake refuses times more than five minutes ahead
            (docs/intake.md#limits).
        progress: called with a short line now and then (and at the end).

    Returns:
        The ``DriveReport``.

    Raises:
        TrafficError: the decision point answered other than 200, or the intake other than
            202 (after retrying 503s).
        httpx.HTTPError: a connection failed.

    """
    traffic = scenarios(company, checks=checks, seed=seed)
    say = progress or (lambda _: None)
    with httpx.Client(timeout=30.0) as http:
        d = _Driver(company, http, pdp_url, intake_url, intake_token, seed, now, pdp_token)
        for n, step in enumerate(traffic.steps, 1):
            if isinstance(step, PlanCase):
                d.plan(step)
            elif isinstance(step, AuthzenBatch):
                for case, resp in zip(step.cases, d.authzen(step.cases), strict=True):
                    d.after_check(case.request, resp)
            elif step.route == "authzen":
                d.after_check(step.request, d.authzen((step,))[0])
            else:
                d.after_check(step.request, d.check(step, "evaluation"))
            if n % 250 == 0:
                r = d.report
                say(f"{r.checks} checks, {r.plans} plans, {r.events_sent} events")
        d.flush()
        d.challenge_outcomes()
    r = d.report
    r.finished_at = datetime.now(UTC)
    say(
        f"done: {r.checks} checks, {r.plans} plans, {r.events_sent} events "
        f"({r.list_reports} list reports)"
    )
    return r
