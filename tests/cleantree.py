"""A test run leaves the working tree as it found it (pytest hooks, imported by conftest.py).

At the start of a session the hooks note what ``git status --porcelain`` lists (with each
listed file's content hash, so a file changed before the run and again by it is seen too); at
its end they compare, and a run that changed, added or removed a file git sees fails, naming
the files. Tests write into ``tmp_path``; the committed screenshots are refreshed by
``make screenshots`` only, never by a test.

The check runs in CI (``CI`` set, as ``.ci/run`` runs) or when ``SVC_CHECK_CLEAN_TREE=1``; on a
working tree that others edit while the tests run, it is off unless asked for (their edits
would count as the run's). Outside a git checkout it does nothing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: What the session started with: path -> (git's two-letter status, content hash or "").
_started: dict[str, tuple[str, str]] | None = None


def enabled() -> bool:
    """Whether the check runs: in CI (``CI`` set and not ``false``/``0``), or when asked."""
    ci = os.environ.get("CI", "").strip().lower()
    return os.environ.get("SVC_CHECK_CLEAN_TREE") == "1" or ci not in ("", "0", "false")


def tree_state() -> dict[str, tuple[str, str]] | None:
    """What git lists as changed or untracked (ignored files aside), with content hashes.

    Returns:
        ``{path: (status, sha256 of the file or "")}`` for every path ``git status
        --porcelain --untracked-files=all`` lists, paths relative to the repository; None
        when git is missing or the directory is not a checkout.

    """
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    state: dict[str, tuple[str, str]] = {}
    entries = out.split(b"\0")
    i = 0
    while i < len(entries):
        entry = entries[i].decode("utf-8", "surrogateescape")
        i += 1
        if not entry:
            continue
        code, path = entry[:2], entry[3:]
        if code[0] in "RC":
            i += 1  # a rename's or copy's source path follows
        file = REPO / path
        digest = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else ""
        state[path] = (code, digest)
    return state


def pytest_sessionstart(session: pytest.Session) -> None:
    """Notes the tree's state before any test runs."""
    global _started
    _started = tree_state() if enabled() else None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the run (exit status 1) when the tree is not as the session found it."""
    if _started is None:
        return
    now = tree_state()
    if now is None:
        return
    changed = sorted(p for p in _started.keys() | now.keys() if _started.get(p) != now.get(p))
    if not changed:
        return
    writer = session.config.get_terminal_writer()
    writer.line()
    writer.line(
        "the test run changed the working tree (tests must write under tmp_path; "
        "docs/images/ is refreshed by `make screenshots`):",
        red=True,
        bold=True,
    )
    for path in changed:
        after = now.get(path)
        if after is None:
            how = "back to its committed state"
        elif after[0] == "??":
            how = "new file"
        elif "D" in after[0]:
            how = "deleted"
        else:
            how = "modified"
        writer.line(f"  {path}: {how}", red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
