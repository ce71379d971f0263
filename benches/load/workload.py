"""The load bench's workload: a TinyTodo world and a 16-request mix, in every wire form sent.

The policies are Cedar's TinyTodo example with its three commented-out policies switched on
(``tinytodo.cedar`` beside this file) and the same set written for Cerbos
(``cerbos/policies/*.yaml``). The world, built from a fixed seed:

* teams ``admin``, ``temp``, ``interns`` (a member of ``temp``) and ``squad-0`` to ``squad-4``;
* ``USERS`` users, each with a ``joblevel`` (1 to 10), a ``location`` (``ABC17``, ``DEF33`` or
  ``XYZ77``), one squad and at most one of ``admin``, ``temp``, ``interns``;
* ``LISTS`` lists, each with an owner, a reader team and an editor team (squads; every tenth
  list is readable by ``temp``, so interns read it through the team hierarchy).

svc holds the world as its bundle's entity store and receives entity references only. Cerbos
holds no entities, so its requests carry what the policies read: the principal's teams, closed
over the hierarchy, as roles (plus ``user``), its ``joblevel`` and ``location``; the list's
``owner``, ``owner_location``, ``readers`` and ``editors``. That is how each is meant to be called.

The mix has one request per case below; each case names the policy that decides it and the
expected verdict, and the bench checks svc and Cerbos against it before timing anything.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SEED = 20_260_501
USERS = 1_000
LISTS = 100
SQUADS = 5
LOCATIONS = ("ABC17", "DEF33", "XYZ77")
APP = {"type": "Application", "id": "TinyTodo"}

Json = dict[str, Any]


@dataclass(frozen=True)
class User:
    """A TinyTodo user and what the policies read of it."""

    id: str
    joblevel: int
    location: str
    team: str | None  # admin, temp, interns or None
    squad: str

    def teams(self) -> list[str]:
        """Every team the user is in, closed over the hierarchy (interns are in temp)."""
        ts = [self.squad]
        if self.team is not None:
            ts.append(self.team)
        if self.team == "interns":
            ts.append("temp")
        return sorted(ts)

    def high_rank_def(self) -> bool:
        """Cedar's ``principal.joblevel > 6 && principal.location like "DEF*"``."""
        return self.joblevel > 6 and self.location.startswith("DEF")


@dataclass(frozen=True)
class TodoList:
    """A list and the attributes the policies read."""

    id: str
    owner: User
    readers: str
    editors: str


