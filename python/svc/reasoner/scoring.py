"""The risk model: 30 days of daily rollups to a 0..100 score with its factors (docs/reasoner.md).

Pure computation over what ``svc.history.rollups`` reads (``DayRows``, ``PrincipalSets``) and
the principals snapshot's peers (``Directory``); no I/O. The model, every weight and floor and
why, is docs/reasoner.md; in short:

* The window is ``window_days`` UTC days ending today. Its last ``recent_days`` are the days
  observed; the days before them are the **baseline**. A principal with fewer than
  ``learning_days`` active baseline days is **learning**: scored against peers only, and never
  contained (``Gate``).
* Each daily metric (weighted row volume, data moved out, denies and failures, challenges
  rejected, expired or failed, cloud failures, sensitive cloud actions) is compared, in log
  space, with the principal's own baseline (median and MAD of its active baseline days) and
  with its peers' (the median and MAD of the
  peers' own medians), each z with a floor on the spread; a day counts only above the metric's
  absolute floor, and the smaller of the two z (beyond **both** baselines) makes the strength,
  0 at z = 3 and 1 at z = 6. Its contribution is the family's weight times the strongest
  recent day's strength, halved every ``half_life_days`` of age: the score comes down as its
  evidence ages, and is gone once the day enters the baseline.
* First-time and rare things: source addresses, actions, resource types and tools never seen
  in the principal's baseline (rarer still when few of its peers used them), a burst of new
  resources, activity in hours the principal and its peers are not active; for agents, people
  acted for who are new to the agent (and served by no other agent of its app).
* Contributions are sorted and weighted down by rank (1, 1/2, 1/4, ...), so however many weak
  signals there are they add up to at most twice the largest; the sum, capped at 100, is the
  score.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from svc.history.rollups import RARE_SHARE, DayRows, PrincipalSets, RareResources, WindowSets
from svc.history.schema import ACCESS_WEIGHTS

__all__ = [
    "FAMILIES",
    "Directory",
    "Factor",
    "Model",
    "Score",
    "peer_groups",
    "peers_from_snapshot",
    "score_window",
]

#: The signal families (docs/reasoner.md#signals): the containment gate counts families, not
#: factors, so two factors of one family are one piece of evidence.
FAMILIES: dict[str, str] = {
    "volume": "a",
    "moved_out": "b",
    "denies_failures": "c",
    "challenges_failed": "c",
    "new_source_ips": "d",
    "new_actions": "d",
    "new_resource_types": "d",
    "new_tools": "d",
    "new_resources": "d",
    "rare_resources": "d",
    "odd_hours": "d",
    "new_people_acted_for": "e",
    "cloud_failures": "f",
    "sensitive_actions": "f",
}


@dataclass(frozen=True)
class Model:
    """The model's parameters (docs/reasoner.md#parameters); the defaults are the documented ones.

    Attributes:
        window_days: days read, today included (30).
        recent_days: the last days observed; the others are the baseline (7).
        learning_days: active baseline days below which a principal is learning (7).
        half_life_days: age, in days, at which a recent day's strength is halved (2).
        min_peers: peers (with a baseline) a peer group needs; else the next group (3).
        z_start, z_full: z at which a metric's strength starts (0) and is full (1) (3, 6).
        spread_floor: smallest spread, in natural-log units, a z is divided by (0.5: a day
            must be e^1.5 = 4.5 times the median before z reaches 3).
        weights: points of each factor at full strength.
        floors: a metric's absolute floor per day: below it a day is not anomalous.
        family_caps: most points of one family (its factors summed 1, 1/2, 1/4, ...).
        rank_decay: the weight of the n-th largest family is rank_decay^(n-1) (0.75): six
            families of equal points add up to at most 3.3 times one.

    """

    window_days: int = 30
    recent_days: int = 7
    learning_days: int = 7
    half_life_days: float = 2.0
    min_peers: int = 3
    z_start: float = 3.0
    z_full: float = 6.0
    spread_floor: float = 0.5
    rank_decay: float = 0.75
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "moved_out": 60.0,
            "volume": 40.0,
            "denies_failures": 45.0,
            "challenges_failed": 35.0,
            "sensitive_actions": 35.0,
            "new_people_acted_for": 40.0,
            "cloud_failures": 25.0,
            "new_source_ips": 25.0,
            "new_resources": 25.0,
            "rare_resources": 25.0,
            "odd_hours": 25.0,
            "new_actions": 15.0,
            "new_resource_types": 15.0,
            "new_tools": 15.0,
        }
    )
    family_caps: Mapping[str, float] = field(
        default_factory=lambda: {"a": 40.0, "b": 60.0, "c": 45.0, "d": 45.0, "e": 40.0, "f": 40.0}
    )
    floors: Mapping[str, float] = field(
        default_factory=lambda: {
            "volume": 200.0,
            "moved_out": 100.0,
            "denies_failures": 10.0,
            "challenges_failed": 3.0,
            "cloud_failures": 5.0,
            "sensitive_actions": 1.0,
        }
    )


@dataclass(frozen=True)
class Factor:
    """One contribution to a score.

    Attributes:
        name: the factor (``FAMILIES`` keys).
        observed: what was seen (a number, or a list of the new values).
        baseline: what is usual: the principal's own typical value, or ``None`` while learning.
        contribution: points before the rank weighting, 0..weight.
        peers: the peers' typical value (metrics), or the share of peers that used the values.
        day: the day the metric's strongest evidence is from (metrics only).

    """

    name: str
    observed: Any
    baseline: Any
    contribution: float
    peers: Any = None
    day: date | None = None

    @property
    def family(self) -> str:
        """The factor's family letter (``FAMILIES``)."""
        return FAMILIES[self.name]

    def as_json(self) -> dict[str, Any]:
        """``{name, family, observed, baseline, peers, contribution, day}`` (JSON types)."""
        return {
            "name": self.name,
            "family": self.family,
            "observed": _plain(self.observed),
            "baseline": _plain(self.baseline),
            "peers": _plain(self.peers),
            "contribution": round(self.contribution, 2),
            "day": self.day.isoformat() if self.day else None,
        }


