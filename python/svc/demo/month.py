"""A labelled synthetic month of history: routine traffic, injected stories and decoys.

The reasoner's evaluation (docs/benchmarks.md, "Reasoner"), its tests and the demo company's
backfilled month read this (docs/reasoner.md#evaluation). ``month(...)`` makes a population of
people in departments and agents in apps, a month of their routine decisions and events, and
injects stories modelled on the CERT insider threat scenarios and on agent misuse, plus decoys
that must not be contained; ``fill(client, m)`` stores it in a history store.

Routine: each person works most weekdays in their own hours (8 to 18 give or take), from their
own office address, on their department's documents (reading, listing, editing, sometimes
downloading a few); a few decisions are denied. The routine has irregularities too (``noise``):
on 3% of a person's days they work from another address, on 3% late, on 2% they read three
to six times their usual, on 1% they export a few hundred rows once. Agents act for a fixed
handful of people of their app, listing and reading through tools; a nightly service account
reads and exports a steady batch.

Stories (label ``contain``: the gate should contain them; ``flag``: high score, no moving out):

* ``after_hours_leaver`` (CERT scenario 1): from six days before the end works after hours
  from home, then moves data out on the last two days.
* ``exporter`` (CERT scenario 2): on the last three days exports thirty times its usual rows,
  reading documents it never read before.
* ``compromised`` (CERT scenario 3-like, ``flag``): on the last day reads another department's
  and its manager's documents from a new address, with a burst of denies.
* ``agent_misuse``: an agent acting on the last two days for people it never served, listing
  and exporting far beyond its app's peers.
* ``sa_exporter``: a service account exporting twenty times its nightly rows on the last day.

Decoys (label ``decoy``): ``heavy_reader`` (twenty times its department's reading, every day),
``listing_team`` (a whole department listing many rows every day), ``one_day_spike`` (five
times the usual listing for one day), ``steady_exporter`` (exports every day, as its job).
"""

from __future__ import annotations

import json
import random
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

__all__ = [
    "CONTAIN",
    "DECOY",
    "FLAG",
    "Actor",
    "Month",
    "Story",
    "fill",
    "month",
]

CONTAIN = "contain"
FLAG = "flag"
DECOY = "decoy"

_STORY_LABELS = {
    "after_hours_leaver": CONTAIN,
    "exporter": CONTAIN,
    "compromised": FLAG,
    "agent_misuse": CONTAIN,
    "sa_exporter": CONTAIN,
    "heavy_reader": DECOY,
    "listing_team": DECOY,
    "one_day_spike": DECOY,
    "steady_exporter": DECOY,
}


@dataclass
class Actor:
    """One principal of the month.

    Attributes:
        type: ``Human`` or ``ServiceAccount``.
        id: the user name or account id.
        group: the department (people) or app (accounts).
        ip: the usual source address.
        start_hour: the hour work starts (UTC).
        rate: events on a working day (mean).
        people: for agents, the people it acts for.
        manager: for people, the manager's user name.

    """

    type: str
    id: str
    group: str
    ip: str
    start_hour: int = 9
    rate: float = 8.0
    people: list[str] = field(default_factory=list)
    manager: str | None = None


@dataclass(frozen=True)
class Story:
    """One injected story or decoy: who, what, when it starts (UTC), and its label."""

    name: str
    principal: tuple[str, str]
    start: datetime
    label: str


