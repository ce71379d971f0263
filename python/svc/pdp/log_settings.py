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

This module imports nothing heavy, so the command line can take its defaults from here.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "LOG_COMMIT_MS",
    "LOG_COMMIT_MS_MAX",
    "LOG_DURABILITY",
    "LOG_FSYNC",
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