@dataclass
class World:
    """Users, lists and the entity store svc loads."""

    users: list[User]
    lists: list[TodoList]
    entities: list[Json] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    """One request of the mix."""

    name: str
    action: str
    principal: User
    lst: TodoList | None  # None: the resource is Application::"TinyTodo"
    expect: str  # allow or deny, by the policies' text

    # --- svc ---------------------------------------------------------------------------------

    def resource_ref(self) -> Json:
        """The resource as an entity reference."""
        return dict(APP) if self.lst is None else {"type": "List", "id": self.lst.id}

    def svc_json(self) -> Json:
        """The body of svc's ``POST /v1/access/evaluation`` (docs/api.md)."""
        return {
            "principal": {"type": "User", "id": self.principal.id},
            "action": self.action,
            "resource": self.resource_ref(),
        }

    def svc_grpc(self, pb: Any) -> bytes:
        """svc's ``svc.authz.v1.CheckRequest``, serialized (no gRPC frame)."""
        req = pb.CheckRequest(
            principal=pb.EntityRef(type="User", id=self.principal.id),
            action=self.action,
            resource=pb.EntityRef(**self.resource_ref()),
        )
        return bytes(req.SerializeToString())

    # --- Cerbos ------------------------------------------------------------------------------

    def principal_attrs(self) -> Json:
        """What Cerbos's policies read of the principal."""
        return {"joblevel": self.principal.joblevel, "location": self.principal.location}

    def roles(self) -> list[str]:
        """The principal's Cerbos roles: its teams (closed over the hierarchy) and ``user``."""
        return ["user", *self.principal.teams()]

    def resource_attrs(self) -> Json:
        """What Cerbos's policies read of the resource."""
        if self.lst is None:
            return {}
        return {
            "owner": self.lst.owner.id,
            "owner_location": self.lst.owner.location,
            "readers": self.lst.readers,
            "editors": self.lst.editors,
        }

    def authzen_json(self) -> Json:
        """The body of an AuthZEN 1.0 access evaluation for Cerbos (``/access/v1/evaluation``).

        Cerbos reads the principal's roles from ``subject.properties["cerbos.roles"]`` (else the
        only role is the subject's type) and takes every property as an attribute (Cerbos's
        ``internal/svc/authzen_svc.go``).
        """
        ref = self.resource_ref()
        return {
            "subject": {
                "type": "User",
                "id": self.principal.id,
                "properties": {"cerbos.roles": self.roles(), **self.principal_attrs()},
            },
            "action": {"name": self.action},
            "resource": {"type": ref["type"], "id": ref["id"], "properties": self.resource_attrs()},
        }

    def cerbos_check_json(self) -> Json:
        """The same request as Cerbos's CheckResources JSON (``POST /api/check/resources``)."""
        ref = self.resource_ref()
        return {
            "requestId": self.name,
            "principal": {
                "id": self.principal.id,
                "roles": self.roles(),
                "attr": self.principal_attrs(),
            },
            "resources": [
                {
                    "actions": [self.action],
                    "resource": {
                        "kind": ref["type"],
                        "id": ref["id"],
                        "attr": self.resource_attrs(),
                    },
                }
            ],
        }

    def cerbos_grpc(self, cpb: Any) -> bytes:
        """Cerbos's ``cerbos.request.v1.CheckResourcesRequest``, serialized (no gRPC frame)."""
        from google.protobuf import json_format

        msg = cpb.CheckResourcesRequest()
        json_format.ParseDict(self.cerbos_check_json(), msg)
        return bytes(msg.SerializeToString())


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: flag 0 (not compressed), 4-byte big-endian length."""
    return struct.pack(">BI", 0, len(message)) + message


def build_world(seed: int = SEED) -> World:
    """The users, teams and lists, and svc's entity store (Cedar's entity JSON)."""
    rng = random.Random(seed)
    users = []
    for i in range(USERS):
        roll = rng.random()
        team = (
            "admin" if roll < 0.1 else "interns" if roll < 0.3 else "temp" if roll < 0.6 else None
        )
        users.append(
            User(
                id=f"user-{i:04d}",
                joblevel=rng.randint(1, 10),
                location=rng.choice(LOCATIONS),
                team=team,
                squad=f"squad-{rng.randrange(SQUADS)}",
            )
        )
    lists = []
    for k in range(LISTS):
        lists.append(
            TodoList(
                id=f"list-{k:03d}",
                owner=users[rng.randrange(USERS)],
                readers="temp" if k % 10 == 9 else f"squad-{k % SQUADS}",
                editors=f"squad-{(k + 1) % SQUADS}",
            )
        )

    def team_uid(t: str) -> Json:
        return {"type": "Team", "id": t}

    ents: list[Json] = [{"uid": dict(APP), "attrs": {}, "parents": []}]
    for t in ("admin", "temp", *(f"squad-{s}" for s in range(SQUADS))):
        ents.append({"uid": team_uid(t), "attrs": {}, "parents": [dict(APP)]})
    ents.append({"uid": team_uid("interns"), "attrs": {}, "parents": [dict(APP), team_uid("temp")]})
    for u in users:
        parents = [dict(APP), team_uid(u.squad)]
        if u.team is not None:
            parents.append(team_uid(u.team))
        ents.append(
            {
                "uid": {"type": "User", "id": u.id},
                "attrs": {"joblevel": u.joblevel, "location": u.location},
                "parents": parents,
            }
        )
    for lst in lists:
        ents.append(
            {
                "uid": {"type": "List", "id": lst.id},
                "attrs": {
                    "name": f"list {lst.id}",
                    "owner": {"__entity": {"type": "User", "id": lst.owner.id}},
                    "readers": {"__entity": team_uid(lst.readers)},
                    "editors": {"__entity": team_uid(lst.editors)},
                    "tasks": [{"id": t, "name": f"task {t}", "state": "open"} for t in range(3)],
                },
                "parents": [dict(APP)],
            }
        )
    return World(users, lists, ents)


def build_mix(world: World, seed: int = SEED) -> list[Case]:
    """One request per case: the first (user, list) pair, in a seeded order, that fits it."""
    rng = random.Random(seed + 1)
    users = list(world.users)
    lists = list(world.lists)
    rng.shuffle(users)
    rng.shuffle(lists)

    def member(u: User, team: str) -> bool:
        return team in u.teams()

    def same_loc(u: User, lst: TodoList) -> bool:
        return u.location == lst.owner.location

    def plain(u: User, lst: TodoList) -> bool:
        """Neither owner, reader, editor nor admin of the list."""
        return (
            u.id != lst.owner.id
            and not member(u, lst.readers)
            and not member(u, lst.editors)
            and u.team != "admin"
        )

    def reader_only(u: User, lst: TodoList) -> bool:
        return (
            member(u, lst.readers)
            and not member(u, lst.editors)
            and u.id != lst.owner.id
            and u.team != "admin"
        )

    ListPick = Callable[[User, TodoList], bool]
    AppPick = Callable[[User], bool]
    # name, action, picks a list?, predicate, expected verdict (policy that decides it)
    app_cases: list[tuple[str, str, AppPick, str]] = [
        ("GetLists by a user (p0)", "GetLists", lambda u: u.team is None, "allow"),
        ("CreateList by temp (p0)", "CreateList", lambda u: u.team == "temp", "allow"),
        (
            "CreateList by an intern (p5 forbids)",
            "CreateList",
            lambda u: u.team == "interns",
            "deny",
        ),
        ("CreateList by an admin (p0, p4)", "CreateList", lambda u: u.team == "admin", "allow"),
    ]
    list_cases: list[tuple[str, str, ListPick, str]] = [
        (
            "GetList by a reader at the owner's location (p2)",
            "GetList",
            lambda u, lst: reader_only(u, lst) and same_loc(u, lst) and not u.high_rank_def(),
            "allow",
        ),
        (
            "GetList by a reader elsewhere, low rank (p6 forbids)",
            "GetList",
            lambda u, lst: reader_only(u, lst) and not same_loc(u, lst) and not u.high_rank_def(),
            "deny",
        ),
        (
            "GetList by a high-rank reader at DEF, owner elsewhere (p2)",
            "GetList",
            lambda u, lst: reader_only(u, lst) and not same_loc(u, lst) and u.high_rank_def(),
            "allow",
        ),
        (
            "GetList by an unrelated user (no permit)",
            "GetList",
            lambda u, lst: plain(u, lst) and same_loc(u, lst),
            "deny",
        ),
        (
            "UpdateList by an editor at the owner's location (p3)",
            "UpdateList",
            lambda u, lst: (
                member(u, lst.editors)
                and u.id != lst.owner.id
                and u.team != "admin"
                and same_loc(u, lst)
            ),
            "allow",
        ),
        (
            "UpdateList by a reader who is no editor (no permit)",
            "UpdateList",
            lambda u, lst: reader_only(u, lst) and same_loc(u, lst),
            "deny",
        ),
        (
            "CreateTask by the owner (p1)",
            "CreateTask",
            lambda u, lst: u.id == lst.owner.id,
            "allow",
        ),
        (
            "DeleteList by a non-owner (no permit)",
            "DeleteList",
            lambda u, lst: plain(u, lst) and same_loc(u, lst),
            "deny",
        ),
        (
            "DeleteList by an admin at the owner's location (p4)",
            "DeleteList",
            lambda u, lst: u.team == "admin" and u.id != lst.owner.id and same_loc(u, lst),
            "allow",
        ),
        (
            "DeleteList by an admin elsewhere, low rank (p6 forbids)",
            "DeleteList",
            lambda u, lst: (
                u.team == "admin"
                and u.id != lst.owner.id
                and not same_loc(u, lst)
                and not u.high_rank_def()
            ),
            "deny",
        ),
        (
            "GetList by an intern via temp's read share (p2, hierarchy)",
            "GetList",
            lambda u, lst: (
                lst.readers == "temp"
                and u.team == "interns"
                and not member(u, lst.editors)
                and u.id != lst.owner.id
                and same_loc(u, lst)
            ),
            "allow",
        ),
        (
            "DeleteTask by a high-rank editor at DEF, owner elsewhere (p3)",
            "DeleteTask",
            lambda u, lst: (
                member(u, lst.editors)
                and u.id != lst.owner.id
                and not same_loc(u, lst)
                and u.high_rank_def()
            ),
            "allow",
        ),
    ]

    def rotated(xs: list[Any], j: int, step: int) -> list[Any]:
        """`xs` starting at a case-dependent offset, so that cases pick different entities."""
        k = (j * step) % len(xs)
        return xs[k:] + xs[:k]

    cases: list[Case] = []
    for j, (name, action, pick_app, expect) in enumerate(app_cases):
        u = next(u for u in rotated(users, j, 61) if pick_app(u))
        cases.append(Case(name, action, u, None, expect))
    for j, (name, action, pick_list, expect) in enumerate(list_cases):
        u, lst = next(
            (u, lst)
            for lst in rotated(lists, j, 7)
            for u in rotated(users, j, 61)
            if pick_list(u, lst)
        )
        cases.append(Case(name, action, u, lst, expect))
    return cases


def jsonl(bodies: list[Json]) -> str:
    """Bodies as JSON lines (compact), the format ``post.lua`` reads."""
    return "".join(json.dumps(b, separators=(",", ":")) + "\n" for b in bodies)
