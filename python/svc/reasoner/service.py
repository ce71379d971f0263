"""The reasoner's service layer: one cycle, from history to scores, containments and investigations.

``ReasonerService.run_cycle(at)`` (docs/reasoner.md#a-cycle):

1. **Read.** Settle the rollups of the days whose raw partitions changed since the last cycle
   (``svc.history.rollups.settle``), read the window's daily counters and distinct values,
   the principals snapshot (peers), the stored scores, the reasoner's investigations, the
   containment list and the mode for automated containments.
2. **Score** every ``Human`` and ``ServiceAccount`` active in the window
   (``svc.reasoner.scoring``), and decide: the gate (``svc.reasoner.gate``) for each principal
   not contained, the daily cap, investigations for high scores. Evidence samples and the
   summaries (a model's, when configured) are made here too, before anything is written.
3. **Write.** One ``POST /v1/risk`` with every score that changed (and 0 for a principal whose
   evidence left the window), then ``Contain`` (enforce) or a would-contain investigation
   (monitor), then the other investigations.

Any dependency that fails in steps 1 and 2 (the history, the context service, the challenge or
policy service, the model) raises ``Unavailable`` and nothing is written: the next cycle tries
again. The history client, the service clients, the summarizer and the lease are handed in, so
``svc up`` can give in-process ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

from svc.history import rollups
from svc.history.schema import MOVING_OUT_ACTIONS
from svc.reasoner.clients import (
    ChallengeClient,
    ContextClient,
    PolicyClient,
    Unavailable,
)
from svc.reasoner.gate import GateResult, evaluate
from svc.reasoner.lease import Lease
from svc.reasoner.scoring import Score, peer_groups, peers_from_snapshot, score_window
from svc.reasoner.settings import ReasonerSettings
from svc.reasoner.summary import Summarizer

__all__ = ["SCORED_TYPES", "CycleResult", "CycleStatus", "ReasonerService"]

log = logging.getLogger("svc.reasoner")

#: The principal types scored (docs/architecture.md#entities-and-the-base-schema).
SCORED_TYPES = ("Human", "ServiceAccount")
#: Factors kept with a published score.
TOP_FACTORS = 5
#: Kinds of the reasoner's investigations.
REASONER_KINDS = ("contain", "would_contain", "score")


@dataclass
class CycleResult:
    """What one cycle did (the JSON ``svc reasoner cycle`` prints; docs/reasoner.md#commands).

    Attributes:
        at: the cycle's time.
        mode: the containment mode in force (``enforce``/``monitor``).
        scores: every principal scored, ``{principal, score, learning, factors}``.
        published: scores sent in the cycle's one ``POST /v1/risk``.
        contained: principals contained this cycle, with the gate's evidence.
        would_contain: principals the gate passed in monitor mode, or beyond the daily cap.
        investigations: investigations opened this cycle.
        lifted: principals whose automated containment an admin lifted since the last cycle.
        settled: rollup days rebuilt.
        timings: seconds per step (``settle``, ``read``, ``score``, ``decide``, ``write``).

    """

    at: datetime
    mode: str
    scores: list[dict[str, Any]] = field(default_factory=list)
    published: int = 0
    contained: list[dict[str, Any]] = field(default_factory=list)
    would_contain: list[dict[str, Any]] = field(default_factory=list)
    investigations: list[dict[str, Any]] = field(default_factory=list)
    lifted: list[dict[str, str]] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The result as JSON types."""
        return {
            "at": self.at.isoformat(),
            "mode": self.mode,
            "scores": self.scores,
            "published": self.published,
            "contained": self.contained,
            "would_contain": self.would_contain,
            "investigations": self.investigations,
            "lifted": self.lifted,
            "settled": self.settled,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


@dataclass
class CycleStatus:
    """The loop's state, for ``/readyz`` and ``/metrics``.

    Attributes:
        lease_held: whether this process holds the one-replica lease.
        cycles: cycles that ended, by outcome (``ok``, ``failed``).
        last_ok: when the last cycle that worked ended.
        last_error: the last failure's message.
        last_result: the last cycle's counts (scored, published, contained, would_contain).

    """

    lease_held: bool = False
    cycles: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})
    last_ok: datetime | None = None
    last_error: str | None = None
    last_result: dict[str, float] = field(default_factory=dict)