def _plain(v: Any) -> Any:
    if isinstance(v, float | np.floating):
        return round(float(v), 2)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, frozenset | set):
        return sorted(v)
    return v


@dataclass(frozen=True)
class Score:
    """A principal's score (``score_window``).

    Attributes:
        principal: ``(type, id)``.
        score: 0..100.
        learning: fewer than ``learning_days`` active baseline days.
        factors: every non-zero factor, largest contribution first.
        peer_group: the peer group compared with, ``kind:name`` (``department:Sales``).
        gate: the per-day evidence the containment gate reads (``svc.reasoner.gate``):
            ``moved_out`` day values, own and peer z of the recent days.

    """

    principal: tuple[str, str]
    score: int
    learning: bool
    factors: list[Factor]
    peer_group: str
    gate: dict[str, Any]

    def top(self, n: int = 5) -> list[dict[str, Any]]:
        """The `n` largest factors as JSON."""
        return [f.as_json() for f in self.factors[:n]]


@dataclass(frozen=True)
class Directory:
    """Who each principal's peers are, from the principals snapshot (``peers_from_snapshot``).

    Attributes:
        groups: principal ``(type, id)`` -> its candidate peer groups, best first
            (``department:X``, ``app:X``, ``group:X``); ``all:<type>`` is always tried last.

    """

    groups: dict[tuple[str, str], list[str]]


