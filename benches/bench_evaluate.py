"""Decision-core benchmark: ``svc``'s in-process engine against ``cedarpy`` on Cedar's example apps.

What is measured
----------------
For each example app (``document_cloud`` and ``tinytodo`` from Cedar's example repository) and each
store size N (10, 10,000 and 100,000 principals; 10 and 1,000 with ``--quick``):

1. An ``svc`` engine is loaded with ``Engine.from_bundle_dir`` and N synthetic principals of the
   app's principal type (``User``) are added with ``Engine.upsert_entities``, together with the
   entities that make requests do real work:

   * document_cloud: every user has the attributes the schema requires (``personalGroup``,
     ``blocked``) and its personal ``Group`` (so the store holds N users plus N personal groups);
     100 ``Document`` entities with their three ``DocumentShare`` ACLs; personal groups are members
     of some documents' view/modify ACLs.
   * tinytodo: every user has ``joblevel`` and ``location`` and is a member of
     ``Application::"TinyTodo"``, one of the app's own teams and one of 5 "squad" teams; 100
     ``List`` entities (with tasks) whose readers and editors are squads.

   Every synthetic user has the same shape whatever N, so the per-request work does not depend on
   N: only the size of the store does.

2. A request mix of 1,000 requests is drawn (fixed seed) with principals spread over the whole
   store: document_cloud's own ``ALLOW``/``DENY`` request files plus create/view/modify/share
   requests by owners, sharers, blocked and unrelated users and ``Public::"public"``; tinytodo's
   ``GetLists``/``CreateList`` on ``Application::"TinyTodo"`` and ``GetList``/``UpdateList``/
   ``CreateTask``/``DeleteList`` on lists by readers, editors, owners and unrelated users.

   A second, "hot" mix of the same kinds draws its principals from the first 10 users only: it
   separates the cost of a bigger store from the cost of a bigger working set (cache misses).

3. Timed, in one process, with every store size of an app loaded at once and timed in
   interleaved rounds (30; sizes rotated each round), so that drift of the machine's speed hits
   every size and both engines alike (on a shared 2-core VM it moves p50 by up to 1.8x within
   seconds). Each round times, per size:

   * ``svc evaluate``: 1,000 single ``engine.evaluate(request)`` calls, each timed with
     ``time.perf_counter_ns`` around the call (the Python -> Rust conversion of the request, the
     decision and the conversion of the response dict are all inside the sample); 500 more over
     the hot mix;
   * ``cedarpy``: 1,000 ``cedarpy.is_authorized(request, policy_set, entities, schema)`` calls with
     pre-built ``cedarpy.PolicySet``, ``cedarpy.Entities`` and ``cedarpy.Schema`` handles (nothing
     is parsed again per call but the request) over an entity set holding the bundle's entities
     plus the SAME synthetic entities; the call goes through a bound method (about 0.05 us);
   * ``svc evaluate_many`` and ``cedarpy.is_authorized_batch``: one batch of the 1,000-request
     mix each, reported per decision (batch time / 1,000, so a mean, not a p50).

   A short warm-up precedes every timed chunk (before a batch, a batch of 128 requests, so that
   ``evaluate_many`` warms the threaded path it is timed on) and the cyclic garbage collector is
   paused while timing (as ``timeit`` does). p50/p99 pool all samples; the speedup (cedarpy
   p50 / svc p50) and the scaling ratio (p50 at the largest store / p50 at 10) are medians of
   per-round ratios of p50s measured back to back, which cancels the drift. The scaling line
   also prints the first and third quartiles of those per-round ratios, to show how far they
   spread within the run.

   Before timing, every request of both mixes is decided by ``evaluate``, ``evaluate_many``,
   ``cedarpy.is_authorized`` and ``cedarpy.is_authorized_batch``, and the four must agree on
   allow/deny for every request (a disagreement is an error, not a "miss").

Targets (issue "Decision core"): ``evaluate`` p50 <= 15 us and >= 4x faster than cedarpy;
``evaluate_many`` <= 5 us per decision; p50 with the largest store within 20% of p50 with 10
principals. Misses are printed as ``MISS``; the script still exits 0 (benches report, they do not
assert).

Run: ``.venv/bin/python benches/bench_evaluate.py`` (full) or ``... --quick`` (smoke run).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cedarpy

from svc._pdp_core import Engine

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EXAMPLES = REPO / "tests" / "testdata" / "cedar-examples"
APPS = ("document_cloud", "tinytodo")

# Targets of the issue item "Benchmarks".
EVALUATE_P50_MAX_US = 15.0
SPEEDUP_MIN = 4.0
EVALUATE_MANY_MAX_US = 5.0
SCALING_MAX = 1.20

MIX_SIZE = 1_000  # requests in the mix; also the evaluate_many batch size
DOCS = 100  # document_cloud documents
LISTS = 100  # tinytodo lists
SQUADS = 5  # tinytodo squad teams (readers / editors of lists)
HOT = 10  # principals the "hot" control mix draws from
SEED = 20_240_601

Json = dict[str, Any]


@dataclass(frozen=True)
class Profile:
    """How much to measure."""

    sizes: tuple[int, ...]
    rounds: int  # every size is timed once per round, sizes interleaved
    chunk: int  # timed evaluate / is_authorized calls per side per round
    warmup: int  # untimed calls before each timed chunk


FULL = Profile(sizes=(10, 10_000, 100_000), rounds=30, chunk=1_000, warmup=50)
QUICK = Profile(sizes=(10, 1_000), rounds=4, chunk=300, warmup=20)


# --- synthetic worlds --------------------------------------------------------------------------


def uid(ty: str, id_: str) -> Json:
    """An entity reference in Cedar's JSON form."""
    return {"type": ty, "id": id_}


