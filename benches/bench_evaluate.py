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

3. Timed, in the same process, interleaved in rounds so that machine noise hits both sides alike:

   * ``svc evaluate``: one ``engine.evaluate(request)`` call per sample, timed with
     ``time.perf_counter_ns`` around the call (the Python -> Rust conversion of the request, the
     decision and the conversion of the response dict are all inside the sample);
   * ``svc evaluate_many``: ``engine.evaluate_many(batch)`` over the 1,000-request mix, reported per
     decision (batch time / 1,000);
   * ``cedarpy``: ``cedarpy.is_authorized(request, policy_set, entities, schema)`` with pre-built
     ``cedarpy.PolicySet``, ``cedarpy.Entities`` and ``cedarpy.Schema`` handles (nothing is parsed
     again per call but the request), over an entity set holding the bundle's entities plus the
     SAME synthetic entities; and ``cedarpy.is_authorized_batch`` over the same 1,000-request
     batch. The cedarpy call goes through a ``lambda`` (about 0.05 us, negligible here).

   Warm-up calls precede every timed loop and the cyclic garbage collector is paused while timing
   (as ``timeit`` does). Before timing, every request of the mix is decided by ``evaluate``,
   ``evaluate_many``, ``cedarpy.is_authorized`` and ``cedarpy.is_authorized_batch``, and the four
   must agree on allow/deny for every request (a disagreement is an error, not a "miss").

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
DEFAULT_EXAMPLES = REPO.parent / "shared" / "data" / "cedar-examples"
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
SEED = 20_240_601

Json = dict[str, Any]


@dataclass(frozen=True)
class Profile:
    """How much to measure."""

    sizes: tuple[int, ...]
    evaluate_calls: int  # timed evaluate / is_authorized calls per side
    batches: int  # timed evaluate_many / is_authorized_batch calls per side
    rounds: int  # svc and cedarpy alternate this many times
    warmup: int  # untimed calls before each timed loop


