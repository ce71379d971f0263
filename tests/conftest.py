"""Shared fixtures: paths to the test data kept in the repository (`tests/testdata/`: Cedar's
example apps, sample CloudTrail logs, each with its license and a README.md saying where it comes
from), and a real PostgreSQL (`postgres_url`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cleantree import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (tree stays clean)
from kafka_fixture import dev_kafka, kafka_bootstrap  # noqa: F401  (fixtures for all tests)

REPO = Path(__file__).resolve().parent.parent
TESTDATA = REPO / "tests" / "testdata"
CEDAR_EXAMPLES = TESTDATA / "cedar-examples"
CLOUDTRAIL = TESTDATA / "cloudtrail" / "cloud-snitch"


@pytest.fixture(scope="session")
def cedar_examples() -> Path:
    """The directory of Cedar's example apps, `tests/testdata/cedar-examples` (one bundle
    directory per app: document_cloud, github_example, streaming_service, tags_n_roles,
    tinytodo; see its README.md).

    Fails the test (never skips) when the directory is missing: the data is part of the
    repository, so its absence is a broken checkout.
    """
    if not CEDAR_EXAMPLES.is_dir():
        pytest.fail(
            f"{CEDAR_EXAMPLES} is missing: Cedar's example apps are part of the repository "
            "(tests/testdata/cedar-examples)"
        )
    return CEDAR_EXAMPLES


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of a real PostgreSQL for tests.

    `SVC_TEST_POSTGRES_URL` when set; else `scripts/dev-postgres.sh start` (installs and starts a
    throw-away local cluster) and its `url`. When that fails: fail under CI (env `CI` set),
    otherwise skip with the reason.
    """
    url = os.environ.get("SVC_TEST_POSTGRES_URL")
    if url:
        return url
    script = REPO / "scripts" / "dev-postgres.sh"
    try:
        subprocess.run(
            [str(script), "start"], check=True, capture_output=True, text=True, timeout=600
        )
        url = subprocess.run(
            [str(script), "url"], check=True, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except subprocess.CalledProcessError as e:
        reason = f"scripts/dev-postgres.sh {e.cmd[-1]} failed: {(e.stderr or '').strip()[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = f"scripts/dev-postgres.sh could not run: {e}"
    else:
        return url
    reason = f"no PostgreSQL for tests ({reason}); set SVC_TEST_POSTGRES_URL to use another"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chdb_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The directory of the in-process embedded history stores, as ``chdb:///dir``.

    chDB opens one directory per process (``svc.history.store``): a module opening a directory
    of its own after another module opened one fails. So every in-process store lives in the
    directory already open (a new one when none is), each test in a database of its own
    (``f"{chdb_root}?database=..."``).
    """
    from svc.history.store import _clients

    for dsn in list(_clients):
        if dsn.startswith("chdb:///"):
            return dsn.split("?", 1)[0]
    return f"chdb://{tmp_path_factory.mktemp('chdb')}"