def ref(ty: str, id_: str) -> Json:
    """An entity-valued attribute (``__entity`` escape)."""
    return {"__entity": uid(ty, id_)}


def parse_literal_uid(s: str) -> Json:
    """``Type::"id"`` -> ``{"type", "id"}`` (ids in the example files hold no escapes)."""
    ty, _, rest = s.partition("::")
    return uid(ty, json.loads(rest))


def cedar_entities(raw: Any) -> list[Json]:
    """The bundle's ``entities.json`` as Cedar's JSON array, for cedarpy.

    Accepts Cedar's array format and TinyTodo's entity map (``{group: {"T::\\"id\\"": {euid,
    parents, ...attrs}}}``), as ``svc``'s bundle loader does.
    """
    if isinstance(raw, list):
        return raw
    out: list[Json] = []

    def one(key: str, obj: Json) -> Json:
        obj = dict(obj)
        u = obj.pop("euid", None) or obj.pop("uid", None) or key
        parents = [parse_literal_uid(p) for p in obj.pop("parents", [])]
        return {
            "uid": parse_literal_uid(u) if isinstance(u, str) else u,
            "attrs": obj,
            "parents": parents,
        }

    for group, value in raw.items():
        if "euid" in value or "uid" in value:
            out.append(one(group, value))
        else:
            out.extend(one(k, v) for k, v in value.items())
    return out


@dataclass
class World:
    """One app at one store size: what both engines hold and the requests they answer."""

    app: str
    n: int
    entities: list[Json]  # synthetic entities (added to svc's store and to cedarpy's set)
    requests: list[Json]  # principals drawn from the whole store
    hot_requests: list[Json]  # the same kinds, principals drawn from the first HOT users only
    notes: list[str] = field(default_factory=list)


def user_id(i: int) -> str:
    return f"user-{i}"


