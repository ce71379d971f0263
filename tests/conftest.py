"""Shared fixtures: paths to the golden corpus and to ../shared/data (present in CI), and a
real PostgreSQL (`postgres_url`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kafka_fixture import dev_kafka, kafka_bootstrap  # noqa: F401  (fixtures for all tests)

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CEDAR_EXAMPLES = SHARED_DATA / "cedar-examples"


@pytest.fixture(scope="session")
def cedar_examples() -> Path:
    if not CEDAR_EXAMPLES.is_dir():
        pytest.skip("../shared/data/cedar-examples is not present")
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
