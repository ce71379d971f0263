"""Data files that hold secrets or live tokens: created 0600 in a 0700 directory.

docs/architecture.md#storage. A service's SQLite database holds what only the service may read
(the policy outbox's link tokens, the challenge service's sessions and keys, the directory), so
``private_sqlite`` makes its file before SQLite does: mode 0600 (owner read and write), in a
directory this call makes with mode 0700. An existing file is narrowed to 0600; SQLite gives its
journal and WAL files the database file's mode, so they follow. The database's directory is
narrowed to 0700 too (``svc up``'s data directory), unless it is the working directory (where a
default URL points), the home directory, the root or a shared sticky one such as ``/tmp``.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "private_file", "private_sqlite"]

log = logging.getLogger("svc.common.files")

#: The mode of a data file: the owner reads and writes, nobody else.
FILE_MODE = 0o600
#: The mode of a data directory this module makes.
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Makes ``path`` (and missing parents) a directory only its owner can enter, mode 0700.

    Args:
        path: the directory; an existing one owned by this user is narrowed to 0700.

    Returns:
        ``path``.

    Raises:
        OSError: it cannot be made, or is not a directory.

    """
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    st = path.stat()
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        path.chmod(DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Makes sure ``path`` exists with mode 0600 (created empty when missing).

    A missing parent directory is made with mode 0700; an existing one is left as it is.

    Args:
        path: the file.

    Returns:
        ``path``.

    Raises:
        OSError: the file or its directory cannot be made, or its mode cannot be set.

    """
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def private_sqlite(url: str) -> None:
    """For a SQLite file URL, the database file made (or narrowed to) mode 0600 before use.

    Args:
        url: a SQLAlchemy URL; anything but ``sqlite:///<path>`` (another database, an
            in-memory SQLite, a ``file:`` URI) is left alone.

    Raises:
        OSError: the file or its directory cannot be made, or its mode cannot be set.

    """
    try:
        parsed = make_url(url)
    except Exception:  # not a URL SQLAlchemy reads: create_engine will say so
        return
    if not parsed.drivername.startswith("sqlite"):
        return
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database).resolve()
    parent = path.parent
    shared = {Path.cwd().resolve(), Path.home().resolve(), Path("/")}
    if parent.exists() and parent not in shared and not parent.stat().st_mode & stat.S_ISVTX:
        private_dir(parent)
    private_file(path)
