"""Query-plan benchmark: ``svc``'s ``Engine.plan`` against ``cedarpy``'s partial evaluation.

What is measured
----------------
Subjects (each one bundle, loaded into an ``svc`` engine and into ``cedarpy`` handles):

* Cedar's example apps (``tests/testdata/cedar-examples``): ``document_cloud``, ``tinytodo``,
  ``github_example``, ``streaming_service`` and ``tags_n_roles``, each loaded with
  ``Engine.from_bundle_dir``. Plan requests are every principal of the app's own
  ``entities.json`` (of the types the actions apply to) times every action that applies to a
  resource type, with contexts taken from the app's ``ALLOW``/``DENY`` request files when the
  action needs one (``document_cloud``: ``is_authenticated`` true and false). ``tinytodo`` ships
  no lists, so three ``List`` entities are added to both engines, only for the check requests.
* Synthetic policy sets of 10, 100 and 1,000 policies over one schema (``User in [Group]``,
  ``Group in [Group]``, ``Doc`` with ``owner``, ``dept``, ``level``, ``tags``, ``title``,
  ``public``, optional ``archived`` and ``readers: Set<Group>``), generated from a fixed seed:
  conditions on resource attributes (``==``, ``!=``, ``<``, ``<=``, ``>``, ``has``,
  ``contains``, ``containsAny``, ``principal in resource.readers``, ``like``), on principal
  attributes and on the context, scopes on users, groups and single docs, about 15% forbids and
  ``@id`` on every tenth policy. 50 users in 20 groups and 100 docs in the store; each set is
  validated by cedarpy and loaded strictly by svc.

Per subject, four kinds of call, each timed one call at a time with ``time.perf_counter_ns``
(the Python -> Rust conversion of the request and the conversion of the response dict back to
Python are inside the sample):

* ``svc plan``: ``engine.plan({principal, action, resource_type, context})``, principals varied
  over the mix (shuffled, cycled); ``plan_qid`` is never passed, so every call builds a plan
  with its own qid. The engine's plan memo is on (the default): a question asked before, with
  the principal's entities, context and policies unchanged, reuses that plan's filters; since
  the mix cycles, nearly every timed call is such a repeat;
* ``svc plan cold``: the same calls with the memo off (``configure_plans(memo=False)`` around
  the chunk), so every call runs Cedar's partial evaluation: the cost of a question not seen
  before;
* ``svc check``: ``engine.evaluate`` with the same principals, actions and contexts and a
  concrete resource of the planned type, for the "plan at most 2x check" target;
* ``cedarpy partial``: ``cedarpy.is_authorized_partial`` on the same policies, schema, entities
  and request with the resource left out (cedarpy treats an absent field as unknown). cedarpy
  has no typed unknowns: its resource unknown carries no entity type, so the type is not known
  to cedarpy (svc plans for one type). Pre-built ``PolicySet``, ``Schema`` and ``Entities``
  handles; the ``Entities`` handle holds the schema's action entities (so the action hierarchy
  is known, as it is to svc) plus the bundle's entities.

Interleaved rounds (20; 4 with ``--quick``): each round times a chunk of every kind on every
subject, subjects and kinds in rotated order, so that drift of the machine's speed hits every
side alike. Chunk sizes are set per subject and kind from a calibration pass (about 0.1 s of
calls per chunk). A short warm-up precedes every chunk and the cyclic GC is paused while timing.
p50/p99 pool all samples; ratios (plan/check, cold/check, cedarpy/plan, cedarpy/cold) are
medians of per-round ratios of p50s measured back to back.

Before timing, every request is run once on every side: svc must return a plan (an ``outcome``,
and a ``filter`` when conditional), ``evaluate`` must agree with ``cedarpy.is_authorized`` on
every check request, and cedarpy's partial evaluation must answer without errors (a decision, or
residuals). For the synthetic sets, every conditional plan's filter is also evaluated on all 100
docs with ``svc.plan.evaluate`` and compared with ``engine.evaluate`` on the same doc (rows
needing row checks are skipped).

Targets (issue "Query plans"): plan p50 <= 100 us on the example apps; plan p50 <= 2x the check
p50 on the same bundle; faster than cedarpy's partial evaluation at every size. Misses print as
``MISS``; the script exits 0 (benches report, they do not assert).

Run: ``.venv/bin/python benches/bench_plan.py`` (about 2 minutes) or ``... --quick``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cedarpy

from svc.pdp import Engine, RequestError
from svc.plan import evaluate as filter_evaluate
from svc.plan import parse_filter

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EXAMPLES = REPO / "tests" / "testdata" / "cedar-examples"

# Targets of the issue item "Query plans".
PLAN_P50_MAX_US = 100.0
PLAN_OVER_CHECK_MAX = 2.0
SPEEDUP_MIN = 1.0

SIZES = (10, 100, 1_000)
SEED = 20_240_611
SANITY_ROW_PLANS = 20  # conditional plans whose filter is checked row by row on every doc
SANITY_CHECKS = 300  # check requests compared with cedarpy.is_authorized before timing

Json = dict[str, Any]


@dataclass(frozen=True)
class Profile:
    """How much to measure."""

    rounds: int
    chunk_s: float  # target seconds of calls per timed chunk
    min_chunk: int
    max_chunk: int
    warmup: int


FULL = Profile(rounds=20, chunk_s=0.1, min_chunk=40, max_chunk=1_000, warmup=10)
QUICK = Profile(rounds=4, chunk_s=0.02, min_chunk=10, max_chunk=200, warmup=3)


# --- helpers -----------------------------------------------------------------------------------


def uid(ty: str, id_: str) -> Json:
    return {"type": ty, "id": id_}


def ref(ty: str, id_: str) -> Json:
    return {"__entity": uid(ty, id_)}


def parse_literal_uid(s: str) -> Json:
    """``Type::"id"`` -> ``{"type", "id"}``."""
    ty, _, rest = s.partition("::")
    return uid(ty, json.loads(rest))


def norm_uid(u: Any) -> Json:
    """Any of Cedar's entity-reference spellings -> ``{"type", "id"}``."""
    if isinstance(u, str):
        return parse_literal_uid(u)
    if "__entity" in u:
        return dict(u["__entity"])
    return {"type": u["type"], "id": u["id"]}