def document_cloud_world(n: int, bundle: Path, rng: random.Random) -> World:
    """N users with personal groups, 100 documents with ACLs, and a request mix."""
    ents: list[Json] = []
    for i in range(n):
        u = user_id(i)
        ents.append(
            {
                "uid": uid("User", u),
                "attrs": {
                    "personalGroup": ref("Group", f"{u}-personal"),
                    "blocked": [ref("User", user_id((i + 1) % n))],
                },
                "parents": [uid("Group", f"{u}-personal")],
            }
        )
        shares = [uid("DocumentShare", f"doc-{i % DOCS}-view")]
        if i % 3 == 0:
            shares.append(uid("DocumentShare", f"doc-{(i + 1) % DOCS}-modify"))
        ents.append(
            {
                "uid": uid("Group", f"{u}-personal"),
                "attrs": {"owner": ref("User", u)},
                "parents": shares,
            }
        )

    def owner(k: int) -> int:
        return (k * 7_919) % n

    for k in range(DOCS):
        d = f"doc-{k}"
        ents.append(
            {
                "uid": uid("Document", d),
                "attrs": {
                    "owner": ref("User", user_id(owner(k))),
                    "isPrivate": k % 4 == 0,
                    "publicAccess": ("view", "edit", "none")[k % 3],
                    "viewACL": ref("DocumentShare", f"{d}-view"),
                    "modifyACL": ref("DocumentShare", f"{d}-modify"),
                    "manageACL": ref("DocumentShare", f"{d}-manage"),
                },
                "parents": [],
            }
        )
        for acl in ("view", "modify", "manage"):
            ents.append({"uid": uid("DocumentShare", f"{d}-{acl}"), "attrs": {}, "parents": []})

    examples = [
        json.loads(p.read_text())
        for sub in ("ALLOW", "DENY")
        for p in sorted((bundle / sub).glob("*.json"))
    ]

    def req(p: Json, action: str, r: Json, authenticated: bool = True) -> Json:
        return {
            "principal": p,
            "action": f'Action::"{action}"',
            "resource": r,
            "context": {"is_authenticated": authenticated},
        }

    def user(i: int) -> Json:
        return uid("User", user_id(i))

    def doc(k: int) -> Json:
        return uid("Document", f"doc-{k}")

    def draw(active: int) -> Json:
        i, k = rng.randrange(active), rng.randrange(DOCS)
        kind = rng.randrange(10)
        if kind == 0:
            return rng.choice(examples)
        if kind == 1:
            return req(user(i), "CreateDocument", uid("Drive", "drive"), rng.random() < 0.9)
        if kind == 2:
            return req(user(owner(k)), "ViewDocument", doc(k))
        if kind == 3:
            return req(user(i), "ViewDocument", doc(i % DOCS))  # via the view ACL
        if kind == 4:
            return req(user(i), "ViewDocument", doc(k))  # mostly unrelated
        if kind == 5:
            return req(user(owner(k)), "ModifyDocument", doc(k))
        if kind == 6:
            return req(user((owner(k) + 1) % n), "ModifyDocument", doc(k))  # blocked by owner
        if kind == 7:
            j = (i // 3) * 3
            return req(user(j), "ModifyDocument", doc((j + 1) % DOCS))  # via the modify ACL
        if kind == 8:
            return req(uid("Public", "public"), "ViewDocument", doc(k))
        return req(user(i), "DeleteGroup", uid("Group", f"{user_id(i)}-personal"))

    return World(
        "document_cloud",
        n,
        ents,
        [draw(n) for _ in range(MIX_SIZE)],
        [draw(min(n, HOT)) for _ in range(MIX_SIZE)],
        notes=[f"store: {n} users + {n} personal groups + {DOCS} documents + {3 * DOCS} shares"],
    )


def tinytodo_world(n: int, rng: random.Random) -> World:
    """N users in squads, 100 lists shared with squads, and a request mix."""
    app = uid("Application", "TinyTodo")
    ents: list[Json] = [
        {"uid": uid("Team", f"squad-{s}"), "attrs": {}, "parents": [app]} for s in range(SQUADS)
    ]
    for i in range(n):
        ents.append(
            {
                "uid": uid("User", user_id(i)),
                "attrs": {"joblevel": i % 10, "location": ("ABC17", "DEF33", "XYZ77")[i % 3]},
                "parents": [
                    app,
                    uid("Team", ("temp", "admin", "interns")[i % 3]),
                    uid("Team", f"squad-{i % SQUADS}"),
                ],
            }
        )

    def owner(k: int) -> int:
        return (k * 7_919) % n

    for k in range(LISTS):
        ents.append(
            {
                "uid": uid("List", f"list-{k}"),
                "attrs": {
                    "name": f"list {k}",
                    "owner": ref("User", user_id(owner(k))),
                    "readers": ref("Team", f"squad-{k % SQUADS}"),
                    "editors": ref("Team", f"squad-{(k + 1) % SQUADS}"),
                    "tasks": [{"id": t, "name": f"task {t}", "state": "open"} for t in range(3)],
                },
                "parents": [app],
            }
        )

    def member(squad: int, active: int) -> Json:
        """A random user of squad ``squad`` among the first ``active`` users."""
        i = rng.randrange((active - squad + SQUADS - 1) // SQUADS) * SQUADS + squad
        return uid("User", user_id(i))

    def req(p: Json, action: str, r: Json) -> Json:
        return {"principal": p, "action": f'Action::"{action}"', "resource": r}

    def draw(active: int) -> Json:
        i, k = rng.randrange(active), rng.randrange(LISTS)
        lst = uid("List", f"list-{k}")
        kind = rng.randrange(7)
        if kind == 0:
            return req(uid("User", user_id(i)), "GetLists", app)
        if kind == 1:
            return req(uid("User", user_id(i)), "CreateList", app)
        if kind == 2:
            return req(member(k % SQUADS, active), "GetList", lst)  # reader
        if kind == 3:
            return req(member((k + 2) % SQUADS, active), "GetList", lst)  # not a member
        if kind == 4:
            return req(member((k + 1) % SQUADS, active), "UpdateList", lst)  # editor
        if kind == 5:
            return req(uid("User", user_id(owner(k))), "CreateTask", lst)
        return req(uid("User", user_id(i)), "DeleteList", lst)

    return World(
        "tinytodo",
        n,
        ents,
        [draw(n) for _ in range(MIX_SIZE)],
        [draw(min(n, HOT)) for _ in range(MIX_SIZE)],
        notes=[f"store: {SQUADS} squads + {n} users + {LISTS} lists"],
    )


# --- measurement -------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``samples``, nearest-rank."""
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def time_calls(
    fn: Callable[[Json], Any], requests: Sequence[Json], calls: int, start: int, warmup: int
) -> list[float]:
    """Times ``calls`` single calls of ``fn`` over ``requests`` (cyclically); microseconds each."""
    n = len(requests)
    for i in range(warmup):
        fn(requests[(start + i) % n])
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


# Requests in the warm-up batch before a timed batch: enough that svc's ``evaluate_many`` takes
# the path it times, which splits a batch over threads from 64 requests on (``PARALLEL_MIN`` in
# crates/pdp_py/src/lib.rs). A smaller warm-up ran on one thread and left the second vCPU idle,
# and the first batch after an idle spell is slower on the VM of docs/benchmarks.md (measured on
# document_cloud: 6.0 us per decision after 30 ms idle, 3.9 to 5.9 us back to back).
BATCH_WARMUP = 128


def time_batch(fn: Callable[[list[Json]], Any], batch: list[Json], warmup: int) -> float:
    """Times one ``fn(batch)`` call after a warm-up batch on a slice of at least
    ``BATCH_WARMUP`` requests; returns microseconds per decision."""
    fn(batch[: max(warmup, BATCH_WARMUP)])
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        fn(batch)
        dt = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    return dt / 1_000 / len(batch)


class Subject:
    """One app at one store size, both engines loaded and checked, and its timing samples."""

    def __init__(self, world: World, bundle: Path) -> None:
        """Builds the svc engine and the cedarpy handles, and checks they agree."""
        self.app, self.n = world.app, world.n
        self.requests, self.hot = world.requests, world.hot_requests
        self.setup_s: dict[str, float] = {}

        t = time.perf_counter()
        self.engine = Engine.from_bundle_dir(bundle)
        added = self.engine.upsert_entities(world.entities)
        self.setup_s["svc load+upsert"] = time.perf_counter() - t
        assert added == len(world.entities), (added, len(world.entities))
        self.store_size = self.engine.store_size

        t = time.perf_counter()
        schema_file = next(p for p in bundle.glob("*.cedarschema"))
        self.schema = cedarpy.Schema.from_str(schema_file.read_text())
        self.policies = cedarpy.PolicySet.from_str((bundle / "policies.cedar").read_text())
        base = cedar_entities(json.loads((bundle / "entities.json").read_text()))
        # Parsed without the schema: document_cloud's own entities.json breaks its schema (svc
        # loads it with a warning). Requests are still validated against the schema per call.
        self.entities = cedarpy.Entities.from_json_str(json.dumps(base + world.entities))
        self.setup_s["cedarpy handles"] = time.perf_counter() - t

        verdicts = self.agree(self.requests)
        self.agree(self.hot)
        self.allow_rate = verdicts.count("allow") / len(verdicts)

        # Samples (us): pooled per kind, and per-round p50s for paired ratios.
        self.samples: dict[str, list[float]] = {k: [] for k in ("svc", "hot", "cpy", "many", "cb")}
        self.round_p50: dict[str, list[float]] = {k: [] for k in ("svc", "hot", "cpy")}

    def cedarpy_one(self, r: Json) -> Any:
        """One cedarpy decision with the pre-built handles."""
        return cedarpy.is_authorized(r, self.policies, self.entities, self.schema)

    def cedarpy_batch(self, b: list[Json]) -> Any:
        """A cedarpy batch with the pre-built handles."""
        return cedarpy.is_authorized_batch(b, self.policies, self.entities, self.schema)

    def agree(self, reqs: list[Json]) -> list[str]:
        """Checks every entry point against cedarpy on every request; returns svc's verdicts."""
        single = [self.engine.evaluate(r)["verdict"] for r in reqs]
        many = [d["verdict"] for d in self.engine.evaluate_many(reqs)]
        c_single = [self.cedarpy_one(r) for r in reqs]
        c_many = self.cedarpy_batch(reqs)
        for i, r in enumerate(reqs):
            c1, c2 = c_single[i], c_many[i]
            want = "allow" if c1.allowed else "deny"
            got = (single[i], many[i], "allow" if c2.allowed else "deny")
            if any(g != want for g in got) or c1.diagnostics.errors:
                raise AssertionError(
                    f"{self.app} N={self.n}: request {i} {json.dumps(r)}: svc evaluate/"
                    f"evaluate_many/cedarpy batch said {got}, cedarpy said {want} "
                    f"(errors: {c1.diagnostics.errors})"
                )
        return single

    def run_round(self, rnd: int, profile: Profile) -> None:
        """One round: a chunk of each kind of measurement, back to back."""
        start = rnd * profile.chunk
        w = profile.warmup
        chunks = {
            "svc": time_calls(self.engine.evaluate, self.requests, profile.chunk, start, w),
            "cpy": time_calls(self.cedarpy_one, self.requests, profile.chunk, start, w),
            "hot": time_calls(self.engine.evaluate, self.hot, profile.chunk // 2, start, w),
        }
        for k, v in chunks.items():
            self.samples[k] += v
            self.round_p50[k].append(percentile(v, 0.5))
        self.samples["many"].append(time_batch(self.engine.evaluate_many, self.requests, w))
        self.samples["cb"].append(time_batch(self.cedarpy_batch, self.requests, w))


@dataclass
class Result:
    """Figures for one app at one store size (microseconds; ratios are medians of per-round
    ratios, so that drift of the machine's speed during the run cancels out)."""

    app: str
    n: int
    store_size: int
    allow_rate: float
    setup_s: dict[str, float]
    svc_p50: float
    svc_p99: float
    svc_mean: float
    hot_p50: float
    many_per_decision: float
    cedarpy_p50: float
    cedarpy_p99: float
    cedarpy_batch_per_decision: float
    speedup: float  # cedarpy p50 / svc evaluate p50, paired per round


@dataclass
class Scaling:
    """Per-app ratios of the largest store to the smallest, paired per round."""

    app: str
    small: int
    large: int
    svc: float
    hot: float
    cedarpy: float
    many: float
    # First and third quartiles of the per-round ratios behind ``svc``: how much the ratio
    # moved from round to round within this run.
    svc_quartiles: tuple[float, float]


def measure_app(app: str, bundle: Path, profile: Profile) -> tuple[list[Result], Scaling]:
    """Builds one subject per store size, then times them all in interleaved rounds."""
    subjects = []
    for n in profile.sizes:
        t = time.perf_counter()
        rng = random.Random(f"{SEED}-{app}-{n}")
        world = (
            document_cloud_world(n, bundle, rng)
            if app == "document_cloud"
            else tinytodo_world(n, rng)
        )
        subjects.append(Subject(world, bundle))
        setup = ", ".join(f"{k} {v:.2f}s" for k, v in subjects[-1].setup_s.items())
        print(
            f"  {app} N={n:,}: {'; '.join(world.notes)}; {setup}; "
            f"agreement checked in {time.perf_counter() - t:.1f}s",
            flush=True,
        )
        del world
    gc.collect()

    t = time.perf_counter()
    k = len(subjects)
    for rnd in range(profile.rounds):
        # Rotate the order so that no size always runs first after another's cache traffic.
        for s in subjects[rnd % k :] + subjects[: rnd % k]:
            s.run_round(rnd, profile)
    print(f"  {app}: {profile.rounds} rounds timed in {time.perf_counter() - t:.1f}s", flush=True)

    results = []
    for s in subjects:
        results.append(
            Result(
                app=app,
                n=s.n,
                store_size=s.store_size,
                allow_rate=s.allow_rate,
                setup_s=s.setup_s,
                svc_p50=percentile(s.samples["svc"], 0.50),
                svc_p99=percentile(s.samples["svc"], 0.99),
                svc_mean=statistics.fmean(s.samples["svc"]),
                hot_p50=percentile(s.samples["hot"], 0.50),
                many_per_decision=statistics.median(s.samples["many"]),
                cedarpy_p50=percentile(s.samples["cpy"], 0.50),
                cedarpy_p99=percentile(s.samples["cpy"], 0.99),
                cedarpy_batch_per_decision=statistics.median(s.samples["cb"]),
                speedup=statistics.median(
                    c / v for c, v in zip(s.round_p50["cpy"], s.round_p50["svc"], strict=True)
                ),
            )
        )
    lo, hi = subjects[0], subjects[-1]

    def paired(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b, strict=True))

    scaling = Scaling(
        app=app,
        small=lo.n,
        large=hi.n,
        svc=paired(hi.round_p50["svc"], lo.round_p50["svc"]),
        hot=paired(hi.round_p50["hot"], lo.round_p50["hot"]),
        cedarpy=paired(hi.round_p50["cpy"], lo.round_p50["cpy"]),
        many=paired(hi.samples["many"], lo.samples["many"]),
        svc_quartiles=quartiles(
            [x / y for x, y in zip(hi.round_p50["svc"], lo.round_p50["svc"], strict=True)]
        ),
    )
    return results, scaling


def quartiles(xs: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``xs`` (at least two values; ``statistics.quantiles``
    with its default exclusive method)."""
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(results: list[Result], scalings: list[Scaling]) -> None:
    """Prints the table and the PASS/MISS lines."""
    head = (
        f"{'app':<15}{'N':>8}{'store':>9}{'allow':>6}"
        f"{'eval p50':>9}{'p99':>8}{'mean':>8}{'hot p50':>9}{'many/dec':>9}"
        f"{'cpy p50':>9}{'p99':>8}{'cpy batch':>10}{'speedup':>8}"
    )
    print()
    print(
        "All times in microseconds per decision. eval = svc Engine.evaluate, one call;\n"
        f"hot p50 = the same, requests from the first {HOT} principals only; many/dec =\n"
        f"Engine.evaluate_many, batches of {MIX_SIZE:,} (a mean: compare with eval mean);\n"
        "cpy = cedarpy.is_authorized with pre-built PolicySet/Entities/Schema handles;\n"
        "cpy batch = cedarpy.is_authorized_batch (mean); speedup = cpy p50 / eval p50\n"
        "(median of the per-round ratios)."
    )
    print()
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.app:<15}{r.n:>8,}{r.store_size:>9,}{r.allow_rate:>6.0%}"
            f"{r.svc_p50:>9.1f}{r.svc_p99:>8.1f}{r.svc_mean:>8.1f}{r.hot_p50:>9.1f}"
            f"{r.many_per_decision:>9.1f}{r.cedarpy_p50:>9.1f}{r.cedarpy_p99:>8.1f}"
            f"{r.cedarpy_batch_per_decision:>10.1f}{r.speedup:>7.2f}x"
        )
    print()

    print("Scaling, largest store / smallest (median of per-round ratios of p50s):")
    for sc in scalings:
        print(
            f"  {sc.app:<15} evaluate p50({sc.large:,})/p50({sc.small:,}) = {sc.svc:.3f} "
            f"(rounds' quartiles {sc.svc_quartiles[0]:.3f}-{sc.svc_quartiles[1]:.3f}); "
            f"hot: {sc.hot:.3f}; evaluate_many: {sc.many:.3f}; cedarpy: {sc.cedarpy:.3f}"
        )
    print()

    def target(ok: bool, what: str, figure: str) -> None:
        print(f"  {verdict(ok)}  {what:<40}{figure}")

    print("Targets:")
    for r in results:
        tag = f"{r.app} N={r.n:,}"
        target(
            r.svc_p50 <= EVALUATE_P50_MAX_US,
            f"evaluate p50 <= {EVALUATE_P50_MAX_US:g} us",
            f"{tag}: {r.svc_p50:.1f} us",
        )
        target(
            r.speedup >= SPEEDUP_MIN,
            f"evaluate >= {SPEEDUP_MIN:g}x faster than cedarpy",
            f"{tag}: {r.speedup:.2f}x",
        )
        target(
            r.many_per_decision <= EVALUATE_MANY_MAX_US,
            f"evaluate_many <= {EVALUATE_MANY_MAX_US:g} us per decision",
            f"{tag}: {r.many_per_decision:.1f} us",
        )
    for sc in scalings:
        target(
            sc.svc <= SCALING_MAX,
            f"p50({sc.large:,}) within {SCALING_MAX - 1:.0%} of p50({sc.small:,})",
            f"{sc.app}: {sc.svc - 1:+.1%}",
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: sizes 10 and 1,000, few iterations"
    )
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
        f"svc decision-core bench ({'quick' if args.quick else 'full'}): python "
        f"{platform.python_version()}, cedarpy {_version('cedarpy')}, {os.cpu_count()} CPUs, "
        f"{platform.machine()}"
    )
    print(
        f"sizes {', '.join(f'{n:,}' for n in profile.sizes)}; {profile.rounds} interleaved rounds "
        f"of {profile.chunk:,} evaluate calls per side and one batch of {MIX_SIZE:,} per side "
        f"per size"
    )
    print(f"load average at start: {_load()} (other work on the machine skews every figure)")
    results: list[Result] = []
    scalings: list[Scaling] = []
    for app in APPS:
        rs, sc = measure_app(app, args.examples / app, profile)
        results += rs
        scalings.append(sc)
        gc.collect()
    report(results, scalings)
    print(f"\nload average at end: {_load()}")
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