@dataclass
class Month:
    """A month of history with its labels.

    Attributes:
        end: the last day (UTC; the month is the ``days`` days ending on it).
        actors: every principal.
        decisions: decision records (``svc.decisions.v1`` shape).
        events: intake records (``svc.events.v1`` shape, with ``ingest_id``).
        stories: the injected stories and decoys.

    """

    end: date
    actors: list[Actor]
    decisions: list[dict[str, Any]]
    events: list[dict[str, Any]]
    stories: list[Story]

    def people(self) -> list[Actor]:
        """The people."""
        return [a for a in self.actors if a.type == "Human"]

    def accounts(self) -> list[Actor]:
        """The service accounts."""
        return [a for a in self.actors if a.type == "ServiceAccount"]

    def snapshot(self) -> dict[str, Any]:
        """A principals snapshot (``GET /v1/principals`` shape) naming departments and apps."""
        out: list[dict[str, Any]] = []
        for a in self.actors:
            if a.type == "Human":
                value = {
                    "uid": {"type": "Human", "id": a.id},
                    "attrs": {"active": True, "department": a.group, "title": ""},
                    "parents": [{"type": "Group", "id": f"{a.group}-staff"}],
                }
            else:
                value = {"id": a.id, "app": a.group, "groups": [], "owner": "", "ai": True}
            out.append({"kind": a.type, "id": a.id, "value": value, "removed": False})
        return {"principals_version": 1, "principals": out}


