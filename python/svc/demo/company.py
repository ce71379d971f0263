"""The demo company: a synthetic organization and the policy bundle it runs under.

The demo job (docs/architecture.md#components; docs/demo.md), used by ``svc demo`` and ``svc up
--demo``. ``generate`` builds the company from a seed (same seed, same company: every choice comes
from one ``random.Random(seed)``, nothing from the clock); ``write_bundle`` writes its policy
bundle directory (docs/bundles.md); ``provision`` loads what a bundle cannot carry (work items,
the containment list, reasoner risk scores) into a decision point's engine. docs/demo.md
describes the company and what each policy demonstrates.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from svc.pdp import Engine

__all__ = [
    "POLICIES",
    "SCHEMA",
    "Company",
    "Person",
    "Resource",
    "ServiceAccount",
    "WorkItem",
    "generate",
    "provision",
    "write_bundle",
]

Json = dict[str, Any]

#: (department, share of the staff, job word). The CEO heads department ``executive``.
DEPARTMENTS: tuple[tuple[str, float, str], ...] = (
    ("engineering", 0.30, "Engineer"),
    ("sales", 0.15, "Account Executive"),
    ("support", 0.14, "Support Specialist"),
    ("finance", 0.09, "Analyst"),
    ("product", 0.09, "Product Manager"),
    ("marketing", 0.09, "Marketer"),
    ("hr", 0.07, "People Partner"),
    ("legal", 0.07, "Counsel"),
)
FIRST = (
    "ada alan anna arjun beatriz ben carla chen dana diego elena emeka farah felix grace hana "
    "ian ines jamal jane kai kofi lara leo maria mateo nadia nikhil olga omar priya quinn rosa "
    "sam sara tariq uma victor wei xena yara yusuf zoe"
).split()
LAST = (
    "adams baker costa dubois evans fischer garcia haddad ito jensen kim lopez mensah nakamura "
    "okafor patel quispe rossi silva tanaka ueda vargas wang xu yilmaz zhang novak moreau "
    "schmidt kowalski oliveira murphy singh hughes larsen"
).split()
#: Groups besides departments; people are in them directly, all are under ``staff``.
EXTRA_GROUPS = (
    "managers",
    "interns",
    "contractors",
    "partner-managers",
    "security",
    "auditors",
    "oncall",
)
DOC_TAGS = ("roadmap", "design", "contract", "pii", "budget", "hiring", "incident", "pricing")
TICKET_TAGS = ("bug", "outage", "billing", "access", "feature", "onboarding")
INDUSTRIES = ("retail", "health", "banking", "media", "energy", "logistics")
REGIONS = ("emea", "amer", "apac")
#: (id, ai, groups, owner's department, description). The app is the id up to its first dot
#: (an app signs only for ``<app>.<name>``, docs/architecture.md#trusted-app-issuers);
#: ``registered`` False for the last one.
SERVICE_ACCOUNTS: tuple[tuple[str, bool, tuple[str, ...], str, str], ...] = (
    ("copilot.assistant", True, ("assistants",), "engineering", "AI assistant people delegate to"),
    ("helpdesk.triage", True, ("assistants",), "support", "AI agent that triages tickets"),
    ("crm.summarizer", True, ("assistants",), "sales", "AI agent that updates customer accounts"),
    ("docs.writer", True, ("assistants",), "product", "AI agent that drafts documents"),
    ("docs.indexer", False, ("automation",), "engineering", "search indexer"),
    ("backup.sync", False, ("automation",), "engineering", "document backup and cleanup"),
    ("billing.exporter", False, ("automation",), "finance", "exports customers to billing"),
    ("ci.deployer", False, ("automation",), "engineering", "release pipeline"),
    ("legacy.reportbot", False, (), "finance", "retired report bot, never registered"),
)


@dataclass(frozen=True)
class Person:
    """A ``Human`` principal: id is the SCIM ``userName``.

    Entity types are in docs/architecture.md#entities-and-the-base-schema.

    ``groups`` are the person's Cedar parents (their department's group first); ``manager`` is
    a user name, None only for the CEO; ``active`` False marks a leaver not yet removed.
    """

    user_name: str
    name: str
    department: str
    title: str
    level: int
    manager: str | None
    groups: tuple[str, ...]
    active: bool = True


@dataclass(frozen=True)
class ServiceAccount:
    """A ``ServiceAccount`` principal: its record plus ``registered`` and ``app``.

    The record is in docs/architecture.md#entities-and-the-base-schema.
    """

    id: str
    owner: str
    ai: bool
    groups: tuple[str, ...]
    description: str
    registered: bool = True

    @property
    def app(self) -> str:
        """The trusted app that signs for it: the id up to its first dot.

        See docs/architecture.md#trusted-app-issuers.
        """
        return self.id.split(".", 1)[0]

    def record(self) -> Json:
        """The service-account record (``PUT /api/v1/agents/{id}``, ``register_service_accounts``).

        Its fields are in docs/architecture.md#entities-and-the-base-schema.
        """
        return {
            "id": self.id,
            "owner": self.owner,
            "ai": self.ai,
            "groups": list(self.groups),
            "description": self.description,
        }


@dataclass(frozen=True)
class Resource:
    """A ``Document``, ``Ticket`` or ``Customer``; ``attrs`` are Cedar entity JSON values."""

    type: str
    id: str
    attrs: Json
    parents: tuple[str, ...] = ()  # Folder ids (documents only)

    @property
    def ref(self) -> dict[str, str]:
        """The ``{type, id}`` reference (docs/architecture.md#entities-and-the-base-schema)."""
        return {"type": self.type, "id": self.id}

    @property
    def owner(self) -> str:
        """The owner's user name."""
        return str(self.attrs["owner"]["__entity"]["id"])

    def entity(self) -> Json:
        """The resource as a Cedar JSON entity (also the row shape of ``svc.plan.evaluate``)."""
        return {
            "uid": self.ref,
            "attrs": self.attrs,
            "parents": [{"type": "Folder", "id": p} for p in self.parents],
        }


@dataclass(frozen=True)
class WorkItem:
    """An issue-tracker task (id ``<tracker>:<key>``; docs/architecture.md#agent-tokens).

    An agent working on an open item counts as assigned to exactly the resources it links; a
    closed one assigns nothing (docs/decisions.md, "Work items").
    """

    id: str
    status: str
    assignee: str
    links: tuple[tuple[str, str], ...]  # (type, id)

    def record(self) -> Json:
        """The item as ``Engine.upsert_work_items`` takes it."""
        return {
            "id": self.id,
            "status": self.status,
            "links": [{"type": t, "id": i} for t, i in self.links],
        }


@dataclass
class Company:
    """A synthetic company: people, groups, service accounts, resources and work items.

    Attributes:
        seed: the seed it was generated from.
        people: every ``Human``, the CEO first, then department by department.
        groups: group id -> parent group ids (Cedar ``Group`` hierarchy).
        service_accounts: AI and non-AI agents, each with an owner; one is unregistered.
        documents, tickets, customers: the resources, with owners, sensitivity and tags.
        work_items: tracker tasks linking resources, some open and some closed.
        contained: user names on the containment list (docs/architecture.md#built-in-denials).
        risk_scores: user name -> the reasoner's score (0..100), for a few people.
        grants: (user name, document id) pairs granted by the ``document-reader`` template.

    """

    seed: int
    people: list[Person]
    groups: dict[str, tuple[str, ...]]
    service_accounts: list[ServiceAccount]
    documents: list[Resource]
    tickets: list[Resource]
    customers: list[Resource]
    work_items: list[WorkItem]
    contained: list[str]
    risk_scores: dict[str, int]
    grants: list[tuple[str, str]]
    _by_name: dict[str, Person] = field(default_factory=dict, compare=False, repr=False)

    def person(self, user_name: str) -> Person:
        """The person with this user name. Raises KeyError when there is none."""
        if not self._by_name:
            self._by_name.update((p.user_name, p) for p in self.people)
        return self._by_name[user_name]

    def in_group(self, group: str) -> list[Person]:
        """The people whose groups (directly) include ``group``."""
        return [p for p in self.people if group in p.groups]

    def resources(self, type_: str) -> list[Resource]:
        """The resources of one type (``Document``, ``Ticket``, ``Customer``)."""
        return {"Document": self.documents, "Ticket": self.tickets, "Customer": self.customers}[
            type_
        ]

    def entities(self) -> list[Json]:
        """Every entity of the bundle's ``entities.json``, in Cedar's entity JSON shape."""

        def ref(t: str, i: str) -> Json:
            return {"type": t, "id": i}

        out: list[Json] = [
            {"uid": ref("Group", g), "attrs": {}, "parents": [ref("Group", p) for p in ps]}
            for g, ps in self.groups.items()
        ]
        out += [{"uid": ref("Folder", d), "attrs": {}, "parents": []} for d in self.departments()]
        for p in self.people:
            attrs: Json = {
                "department": p.department,
                "title": p.title,
                "active": p.active,
            }
            if p.manager is not None:
                attrs["manager"] = {"__entity": ref("Human", p.manager)}
            out.append(
                {
                    "uid": ref("Human", p.user_name),
                    "attrs": attrs,
                    "parents": [ref("Group", g) for g in p.groups],
                }
            )
        for sa in self.service_accounts:
            out.append(
                {
                    "uid": ref("ServiceAccount", sa.id),
                    "attrs": {
                        "owner": {"__entity": ref("Human", sa.owner)},
                        "ai": sa.ai,
                        "registered": sa.registered,
                        "app": sa.app,
                        "description": sa.description,
                    },
                    "parents": [ref("Group", g) for g in sa.groups],
                }
            )
        out += [r.entity() for r in (*self.documents, *self.tickets, *self.customers)]
        return out

    def departments(self) -> list[str]:
        """Department names, the CEO's ``executive`` first."""
        return ["executive", *(d for d, _, _ in DEPARTMENTS)]


def _split(total: int) -> list[int]:
    """Department sizes summing to ``total`` (at least 3 each), by the shares of DEPARTMENTS."""
    sizes = [max(3, round(total * share)) for _, share, _ in DEPARTMENTS]
    sizes[0] += total - sum(sizes)
    if sizes[0] < 3:
        raise ValueError("too few people for the departments")
    return sizes


def _ref_id(value: Any) -> str | None:
    """The id of a Cedar entity value ``{"__entity": {"type", "id"}}``, None when absent."""
    return None if value is None else str(value["__entity"]["id"])


def _names(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """``n`` distinct (user name, display name) pairs."""
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    while len(out) < n:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        user = f"{first}.{last}"
        k = 2
        while user in seen:
            user, k = f"{first}.{last}{k}", k + 1
        seen.add(user)
        out.append((user, f"{first.title()} {last.title()}"))
    return out


def _people(rng: random.Random, n: int) -> list[Person]:
    """The CEO, then per department a head, team leads (one per eight) and members."""
    names = iter(_names(rng, n))
    ceo_user, ceo_name = next(names)
    people = [
        Person(
            ceo_user, ceo_name, "executive", "Chief Executive", 8, None, ("executive", "managers")
        )
    ]
    for (dept, _, job), size in zip(DEPARTMENTS, _split(n - 1), strict=True):
        head_user, head_name = next(names)
        people.append(
            Person(
                head_user,
                head_name,
                dept,
                f"Head of {dept.title()}",
                7,
                ceo_user,
                (dept, "managers"),
            )
        )
        leads: list[str] = []
        for _ in range(max(1, (size - 1) // 8)):
            user, name = next(names)
            leads.append(user)
            people.append(Person(user, name, dept, f"{job} Lead", 5, head_user, (dept, "managers")))
        for _ in range(size - 1 - len(leads)):
            user, name = next(names)
            level = rng.choice((1, 2, 2, 3, 3, 4))
            extra: list[str] = []
            roll = rng.random()
            if dept in ("engineering", "support", "marketing") and roll < 0.07:
                extra, level, title = ["interns"], 1, f"{job} Intern"
            elif roll < 0.12:
                extra, title = ["contractors"], f"Contract {job}"
            else:
                title = f"Senior {job}" if level >= 3 else job
            if dept == "sales" and rng.random() < 0.3:
                extra.append("partner-managers")
            if dept == "engineering" and "interns" not in extra and rng.random() < 0.15:
                extra.append("security")
            if dept in ("finance", "legal") and rng.random() < 0.3:
                extra.append("auditors")
            if dept in ("support", "engineering") and rng.random() < 0.2:
                extra.append("oncall")
            people.append(Person(user, name, dept, title, level, rng.choice(leads), (dept, *extra)))
    return people


def generate(seed: int = 7, people: int = 300) -> Company:
    """Generates the demo company (docs/demo.md#the-company).

    Args:
        seed: every choice comes from ``random.Random(seed)``; the same seed and size give an
            equal company (no clock, no global randomness).
        people: how many ``Human`` principals (at least 40): a CEO and eight departments, each
            with a head, team leads and members, so every manager chain ends at the CEO.

    Returns:
        The company: about two documents and one ticket per person, a customer per four people,
        a work item per ten, nine service accounts (four AI, four not, one unregistered), one
        contained person and a few reasoner risk scores.

    Raises:
        ValueError: ``people`` is below 40.

    """
    if people < 40:
        raise ValueError(f"people {people}: the demo company needs at least 40")
    rng = random.Random(seed)
    staff = _people(rng, people)
    groups: dict[str, tuple[str, ...]] = {"staff": (), "agents": ()}
    groups.update((g, ("staff",)) for g in ("executive", *(d for d, _, _ in DEPARTMENTS)))
    groups.update((g, ("staff",)) for g in EXTRA_GROUPS)
    groups.update(assistants=("agents",), automation=("agents",))
    # Leavers, the contained person and the reasoner's scores are ordinary members.
    members = [p for p in staff if p.level < 5 and not set(p.groups) & {"interns", "contractors"}]
    leavers = {p.user_name for p in rng.sample(members, 2)}
    staff = [replace(p, active=False) if p.user_name in leavers else p for p in staff]
    scored = rng.sample([p for p in members if p.user_name not in leavers], 5)
    contained = [scored[0].user_name]
    risk = {p.user_name: s for p, s in zip(scored, (97, 93, 78, 74, 12), strict=True)}
    by_dept: dict[str, list[Person]] = {}
    for p in staff:
        by_dept.setdefault(p.department, []).append(p)

    def owner_in(dept: str) -> str:
        senior = [p for p in by_dept[dept] if p.level >= 3 and p.active]
        return rng.choice(senior).user_name

    sas = [
        ServiceAccount(i, owner_in(d), ai, gs, desc, registered=bool(gs))
        for i, ai, gs, d, desc in SERVICE_ACCOUNTS
    ]

    def ent(t: str, i: str) -> Json:
        return {"__entity": {"type": t, "id": i}}

    security = [p for p in staff if "security" in p.groups]
    documents: list[Resource] = []
    for n in range(2 * people):
        owner = rng.choice(staff)
        sens = rng.choices(("public", "internal", "confidential", "secret"), (15, 50, 25, 10))[0]
        tags = set(rng.sample(DOC_TAGS, rng.randint(0, 2)))
        if rng.random() < 0.12:
            tags.add(rng.choice(DEPARTMENTS)[0])  # shared with another department
        if sens == "secret" and security and rng.random() < 0.5:
            owner = rng.choice(security)
        documents.append(
            Resource(
                "Document",
                f"doc-{n + 1:04d}",
                {
                    "owner": ent("Human", owner.user_name),
                    "department": owner.department,
                    "sensitivity": sens,
                    "tags": sorted(tags),
                },
                (owner.department,),
            )
        )
    customers: list[Resource] = []
    for n in range(max(10, people // 4)):
        tier = rng.choices(("smb", "enterprise", "strategic"), (60, 30, 10))[0]
        customers.append(
            Resource(
                "Customer",
                f"cust-{n + 1:03d}",
                {
                    "owner": ent("Human", rng.choice(by_dept["sales"]).user_name),
                    "tier": tier,
                    "region": rng.choice(REGIONS),
                    "sensitivity": "restricted" if tier == "strategic" else "internal",
                    "tags": [rng.choice(INDUSTRIES)],
                },
            )
        )
    tickets: list[Resource] = []
    workers = by_dept["support"] + by_dept["engineering"]
    for n in range(people):
        attrs: Json = {
            "owner": ent("Human", rng.choice(staff).user_name),
            "department": "support",
            "status": rng.choices(("open", "in_progress", "closed"), (50, 25, 25))[0],
            "priority": rng.randint(1, 4),
            "sensitivity": rng.choices(("internal", "confidential"), (85, 15))[0],
            "tags": sorted(rng.sample(TICKET_TAGS, rng.randint(1, 2))),
        }
        if rng.random() < 0.8:
            worker = rng.choice(workers)
            attrs["assignee"] = ent("Human", worker.user_name)
            attrs["department"] = worker.department
        if rng.random() < 0.6:
            attrs["customer"] = ent("Customer", rng.choice(customers).id)
        tickets.append(Resource("Ticket", f"TCK-{n + 1001}", attrs))
    assigned = [t.attrs for t in tickets if "assignee" in t.attrs]
    work_items: list[WorkItem] = []
    for n in range(max(8, people // 10)):
        kind = n % 3
        if kind == 0:  # a support task: tickets assigned to one person
            assignee = str(_ref_id(rng.choice(assigned)["assignee"]))
            mine = [t for t in tickets if _ref_id(t.attrs.get("assignee")) == assignee]
            links = tuple(("Ticket", t.id) for t in rng.sample(mine, min(len(mine), 3)))
            key = f"jira:OPS-{100 + n}"
        elif kind == 1:  # a writing task: a person's documents
            owner_doc = rng.choice(documents)
            mine = [d for d in documents if d.owner == owner_doc.owner]
            links = tuple(("Document", d.id) for d in rng.sample(mine, min(len(mine), 3)))
            assignee, key = owner_doc.owner, f"jira:DOC-{100 + n}"
        else:  # an account task: customers of one account owner
            c = rng.choice(customers)
            mine = [x for x in customers if x.owner == c.owner]
            links = tuple(("Customer", x.id) for x in rng.sample(mine, min(len(mine), 2)))
            assignee, key = c.owner, f"jira:CRM-{100 + n}"
        status = "closed" if rng.random() < 0.25 else "open"
        work_items.append(WorkItem(key, status, assignee, links))
    others = [
        (p, d)
        for p in rng.sample(staff, 6)
        for d in rng.sample(documents, 1)
        if d.attrs["department"] != p.department
    ]
    grants = [(p.user_name, d.id) for p, d in others]
    return Company(
        seed, staff, groups, sas, documents, tickets, customers, work_items, contained, risk, grants
    )


#: The demo company's policy files and schema: package data in ``svc/demo/bundle/``, written
#: into every bundle ``write_bundle`` makes (docs/demo.md).
_BUNDLE = resources.files("svc.demo").joinpath("bundle")

#: The schema (``company.cedarschema``): the base schema of
#: docs/architecture.md#entities-and-the-base-schema plus folders, documents, tickets and
#: customers.
SCHEMA: str = _BUNDLE.joinpath("company.cedarschema").read_text(encoding="utf-8")

#: The policy files by name, in the order they are written (``10-documents.cedar``, ...).
POLICIES: dict[str, str] = {
    f.name: f.read_text(encoding="utf-8")
    for f in sorted(_BUNDLE.iterdir(), key=lambda f: f.name)
    if f.name.endswith(".cedar")
}


def write_bundle(company: Company, dir: Path, *, entities: bool = True) -> None:
    """Writes the company's policy bundle directory (docs/bundles.md, docs/decisions.md).

    Files: ``company.cedarschema`` (``SCHEMA``), the ``POLICIES`` files, ``entities.json``
    (groups, folders, people, service accounts with ``registered``, resources) and ``linked``
    (the ``document-reader`` template's grants). Existing files of those names are replaced;
    nothing else in ``dir`` is touched. Work items, containments and risk scores are not bundle
    data: load them with ``provision``.

    Args:
        company: from ``generate``.
        dir: the directory (created with its parents when missing).
        entities: write ``entities.json``; False for a decision point that takes people,
            groups and resources from the context service (``svc up``,
            ``svc.demo.directory.provision_context``): a bundle's entity wins over the
            service's, so the bundle must not carry them.

    Raises:
        OSError: the directory or a file cannot be written.

    """
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "company.cedarschema").write_text(SCHEMA, encoding="utf-8")
    for name, text in POLICIES.items():
        (dir / name).write_text(text, encoding="utf-8")
    if entities:
        (dir / "entities.json").write_text(
            json.dumps(company.entities(), indent=1) + "\n", encoding="utf-8"
        )
    links = [
        {
            "template_id": "document-reader",
            "link_id": f"reader-{user}-{doc}",
            "args": {"?principal": f'Human::"{user}"', "?resource": f'Document::"{doc}"'},
        }
        for user, doc in company.grants
    ]
    (dir / "linked").write_text(json.dumps(links, indent=1) + "\n", encoding="utf-8")


def provision(engine: Engine, company: Company) -> None:
    """Loads into an engine what the bundle cannot carry (docs/decisions.md).

    The work items (``upsert_work_items``), the containment list (``set_containments``, as the
    containment feed would) and the reasoner's risk scores (``set_risk_scores``, which replace
    any ``risk_score`` a caller sends, docs/decisions.md#context-the-decision-point-fills-in). Call
    it after the bundle is loaded; a bundle reload keeps them.

    Args:
        engine: an engine over this company's bundle.
        company: from ``generate``.

    Raises:
        svc.pdp.RequestError: the engine refused a record (its bundle is not this company's).

    """
    engine.upsert_work_items([w.record() for w in company.work_items])
    engine.set_containments([{"type": "Human", "id": u} for u in company.contained])
    engine.set_risk_scores(
        [
            {"principal": {"type": "Human", "id": u}, "score": s}
            for u, s in company.risk_scores.items()
        ]
    )
