"""The one-replica lease: two reasoners never run a cycle at once (docs/reasoner.md#one-replica).

* ``postgresql://...``: a session-level advisory lock (``pg_try_advisory_lock``) on a connection
  the lease keeps open; the lock ends with the connection, so a reasoner that dies (or whose
  connection drops) frees it for the next.
* ``file:///path``: an exclusive ``flock`` on that file, freed when the process ends (one host:
  ``svc up``).

``acquire()`` never waits: it tries, and says whether this process holds the lease now; a
reasoner that does not hold it runs no cycle and says so in ``/readyz`` and
``svc_reasoner_lease_held``. A held lease is checked again before each cycle (a PostgreSQL
connection that dropped lost its lock).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import Any
from urllib.parse import urlparse

__all__ = ["Lease", "lease_from_url"]

log = logging.getLogger("svc.reasoner.lease")


class Lease:
    """No lease: always held (one process by construction)."""

    describe = "none"

    def acquire(self) -> bool:
        """Tries to hold the lease; returns whether this process holds it now."""
        return True

    def release(self) -> None:
        """Frees the lease when held."""


class FileLease(Lease):
    """An exclusive ``flock`` on a file (module docs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.describe = f"file {path}"
        self._fd: int | None = None
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Takes the lock when free; returns whether it is held."""
        with self._lock:
            if self._fd is not None:
                return True
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._fd = fd
            return True

    def release(self) -> None:
        """Frees the lock."""
        with self._lock:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None


class PostgresLease(Lease):
    """A session-level advisory lock on a connection kept open (module docs)."""

    def __init__(self, url: str, key: int) -> None:
        self.url = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self.key = key
        self.describe = f"PostgreSQL advisory lock {key}"
        self._conn: Any = None
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Holds the lock when free (checking a held one's connection is alive)."""
        import psycopg

        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.execute("SELECT 1")
                    return True
                except psycopg.Error:
                    log.warning("reasoner lease: the connection holding the lock dropped")
                    self._drop()
            try:
                conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            except psycopg.Error as e:
                log.warning("reasoner lease: cannot connect: %s", e)
                return False
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
            if not row or not row[0]:
                conn.close()
                return False
            self._conn = conn
            return True

    def _drop(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass
        self._conn = None

    def release(self) -> None:
        """Unlocks and closes the connection."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
                except Exception:
                    pass
                self._drop()


def lease_from_url(url: str | None, key: int = 0) -> Lease:
    """The lease a ``lease_url`` setting names.

    Raises:
        ValueError: a scheme other than ``postgresql``, ``postgresql+psycopg`` or ``file``.

    """
    if not url:
        return Lease()
    scheme = urlparse(url).scheme
    if scheme in ("postgresql", "postgresql+psycopg", "postgres"):
        return PostgresLease(url, key)
    if scheme == "file":
        return FileLease(urlparse(url).path)
    raise ValueError(f"lease URL `{url}`: expected postgresql:// or file://")