def cedar_entities(raw: Any) -> list[Json]:
    """A bundle's ``entities.json`` as Cedar's JSON array (TinyTodo's entity map too)."""
    if isinstance(raw, list):
        return raw
    out: list[Json] = []

    def one(key: str, obj: Json) -> Json:
        obj = dict(obj)
        u = obj.pop("euid", None) or obj.pop("uid", None) or key
        parents = [parse_literal_uid(p) for p in obj.pop("parents", [])]
        return {"uid": norm_uid(u), "attrs": obj, "parents": parents}

    for group, value in raw.items():
        if "euid" in value or "uid" in value:
            out.append(one(group, value))
        else:
            out.extend(one(k, v) for k, v in value.items())
    return out


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-quantile."""
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def time_calls(
    fn: Callable[[Json], Any], requests: Sequence[Json], calls: int, start: int, warmup: int
) -> list[float]:
    """Times ``calls`` single calls of ``fn`` over ``requests`` (cyclically); microseconds."""
    n = len(requests)
    for i in range(warmup):
        fn(requests[(start + n - 1 - i) % n])
    clock = time.perf_counter_ns
    out = [0] * calls
    gc.disable()
    try:
        for i in range(calls):
            r = requests[(start + i) % n]
            t0 = clock()
            fn(r)
            out[i] = clock() - t0
    finally:
        gc.enable()
    return [ns / 1_000 for ns in out]


# --- subjects ----------------------------------------------------------------------------------


@dataclass
class Inputs:
    """One bundle as both sides see it, and its request mixes."""

    label: str
    kind: str  # "app" or "synthetic"
    engine: Engine
    cp_policies: Any
    cp_schema: Any
    cp_entities: Any
    plans: list[Json]  # svc plan requests
    partials: list[Json]  # cedarpy partial requests, index-aligned with ``plans``
    checks: list[Json]  # evaluate requests (full uids; fed to cedarpy for the agreement check)
    docs: list[Json] = field(default_factory=list)  # synthetic resources, for filter checks
    outcomes: list[str] = field(default_factory=list)  # svc plan outcome per plan request
    notes: list[str] = field(default_factory=list)


def literal(u: Json) -> str:
    """``{"type", "id"}`` -> ``Type::"id"`` (cedarpy's request fields are strings)."""
    return f"{u['type']}::{json.dumps(u['id'])}"


def partial_request(plan_request: Json) -> Json:
    """The cedarpy partial request for a plan request: the resource left out (unknown)."""
    q = plan_request
    return {"principal": literal(q["principal"]), "action": q["action"], "context": q["context"]}


def action_uid(a: str) -> str:
    return f"Action::{json.dumps(a)}"


def cedarpy_handles(schema_text: str, policies_text: str, entities: list[Json]) -> tuple:
    """Pre-built cedarpy handles; the entities hold the schema's action entities too.

    The entities are parsed with the schema (which adds the action entities and types values
    such as streaming_service's ``datetime`` attributes) when they conform to it. Otherwise
    (document_cloud's and github_example's ``entities.json`` break their own schemas; svc loads
    them with a warning) the action entities come from the schema alone and the bundle's
    entities are added without it.
    """
    schema = cedarpy.Schema.from_str(schema_text)
    policies = cedarpy.PolicySet.from_str(policies_text)
    text = json.dumps(entities)
    try:
        ents = cedarpy.Entities.from_json_str(text, schema)
    except ValueError:
        ents = cedarpy.Entities.from_json_str("[]", schema).with_added_json_str(text)
    return policies, schema, ents


# Per app: principal types; resource type -> actions; contexts per action ("*" = default);
# entities added for check requests only.
APP_SPECS: dict[str, Json] = {
    "document_cloud": {
        "principals": ("User", "Public"),
        "actions": {
            "Document": (
                "ViewDocument",
                "ModifyDocument",
                "DeleteDocument",
                "EditIsPrivate",
                "EditPublicAccess",
                "AddToShareACL",
            ),
            "Group": ("DeleteGroup", "ModifyGroup"),
        },
        "contexts": {"*": [{"is_authenticated": True}, {"is_authenticated": False}]},
    },
    "tinytodo": {
        "principals": ("User",),
        "actions": {
            "List": (
                "GetList",
                "UpdateList",
                "DeleteList",
                "CreateTask",
                "UpdateTask",
                "DeleteTask",
                "EditShare",
            ),
        },
        "contexts": {"*": [{}]},
        "extra": [
            {
                "uid": uid("List", f"list-{k}"),
                "attrs": {
                    "name": f"list {k}",
                    "owner": ref("User", ("kesha", "aaron", "emina")[k]),
                    "readers": ref("Team", ("temp", "admin", "interns")[k]),
                    "editors": ref("Team", ("admin", "interns", "temp")[k]),
                    "tasks": [{"id": 1, "name": "t", "state": "open"}],
                },
                "parents": [uid("Application", "TinyTodo")],
            }
            for k in range(3)
        ],
    },
    "github_example": {
        "principals": ("User",),
        "actions": {
            "Repository": (
                "pull",
                "fork",
                "push",
                "add_reader",
                "add_triager",
                "add_writer",
                "add_maintainer",
                "add_admin",
            ),
            "Issue": ("delete_issue", "edit_issue", "assign_issue"),
        },
        "contexts": {"*": [{}]},
    },
    "streaming_service": {
        "principals": ("Subscriber", "FreeMember"),
        "actions": {"Movie": ("watch", "rent", "buy"), "Show": ("watch",)},
        "contexts": {"buy": "rent"},  # from the request files; buy's context has rent's shape
    },
    "tags_n_roles": {
        "principals": ("User",),
        "actions": {"Workspace": ("ReadWorkspace", "UpdateWorkspace", "DeleteWorkspace")},
        "contexts": {"*": [{}]},
    },
}
APPS = tuple(APP_SPECS)


def app_inputs(app: str, bundle: Path, rng: random.Random) -> Inputs:
    spec = APP_SPECS[app]
    engine = Engine.from_bundle_dir(bundle)
    extra = spec.get("extra", [])
    if extra:
        engine.upsert_entities(extra)
    schema_text = next(bundle.glob("*.cedarschema")).read_text()
    policies_text = "\n".join(p.read_text() for p in sorted(bundle.glob("*.cedar")))
    ents = cedar_entities(json.loads((bundle / "entities.json").read_text())) + extra
    cp = cedarpy_handles(schema_text, policies_text, ents)

    # Contexts: the request files' contexts per action, else the spec's.
    file_ctx: dict[str, list[Json]] = {}
    for sub in ("ALLOW", "DENY"):
        for p in sorted((bundle / sub).glob("*.json")) if (bundle / sub).is_dir() else []:
            r = json.loads(p.read_text())
            a = norm_uid(r["action"])["id"]
            c = r.get("context", {})
            if c not in file_ctx.setdefault(a, []):
                file_ctx[a].append(c)

    def contexts(action: str) -> list[Json]:
        ctx = spec["contexts"]
        if action in file_ctx:
            return file_ctx[action]
        if isinstance(ctx.get(action), str):
            return file_ctx[ctx[action]]
        return ctx.get(action) or ctx["*"]

    uids = [norm_uid(e["uid"]) for e in ents]
    principals = [u for u in uids if u["type"] in spec["principals"]]
    plans: list[Json] = []
    checks: list[Json] = []
    dropped = 0
    for rtype, actions in spec["actions"].items():
        resources = [u for u in uids if u["type"] == rtype]
        for a in actions:
            for c in contexts(a):
                for p in principals:
                    req = {"principal": p, "action": action_uid(a), "resource_type": rtype}
                    req["context"] = c
                    try:
                        engine.plan(req)
                    except RequestError:
                        dropped += 1  # the action does not apply to this principal type
                        continue
                    plans.append(req)
                    checks += [
                        {"principal": p, "action": action_uid(a), "resource": r, "context": c}
                        for r in resources
                    ]
    rng.shuffle(plans)
    rng.shuffle(checks)
    partials = [partial_request(q) for q in plans]
    notes = [
        f"{len(principals)} principals, {sum(map(len, spec['actions'].values()))} actions, "
        f"{len(plans)} plan requests ({dropped} dropped: action not for that principal type), "
        f"{len(checks)} check requests"
    ]
    return Inputs(app, "app", engine, *cp, plans, partials, checks, notes=notes)


# --- synthetic policy sets ---------------------------------------------------------------------

SYN_SCHEMA = """\
entity Group in [Group];
entity User in [Group] = {
  dept: String,
  level: Long,
  tags: Set<String>,
};
entity Doc = {
  owner: User,
  dept: String,
  level: Long,
  tags: Set<String>,
  title: String,
  public: Bool,
  archived?: Bool,
  readers: Set<Group>,
};
action view, edit, share appliesTo {
  principal: [User],
  resource: [Doc],
  context: { mfa: Bool, hour: Long },
};
"""
N_USERS, N_GROUPS, N_DOCS, N_DEPTS, N_TAGS = 50, 20, 100, 5, 10


def syn_entities(rng: random.Random) -> tuple[list[Json], list[Json]]:
    """Groups (a tree, plus ``admins``), users in 1-2 groups, and docs. Returns (all, docs)."""
    ents: list[Json] = [{"uid": uid("Group", "admins"), "attrs": {}, "parents": []}]
    for g in range(N_GROUPS):
        parents = [uid("Group", f"g{(g - 1) // 3}")] if g else []
        ents.append({"uid": uid("Group", f"g{g}"), "attrs": {}, "parents": parents})
    for i in range(N_USERS):
        groups = {f"g{rng.randrange(N_GROUPS)}" for _ in range(rng.randint(1, 2))}
        if i % 10 == 0:
            groups.add("admins")
        ents.append(
            {
                "uid": uid("User", f"u{i}"),
                "attrs": {
                    "dept": f"d{i % N_DEPTS}",
                    "level": i % 8,
                    "tags": sorted({f"t{rng.randrange(N_TAGS)}" for _ in range(2)}),
                },
                "parents": [uid("Group", g) for g in sorted(groups)],
            }
        )
    docs = []
    for k in range(N_DOCS):
        attrs: Json = {
            "owner": ref("User", f"u{rng.randrange(N_USERS)}"),
            "dept": f"d{rng.randrange(N_DEPTS)}",
            "level": rng.randrange(10),
            "tags": sorted(
                {f"t{rng.randrange(N_TAGS)}" for _ in range(rng.randint(0, 3))}
                | ({"locked"} if k % 7 == 0 else set())
            ),
            "title": f"{rng.choice(('report', 'memo', 'plan'))}-{k}",
            "public": k % 3 == 0,
            "readers": [ref("Group", f"g{rng.randrange(N_GROUPS)}") for _ in range(2)],
        }
        if k % 4:
            attrs["archived"] = k % 4 == 1
        docs.append({"uid": uid("Doc", f"doc{k}"), "attrs": attrs, "parents": []})
    return ents + docs, docs


def syn_policies(n: int, rng: random.Random) -> str:
    """``n`` policies drawn from the templates below, deterministically."""

    def u() -> str:
        return f'User::"u{rng.randrange(N_USERS)}"'

    def g() -> str:
        return f'Group::"g{rng.randrange(N_GROUPS)}"'

    def d() -> str:
        return f'"d{rng.randrange(N_DEPTS)}"'

    def t() -> str:
        return f'"t{rng.randrange(N_TAGS)}"'

    def lv() -> int:
        return rng.randrange(1, 10)

    def act() -> str:
        return rng.choice(
            (
                'action == Action::"view"',
                'action == Action::"edit"',
                'action in [Action::"view", Action::"edit"]',
                "action",
            )
        )

    templates: list[tuple[int, Callable[[], str]]] = [
        (
            3,
            lambda: (
                f"permit(principal, {act()}, resource) "
                f"when {{ resource.owner == principal && resource.level != {lv()} }};"
            ),
        ),
        (
            3,
            lambda: (
                f'permit(principal, action == Action::"view", resource) '
                f"when {{ principal in resource.readers && resource.dept != {d()} }};"
            ),
        ),
        (
            4,
            lambda: (
                f"permit(principal == {u()}, {act()}, resource) when {{ resource.level < {lv()} }};"
            ),
        ),
        (
            4,
            lambda: (
                f"permit(principal in {g()}, {act()}, resource) "
                f"when {{ resource.dept == {d()} && resource.level <= {lv()} }};"
            ),
        ),
        (
            3,
            lambda: (
                f"permit(principal in {g()}, {act()}, resource) when {{ resource has "
                f"archived && !resource.archived && resource.tags.contains({t()}) }};"
            ),
        ),
        (
            2,
            lambda: (
                f"permit(principal, {act()}, resource) "
                f'when {{ resource.title like "*-{rng.randrange(N_DOCS)}*" && resource.public }};'
            ),
        ),
        (
            2,
            lambda: (
                'permit(principal, action == Action::"edit", resource) when { '
                "resource.dept == principal.dept && resource.level <= principal.level "
                "&& context.mfa };"
            ),
        ),
        (
            2,
            lambda: (
                f"permit(principal, {act()}, resource) when {{ "
                f"resource.tags.containsAny([{t()}, {t()}]) && context.hour < {rng.randrange(24)} "
                f"&& resource.level > {lv()} }};"
            ),
        ),
        (
            1,
            lambda: (
                f'permit(principal in {g()}, action == Action::"view", '
                f'resource == Doc::"doc{rng.randrange(N_DOCS)}");'
            ),
        ),
        (
            1,
            lambda: (
                f'permit(principal, action == Action::"share", resource) '
                f"when {{ resource.owner == principal && principal.tags.contains({t()}) }};"
            ),
        ),
        (
            1,
            lambda: (
                f"forbid(principal in {g()}, {act()}, resource) "
                f'when {{ resource.tags.contains("locked") }};'
            ),
        ),
        (
            1,
            lambda: (
                "forbid(principal, action, resource) when { resource has archived && "
                'resource.archived } unless { principal in Group::"admins" };'
            ),
        ),
        (
            1,
            lambda: (
                f"forbid(principal == {u()}, {act()}, resource) when {{ resource.level > {lv()} }};"
            ),
        ),
    ]
    weights = [w for w, _ in templates]
    out = []
    for i in range(n):
        _, make = rng.choices(templates, weights)[0]
        body = make()
        if i % 10 == 0:
            body = f'@id("syn-{i}")\n{body}'
        out.append(body)
    return "\n".join(out) + "\n"


def synthetic_inputs(n: int, rng: random.Random) -> Inputs:
    ents, docs = syn_entities(random.Random(f"{SEED}-entities"))
    policies_text = syn_policies(n, rng)
    valid = cedarpy.validate_policies(policies_text, SYN_SCHEMA)
    if not valid.validation_passed:
        raise AssertionError(f"synthetic set {n}: {valid.errors}")
    engine = Engine(policies_text, SYN_SCHEMA, ents)  # strict: raises on any problem
    assert len(engine.policy_names) == n, (len(engine.policy_names), n)
    cp = cedarpy_handles(SYN_SCHEMA, policies_text, ents)
    plans, checks = [], []
    for i in range(N_USERS):
        for a in ("view", "edit", "share"):
            for mfa in (True, False):
                c = {"mfa": mfa, "hour": (7 * i + len(a)) % 24}
                p = uid("User", f"u{i}")
                plans.append(
                    {"principal": p, "action": action_uid(a), "resource_type": "Doc", "context": c}
                )
                checks += [
                    {
                        "principal": p,
                        "action": action_uid(a),
                        "resource": uid("Doc", f"doc{rng.randrange(N_DOCS)}"),
                        "context": c,
                    }
                    for _ in range(3)
                ]
    rng.shuffle(plans)
    rng.shuffle(checks)
    partials = [partial_request(q) for q in plans]
    forbids = policies_text.count("forbid(")
    notes = [
        f"{n} policies ({forbids} forbid), {len(ents)} entities, {len(plans)} plan requests, "
        f"{len(checks)} check requests"
    ]
    return Inputs(
        f"synthetic {n:,}",
        "synthetic",
        engine,
        *cp,
        plans,
        partials,
        checks,
        docs=docs,
        notes=notes,
    )


# --- sanity ------------------------------------------------------------------------------------


def sanity(s: Inputs) -> dict[str, Counter]:
    """Runs every request on every side once; raises on a broken answer. Returns tallies."""
    outcomes: Counter = Counter()
    pair: Counter = Counter()
    row_checks: Counter = Counter()
    row_checked_plans = 0
    for q, pq in zip(s.plans, s.partials, strict=True):
        plan = s.engine.plan(q)
        out = plan["outcome"]
        outcomes[out] += 1
        s.outcomes.append(out)
        if out in ("conditional", "challenge") and "filter" not in plan:
            raise AssertionError(f"{s.label}: {q}: {out} plan without a filter")
        r = cedarpy.is_authorized_partial(pq, s.cp_policies, s.cp_entities, s.cp_schema)
        if r.diagnostics.errors:
            raise AssertionError(f"{s.label}: cedarpy partial {pq}: {r.diagnostics.errors}")
        dec = r.decision.name
        if dec == "NoDecision" and not r.residuals:
            raise AssertionError(f"{s.label}: cedarpy partial {pq}: no decision, no residuals")
        pair[(out, dec)] += 1
        if (
            s.docs
            and out == "conditional"
            and not plan["needs_row_checks"]
            and row_checked_plans < SANITY_ROW_PLANS
        ):
            row_checked_plans += 1
            node = parse_filter(plan["filter"])
            for doc in s.docs:
                want = s.engine.evaluate(
                    {
                        "principal": q["principal"],
                        "action": q["action"],
                        "resource": doc["uid"],
                        "context": q["context"],
                    }
                )["verdict"]
                got = "allow" if filter_evaluate(node, doc) else "deny"
                row_checks["agree" if got == want else "DISAGREE"] += 1
                if got != want:
                    raise AssertionError(f"{s.label}: filter of {q} on {doc['uid']}: {got}/{want}")
    for q in s.checks[:SANITY_CHECKS]:
        got = s.engine.evaluate(q)["verdict"]
        c = cedarpy.is_authorized(q, s.cp_policies, s.cp_entities, s.cp_schema)
        want = "allow" if c.allowed else "deny"
        if got != want or c.diagnostics.errors:
            raise AssertionError(f"{s.label}: check {q}: svc {got}, cedarpy {want}")
    return {"svc": outcomes, "pairs": pair, "rows": row_checks}


# --- measurement -------------------------------------------------------------------------------

KINDS = ("plan", "cold", "check", "cpy")


class Subject:
    def __init__(self, inputs: Inputs, profile: Profile) -> None:
        self.i = inputs
        t = time.perf_counter()
        self.tally = sanity(inputs)
        self.sanity_s = time.perf_counter() - t
        self.fns: dict[str, tuple[Callable[[Json], Any], list[Json]]] = {
            "plan": (inputs.engine.plan, inputs.plans),
            "cold": (inputs.engine.plan, inputs.plans),  # timed with the plan memo off
            "check": (inputs.engine.evaluate, inputs.checks),
            "cpy": (self.cedarpy_partial, inputs.partials),
        }
        self.chunks = {}
        for k, (fn, reqs) in self.fns.items():
            m = min(len(reqs), 50)
            inputs.engine.configure_plans(memo=k != "cold")
            cal = statistics.median(time_calls(fn, reqs, m, 0, 3)) / 1e6
            inputs.engine.configure_plans(memo=True)
            self.chunks[k] = max(
                profile.min_chunk, min(profile.max_chunk, int(profile.chunk_s / cal))
            )
        self.samples: dict[str, list[float]] = {k: [] for k in KINDS}
        self.round_p50: dict[str, list[float]] = {k: [] for k in KINDS}
        self.by_outcome: dict[str, list[float]] = {}  # plan samples split by svc outcome

    def cedarpy_partial(self, r: Json) -> Any:
        i = self.i
        return cedarpy.is_authorized_partial(r, i.cp_policies, i.cp_entities, i.cp_schema)

    def run_round(self, rnd: int, profile: Profile) -> None:
        kinds = KINDS[rnd % len(KINDS) :] + KINDS[: rnd % len(KINDS)]
        for k in kinds:
            fn, reqs = self.fns[k]
            start = rnd * self.chunks[k]
            if k == "cold":
                self.i.engine.configure_plans(memo=False)
            try:
                v = time_calls(fn, reqs, self.chunks[k], start, min(profile.warmup, self.chunks[k]))
            finally:
                self.i.engine.configure_plans(memo=True)
            self.samples[k] += v
            if k == "plan":
                for j, x in enumerate(v):
                    out = self.i.outcomes[(start + j) % len(reqs)]
                    self.by_outcome.setdefault(out, []).append(x)
            self.round_p50[k].append(percentile(v, 0.5))

    def paired(self, a: str, b: str) -> float:
        """Median over rounds of p50(a) / p50(b)."""
        return statistics.median(
            x / y for x, y in zip(self.round_p50[a], self.round_p50[b], strict=True)
        )


# --- profile -----------------------------------------------------------------------------------


def micro(fn: Callable[[], Any], budget_s: float = 0.3, most: int = 300) -> float:
    """p50 (us) of up to ``most`` calls of ``fn`` within about ``budget_s``, after a warm-up."""
    for _ in range(3):
        fn()
    clock = time.perf_counter_ns
    out: list[int] = []
    gc.disable()
    try:
        end = clock() + budget_s * 1e9
        while len(out) < most and (len(out) < 5 or clock() < end):
            t0 = clock()
            fn()
            out.append(clock() - t0)
    finally:
        gc.enable()
    return percentile(out, 0.5) / 1_000


def where_time_goes(subjects: list[Subject]) -> None:
    """Plan p50 by outcome (from the timed rounds) and with the principal contained.

    A contained principal gets ``always_denied`` before any policy is looked at, so that
    figure is the floor: binding, request parse and response, no planning.
    """
    print(
        "\nPlan p50 by outcome (timed rounds) and for a contained principal (engine short cut,\n"
        "no policy looked at: the binding and request/response floor):"
    )
    for s in subjects:
        eng = s.i.engine
        parts = [
            f"{out} {percentile(v, 0.5):.1f} us (n={len(v)})"
            for out, v in sorted(s.by_outcome.items())
        ]
        q = s.i.plans[0]
        eng.contain([q["principal"]])
        try:
            assert eng.plan(q)["outcome"] == "always_denied"
            parts.append(f"contained {micro(lambda q=q, eng=eng: eng.plan(q)):.1f} us")
        finally:
            eng.lift([q["principal"]])
        print(f"  {s.i.label:<18} " + "; ".join(parts))


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(subjects: list[Subject]) -> None:
    print(
        "\nAll times in microseconds per call. plan = svc Engine.plan (default: plan memo on,\n"
        "so a repeated question reuses its filters); cold = the same calls with the memo off\n"
        "(every call runs partial evaluation); check = svc Engine.evaluate on the same bundle\n"
        "(same principals/actions/contexts, a resource of the planned type); plan/chk and\n"
        "cold/chk = median of per-round p50 ratios; cpy = cedarpy is_authorized_partial,\n"
        "resource unknown, pre-built handles; speedup = cpy p50 / plan p50 (cold: / cold p50),\n"
        "median of per-round ratios."
    )
    head = (
        f"{'subject':<19}{'plans':>6}{'plan p50':>9}{'p99':>8}{'cold p50':>9}{'p99':>8}"
        f"{'check p50':>10}{'plan/chk':>9}{'cold/chk':>9}{'cpy p50':>9}{'p99':>9}"
        f"{'speedup':>8}{'cold':>7}"
    )
    print()
    print(head)
    print("-" * len(head))
    for s in subjects:
        sm = s.samples
        print(
            f"{s.i.label:<19}{len(s.i.plans):>6}{percentile(sm['plan'], 0.5):>9.1f}"
            f"{percentile(sm['plan'], 0.99):>8.1f}{percentile(sm['cold'], 0.5):>9.1f}"
            f"{percentile(sm['cold'], 0.99):>8.1f}{percentile(sm['check'], 0.5):>10.1f}"
            f"{s.paired('plan', 'check'):>8.2f}x{s.paired('cold', 'check'):>8.2f}x"
            f"{percentile(sm['cpy'], 0.5):>9.1f}{percentile(sm['cpy'], 0.99):>9.1f}"
            f"{s.paired('cpy', 'plan'):>7.2f}x{s.paired('cpy', 'cold'):>6.2f}x"
        )
    print(
        "\nSamples per kind (plan/cold/check/cpy): "
        + "; ".join(
            f"{s.i.label} {'/'.join(str(len(s.samples[k])) for k in KINDS)}" for s in subjects
        )
    )

    print("\nOutcomes (svc plan outcome, cedarpy partial decision) over each plan mix:")
    for s in subjects:
        pairs = ", ".join(f"{a}/{b} {n}" for (a, b), n in sorted(s.tally["pairs"].items()))
        rows = s.tally["rows"]
        extra = f"; filter vs evaluate on docs: {dict(rows)}" if rows else ""
        print(f"  {s.i.label:<18} {pairs}{extra}")

    def target(ok: bool, what: str, figure: str) -> None:
        print(f"  {verdict(ok)}  {what:<42}{figure}")

    for kind, label in (("plan", "memo on"), ("cold", "memo off")):
        print(f"\nTargets ({kind}: {label}):")
        for s in subjects:
            if s.i.kind == "app":
                p50 = percentile(s.samples[kind], 0.5)
                target(
                    p50 <= PLAN_P50_MAX_US,
                    f"{kind} p50 <= {PLAN_P50_MAX_US:g} us",
                    f"{s.i.label}: {p50:.1f} us",
                )
        for s in subjects:
            r = s.paired(kind, "check")
            target(
                r <= PLAN_OVER_CHECK_MAX,
                f"{kind} p50 <= {PLAN_OVER_CHECK_MAX:g}x check p50",
                f"{s.i.label}: {r:.2f}x",
            )
        for s in subjects:
            r = s.paired("cpy", kind)
            target(r > SPEEDUP_MIN, f"{kind} faster than cedarpy partial", f"{s.i.label}: {r:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 short rounds")
    parser.add_argument(
        "--examples",
        type=Path,
        default=Path(os.environ.get("SVC_CEDAR_EXAMPLES", DEFAULT_EXAMPLES)),
        help="directory holding Cedar's example apps (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    for app in APPS:
        if not (args.examples / app).is_dir():
            print(f"error: {args.examples / app} not found (see --examples)", file=sys.stderr)
            return 2

    print(
        f"svc query-plan bench ({'quick' if args.quick else 'full'}): python "
        f"{platform.python_version()}, cedarpy {_version('cedarpy')}, {os.cpu_count()} CPUs, "
        f"{platform.machine()}"
    )
    print(f"load average at start: {_load()} (other work on the machine skews every figure)")
    t0 = time.perf_counter()
    inputs = [app_inputs(a, args.examples / a, random.Random(f"{SEED}-{a}")) for a in APPS]
    inputs += [synthetic_inputs(n, random.Random(f"{SEED}-syn-{n}")) for n in SIZES]
    subjects = []
    for i in inputs:
        s = Subject(i, profile)
        subjects.append(s)
        print(
            f"  {i.label}: {'; '.join(i.notes)}; sanity {s.sanity_s:.1f}s; chunks "
            + "/".join(str(s.chunks[k]) for k in KINDS),
            flush=True,
        )
    gc.collect()

    t = time.perf_counter()
    k = len(subjects)
    for rnd in range(profile.rounds):
        for s in subjects[rnd % k :] + subjects[: rnd % k]:
            s.run_round(rnd, profile)
    print(
        f"{profile.rounds} interleaved rounds timed in {time.perf_counter() - t:.1f}s", flush=True
    )

    report(subjects)
    where_time_goes(subjects)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s; load average at end: {_load()}")
    return 0


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