def peers_from_snapshot(snapshot: Mapping[str, Any]) -> Directory:
    """Peer groups from a ``GET /v1/principals`` answer (docs/context.md#principals).

    People: their department, then their groups from the smallest to the largest (peers who
    share a small group are the closest, as Sentinel ranks peers by shared membership).
    Service accounts: their app (the id up to its first dot), then their groups.

    Args:
        snapshot: ``{"principals": [{"kind", "id", "value", "removed"}]}``.

    Returns:
        The ``Directory``.

    """
    people: dict[str, tuple[str, list[str]]] = {}
    accounts: dict[str, tuple[str, list[str]]] = {}
    sizes: Counter[str] = Counter()
    for rec in snapshot.get("principals", []):
        kind, value = rec.get("kind"), rec.get("value") or {}
        if kind == "Human":
            attrs = value.get("attrs") or {}
            gs = [str(p.get("id")) for p in value.get("parents") or [] if p.get("type") == "Group"]
            people[str(rec.get("id"))] = (str(attrs.get("department") or ""), gs)
            sizes.update(gs)
        elif kind == "ServiceAccount":
            gs = [str(g) for g in value.get("groups") or []]
            app = str(value.get("app") or str(rec.get("id")).split(".", 1)[0])
            accounts[str(rec.get("id"))] = (app, gs)
            sizes.update(gs)
    groups: dict[tuple[str, str], list[str]] = {}
    for pid, (dept, gs) in people.items():
        first = [f"department:{dept}"] if dept else []
        groups[("Human", pid)] = first + [f"group:{g}" for g in sorted(gs, key=sizes.__getitem__)]
    for sid, (app, gs) in accounts.items():
        groups[("ServiceAccount", sid)] = [f"app:{app}"] + [
            f"group:{g}" for g in sorted(gs, key=sizes.__getitem__)
        ]
    return Directory(groups)


# -- robust statistics ------------------------------------------------------------------------

_MAD_SCALE = 1.4826  # MAD of a normal distribution's sample -> its standard deviation


