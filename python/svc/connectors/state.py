"""What a connector remembers between polls and restarts: its cursors and the ids it wrote.

A SQLite file (``SVC_CONNECTORS_STATE_PATH``; docs/connectors.md#state), one per connector
replica (the connectors run as one replica). Two tables:

* ``cursor(connector, name, value)``: the Drive connector's change page token, crawl page token
  and phase; the Jira connector's last ``updated`` and last reconciliation;
* ``known(connector, id, version, gen)``: every id written to the context service and not
  deleted since, with the source's version of it (Jira: ``updated``, for deduplication) and the
  crawl generation that last saw it (a full crawl deletes the ids an older generation holds).

``commit`` writes cursor values and known ids in one transaction, called only once the context
service has accepted the batch they describe: a connector killed between the two sends that
batch again on restart, which the context service stores without a new change (it skips a
record equal to the one held), so nothing is lost and nothing is doubled.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["State"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cursor (
  connector TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (connector, name));
CREATE TABLE IF NOT EXISTS known (
  connector TEXT NOT NULL, id TEXT NOT NULL, version TEXT NOT NULL, gen INTEGER NOT NULL,
  PRIMARY KEY (connector, id));
"""


class State:
    """The connectors' state file (module docs); thread-safe.

    Args:
        path: the SQLite file (created with its parent directory); ``":memory:"`` for a state
            that ends with the process.

    Raises:
        sqlite3.Error: the file cannot be opened or is not a SQLite database.

    """

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def get(self, connector: str, name: str) -> str | None:
        """A cursor value, or None when never set."""
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM cursor WHERE connector = ? AND name = ?", (connector, name)
            ).fetchone()
        return None if row is None else str(row[0])

    def versions(self, connector: str, ids: Iterable[str]) -> dict[str, str]:
        """The known version of each of ``ids`` the connector holds (absent ones left out)."""
        out: dict[str, str] = {}
        wanted = list(ids)
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                q = ",".join("?" * len(part))
                for k, v in self._db.execute(
                    f"SELECT id, version FROM known WHERE connector = ? AND id IN ({q})",
                    (connector, *part),
                ):
                    out[str(k)] = str(v)
        return out

    def known_ids(self, connector: str, *, older_than_gen: int | None = None) -> list[str]:
        """Every id the connector wrote and holds.

        With ``older_than_gen``: those whose generation is below it (what a finished full
        crawl did not see).
        """
        with self._lock:
            if older_than_gen is None:
                rows = self._db.execute(
                    "SELECT id FROM known WHERE connector = ? ORDER BY id", (connector,)
                )
            else:
                rows = self._db.execute(
                    "SELECT id FROM known WHERE connector = ? AND gen < ? ORDER BY id",
                    (connector, older_than_gen),
                )
            return [str(r[0]) for r in rows]

    def commit(
        self,
        connector: str,
        *,
        cursor: Mapping[str, str] | None = None,
        known: Mapping[str, str] | None = None,
        gen: int = 0,
        forget: Iterable[str] = (),
    ) -> None:
        """Saves cursor values and known ids in one transaction (module docs).

        Args:
            connector: ``drive`` or ``jira``.
            cursor: cursor names and their new values.
            known: ids written, with their source versions.
            gen: the generation recorded with ``known``.
            forget: ids deleted from the context service.

        Raises:
            sqlite3.Error: the write failed; nothing of it is kept.

        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for name, value in (cursor or {}).items():
                    self._db.execute(
                        "INSERT INTO cursor (connector, name, value) VALUES (?, ?, ?) "
                        "ON CONFLICT (connector, name) DO UPDATE SET value = excluded.value",
                        (connector, name, value),
                    )
                self._db.executemany(
                    "INSERT INTO known (connector, id, version, gen) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (connector, id) DO UPDATE SET version = excluded.version, "
                    "gen = excluded.gen",
                    [(connector, k, v, gen) for k, v in (known or {}).items()],
                )
                self._db.executemany(
                    "DELETE FROM known WHERE connector = ? AND id = ?",
                    [(connector, k) for k in forget],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Closes the file."""
        with self._lock:
            self._db.close()