def _uuid7(t: datetime, rng: random.Random) -> str:
    """A UUIDv7 (RFC 9562, section 5.7) for time `t`, its random bits from `rng`.

    Decision and ingest ids are time ordered (docs/architecture.md#identifiers-and-errors), so
    a backfilled record sorts among live ones by when it happened; drawing the random bits from
    the month's generator keeps a month the same for the same seed.
    """
    ms = int(t.timestamp() * 1000)
    # 128 bits drawn, as a random UUID takes, so the month's other draws stay where they were.
    bits = rng.getrandbits(128)
    rand_a, rand_b = bits & 0xFFF, (bits >> 12) & ((1 << 62) - 1)
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b))


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class _Gen:
    def __init__(self, seed: int, noise: bool = True) -> None:
        self.rng = random.Random(seed)
        self.noise = noise
        self.decisions: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def at(self, day: date, hour: float) -> datetime:
        h = max(0.0, min(23.99, hour))
        t = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(hours=h)
        return t + timedelta(seconds=self.rng.randrange(0, 3600))

    def event(
        self,
        a: Actor,
        t: datetime,
        action: str,
        resource: tuple[str, str],
        *,
        access: str | None = None,
        count: int | None = None,
        ip: str | None = None,
        tool: str | None = None,
        on_behalf_of: str | None = None,
        outcome: str | None = "success",
        system: str = "drive",
    ) -> None:
        rec: dict[str, Any] = {
            "ingest_id": _uuid7(t, self.rng),
            "at": _rfc3339(t),
            "received_at": _rfc3339(t + timedelta(seconds=1)),
            "system": system,
            "principal": {"type": a.type, "id": a.id},
            "on_behalf_of": {"type": "Human", "id": on_behalf_of} if on_behalf_of else None,
            "action": action,
            "resource": {"type": resource[0], "id": resource[1]},
            "source_ip": ip or a.ip,
            "attributes": {},
        }
        if outcome:
            rec["outcome"] = outcome
        if access:
            rec["access"] = access
            if count is not None:
                rec["count"] = count
        if tool:
            rec["tool"] = tool
            rec["action_class"] = "read"
        self.events.append(rec)

    def decision(
        self,
        a: Actor,
        t: datetime,
        action: str,
        resource: tuple[str, str],
        verdict: str = "allow",
        on_behalf_of: str | None = None,
    ) -> None:
        self.decisions.append(
            {
                "qid": _uuid7(t, self.rng),
                "at": _rfc3339(t),
                "call": "check",
                "transport": "http",
                "principal": {"type": a.type, "id": a.id},
                "on_behalf_of": {"type": "Human", "id": on_behalf_of} if on_behalf_of else None,
                "action": action,
                "resource": {"type": resource[0], "id": resource[1]},
                "verdict": verdict,
                "challenges": [],
                "policies": ["deny-default" if verdict == "deny" else "dept-read"],
                "mode": "enforce",
                "policy_version": 1,
                "principals_version": 1,
                "latency_us": 40,
                "pdp": "svc-pdp-0",
            }
        )

    # -- routine ------------------------------------------------------------------------------

    def person_day(
        self, a: Actor, day: date, *, scale: float = 1.0, list_scale: float = 1.0
    ) -> None:
        rng = self.rng
        docs = [("Document", f"{a.group.lower()}/{k}") for k in range(40)]
        k = zlib.crc32(a.id.encode()) % 20
        mine = docs[k : k + 12]
        # The routine's irregularities: a day away (another address), a late day, a deadline
        # day reading several times the usual, a one-off export of a few hundred rows.
        ip, shift, busy = a.ip, 0.0, 1.0
        if self.noise:
            if rng.random() < 0.03:
                ip = f"100.64.{rng.randrange(256)}.{rng.randrange(1, 255)}"
            if rng.random() < 0.03:
                shift = 8.0
            if rng.random() < 0.02:
                busy = rng.uniform(3, 6)
            if rng.random() < 0.01:
                t = self.at(day, a.start_hour + shift + rng.uniform(0, 8))
                doc = rng.choice(mine)
                n = rng.randint(100, 800)
                self.event(a, t, "export", doc, access="exported", count=n, ip=ip)
        scale *= busy
        for _ in range(max(1, int(rng.gauss(a.rate, a.rate / 4)))):
            t = self.at(day, rng.gauss(a.start_hour + shift + 4, 2.2))
            doc = rng.choice(mine if rng.random() < 0.85 else docs)
            r = rng.random()
            if r < 0.45:
                n = max(1, int(rng.gauss(12, 4) * scale))
                self.event(a, t, "view", doc, access="read", count=n, ip=ip)
                self.decision(a, t, "view", doc, "deny" if rng.random() < 0.02 else "allow")
            elif r < 0.75:
                n = max(1, int(rng.gauss(120, 30) * scale * list_scale))
                self.event(a, t, "search", ("Document", ""), access="listed", count=n, ip=ip)
            elif r < 0.95:
                n = max(1, int(rng.gauss(3, 1)))
                self.event(a, t, "edit", doc, access="written", count=n, ip=ip)
                self.decision(a, t, "edit", doc)
            else:
                self.event(a, t, "download", doc, access="read", count=1, ip=ip)

    def agent_day(
        self, a: Actor, day: date, *, people: list[str] | None = None, scale: float = 1.0
    ) -> None:
        rng = self.rng
        for _ in range(max(1, int(rng.gauss(a.rate, a.rate / 4)))):
            person = rng.choice(people or a.people)
            t = self.at(day, rng.gauss(13, 3))
            doc = ("Document", f"{a.group}/{person}/{rng.randrange(8)}")
            if rng.random() < 0.6:
                n = max(1, int(rng.gauss(60, 15) * scale))
                self.event(
                    a,
                    t,
                    "search",
                    ("Document", ""),
                    access="listed",
                    count=n,
                    tool=f"{a.group}.search",
                    on_behalf_of=person,
                )
            else:
                self.event(
                    a,
                    t,
                    "view",
                    doc,
                    access="read",
                    count=max(1, int(rng.gauss(5, 2) * scale)),
                    tool=f"{a.group}.read",
                    on_behalf_of=person,
                )
                self.decision(a, t, "view", doc, on_behalf_of=person)

    def nightly(self, a: Actor, day: date, rows: int) -> None:
        t = self.at(day, 2)
        self.event(a, t, "query", ("Table", "orders"), access="read", count=rows, system="etl")
        self.event(a, t, "export", ("Table", "orders"), access="exported", count=rows, system="etl")
        self.decision(a, t, "export", ("Table", "orders"))