def _median_mad(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise median and MAD of `values` (NaN = no value); NaN where a row has none."""
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(values, axis=1)
            mad = np.nanmedian(np.abs(values - med[:, None]), axis=1)
    return med, mad


def _metrics(rows: DayRows) -> dict[str, np.ndarray]:
    """The daily metrics (principals x days) the model compares."""
    c = rows.counters
    kinds = ("listed", "read", "written", "exported")
    volume = sum(ACCESS_WEIGHTS[k] * c[f"rows_{k}"] for k in kinds)
    return {
        "volume": np.asarray(volume, dtype=float),
        "moved_out": c["moved_out_rows"],
        "denies_failures": c["denies"] + c["failures"],
        "challenges_failed": c["challenges_failed"],
        "cloud_failures": c["cloud_failures"],
        "sensitive_actions": c["sensitive"],
        # for the gate only: the volume without exported rows (independent of family b)
        "volume_other": np.asarray(
            sum(ACCESS_WEIGHTS[k] * c[f"rows_{k}"] for k in ("listed", "read", "written")),
            dtype=float,
        ),
    }


@dataclass
class _PeerStats:
    """Per peer group and metric: the median and MAD of the members' own medians (log)."""

    med: dict[str, dict[str, float]]
    mad: dict[str, dict[str, float]]
    members: dict[str, list[int]]


def _assign_groups(
    principals: list[tuple[str, str]],
    directory: Directory,
    has_base: np.ndarray,
    min_peers: int,
) -> tuple[list[str], dict[str, list[int]]]:
    """Each principal's peer group, and the members with a baseline of each group chosen.

    The first candidate with `min_peers` others that have a baseline; else ``all:<type>``.
    """
    with_base: dict[str, list[int]] = {}
    for i, p in enumerate(principals):
        for g in [*directory.groups.get(p, []), f"all:{p[0]}"]:
            with_base.setdefault(g, [])
            if has_base[i]:
                with_base[g].append(i)
    chosen: list[str] = []
    members: dict[str, list[int]] = {}
    for i, p in enumerate(principals):
        pick = f"all:{p[0]}"
        for g in directory.groups.get(p, []):
            others = len(with_base.get(g, [])) - (1 if has_base[i] else 0)
            if others >= min_peers:
                pick = g
                break
        chosen.append(pick)
        members.setdefault(pick, with_base.get(pick, []))
    return chosen, members


def peer_groups(
    rows: DayRows, directory: Directory, model: Model | None = None
) -> dict[tuple[str, str], tuple[str, int]]:
    """Each principal's peer group as ``score_window`` chooses it, with the group's size.

    What ``svc.history.rollups.read_rare_resources`` needs to count a resource's users among
    a principal's peers before the window is scored.

    Args:
        rows: the window's daily counters (``svc.history.rollups.read_days``).
        directory: peer groups (``peers_from_snapshot``).
        model: parameters (default ``Model()``).

    Returns:
        ``(type, id)`` -> (group name, members of the group with a baseline, at least 1).

    """
    model = model or Model()
    split = len(rows.days) - model.recent_days
    has_base = rows.active[:, : max(0, split)].sum(axis=1) > 0
    group_of, members = _assign_groups(rows.principals, directory, has_base, model.min_peers)
    return {
        p: (group_of[i], max(1, len(members.get(group_of[i], []))))
        for i, p in enumerate(rows.principals)
    }


def _peer_stats(
    own_med: dict[str, np.ndarray], members: dict[str, list[int]]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    med: dict[str, dict[str, float]] = {}
    mad: dict[str, dict[str, float]] = {}
    for g, idx in members.items():
        med[g], mad[g] = {}, {}
        for name, values in own_med.items():
            v = values[idx] if idx else np.array([])
            v = v[~np.isnan(v)]
            if v.size == 0:
                med[g][name], mad[g][name] = math.nan, math.nan
                continue
            m = float(np.median(v))
            med[g][name] = m
            mad[g][name] = float(np.median(np.abs(v - m)))
    return med, mad


def _strength(z: np.ndarray, model: Model) -> np.ndarray:
    return np.clip((z - model.z_start) / (model.z_full - model.z_start), 0.0, 1.0)


def score_window(
    rows: DayRows,
    sets: WindowSets,
    directory: Directory,
    model: Model | None = None,
    rare: Mapping[tuple[str, str], RareResources] | None = None,
) -> list[Score]:
    """Scores every principal of `rows` (docs/reasoner.md#the-score).

    Args:
        rows: the window's daily counters (``svc.history.rollups.read_days``); its last day is
            today, its length ``model.window_days``.
        sets: the window's distinct values split at the first recent day
            (``svc.history.rollups.read_sets``).
        directory: peer groups (``peers_from_snapshot``).
        model: parameters (default ``Model()``).
        rare: resources uncommon among each principal's peers
            (``svc.history.rollups.read_rare_resources`` with ``peer_groups``); None: the
            ``rare_resources`` factor is not computed.

    Returns:
        One ``Score`` per principal active in the window, in the order of ``rows.principals``.

    Raises:
        ValueError: the window is shorter than ``recent_days + 1`` days.

    """
    model = model or Model()
    n_days = len(rows.days)
    if n_days <= model.recent_days:
        raise ValueError(f"a window of {n_days} days: needs more than {model.recent_days}")
    n = len(rows.principals)
    if n == 0:
        return []
    split = n_days - model.recent_days
    metrics = _metrics(rows)
    base_active = rows.active[:, :split]
    n_base = base_active.sum(axis=1)
    learning = n_base < model.learning_days

    # Own baselines: median and MAD of log1p(value) over the active baseline days.
    logs = {k: np.log1p(v) for k, v in metrics.items()}
    own_med: dict[str, np.ndarray] = {}
    own_mad: dict[str, np.ndarray] = {}
    for k, lv in logs.items():
        base = np.where(base_active, lv[:, :split], np.nan)
        own_med[k], own_mad[k] = _median_mad(base)

    has_base = n_base > 0
    group_of, members = _assign_groups(rows.principals, directory, has_base, model.min_peers)
    p_med, p_mad = _peer_stats(own_med, members)

    ages = np.arange(model.recent_days - 1, -1, -1, dtype=float)  # recent days' ages
    decay = 0.5 ** (ages / model.half_life_days)

    # z of every recent day against own and peer baselines, per metric
    zs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    g_meds: dict[str, np.ndarray] = {}
    strengths: dict[str, np.ndarray] = {}
    for k, lv in logs.items():
        recent = lv[:, split:]
        own_sd = np.maximum(_MAD_SCALE * np.nan_to_num(own_mad[k], nan=0.0), model.spread_floor)
        z_own = (recent - own_med[k][:, None]) / own_sd[:, None]
        z_own[learning] = np.nan
        g_med = np.array([p_med[g][k] for g in group_of])
        g_mad = np.array([p_mad[g][k] for g in group_of])
        peer_sd = np.maximum(_MAD_SCALE * np.nan_to_num(g_mad, nan=0.0), model.spread_floor)
        z_peer = (recent - g_med[:, None]) / peer_sd[:, None]
        zs[k] = (z_own, z_peer)
        g_meds[k] = g_med
        # beyond both baselines: the smaller z; a learning principal: the peers'; without a
        # peer group: its own
        has_peers = ~np.isnan(g_med)[:, None]
        z = np.where(
            learning[:, None], z_peer, np.where(has_peers, np.minimum(z_own, z_peer), z_own)
        )
        above = metrics[k][:, split:] >= model.floors[k.removesuffix("_other")]
        strengths[k] = np.where(above, _strength(np.nan_to_num(z, nan=0.0), model), 0.0)
    # The exported rows are family b's evidence too: a volume that is anomalous only through
    # them counts half (docs/reasoner.md#metrics-baselines-strength).
    strengths["volume"] = np.maximum(strengths["volume_other"], 0.5 * strengths["volume"])
    metric_factors: dict[int, list[Factor]] = {}
    rows_n = np.arange(n)
    for k in (
        "volume",
        "moved_out",
        "denies_failures",
        "challenges_failed",
        "cloud_failures",
        "sensitive_actions",
    ):
        decayed = strengths[k] * decay[None, :]
        best_day = decayed.argmax(axis=1)
        best = decayed[rows_n, best_day]
        for i in np.nonzero(best > 0)[0].tolist():
            j = int(best_day[i])
            peer_med = g_meds[k][i]
            metric_factors.setdefault(i, []).append(
                Factor(
                    k,
                    float(metrics[k][i, split + j]),
                    None if learning[i] else float(np.expm1(own_med[k][i])),
                    model.weights[k] * float(best[i]),
                    peers=None if math.isnan(peer_med) else float(np.expm1(peer_med)),
                    day=rows.days[split + j],
                )
            )

    # how many of each group used each value new to someone, and each group's hours
    group_by_key = {p: group_of[i] for i, p in enumerate(rows.principals)}
    freq: dict[str, Counter[tuple[str, str]]] = {}
    for dim, users in sets.users.items():
        c: Counter[tuple[str, str]] = Counter()
        for value, who in users.items():
            for q in who:
                gq = group_by_key.get(q)
                if gq is not None:
                    c[(gq, value)] += 1
        freq[dim] = c
    hours: dict[str, np.ndarray] = {}
    for i, p in enumerate(rows.principals):
        sp = sets.get(p)
        if sp is not None:
            g = group_of[i]
            if g in hours:
                hours[g] = hours[g] + sp.base_hours
            else:
                hours[g] = sp.base_hours.copy()
    group_size = {g: max(1, len(idx)) for g, idx in members.items()}

    out: list[Score] = []
    for i, p in enumerate(rows.principals):
        factors = metric_factors.get(i, [])
        g = group_of[i]
        gate: dict[str, Any] = {"split": split}
        if any(f.name == "moved_out" for f in factors):
            # what the containment gate reads (svc.reasoner.gate): only where there is a move
            for k in ("moved_out", "volume_other"):
                z_own, z_peer = zs[k]
                gate[k] = {
                    "values": metrics[k][i, split:].tolist(),
                    "z_own": np.nan_to_num(z_own[i], nan=-np.inf).tolist(),
                    "z_peer": np.nan_to_num(z_peer[i], nan=-np.inf).tolist(),
                    "peers": not math.isnan(g_meds[k][i]),
                }
        s = sets.get(p)
        if s is not None:
            size = group_size.get(g, 1)
            factors = factors + list(_novelty(g, s, learning[i], freq, size, model))
            hf = _odd_hours(s, hours.get(g), learning[i], model)
            if hf is not None:
                factors.append(hf)
            rr = rare.get(p) if rare else None
            if rr is not None:
                active = rows.active[i]
                rf = _rare_resources(
                    rr, int(active[:split].sum()), int(active[split:].sum()), learning[i], model
                )
                if rf is not None:
                    factors.append(rf)
            if p[0] == "ServiceAccount":
                af = _acted_for(g, s, freq.get("acted_for", Counter()), learning[i], model)
                if af is not None:
                    factors.append(af)
        factors.sort(key=lambda f: -f.contribution)
        families = _families(factors, model)
        total = sum(
            pts * model.rank_decay**r
            for r, pts in enumerate(sorted(families.values(), reverse=True))
        )
        gate["families"] = families
        out.append(
            Score(
                principal=p,
                score=int(min(100, round(total))),
                learning=bool(learning[i]),
                factors=factors,
                peer_group=g,
                gate=gate,
            )
        )
    return out


def _families(factors: list[Factor], model: Model) -> dict[str, float]:
    """Points per family: its factors, largest first, weighted 1, 1/2, 1/4, ..., capped."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for f in factors:  # largest first
        r = seen.get(f.family, 0)
        seen[f.family] = r + 1
        out[f.family] = out.get(f.family, 0.0) + f.contribution * 0.5**r
    return {fam: round(min(pts, model.family_caps.get(fam, pts)), 2) for fam, pts in out.items()}


_NOVELTY = {
    "source_ips": "new_source_ips",
    "actions": "new_actions",
    "resource_types": "new_resource_types",
    "tools": "new_tools",
}


def _novelty(
    g: str,
    s: PrincipalSets,
    learning: bool,
    freq: Mapping[str, Counter[tuple[str, str]]],
    size: int,
    model: Model,
) -> Iterable[Factor]:
    """First-time values of the recent days, and a burst of new resources.

    Each new value counts 1 when fewer than 10% of the peers used it in the window, else 1/2;
    full strength at 2 (a learning principal: only the values rare among peers count, at half
    weight).
    """
    for dim, name in _NOVELTY.items():
        new = s.new[dim]
        if not new:
            continue
        counts = freq.get(dim, Counter())
        weight = 0.0
        rare = []
        for v in new:
            share = (counts.get((g, v), 0) - 1) / size  # the principal itself is a user
            if share < 0.10:
                weight += 1.0
                rare.append(v)
            elif not learning:
                weight += 0.5
        strength = min(1.0, weight / 2.0) * (0.5 if learning else 1.0)
        if strength > 0:
            yield Factor(
                name,
                sorted(new)[:10],
                None if learning else s.base_count[dim],
                model.weights[name] * strength,
                peers=round(len(rare) / len(new), 2),
            )
    if not learning and s.new_resources > 0:
        base = max(25, s.base_resources)
        ratio = s.new_resources / base
        strength = min(1.0, max(0.0, (ratio - 0.5) / 1.5))
        if strength > 0 and s.new_resources >= 25:
            points = model.weights["new_resources"] * strength
            yield Factor("new_resources", s.new_resources, s.base_resources, points)


def _rare_resources(
    r: RareResources, base_days: int, recent_days: int, learning: bool, model: Model
) -> Factor | None:
    """Resources first touched on the recent days that few of the peers touched.

    Against the principal's own pace: the rare resources its active baseline days held per
    active day, times its active recent days, is what is usual. Strength 0 at the larger of
    10 and twice the usual, full at twice that (a learning principal: against 10 only, at half
    weight). Sentinel's "uncommon among peers".
    """
    usual = 0.0 if learning else r.base_rare / max(1, base_days) * max(1, recent_days)
    start = max(10.0, 2.0 * usual)
    strength = min(1.0, max(0.0, (r.new_rare - start) / start)) * (0.5 if learning else 1.0)
    if strength <= 0:
        return None
    return Factor(
        "rare_resources",
        {"count": r.new_rare, "touched_by_no_peer": r.new_unshared, "examples": list(r.examples)},
        None if learning else round(usual, 1),
        model.weights["rare_resources"] * strength,
        peers={"rare_below_share": RARE_SHARE},
    )


def _odd_hours(
    s: PrincipalSets, peer_hours: np.ndarray | None, learning: bool, model: Model
) -> Factor | None:
    """Recent activity in hours the principal and its peers are not active in.

    Odd hours: under 1% of the principal's baseline activity and under 2% of its peers';
    strength 0 at 10% of the recent activity, full at 40%, from 20 records up.
    """
    total = float(s.recent_hours.sum())
    if total == 0:
        return None
    own_total = float(s.base_hours.sum())
    if peer_hours is None:
        peer_hours = np.zeros(24)
    peers_total = float(peer_hours.sum())
    odd = 0
    odd_hours = []
    for h in np.nonzero(s.recent_hours)[0].tolist():
        cnt = int(s.recent_hours[h])
        own_share = float(s.base_hours[h]) / own_total if own_total else 0.0
        peer_share = float(peer_hours[h]) / peers_total if peers_total else 0.0
        if (learning or own_share < 0.01) and (peers_total == 0 or peer_share < 0.02):
            if learning and peers_total == 0:
                continue
            odd += cnt
            odd_hours.append(h)
    if odd < 20:
        return None
    share = odd / total
    strength = min(1.0, max(0.0, (share - 0.10) / 0.30)) * (0.5 if learning else 1.0)
    if strength <= 0:
        return None
    return Factor(
        "odd_hours",
        {"hours": sorted(odd_hours), "records": odd, "share": round(share, 2)},
        None
        if learning
        else [h for h in range(24) if s.base_hours[h] / max(1.0, own_total) >= 0.01],
        model.weights["odd_hours"] * strength,
    )


def _acted_for(
    g: str,
    s: PrincipalSets,
    served: Counter[tuple[str, str]],
    learning: bool,
    model: Model,
) -> Factor | None:
    """People an agent acted for on the recent days who are new to it.

    Each counts 1 when no other agent of its peer group served them in the window, else 1/2;
    strength 0 at 2, full at 8.
    """
    new = s.new["acted_for"]
    if not new:
        return None
    weight = 0.0
    unserved = 0
    for person in new:
        if served.get((g, person), 0) <= 1:  # only this agent
            weight += 1.0
            unserved += 1
        elif not learning:
            weight += 0.5
    strength = min(1.0, max(0.0, (weight - 2.0) / 6.0)) * (0.5 if learning else 1.0)
    if strength <= 0:
        return None
    return Factor(
        "new_people_acted_for",
        sorted(new)[:10] + ([f"... {len(new)} in all"] if len(new) > 10 else []),
        None if learning else s.base_count["acted_for"],
        model.weights["new_people_acted_for"] * strength,
        peers={"served_by_no_peer": unserved},
    )
