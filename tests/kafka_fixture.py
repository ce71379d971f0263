"""Fixtures for a real Kafka broker: `kafka_bootstrap` and `dev_kafka`.

Load with `pytest -p kafka_fixture` (tests/ is on sys.path through conftest.py), or import the
fixtures into conftest.py: `from kafka_fixture import dev_kafka, kafka_bootstrap`.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "dev-kafka.sh"


def _script(*args: str, timeout: float = 600) -> str:
    return subprocess.run(
        [str(SCRIPT), *args], check=True, capture_output=True, text=True, timeout=timeout
    ).stdout.strip()


def create_topics(bootstrap: str, *names: str, partitions: int = 3, within: float = 120) -> None:
    """Creates `names` on the broker, retrying while it does not answer (other work may be
    restarting it). A topic that already exists counts as made: a retry after an answer lost
    under load finds the topics its first try created.

    Raises:
        confluent_kafka.KafkaException: the broker still refuses after `within` seconds.

    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    deadline = time.monotonic() + within
    while True:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        try:
            for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
                try:
                    f.result(30)
                except KafkaException as e:
                    if "TOPIC_ALREADY_EXISTS" not in str(e):
                        raise
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap servers (`host:port[,host:port...]`) of a real Kafka for tests.

    `SVC_TEST_KAFKA_BOOTSTRAP` when set (Redpanda or any Kafka); else `scripts/dev-kafka.sh start`
    (fetches Apache Kafka's jars once and starts a local KRaft broker) and its `url`. When that
    fails: fail under CI (env `CI` set), otherwise skip with the reason.
    """
    bootstrap = os.environ.get("SVC_TEST_KAFKA_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    try:
        _script("start")
        bootstrap = _script("url", timeout=60)
    except subprocess.CalledProcessError as e:
        reason = f"scripts/dev-kafka.sh {e.cmd[-1]} failed: {(e.stderr or '').strip()[-800:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = f"scripts/dev-kafka.sh could not run: {e}"
    else:
        return bootstrap
    reason = f"no Kafka for tests ({reason}); set SVC_TEST_KAFKA_BOOTSTRAP to use another"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True)
class DevKafka:
    """The local broker of scripts/dev-kafka.sh, for tests that stop and restart it."""

    bootstrap: str

    def stop(self) -> None:
        self._run("stop", timeout=120)

    def start(self) -> None:
        self._run("start")

    def create_topics(self) -> str:
        return self._run("create-topics")

    @staticmethod
    def _run(verb: str, timeout: float = 600) -> str:
        """Run `scripts/dev-kafka.sh VERB`; on failure raise with the script's own words.

        Raises RuntimeError carrying the exit status and the tail of the script's stderr (which
        holds the broker log's tail when the broker does not come up), since pytest's report of a
        CalledProcessError leaves stderr out.
        """
        try:
            return _script(verb, timeout=timeout)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(
                f"scripts/dev-kafka.sh {verb} exited {e.returncode}:\n{(e.stderr or '')[-4000:]}"
            ) from None


@pytest.fixture(scope="session")
def dev_kafka(kafka_bootstrap: str) -> DevKafka:
    """Control of the local broker; skips when tests run against SVC_TEST_KAFKA_BOOTSTRAP."""
    if os.environ.get("SVC_TEST_KAFKA_BOOTSTRAP"):
        pytest.skip("SVC_TEST_KAFKA_BOOTSTRAP is set: the broker is not scripts/dev-kafka.sh's")
    return DevKafka(kafka_bootstrap)