FULL = Profile(sizes=(10, 10_000, 100_000), evaluate_calls=30_000, batches=40, rounds=5, warmup=500)
QUICK = Profile(sizes=(10, 1_000), evaluate_calls=2_000, batches=4, rounds=2, warmup=100)


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
    requests: list[Json]
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

    def draw() -> Json:
        i, k = rng.randrange(n), rng.randrange(DOCS)
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
        [draw() for _ in range(MIX_SIZE)],
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

    def member(squad: int) -> Json:
        """A random user of squad ``squad``."""
        i = rng.randrange((n - squad + SQUADS - 1) // SQUADS) * SQUADS + squad
        return uid("User", user_id(i))

    def req(p: Json, action: str, r: Json) -> Json:
        return {"principal": p, "action": f'Action::"{action}"', "resource": r}

    def draw() -> Json:
        i, k = rng.randrange(n), rng.randrange(LISTS)
        lst = uid("List", f"list-{k}")
        kind = rng.randrange(7)
        if kind == 0:
            return req(uid("User", user_id(i)), "GetLists", app)
        if kind == 1:
            return req(uid("User", user_id(i)), "CreateList", app)
        if kind == 2:
            return req(member(k % SQUADS), "GetList", lst)  # reader
        if kind == 3:
            return req(member((k + 2) % SQUADS), "GetList", lst)  # neither reader nor editor
        if kind == 4:
            return req(member((k + 1) % SQUADS), "UpdateList", lst)  # editor
        if kind == 5:
            return req(uid("User", user_id(owner(k))), "CreateTask", lst)
        return req(uid("User", user_id(i)), "DeleteList", lst)

    return World(
        "tinytodo",
        n,
        ents,
        [draw() for _ in range(MIX_SIZE)],
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
    gc.collect()
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


def time_batches(fn: Callable[[list[Json]], Any], batch: list[Json], times: int) -> list[float]:
    """Times ``times`` calls of ``fn(batch)`` (after one warm-up); microseconds per decision."""
    fn(batch)
    clock = time.perf_counter_ns
    out = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(times):
            t0 = clock()
            fn(batch)
            out.append((clock() - t0) / 1_000 / len(batch))
    finally:
        gc.enable()
    return out


@dataclass
class Result:
    """Figures for one app at one store size (microseconds)."""

    app: str
    n: int
    store_size: int
    allow_rate: float
    svc_p50: float
    svc_p99: float
    many_per_decision: float
    cedarpy_p50: float
    cedarpy_p99: float
    cedarpy_batch_per_decision: float
    setup_s: dict[str, float]

    @property
    def speedup(self) -> float:
        """cedarpy p50 / svc evaluate p50."""
        return self.cedarpy_p50 / self.svc_p50


def run_world(world: World, bundle: Path, profile: Profile) -> Result:
    """Builds both engines for ``world``, checks they agree, then times them."""
    setup: dict[str, float] = {}

    t = time.perf_counter()
    engine = Engine.from_bundle_dir(bundle)
    added = engine.upsert_entities(world.entities)
    setup["svc load+upsert"] = time.perf_counter() - t
    assert added == len(world.entities), (added, len(world.entities))

    t = time.perf_counter()
    schema_file = next(p for p in bundle.glob("*.cedarschema"))
    schema = cedarpy.Schema.from_str(schema_file.read_text())
    policies = cedarpy.PolicySet.from_str((bundle / "policies.cedar").read_text())
    base = cedar_entities(json.loads((bundle / "entities.json").read_text()))
    # Parsed without the schema: document_cloud's own entities.json breaks its schema (svc loads
    # it with a warning). Requests are still validated against the schema handle per call.
    entities = cedarpy.Entities.from_json_str(json.dumps(base + world.entities))
    setup["cedarpy handles"] = time.perf_counter() - t

    reqs = world.requests

    def cedarpy_one(r: Json) -> Any:
        return cedarpy.is_authorized(r, policies, entities, schema)

    def cedarpy_batch(b: list[Json]) -> Any:
        return cedarpy.is_authorized_batch(b, policies, entities, schema)

    # Agreement: every request, every entry point.
    single = [engine.evaluate(r)["verdict"] for r in reqs]
    many = [d["verdict"] for d in engine.evaluate_many(reqs)]
    c_single = [cedarpy_one(r) for r in reqs]
    c_many = cedarpy_batch(reqs)
    for i, r in enumerate(reqs):
        c1, c2 = c_single[i], c_many[i]
        want = "allow" if c1.allowed else "deny"
        got = (single[i], many[i], "allow" if c2.allowed else "deny")
        if any(g != want for g in got) or c1.diagnostics.errors:
            raise AssertionError(
                f"{world.app} N={world.n}: request {i} {json.dumps(r)}: svc evaluate/"
                f"evaluate_many/cedarpy batch said {got}, cedarpy said {want} "
                f"(errors: {c1.diagnostics.errors})"
            )
    allow_rate = single.count("allow") / len(single)

    # Timing, svc and cedarpy alternating in rounds.
    per_round = profile.evaluate_calls // profile.rounds
    batches_per_round = max(1, profile.batches // profile.rounds)
    svc_s: list[float] = []
    c_s: list[float] = []
    many_s: list[float] = []
    c_batch_s: list[float] = []
    for rnd in range(profile.rounds):
        start = rnd * per_round
        svc_s += time_calls(engine.evaluate, reqs, per_round, start, profile.warmup)
        c_s += time_calls(cedarpy_one, reqs, per_round, start, profile.warmup)
        many_s += time_batches(engine.evaluate_many, reqs, batches_per_round)
        c_batch_s += time_batches(cedarpy_batch, reqs, max(1, batches_per_round // 2))

    return Result(
        app=world.app,
        n=world.n,
        store_size=engine.store_size,
        allow_rate=allow_rate,
        svc_p50=percentile(svc_s, 0.50),
        svc_p99=percentile(svc_s, 0.99),
        many_per_decision=statistics.median(many_s),
        cedarpy_p50=percentile(c_s, 0.50),
        cedarpy_p99=percentile(c_s, 0.99),
        cedarpy_batch_per_decision=statistics.median(c_batch_s),
        setup_s=setup,
    )


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(results: list[Result]) -> None:
    """Prints the table and the PASS/MISS lines."""
    head = (
        f"{'app':<15}{'N':>8}{'store':>9}{'allow':>7}"
        f"{'eval p50':>10}{'eval p99':>10}{'many/dec':>10}"
        f"{'cedarpy p50':>13}{'cedarpy p99':>13}{'cp batch/dec':>14}{'speedup':>9}"
    )
    print()
    print("All times in microseconds (us). eval = svc Engine.evaluate per call; many/dec =")
    print("svc Engine.evaluate_many per decision (batches of 1,000); cedarpy = is_authorized per")
    print("call with pre-built PolicySet/Entities/Schema handles; cp batch/dec =")
    print("is_authorized_batch per decision; speedup = cedarpy p50 / eval p50.")
    print()
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.app:<15}{r.n:>8,}{r.store_size:>9,}{r.allow_rate:>7.0%}"
            f"{r.svc_p50:>10.2f}{r.svc_p99:>10.2f}{r.many_per_decision:>10.2f}"
            f"{r.cedarpy_p50:>13.2f}{r.cedarpy_p99:>13.2f}{r.cedarpy_batch_per_decision:>14.2f}"
            f"{r.speedup:>8.1f}x"
        )
    print()

    by_app: dict[str, list[Result]] = {}
    for r in results:
        by_app.setdefault(r.app, []).append(r)
    print("Scaling (svc evaluate p50 at the largest store / p50 at the smallest):")
    scaling: dict[str, tuple[Result, Result, float]] = {}
    for app, rs in by_app.items():
        lo, hi = min(rs, key=lambda r: r.n), max(rs, key=lambda r: r.n)
        ratio = hi.svc_p50 / lo.svc_p50
        many_ratio = hi.many_per_decision / lo.many_per_decision
        scaling[app] = (lo, hi, ratio)
        print(
            f"  {app:<15} p50({hi.n:,})/p50({lo.n:,}) = {ratio:.3f}"
            f"   (evaluate_many per decision: {many_ratio:.3f})"
        )
    print()

    print("Targets:")
    for r in results:
        tag = f"{r.app} N={r.n:,}"
        print(
            f"  {verdict(r.svc_p50 <= EVALUATE_P50_MAX_US)}  evaluate p50 <= "
            f"{EVALUATE_P50_MAX_US:g} us          {tag}: {r.svc_p50:.2f} us"
        )
        print(
            f"  {verdict(r.speedup >= SPEEDUP_MIN)}  evaluate >= {SPEEDUP_MIN:g}x faster than "
            f"cedarpy  {tag}: {r.speedup:.1f}x"
        )
        print(
            f"  {verdict(r.many_per_decision <= EVALUATE_MANY_MAX_US)}  evaluate_many <= "
            f"{EVALUATE_MANY_MAX_US:g} us/decision  {tag}: {r.many_per_decision:.2f} us"
        )
    for app, (lo, hi, ratio) in scaling.items():
        print(
            f"  {verdict(ratio <= SCALING_MAX)}  p50({hi.n:,}) within "
            f"{SCALING_MAX - 1:.0%} of p50({lo.n:,})  {app}: {ratio - 1:+.1%}"
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
        f"sizes {', '.join(f'{n:,}' for n in profile.sizes)}; {profile.evaluate_calls:,} timed "
        f"calls per side; {profile.batches} batches of {MIX_SIZE:,}; {profile.rounds} rounds"
    )
    print(f"load average at start: {_load()} (other work on the machine skews every figure)")
    results = []
    for app in APPS:
        bundle = args.examples / app
        for n in profile.sizes:
            rng = random.Random(f"{SEED}-{app}-{n}")
            t = time.perf_counter()
            world = (
                document_cloud_world(n, bundle, rng)
                if app == "document_cloud"
                else tinytodo_world(n, rng)
            )
            res = run_world(world, bundle, profile)
            setup = ", ".join(f"{k} {v:.2f}s" for k, v in res.setup_s.items())
            print(
                f"  {app} N={n:,}: {'; '.join(world.notes)}; {setup}; "
                f"total {time.perf_counter() - t:.1f}s",
                flush=True,
            )
            del world
            results.append(res)
    report(results)
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
