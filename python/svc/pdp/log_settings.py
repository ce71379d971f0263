"""Durability settings of the decision log, written once for ``svc pdp`` and ``svc up``.

What they mean (docs/history.md, "Durability of the decision log"; options in docs/api.md):

* ``log_commit_ms``: the group-commit window. Every decision's record is appended to the spool
  on disk by a writer thread that writes what arrived every ``log_commit_ms`` milliseconds
  (counted from the first record of the group; 0 writes as soon as a record arrives). A
  ``kill -9`` of the decision point loses at most the records of the last window.
* ``log_durability``: ``window`` answers at once (the loss above is possible); ``durable``
  answers a check or plan only once its record is written, so a kill loses no answered
  decision. Durable mode gathers no window: the writer writes as soon as it is free, and
  records that arrive during a write share the next one; an answer waits for about one write.
* ``log_fsync``: ``fdatasync`` the spool after every group commit. A written record survives a
  kill of the process without it; only this covers a power loss or a kernel crash.

``DecisionLogSettings`` reads them (``SVC_PDP_LOG_*``); ``svc.pdp.settings.PdpSettings`` and
the options of ``svc pdp`` and ``svc up`` (``svc.common.cli``) are made from it.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from svc.common.settings import ComponentSettings

__all__ = [
    "LOG_COMMIT_MS",
    "LOG_COMMIT_MS_MAX",
    "LOG_DURABILITY",
    "LOG_FSYNC",
    "DecisionLogSettings",
    "Durability",
]


class Durability(StrEnum):
    """When a decision is answered relative to its record's group commit."""

    window = "window"
    durable = "durable"


#: Default group-commit window in milliseconds.
LOG_COMMIT_MS = 5
#: Largest window accepted (``svc._pdp_core.DecisionLog`` refuses more, naming the setting).
LOG_COMMIT_MS_MAX = 1000
#: Default durability.
LOG_DURABILITY = Durability.window
#: Default: no fsync per group commit.
LOG_FSYNC = False


class DecisionLogSettings(ComponentSettings, component="pdp"):
    """The decision log's durability settings (module docs): ``SVC_PDP_LOG_*``.

    Raises:
        pydantic.ValidationError: ``log_commit_ms`` is outside 0 to 1000, or
            ``log_durability`` is neither ``window`` nor ``durable``.

    """

    log_commit_ms: int = Field(default=LOG_COMMIT_MS, ge=0, le=LOG_COMMIT_MS_MAX)
    """Decision-log group-commit window (ms; 0: write each record at once). A kill -9 loses at
    most the records of the last window. Window mode only."""
    log_durability: Durability = LOG_DURABILITY
    """window: answer at once; durable: answer once the decision's record is written."""
    log_fsync: bool = LOG_FSYNC
    """fsync the decision log after every group commit (covers power loss)."""
