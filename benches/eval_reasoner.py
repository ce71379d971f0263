"""The reasoner's evaluation on labelled synthetic months (docs/reasoner.md#evaluation).

For each seed: a month of ``svc.demo.month`` (routine traffic of ``--people`` people and
``--agents`` agents, the injected stories and the decoys) is stored in chDB in time order. The
history before the last ``--sim-days`` days goes in at once; from then on, records go in slice
by slice and a cycle runs every ``--every-hours`` hours on what is stored so far: the rollups
(``svc.history.rollups``), the score (``svc.reasoner.scoring``) and the gate with its daily cap
(``svc.reasoner.gate``), exactly as ``ReasonerService`` runs them, without the services around
them. A principal the gate passes is contained from that cycle on.

Printed per seed and in all: precision and recall of containment (stories labelled
``contain``), false containments per 1,000 normal principals (every principal that is neither a
story nor a decoy), decoys contained, the rank and score of each injected actor at the month's
last cycle, and the time from a story's start to its containment. The figures and the command
are in docs/benchmarks.md ("Reasoner").

    python benches/eval_reasoner.py [--people 1000] [--agents 30] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

from svc import history
from svc.demo import month as months
from svc.history import rollups
from svc.history.schema import MOVING_OUT_ACTIONS
from svc.reasoner.gate import GateSettings, evaluate
from svc.reasoner.scoring import Model, peer_groups, peers_from_snapshot, score_window


def _at(rec: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(rec["at"].replace("Z", "+00:00"))


def run_seed(client: Any, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    end = date(2026, 11, 20)
    t0 = time.perf_counter()
    m = months.month(
        people=args.people,
        departments=args.departments,
        agents=args.agents,
        end=end,
        seed=seed,
        days=args.days,
    )
    gen = time.perf_counter() - t0
    sim_start = datetime.combine(end - timedelta(days=args.sim_days - 1), datetime.min.time(), UTC)
    sim_end = datetime.combine(end + timedelta(days=1), datetime.min.time(), UTC)
    decisions = sorted(m.decisions, key=lambda r: r["at"])
    events = sorted(m.events, key=lambda r: r["at"])

    def store(lo: datetime | None, hi: datetime) -> None:
        for kind, recs in (("decisions", decisions), ("events", events)):
            part = [r for r in recs if (lo is None or _at(r) >= lo) and _at(r) < hi]
            for k in range(0, len(part), 50_000):
                history.store(client, kind, list(months.records(part[k : k + 50_000], kind)))

    t0 = time.perf_counter()
    store(None, sim_start)
    fill = time.perf_counter() - t0
    peers = peers_from_snapshot(m.snapshot())
    model, gate = Model(), GateSettings(moved_out_floor=args.floor)
    contained: dict[tuple[str, str], datetime] = {}
    per_day: dict[date, int] = {}
    last_scores: dict[tuple[str, str], int] = {}
    cycle_secs: list[float] = []
    t = sim_start
    while t < sim_end:
        nxt = min(sim_end, t + timedelta(hours=args.every_hours))
        store(t, nxt)
        now = nxt - timedelta(seconds=1)
        today = now.date()
        c0 = time.perf_counter()
        first = today - timedelta(days=model.window_days - 1)
        rows = rollups.read_days(client, first, today)
        sets = rollups.read_sets(
            client, first, today, today - timedelta(days=model.recent_days - 1)
        )
        recent = today - timedelta(days=model.recent_days - 1)
        rare = rollups.read_rare_resources(
            client, first, today, recent, peer_groups(rows, peers, model)
        )
        scores = score_window(rows, sets, peers, model, rare)
        for sc in sorted(scores, key=lambda s: -s.score):
            if sc.principal in contained or sc.score == 0:
                continue
            if evaluate(sc, rows.days, gate).passed:
                if per_day.get(today, 0) < gate.max_per_day:
                    per_day[today] = per_day.get(today, 0) + 1
                    contained[sc.principal] = now
        cycle_secs.append(time.perf_counter() - c0)
        last_scores = {sc.principal: sc.score for sc in scores}
        t = nxt

    labels = {s.principal: s for s in m.stories}
    want = {p for p, s in labels.items() if s.label == months.CONTAIN}
    tp = len(set(contained) & want)
    fp = [p for p in contained if p not in want]
    normal = [(a.type, a.id) for a in m.actors if (a.type, a.id) not in labels]
    false_normal = [p for p in fp if p not in labels]
    decoys_contained = [p for p in fp if p in labels]
    ranked = sorted(last_scores, key=lambda p: -last_scores[p])
    rank = {p: k + 1 for k, p in enumerate(ranked)}
    moving = set(MOVING_OUT_ACTIONS)

    def first_move(s: months.Story) -> datetime | None:
        """The story's first record moving data out, after its start."""
        times = [
            _at(r)
            for r in events
            if (r["principal"]["type"], r["principal"]["id"]) == s.principal
            and _at(r) >= s.start
            and (r["action"] in moving or r.get("access") == "exported")
            and r.get("count", 1) >= 100
        ]
        return min(times, default=None)

    stories = []
    for s in m.stories:
        if s.name == "listing_team":
            continue
        when = contained.get(s.principal)
        moved = first_move(s)
        stories.append(
            {
                "story": s.name,
                "label": s.label,
                "principal": f"{s.principal[0]}::{s.principal[1]}",
                "rank": rank.get(s.principal),
                "score": last_scores.get(s.principal),
                "contained": when is not None,
                "hours_to_containment": None
                if when is None
                else round((when - s.start).total_seconds() / 3600, 1),
                "hours_from_first_move_out": None
                if when is None or moved is None
                else round((when - moved).total_seconds() / 3600, 1),
            }
        )
    team = [s.principal for s in m.stories if s.name == "listing_team"]
    stories.append(
        {
            "story": "listing_team",
            "label": months.DECOY,
            "principal": f"{len(team)} people",
            "rank": min((rank.get(p) or 0) for p in team) if team else None,
            "score": max((last_scores.get(p) or 0) for p in team) if team else None,
            "contained": any(p in contained for p in team),
            "hours_to_containment": None,
            "hours_from_first_move_out": None,
        }
    )
    return {
        "seed": seed,
        "principals": len(m.actors),
        "decisions": len(m.decisions),
        "events": len(m.events),
        "generate_secs": round(gen, 1),
        "fill_secs": round(fill, 1),
        "cycles": len(cycle_secs),
        "cycle_secs_max": round(max(cycle_secs), 2),
        "true_containments": tp,
        "wanted": len(want),
        "false_containments": len(fp),
        "precision": round(tp / len(contained), 3) if contained else None,
        "recall": round(tp / len(want), 3) if want else None,
        "simulated_days": args.sim_days,
        "false_per_1000_normal": round(1000 * len(false_normal) / max(1, len(normal)), 2),
        "false_per_1000_normal_per_30_days": round(
            1000 * len(false_normal) / max(1, len(normal)) * 30 / args.sim_days, 2
        ),
        "false_principals": [f"{t}::{i}" for t, i in fp],
        "decoys_contained": len(decoys_contained),
        "stories": stories,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--people", type=int, default=1000)
    p.add_argument("--departments", type=int, default=8)
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--days", type=int, default=40, help="days of history")
    p.add_argument("--sim-days", type=int, default=14, help="last days run cycle by cycle")
    p.add_argument("--every-hours", type=int, default=6, help="hours between two cycles")
    p.add_argument("--floor", type=float, default=GateSettings.moved_out_floor)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            client = history.connect(f"chdb://{tmp}?database=eval{seed}", create_database=True)
            history.migrate(client)
            r = run_seed(client, seed, args)
            results.append(r)
            print(json.dumps(r), flush=True)
    tp = sum(r["true_containments"] for r in results)
    fp = sum(r["false_containments"] for r in results)
    want = sum(r["wanted"] for r in results)
    hours = [
        s["hours_to_containment"]
        for r in results
        for s in r["stories"]
        if s["hours_to_containment"] is not None
    ]
    moved = [
        s["hours_from_first_move_out"]
        for r in results
        for s in r["stories"]
        if s["hours_from_first_move_out"] is not None
    ]
    normal = sum(r["principals"] for r in results)
    print(
        json.dumps(
            {
                "seeds": len(results),
                "precision": round(tp / (tp + fp), 3) if tp + fp else None,
                "recall": round(tp / want, 3) if want else None,
                "false_containments": fp,
                "false_per_1000_principals_per_30_days": round(
                    1000 * fp / max(1, normal) * 30 / args.sim_days, 2
                ),
                "hours_to_containment": {
                    "min": min(hours, default=None),
                    "max": max(hours, default=None),
                },
                "hours_from_first_move_out": {
                    "min": min(moved, default=None),
                    "max": max(moved, default=None),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
