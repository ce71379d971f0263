"""The decision log's shipper: records from the decision point to Kafka (SPEC 1 and 6, DESIGN 6).

The server (Rust) queues one record per decision in a ``svc._pdp_core.DecisionLog``. A
``Shipper`` thread drains them in batches (one GIL acquisition per batch) and produces them to
``svc.decisions.v1`` with ``confluent-kafka``: idempotent producer, ``acks=all``, key = the
principal (``Type::id``), so one principal's records stay in order on one partition.

Nothing is lost and nothing is dropped silently:

* The producer never gives up on a record (``message.timeout.ms=0``): while the broker is away,
  librdkafka keeps what it already holds and delivers it, exactly once, when the broker returns.
* What the producer cannot hold (its buffer is full, or the broker is known to be down) goes to
  the log's spool on disk, fsynced. While the spool holds anything, new records go to the spool
  too, so the spool is a FIFO and records keep their order.
* The spool is replayed once the producer has delivered everything it held; the replay position
  moves only after the broker acknowledged a whole batch (at least once: a crash mid-replay
  replays again, and the history loader drops duplicates by ``qid``).
* On stop, whatever the producer still holds after the flush timeout is purged and spooled.
* Records are dropped only when the spool is full (``spool_max_bytes``); they are counted in
  ``svc_pdp_decision_log_records_total{state="dropped"}``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from svc._pdp_core import DecisionLog, SpoolBatchHandle
from svc.broker import LOCAL_SCHEME, Producer

__all__ = ["DECISIONS_TOPIC", "Shipper", "bootstrap_servers", "producer_config"]

DECISIONS_TOPIC = "svc.decisions.v1"

log = logging.getLogger("svc.pdp.decision_log")


def bootstrap_servers(url: str) -> str:
    """Kafka bootstrap servers from the one broker setting (``SVC_KAFKA_URL``).

    Accepts ``kafka://host:port[,host:port]`` or a plain ``host:port[,host:port]`` list and
    returns the plain list librdkafka takes. ``local:///path/log.db``, the embedded topic log of
    ``svc up`` (``svc.broker``), is returned as it is: ``svc.broker``'s clients read it.

    Raises:
        ValueError: the URL is empty or has another scheme.

    """
    u = url.strip()
    if u.startswith(LOCAL_SCHEME):
        if len(u) == len(LOCAL_SCHEME):
            raise ValueError(f"broker URL `{url}` names no file; expected local:///path/log.db")
        return u
    if "://" in u:
        scheme, _, rest = u.partition("://")
        if scheme not in ("kafka", "plaintext"):
            raise ValueError(f"broker URL `{url}`: expected kafka://host:port, got `{scheme}://`")
        u = rest.rstrip("/")
    if not u:
        raise ValueError("broker URL is empty; expected kafka://host:port")
    return u


def producer_config(bootstrap: str, buffer_messages: int = 10_000) -> dict[str, Any]:
    """The producer settings of the decision log (see the module docs for why each).

    Args:
        bootstrap: bootstrap servers (``host:port`` list).
        buffer_messages: records librdkafka may hold before the shipper spools instead.

    """
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": 0,
        "linger.ms": 5,
        "compression.type": "lz4",
        "queue.buffering.max.messages": buffer_messages,
        "client.id": "svc-pdp-decision-log",
    }


class _Replay:
    """Delivery state of one spool batch in flight."""

    def __init__(self, handle: SpoolBatchHandle, size: int) -> None:
        self.handle = handle
        self.size = size
        self.acked = 0
        self.failed = 0

    def done(self, err: KafkaError | None, _msg: Message) -> None:
        """Delivery callback of one replayed record."""
        if err is None:
            self.acked += 1
        else:
            self.failed += 1


class Shipper:
    """Moves records from a ``DecisionLog`` to Kafka in a daemon thread.

    Args:
        decision_log: the log the server pushes into.
        bootstrap: Kafka bootstrap servers (``host:port`` list; see ``bootstrap_servers``).
        topic: destination topic (``svc.decisions.v1``).
        batch: records taken per drain / replay step.
        buffer_messages: producer buffer before records are spooled instead.
        flush_timeout: seconds ``stop()`` waits for the broker before spooling the rest.
        extra_config: more librdkafka settings (security, for example); they win.

    """

    def __init__(
        self,
        decision_log: DecisionLog,
        bootstrap: str,
        topic: str = DECISIONS_TOPIC,
        *,
        batch: int = 5000,
        buffer_messages: int = 10_000,
        flush_timeout: float = 10.0,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.log = decision_log
        self.topic = topic
        self.batch = batch
        self.flush_timeout = flush_timeout
        conf = producer_config(bootstrap, buffer_messages)
        conf["error_cb"] = self._on_error
        conf.update(extra_config or {})
        self.producer = Producer(conf)
        self.replay_batch = max(1, min(batch, buffer_messages // 2))
        self._replaying: _Replay | None = None
        self._broker_down = False
        self._delivered = 0
        self._failed: list[tuple[bytes, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="svc-decision-log", daemon=True)

    # -- librdkafka callbacks (run inside poll/flush on the shipper thread)

    def _on_error(self, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            if not self._broker_down:
                log.warning("decision log: broker unreachable, spooling records")
            self._broker_down = True
        elif code == KafkaError._TRANSPORT:
            # Repeats every reconnect attempt while the broker is away; the state change above
            # is what operators need.
            log.debug("decision log: %s", err)
        else:
            log.warning("decision log: producer error: %s", err)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self._delivered += 1
            if self._broker_down:
                log.info("decision log: broker reachable again")
            self._broker_down = False
            return
        key = msg.key() or b""
        value = msg.value() or b""
        self._failed.append((key, value))

    # -- the loop

    def _settle(self, timeout: float) -> None:
        """Serves callbacks; reports deliveries and spools failures."""
        self.producer.poll(timeout)
        if self._delivered:
            self.log.mark_sent(self._delivered)
            self._delivered = 0
        if self._failed:
            failed, self._failed = self._failed, []
            log.warning("decision log: %d records failed delivery, spooling", len(failed))
            self.log.spool(failed)

    def _produce(self, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Produces records in order; returns those the producer could not take.

        The returned tail starts at the first refusal, so order is kept.
        """
        for i, (key, value) in enumerate(records):
            try:
                self.producer.produce(
                    self.topic, value=value, key=key, on_delivery=self._on_delivery
                )
            except BufferError:
                return records[i:]
        return []

    def _probe(self) -> bool:
        """Whether the broker answers a metadata request now."""
        try:
            self.producer.list_topics(self.topic, timeout=1.0)
        except KafkaException:
            return False
        return True

    def _replay(self) -> None:
        """Hands one spool batch to the producer (its buffer is empty, the batch fits).

        The batch is committed by ``_settle_replay`` once every record of it is acknowledged.
        """
        records, handle = self.log.spool_read(self.replay_batch)
        if not records:
            return
        state = _Replay(handle, len(records))
        self._replaying = state
        for key, value in records:
            self.producer.produce(self.topic, value=value, key=key, on_delivery=state.done)

    def _settle_replay(self) -> None:
        """Commits the batch in replay once all of it is acknowledged.

        When some records failed instead (for example purged at stop), the batch is given up
        without a commit, to be read again.
        """
        state = self._replaying
        if state is None:
            return
        if state.acked == state.size:
            self.log.spool_commit(state.handle)
            self.log.mark_sent(state.size)
            self._replaying = None
        elif state.acked + state.failed == state.size:
            self._replaying = None

    def _ship(self, records: list[tuple[bytes, bytes]]) -> None:
        """Produces new records, or spools them behind what the spool already holds.

        While the broker is down, a spool batch is in replay, or the spool holds anything, new
        records queue behind, so they keep their order; what the producer refuses is spooled.
        """
        if self._broker_down or self._replaying is not None or self.log.stats["spool_pending"]:
            self.log.spool(records)
            return
        left = self._produce(records)
        if left:
            self.log.spool(left)

    def run_once(self, wait: float = 0.1) -> None:
        """One step: replay the spool when due, then drain, produce or spool new records."""
        self._settle_replay()
        if self._replaying is None and len(self.producer) == 0 and self.log.stats["spool_pending"]:
            if not self._broker_down or self._probe():
                self._broker_down = False
                self._replay()
        records = self.log.drain(self.batch, wait)
        if records:
            self._ship(records)
        self._settle(0)
        self._settle_replay()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the shipper must outlive any one bad step
                log.exception("decision log: shipper step failed; retrying")
                time.sleep(0.5)
        self._shutdown()

    def _shutdown(self) -> None:
        """Drains what is queued, flushes, and spools whatever the broker did not take."""
        while True:
            records = self.log.drain(self.batch, 0)
            if not records:
                break
            self._ship(records)
        remaining = self.producer.flush(self.flush_timeout)
        if remaining:
            self.producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._settle(0)
        self.producer.flush(0)
        self._settle(0)
        self._settle_replay()

    def start(self) -> None:
        """Starts the shipper thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread after draining, flushing and spooling what remains."""
        self._stop.set()
        self._thread.join(timeout=self.flush_timeout + 30)
