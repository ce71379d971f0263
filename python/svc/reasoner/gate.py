"""The automated containment gate (docs/reasoner.md#the-containment-gate).

Not a bare score threshold. A principal passes when all of these hold:

1. it is not learning (it has its own baseline to be beyond);
2. on one of the last ``gate_days`` days, the rows it moved out (family b) reach the absolute
   floor ``moved_out_floor`` and are beyond its own baseline (z >= ``z_gate``) and its peers'
   (z >= ``z_gate``); without peers, beyond its own baseline by ``z_alone``;
3. at least ``min_families`` families in all show evidence: b and another among a (the volume
   of rows it did not export, beyond both baselines), c, d, e, f (a factor worth at least
   ``min_contribution`` points);
4. for a principal an admin lifted, only evidence after the lift counts: days before the lift
   day are ignored, the lift day counts only through what the caller measured after the lift
   (``post_lift_moved_out``), and the other families only through factors of a day on or after
   the lift day.

The daily cap (``max_per_day``) is applied by the caller (``svc.reasoner.service``), which
knows how many it contained today.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any

from svc.reasoner.scoring import Score

__all__ = ["GateResult", "GateSettings", "evaluate"]


@dataclass(frozen=True)
class GateSettings:
    """The gate's parameters (docs/reasoner.md#the-containment-gate).

    Attributes:
        gate_days: the last days whose evidence may contain (today and yesterday: 2).
        moved_out_floor: rows moved out in a day below which nothing is contained (1,000).
        z_gate: z beyond the own and the peer baseline (3: e^1.5 = 4.5 times the median at
            the spread floor).
        z_alone: z beyond the own baseline when the principal has no peer group (4.5).
        min_families: families with evidence, the moving out included (2).
        min_contribution: points a factor needs to count as its family's evidence (8).
        max_per_day: automated containments per UTC day at most (5).

    """

    gate_days: int = 2
    moved_out_floor: float = 1000.0
    z_gate: float = 3.0
    z_alone: float = 4.5
    min_families: int = 2
    min_contribution: float = 8.0
    max_per_day: int = 5


@dataclass(frozen=True)
class GateResult:
    """What the gate found for one principal.

    Attributes:
        passed: every condition holds.
        reasons: why not (empty when passed), or what held (when passed).
        families: the families with evidence (letters).
        day: the day of the moving-out evidence, when there is one.
        evidence: the numbers behind it (moved-out rows, z values, factors' names).

    """

    passed: bool
    reasons: list[str]
    families: list[str] = field(default_factory=list)
    day: date | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def _beyond(g: dict[str, Any], k: int, settings: GateSettings) -> bool:
    if g["z_own"][k] < settings.z_gate:
        return False
    if g["peers"]:
        return bool(g["z_peer"][k] >= settings.z_gate)
    return bool(g["z_own"][k] >= settings.z_alone)


def evaluate(
    score: Score,
    days: list[date],
    settings: GateSettings | None = None,
    *,
    lifted_on: date | None = None,
    post_lift_moved_out: float | None = None,
) -> GateResult:
    """Whether `score`'s evidence passes the gate (module docs).

    Args:
        score: from ``svc.reasoner.scoring.score_window``.
        days: the window's days (``DayRows.days``), oldest first.
        settings: parameters (default ``GateSettings()``).
        lifted_on: the UTC day an admin lifted the principal's last automated containment.
        post_lift_moved_out: rows moved out on `lifted_on` after the lift.

    Returns:
        A ``GateResult``.

    """
    settings = settings or GateSettings()
    if score.learning:
        return GateResult(False, ["learning: no baseline of its own to be beyond"])
    g = score.gate
    if "moved_out" not in g:
        return GateResult(False, ["no rows moved out beyond its baselines"])
    split = int(g["split"])
    recent_days = days[split:]
    moved = g["moved_out"]
    n = len(recent_days)
    found: int | None = None
    for k in range(n - 1, max(-1, n - 1 - settings.gate_days), -1):
        day = recent_days[k]
        value = float(moved["values"][k])
        if lifted_on is not None:
            if day < lifted_on:
                continue
            if day == lifted_on:
                value = float(post_lift_moved_out or 0.0)
        if value >= settings.moved_out_floor and _beyond(moved, k, settings):
            found = k
            break
    if found is None:
        why = f"no day of the last {settings.gate_days} moved out {settings.moved_out_floor:g}"
        why += " rows or more beyond both its own and its peers' baselines"
        if lifted_on is not None:
            why += f" since the lift on {lifted_on.isoformat()}"
        return GateResult(False, [why])
    families = {"b"}
    names = []
    for f in score.factors:
        if f.family == "b" or f.contribution < settings.min_contribution:
            continue
        if lifted_on is not None and (f.day is None or f.day < lifted_on):
            continue
        if f.family == "a":
            other = g["volume_other"]
            if not any(_beyond(other, k, settings) for k in range(n)):
                continue  # the volume is the moving out itself: not independent
        families.add(f.family)
        names.append(f.name)
    fams = sorted(families)
    evidence = {
        "moved_out_rows": float(moved["values"][found]),
        "z_own": round(float(moved["z_own"][found]), 2),
        "z_peer": round(float(moved["z_peer"][found]), 2) if moved["peers"] else None,
        "other_factors": names,
    }
    if len(families) < settings.min_families:
        return GateResult(
            False,
            [
                f"only {len(families)} famil{'y' if len(families) == 1 else 'ies'} of evidence "
                f"({', '.join(fams)}); {settings.min_families} needed"
            ],
            fams,
            recent_days[found],
            evidence,
        )
    held = [
        f"moved out {evidence['moved_out_rows']:g} rows on {recent_days[found].isoformat()} "
        f"(z {evidence['z_own']} own, {evidence['z_peer']} peers)",
        f"families {', '.join(fams)}",
    ]
    return GateResult(True, held, fams, recent_days[found], evidence)