def _ref(p: tuple[str, str]) -> dict[str, str]:
    return {"type": p[0], "id": p[1]}


def _key_ref(key: str) -> tuple[str, str]:
    t, _, rest = key.partition("::")
    return t, rest[1:-1] if rest.startswith('"') else rest


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


class ReasonerService:
    """The reasoner (module docs).

    Args:
        settings: the component's settings.
        history: a ``clickhouse-connect`` client on the migrated history database.
        context: the context service's client.
        challenge: the challenge service's client.
        policy: the policy service's client.
        summarizer: writes investigation summaries (default: deterministic, or the model the
            settings name).
        lease: the one-replica lease (default: the one ``settings.lease_url`` names).

    """

    def __init__(
        self,
        settings: ReasonerSettings,
        history: Client,
        context: ContextClient,
        challenge: ChallengeClient,
        policy: PolicyClient,
        summarizer: Summarizer | None = None,
        lease: Lease | None = None,
    ) -> None:
        from svc.reasoner.lease import lease_from_url
        from svc.reasoner.settings import read_token

        self.settings = settings
        self.history = history
        self.context = context
        self.challenge = challenge
        self.policy = policy
        key_file = settings.model_api_key_file
        self.summarizer = summarizer or Summarizer(
            settings.model_url,
            settings.model_name,
            lambda: read_token(key_file),
            settings.call_timeout_secs,
        )
        self.lease = lease or lease_from_url(settings.lease_url, settings.lease_key)
        self.status = CycleStatus()
        self._settled_at: datetime | None = None
        self._cycle_lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------------

    def _history(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Unavailable:
            raise
        except Exception as e:  # any driver or engine error: the history is not usable now
            raise Unavailable("history", f"{what}: {type(e).__name__}: {e}") from e

    def _settle(self, first: date, last: date) -> list[date]:
        mark = datetime.now(UTC) - timedelta(seconds=2)
        changed = rollups.changed_days(self.history, self._settled_at)
        days = [d for d in changed if first <= d <= last]
        rebuilt = rollups.settle(self.history, days)
        self._settled_at = mark
        return rebuilt

    def _samples(self, p: tuple[str, str], since: datetime) -> dict[str, list[str]]:
        """Up to five decision ids and five event ids (moving out first) since `since`."""
        params = {"t": p[0], "i": p[1], "s": since.replace(tzinfo=None)}
        who = "principal_type = {t:String} AND principal_id = {i:String}"
        qids = self.history.query(
            f"SELECT qid FROM decisions WHERE {who} AND at >= {{s:DateTime64(3)}} "
            "ORDER BY verdict = 'deny' DESC, at DESC LIMIT 5",
            parameters=params,
        ).result_rows
        moving = ", ".join(f"'{a}'" for a in MOVING_OUT_ACTIONS)
        ids = self.history.query(
            f"SELECT ingest_id FROM events WHERE {who} AND at >= {{s:DateTime64(3)}} "
            f"ORDER BY (action IN ({moving}) OR access = 'exported') DESC, "
            "ifNull(row_count, 0) DESC, at DESC LIMIT 5",
            parameters=params,
        ).result_rows
        return {"decisions": [str(r[0]) for r in qids], "events": [str(r[0]) for r in ids]}

    def _moved_out_since(self, p: tuple[str, str], since: datetime) -> float:
        """Rows `p` moved out from `since` to the end of that UTC day (raw rows, ``FINAL``)."""
        end = datetime.combine(since.date() + timedelta(days=1), datetime.min.time())
        moving = ", ".join(f"'{a}'" for a in MOVING_OUT_ACTIONS)
        rows = self.history.query(
            f"SELECT sumIf(ifNull(row_count, 1), action IN ({moving}) OR access = 'exported') "
            "FROM events FINAL WHERE principal_type = {t:String} AND principal_id = {i:String} "
            "AND at >= {s:DateTime64(3)} AND at < {e:DateTime64(3)}",
            parameters={
                "t": p[0],
                "i": p[1],
                "s": since.astimezone(UTC).replace(tzinfo=None),
                "e": end,
            },
        ).result_rows
        return float(rows[0][0] or 0) if rows else 0.0

    # -- the cycle ---------------------------------------------------------------------------

    def run_cycle(self, at: datetime | None = None) -> CycleResult:
        """Runs one cycle as if the time were `at` (default: now); module docs.

        Returns:
            The ``CycleResult``.

        Raises:
            Unavailable: a dependency failed; nothing was written when it failed while reading
                or deciding (a write that fails midway leaves what was written before it,
                which the next cycle takes into account).
            RuntimeError: another cycle of this process is running.

        """
        if not self._cycle_lock.acquire(blocking=False):
            raise RuntimeError("a cycle is already running")
        try:
            return self._cycle(at)
        finally:
            self._cycle_lock.release()

    def _cycle(self, at: datetime | None) -> CycleResult:
        s = self.settings
        now = (at or datetime.now(UTC)).astimezone(UTC)
        today = now.date()
        first = today - timedelta(days=s.window_days - 1)
        recent = today - timedelta(days=s.recent_days - 1)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()

        settled = self._history("settling the rollups", lambda: self._settle(first, today))
        timings["settle"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = self._history(
            "reading the rollups", lambda: rollups.read_days(self.history, first, today)
        )
        sets = self._history(
            "reading the rollups' sets",
            lambda: rollups.read_sets(self.history, first, today, recent),
        )
        snapshot = self.context.principals()
        stored = {
            (r["principal"]["type"], r["principal"]["id"]): r for r in self.context.risk_scores()
        }
        mine = [i for i in self.context.investigations() if i.get("opened_by") == s.author]
        contained = self.challenge.containments()
        mode = self.policy.containment_mode()
        keep = [k for k, p in enumerate(rows.principals) if p[0] in SCORED_TYPES]
        if len(keep) != len(rows.principals):
            rows = rollups.DayRows(
                [rows.principals[k] for k in keep],
                rows.days,
                {n: v[keep] for n, v in rows.counters.items()},
                rows.active[keep],
            )
        directory = peers_from_snapshot(snapshot)
        # Resources uncommon among peers (one aggregate query over the raw rows' distinct
        # pairs; docs/reasoner.md#factors), peers as the scoring chooses them.
        groups = peer_groups(rows, directory, s.model())
        rare = self._history(
            "reading resources rare among peers",
            lambda: rollups.read_rare_resources(self.history, first, today, recent, groups),
        )
        timings["read"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        scores = score_window(rows, sets, directory, s.model(), rare)
        timings["score"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = CycleResult(at=now, mode=mode, settled=[d.isoformat() for d in settled])
        window = [first.isoformat(), today.isoformat()]
        publish = self._to_publish(scores, stored, window)

        # Lifts: an open containment investigation of ours whose principal is free again.
        lifted_at: dict[tuple[str, str], datetime] = {}
        to_close: list[dict[str, Any]] = []
        for inv in mine:
            if inv.get("kind") != "contain":
                continue
            p = _key_ref(inv["principal"])
            if inv["status"] == "open" and p not in contained:
                to_close.append(inv)
                lifted_at[p] = max(lifted_at.get(p, now), now)
            elif inv["status"] == "closed" and p not in contained:
                closed = _parse_time(inv.get("closed_at")) or now
                lifted_at[p] = max(lifted_at.get(p, closed), closed)
        open_by: dict[tuple[str, str], set[str]] = {}
        acted_today = 0
        for inv in mine:
            p = _key_ref(inv["principal"])
            if inv["status"] == "open" and inv not in to_close:
                open_by.setdefault(p, set()).add(str(inv.get("kind")))
            opened = _parse_time(inv.get("opened_at"))
            if (
                inv.get("kind") in ("contain", "would_contain")
                and opened
                and opened.date() == today
            ):
                if (inv.get("evidence") or {}).get("capped"):
                    continue
                acted_today += 1

        gate_settings = s.gate()
        remaining = max(0, gate_settings.max_per_day - acted_today)
        planned: list[tuple[str, Score, GateResult]] = []
        for sc in sorted(scores, key=lambda x: -x.score):
            if sc.principal in contained or sc.score == 0:
                continue
            lift = lifted_at.get(sc.principal)
            post = None
            if lift is not None and lift.date() >= today - timedelta(days=s.gate_days):
                post = self._history(
                    "reading moves out after a lift",
                    lambda p=sc.principal, t=lift: self._moved_out_since(p, t),  # type: ignore[misc]
                )
            g = evaluate(
                sc,
                rows.days,
                gate_settings,
                lifted_on=lift.date() if lift else None,
                post_lift_moved_out=post,
            )
            if g.passed:
                # A would-contain is recorded once while its investigation is open; in enforce
                # mode a principal held back by the cap is contained once the cap allows.
                recorded = "would_contain" in open_by.get(sc.principal, set())
                if remaining > 0 and (mode == "enforce" or not recorded):
                    remaining -= 1
                    planned.append(("contain" if mode == "enforce" else "would_contain", sc, g))
                elif remaining <= 0 and not recorded:
                    planned.append(("capped", sc, g))
            elif sc.score >= s.investigate_score and not open_by.get(sc.principal):
                planned.append(("score", sc, g))

        # Evidence and summaries, before anything is written.
        actions: list[tuple[str, Score, dict[str, Any], str]] = []
        for kind, sc, gr in planned:
            evidence = self._evidence(kind, sc, gr, window, mode, now)
            summary = self.summarizer.summarize(evidence)
            actions.append((kind, sc, evidence, summary))
        timings["decide"] = time.perf_counter() - t0

        # Writes.
        t0 = time.perf_counter()
        if publish:
            self.context.put_risk_scores(publish)
        result.published = len(publish)
        for inv in to_close:
            p = _key_ref(inv["principal"])
            self.context.close_investigation(
                inv["id"], s.author, f"containment lifted (seen at {now.isoformat()})"
            )
            result.lifted.append(_ref(p))
        for kind, sc, evidence, summary in actions:
            ref = _ref(sc.principal)
            if kind == "contain":
                reason = f"{s.author}: " + "; ".join(evidence["gate"]["reasons"])
                self.challenge.contain(sc.principal, reason[:1000], s.author)
                result.contained.append({"principal": ref, "score": sc.score, **evidence["gate"]})
            elif kind in ("would_contain", "capped"):
                result.would_contain.append(
                    {
                        "principal": ref,
                        "score": sc.score,
                        "capped": kind == "capped",
                        **evidence["gate"],
                    }
                )
            inv = self.context.open_investigation(
                {
                    "principal": ref,
                    "reason": self._reason(kind, sc),
                    "opened_by": s.author,
                    "kind": "would_contain" if kind == "capped" else kind,
                    "evidence": evidence,
                    "summary": summary,
                    "summary_by": self.summarizer.by,
                }
            )
            result.investigations.append(
                {"id": inv["id"], "principal": ref, "kind": inv["kind"], "summary": summary}
            )
        timings["write"] = time.perf_counter() - t0
        result.scores = [
            {
                "principal": _ref(sc.principal),
                "score": sc.score,
                "learning": sc.learning,
                "factors": sc.top(TOP_FACTORS),
            }
            for sc in scores
        ]
        result.timings = timings
        log.info(
            "reasoner cycle at %s: %d scored, %d published, %d contained, %d would-contain, "
            "%d investigations (%s)",
            now.isoformat(),
            len(scores),
            result.published,
            len(result.contained),
            len(result.would_contain),
            len(result.investigations),
            ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()),
        )
        return result

    def _to_publish(
        self,
        scores: list[Score],
        stored: dict[tuple[str, str], dict[str, Any]],
        window: list[str],
    ) -> list[dict[str, Any]]:
        """The scores to send: new or changed ones, and 0 for a stored score no longer seen."""
        out = []
        seen = set()
        for sc in scores:
            seen.add(sc.principal)
            factors = sc.top(TOP_FACTORS)
            old = stored.get(sc.principal)
            names = [f["name"] for f in factors]
            if (
                old is not None
                and old["score"] == sc.score
                and [f["name"] for f in old.get("factors") or []] == names
            ):
                continue
            out.append(
                {
                    "principal": _ref(sc.principal),
                    "score": sc.score,
                    "reason": ", ".join(names),
                    "factors": factors,
                    "details": {
                        "learning": sc.learning,
                        "peer_group": sc.peer_group,
                        "window": window,
                    },
                }
            )
        for p, old in stored.items():
            if p not in seen and p[0] in SCORED_TYPES and old["score"] != 0:
                out.append(
                    {
                        "principal": _ref(p),
                        "score": 0,
                        "reason": "no activity in the window",
                        "factors": [],
                        "details": {"window": window},
                    }
                )
        return out

    def _evidence(
        self,
        kind: str,
        sc: Score,
        g: GateResult | None,
        window: list[str],
        mode: str,
        now: datetime,
    ) -> dict[str, Any]:
        since = datetime.fromisoformat(window[0]).replace(tzinfo=UTC)
        if g is not None and g.day is not None:
            since = datetime.combine(g.day, datetime.min.time(), tzinfo=UTC)
        elif sc.factors and sc.factors[0].day is not None:
            since = datetime.combine(sc.factors[0].day, datetime.min.time(), tzinfo=UTC)
        samples = self._history(
            "reading evidence samples", lambda: self._samples(sc.principal, since)
        )
        evidence: dict[str, Any] = {
            "principal": _ref(sc.principal),
            "kind": "would_contain" if kind == "capped" else kind,
            "score": sc.score,
            "learning": sc.learning,
            "peer_group": sc.peer_group,
            "window": window,
            "factors": sc.top(TOP_FACTORS),
            "mode": mode,
            "at": now.isoformat(),
            "samples": samples,
        }
        if g is not None:
            evidence["gate"] = {
                "passed": g.passed,
                "reasons": g.reasons,
                "families": g.families,
                "day": g.day.isoformat() if g.day else None,
                "evidence": g.evidence,
            }
        if kind == "capped":
            evidence["capped"] = True
        return evidence

    def _reason(self, kind: str, sc: Score) -> str:
        top = ", ".join(f.name for f in sc.factors[:3]) or "no factor"
        return {
            "contain": f"contained automatically: score {sc.score} ({top})",
            "would_contain": f"would contain (monitor mode): score {sc.score} ({top})",
            "capped": f"would contain, daily cap reached: score {sc.score} ({top})",
            "score": f"score {sc.score} ({top})",
        }[kind]


def from_settings(settings: ReasonerSettings, history: Client | None = None) -> ReasonerService:
    """A ``ReasonerService`` with the clients `settings` name.

    Args:
        settings: the component's settings.
        history: a history client to use (``svc up``'s in-process chDB client); default: one
            from ``settings.history_dsn``.

    Returns:
        The service (its lease not yet taken).

    Raises:
        ValueError: no history client and no ``history_dsn``, or a bad lease URL.
        clickhouse_connect.driver.exceptions.ClickHouseError: the history cannot be opened.

    """
    from svc.history import connect
    from svc.reasoner.settings import read_token

    if history is None:
        if not settings.history_dsn:
            raise ValueError("no history: set SVC_REASONER_HISTORY_DSN (--history-dsn)")
        history = connect(settings.history_dsn)
    timeout = settings.call_timeout_secs

    def token(path: Any) -> Callable[[], str | None]:
        return lambda: read_token(path)

    return ReasonerService(
        settings,
        history,
        ContextClient(settings.context_url, token(settings.context_token_file), timeout),
        ChallengeClient(settings.challenge_url, token(settings.challenge_token_file), timeout),
        PolicyClient(settings.policy_url, token(settings.policy_token_file), timeout),
    )
