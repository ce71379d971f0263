"""The demo company's backfilled month: routine history with two stories (docs/reasoner.md).

``company_month(company)`` makes a month of the demo company's routine traffic
(``svc.demo.month.simulate``: each person on their department's documents in their own hours,
each AI agent for a handful of people of its owner's department, the non-AI accounts that move
data nightly as steady exporters) with two stories injected, so the reasoner's first cycle
scores and flags them:

* ``exporter``: a person who exports many times their usual rows on the last three days, reading
  documents they never read before (an insider moving data out);
* ``agent_misuse``: an AI agent that, on the last two days, acts for people it never served,
  listing and exporting far beyond its app's peers (an agent reading beyond its people).

``backfill(client, company)`` stores it in a history store, ending yesterday, so the first
cycle of ``svc up`` sees a month of baseline and the stories in its last days. Its weeks are
laid out as if it ended on a Friday (``WEEKS_END``) whatever the weekday: the same month,
shifted in time, so the first cycle's scores do not depend on the day ``svc up`` starts.
Under ``svc up``: ``backfill(history_client, company)`` after ``svc history migrate`` and before
the reasoner starts; the demo's hard-coded scores are then the reasoner's to make.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

from svc.demo.company import Company
from svc.demo.month import Actor, Month, fill, simulate

__all__ = ["STORIES", "backfill", "company_month"]

#: The stories of the demo company's month.
STORIES: tuple[str, ...] = ("exporter", "agent_misuse")

#: The AI agent the ``agent_misuse`` story falls on (``docs.writer``, docs/demo.md).
STORY_AGENT = "docs.writer"

#: The month's weeks are laid out as if it ended on this day (a Friday), whatever day it ends
#: on: its days of work and rest, and so the reasoner's scores of its first cycle, do not depend
#: on the weekday ``svc up`` starts on (``svc.demo.month.simulate``'s ``weeks_end``).
WEEKS_END = date(2026, 11, 27)

#: Non-AI service accounts that move data every night (steady exporters, never a story).
_NIGHTLY = ("backup", "billing")


def company_month(
    company: Company,
    *,
    end: date | None = None,
    days: int = 30,
    seed: int | None = None,
    stories: tuple[str, ...] = STORIES,
) -> Month:
    """A month of `company`'s history with `stories` in it (module docs).

    Args:
        company: the demo company (``svc.demo.company.generate``).
        end: the last day (default: yesterday, UTC).
        days: days of history.
        seed: the random seed (default: the company's).
        stories: the story names (``svc.demo.month``).

    Returns:
        The ``Month``; its ``stories`` name who the stories fell on.

    Raises:
        ValueError: an unknown story name.

    """
    rng = random.Random(company.seed if seed is None else seed)
    end = end or datetime.now(UTC).date() - timedelta(days=1)
    actors: list[Actor] = []
    by_dept: dict[str, list[str]] = {}
    for k, p in enumerate(company.people):
        if not p.active:
            continue
        actors.append(
            Actor(
                "Human",
                p.user_name,
                p.department,
                f"10.{k // 250}.{k % 250}.10",
                start_hour=rng.choice([7, 8, 8, 9, 9, 9, 10]),
                rate=rng.uniform(5, 12),
                manager=p.manager,
            )
        )
        by_dept.setdefault(p.department, []).append(p.user_name)
    dept_of = {p.user_name: p.department for p in company.people}
    for n, sa in enumerate(company.service_accounts):
        if not sa.registered:
            continue
        app = sa.id.split(".", 1)[0]
        if sa.ai:
            pool = by_dept.get(dept_of.get(sa.owner, ""), []) or [a.id for a in actors]
            people = rng.sample(pool, min(5, len(pool)))
            actors.append(
                Actor("ServiceAccount", sa.id, app, f"10.200.0.{n + 1}", rate=10, people=people)
            )
        elif app in _NIGHTLY:
            # simulate() runs the nightly export of the accounts of the ``etl`` group
            actors.append(Actor("ServiceAccount", sa.id, "etl", f"10.201.0.{n + 1}"))
    # The agent story falls on the first AI agent ``simulate`` meets: put the demo's drafting
    # agent first, so the agents the README and docs/demo.md walk through keep their plain days.
    actors.sort(key=lambda a: a.id != STORY_AGENT)
    return simulate(
        actors,
        end=end,
        days=days,
        stories=stories,
        seed=rng.randrange(2**32),
        weeks_end=WEEKS_END,
    )


def backfill(client: Any, company: Company, *, end: date | None = None) -> Month:
    """Stores the demo company's month (``company_month``) in a history store.

    Args:
        client: a client from ``svc.history.connect`` on a migrated database.
        company: the demo company.
        end: the last day (default: yesterday, UTC).

    Returns:
        The month stored.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: an INSERT failed.

    """
    m = company_month(company, end=end)
    fill(client, m)
    return m