def month(
    *,
    people: int = 200,
    departments: int = 8,
    agents: int = 12,
    days: int = 30,
    end: date | None = None,
    seed: int = 7,
    stories: Iterable[str] | None = None,
    noise: bool = True,
) -> Month:
    """A labelled month (module docs).

    Args:
        people: people, spread over `departments` (at least 20).
        departments: departments (at least 3).
        agents: AI agents, spread over three apps (at least 3).
        days: days of history ending on `end`.
        end: the last day (default: today, UTC).
        seed: the random seed (the same seed gives the same month).
        stories: the story and decoy names to inject (default: all of them).
        noise: give the routine its irregularities (module docs).

    Returns:
        The ``Month``.

    Raises:
        ValueError: too few people, departments or agents, or an unknown story name.

    """
    if people < 20 or departments < 3 or agents < 3:
        raise ValueError("a month needs at least 20 people, 3 departments and 3 agents")
    chosen = set(_STORY_LABELS if stories is None else stories)
    unknown = chosen - set(_STORY_LABELS)
    if unknown:
        raise ValueError(f"unknown stories: {sorted(unknown)}")
    end = end or datetime.now(UTC).date()
    g = _Gen(seed, noise)
    rng = g.rng
    depts = ["Sales", "Finance", "Engineering", "Support", "Legal", "Marketing", "Ops", "HR"]
    depts = (depts * (departments // len(depts) + 1))[:departments]
    depts = [d if depts.count(d) == 1 else f"{d}{k}" for k, d in enumerate(depts)]
    actors: list[Actor] = []
    for k in range(people):
        d = depts[k % departments]
        actors.append(
            Actor(
                "Human",
                f"p{k:05d}@example.com",
                d,
                f"10.{k // 250}.{k % 250}.10",
                start_hour=rng.choice([7, 8, 8, 9, 9, 9, 10]),
                rate=rng.uniform(5, 12),
            )
        )
    by_dept: dict[str, list[Actor]] = {}
    for a in actors:
        by_dept.setdefault(a.group, []).append(a)
    for members in by_dept.values():
        for a in members[1:]:
            a.manager = members[0].id
    apps = ["copilot", "helpdesk", "analyst"]
    humans = [a.id for a in actors]
    for k in range(agents):
        app = apps[k % 3]
        served = rng.sample(humans, 5)
        actors.append(
            Actor(
                "ServiceAccount",
                f"{app}.agent{k}",
                app,
                f"10.200.0.{k + 1}",
                rate=10,
                people=served,
            )
        )
    etl = [Actor("ServiceAccount", f"etl.nightly{k}", "etl", f"10.201.0.{k + 1}") for k in range(3)]
    actors.extend(etl)
    return simulate(actors, end=end, days=days, stories=chosen, gen=g)


def simulate(
    actors: list[Actor],
    *,
    end: date,
    days: int = 30,
    stories: Iterable[str] | None = None,
    seed: int = 7,
    gen: _Gen | None = None,
    weeks_end: date | None = None,
) -> Month:
    """A month of `actors`' routine traffic with the chosen stories injected (module docs).

    The stories fall on the people at indexes 3, 5, 7, 9, 11 and 13 (after the story names'
    order in the module docs), the first AI agent (``agent_misuse``) and the first ``etl``
    service account (``sa_exporter``); a story whose actor is missing is left out.

    Args:
        actors: the population (people with a department and a manager, agents with the people
            they act for, ``etl`` service accounts).
        end: the last day.
        days: days of history.
        stories: the story and decoy names (default: all).
        seed: the random seed when `gen` is not given.
        gen: the generator to continue (``month`` hands its own in).
        weeks_end: lay the weekdays and weekends out as if the last day were this date
            (default: `end` itself): a month made with the same `weeks_end` on any day has
            the same days of work and rest relative to its end, so whatever today's weekday,
            the same seed gives the same month shifted in time.

    Returns:
        The ``Month``.

    Raises:
        ValueError: an unknown story name.

    """
    chosen = set(_STORY_LABELS if stories is None else stories)
    unknown = chosen - set(_STORY_LABELS)
    if unknown:
        raise ValueError(f"unknown stories: {sorted(unknown)}")
    g = gen or _Gen(seed)
    rng = g.rng
    first = end - timedelta(days=days - 1)
    by_dept: dict[str, list[Actor]] = {}
    for a in actors:
        if a.type == "Human":
            by_dept.setdefault(a.group, []).append(a)
    depts = list(by_dept)
    etl = [a for a in actors if a.type == "ServiceAccount" and a.group == "etl"]
    agents = [a for a in actors if a.type == "ServiceAccount" and a.group != "etl" and a.people]
    story_list: list[Story] = []
    special: dict[str, str] = {}
    humans_by_index = [a for a in actors if a.type == "Human"]
    slots = {
        "after_hours_leaver": 3,
        "exporter": 5,
        "compromised": 7,
        "heavy_reader": 9,
        "one_day_spike": 11,
        "steady_exporter": 13,
    }
    picks: dict[str, Actor] = {
        name: humans_by_index[k] for name, k in slots.items() if k < len(humans_by_index)
    }
    if agents:
        picks["agent_misuse"] = agents[0]
    if etl:
        picks["sa_exporter"] = etl[0]
    picks = {name: a for name, a in picks.items() if name in chosen}
    taken = {a.group for a in picks.values()}
    free = [d for d in depts if d not in taken]
    team = by_dept[free[-1]] if "listing_team" in chosen and free else []
    for name, a in picks.items():
        if name in chosen:
            special[a.id] = name
    start_of = {
        "after_hours_leaver": end - timedelta(days=5),
        "exporter": end - timedelta(days=2),
        "compromised": end,
        "agent_misuse": end - timedelta(days=1),
        "sa_exporter": end,
        "heavy_reader": first,
        "one_day_spike": end - timedelta(days=1),
        "steady_exporter": first,
    }
    for name, a in picks.items():
        if name in chosen:
            s = start_of[name]
            story_list.append(
                Story(
                    name,
                    (a.type, a.id),
                    datetime(s.year, s.month, s.day, tzinfo=UTC),
                    _STORY_LABELS[name],
                )
            )
    if team:
        for a in team:
            story_list.append(
                Story(
                    "listing_team",
                    (a.type, a.id),
                    datetime(first.year, first.month, first.day, tzinfo=UTC),
                    DECOY,
                )
            )

    shift = (weeks_end - end) if weeks_end is not None else timedelta(0)
    for n in range(days):
        day = first + timedelta(days=n)
        weekend = (day + shift).weekday() >= 5
        for a in actors:
            role = special.get(a.id)
            if a.type == "Human":
                if weekend and rng.random() > 0.05:
                    continue
                if not weekend and rng.random() < 0.08:
                    continue  # a day off
                if role == "heavy_reader":
                    g.person_day(a, day, scale=20)
                elif a in team:
                    g.person_day(a, day, list_scale=25)
                elif role == "one_day_spike" and day == start_of[role]:
                    g.person_day(a, day, list_scale=5)
                else:
                    g.person_day(a, day)
                if role == "steady_exporter":
                    t = g.at(day, a.start_hour + 2)
                    g.event(
                        a,
                        t,
                        "export",
                        ("Report", "ledger"),
                        access="exported",
                        count=rng.randint(1500, 2500),
                    )
            elif a.group == "etl":
                rows = rng.randint(900, 1100)
                if role == "sa_exporter" and day >= start_of[role]:
                    rows *= 20
                g.nightly(a, day, rows)
            else:
                if weekend or not a.people:
                    continue
                g.agent_day(a, day)
        _inject(g, day, end, actors, picks, chosen, start_of, by_dept)
    return Month(end, actors, g.decisions, g.events, story_list)


def _inject(
    g: _Gen,
    day: date,
    end: date,
    actors: list[Actor],
    picks: dict[str, Actor],
    chosen: set[str],
    start_of: dict[str, date],
    by_dept: dict[str, list[Actor]],
) -> None:
    """The stories' own records of `day`."""
    rng = g.rng
    home = "203.0.113.77"
    if "after_hours_leaver" in picks and day >= start_of["after_hours_leaver"]:
        a = picks["after_hours_leaver"]
        for _ in range(40):
            t = g.at(day, rng.choice([21, 22, 23, 0, 1]))
            doc = ("Document", f"{a.group.lower()}/{rng.randrange(40)}")
            g.event(a, t, "view", doc, access="read", count=rng.randint(10, 30), ip=home)
        if day >= end - timedelta(days=1):
            for k in range(6):
                t = g.at(day, rng.choice([22, 23, 0]))
                doc = ("Document", f"{a.group.lower()}/{k}")
                g.event(
                    a, t, "download", doc, access="exported", count=rng.randint(300, 500), ip=home
                )
    if "exporter" in picks and day >= start_of["exporter"]:
        a = picks["exporter"]
        other = next(d for d in by_dept if d != a.group)
        for k in range(30):
            t = g.at(day, a.start_hour + rng.uniform(0, 8))
            doc = ("Document", f"{other.lower()}/x{day.day}-{k}")
            g.event(a, t, "view", doc, access="read", count=rng.randint(20, 60))
            g.decision(a, t, "view", doc)
        for k in range(8):
            t = g.at(day, a.start_hour + rng.uniform(0, 8))
            g.event(
                a,
                t,
                "export",
                ("Report", f"pipeline-{k}"),
                access="exported",
                count=rng.randint(200, 300),
            )
    if "compromised" in picks and day == start_of["compromised"]:
        a = picks["compromised"]
        other = next(d for d in by_dept if d != a.group)
        ip = "198.51.100.23"
        for k in range(60):
            t = g.at(day, rng.uniform(1, 5))
            doc = ("Document", f"{other.lower()}/{k % 40}")
            g.event(a, t, "view", doc, access="read", count=rng.randint(5, 20), ip=ip)
            g.decision(a, t, "view", doc, "deny" if k % 2 else "allow")
        if a.manager:
            for k in range(10):
                t = g.at(day, rng.uniform(1, 5))
                doc = ("Document", f"{a.manager}/private-{k}")
                g.event(a, t, "view", doc, access="read", count=3, ip=ip)
                g.decision(a, t, "view", doc, "deny")
    if "agent_misuse" in picks and day >= start_of["agent_misuse"]:
        a = picks["agent_misuse"]
        strangers = [p.id for p in actors if p.type == "Human" and p.id not in a.people][:12]
        for person in strangers:
            for _ in range(4):
                t = g.at(day, rng.uniform(9, 17))
                g.event(
                    a,
                    t,
                    "search",
                    ("Document", ""),
                    access="listed",
                    count=rng.randint(800, 1500),
                    tool=f"{a.group}.search",
                    on_behalf_of=person,
                )
            t = g.at(day, rng.uniform(9, 17))
            doc = ("Document", f"{a.group}/{person}/all")
            g.event(
                a,
                t,
                "export",
                doc,
                access="exported",
                count=rng.randint(300, 600),
                tool=f"{a.group}.export",
                on_behalf_of=person,
            )
            g.decision(a, t, "export", doc, on_behalf_of=person)


def records(
    values: Iterable[dict[str, Any]], topic: str
) -> Iterator[tuple[str, int, int, bytes, bytes]]:
    """Broker-shaped records of `values` (for ``svc.history.store``)."""
    for n, v in enumerate(values):
        p = v["principal"]
        yield (topic, 0, n, f"{p['type']}::{p['id']}".encode(), json.dumps(v).encode())


def fill(client: Any, m: Month, batch: int = 50_000) -> tuple[int, int]:
    """Stores the month's decisions and events in a history store (``svc.history.store``).

    Args:
        client: a client from ``svc.history.connect`` on a migrated database.
        m: the month.
        batch: records per INSERT.

    Returns:
        ``(decisions, events)`` stored.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: an INSERT failed.

    """
    from svc import history

    for kind, values in (("decisions", m.decisions), ("events", m.events)):
        recs = list(records(values, f"svc.{kind}.v1"))
        for k in range(0, len(recs), batch):
            history.store(client, kind, recs[k : k + batch])  # type: ignore[arg-type]
    return len(m.decisions), len(m.events)
