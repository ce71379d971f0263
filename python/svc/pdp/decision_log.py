"""The decision log's shipper: records from the decision point's spool to Kafka.

See docs/architecture.md#how-records-flow and docs/history.md#durability-of-the-decision-log.

How a record travels (docs/history.md, "Durability of the decision log"):

* The server (Rust) pushes one record per decision into a ``svc._pdp_core.DecisionLog``. Its
  group-commit writer appends what arrived to the spool on disk, a write-ahead log, every
  ``log_commit_ms``; a ``kill -9`` loses at most the records of the last window, and with
  ``log_durability=durable`` none, since an answer then waits for its record's write.
* A ``Shipper`` thread reads written records in spool order, in batches (one GIL acquisition
  per batch), and produces them to ``svc.decisions.v1`` with ``confluent-kafka``: idempotent
  producer, ``acks=all``, key = the principal (``Type::id``), so one principal's records stay
  in order on one partition.
* A batch is acknowledged to the log (``DecisionLog.ack``) once the broker acknowledged every
  record of it; the log's cursor moves over acknowledged batches in order. After a crash the
  next run sends from the saved cursor: at least once, and the history loader drops duplicates
  by ``qid``.
* The producer never gives up on a record (``message.timeout.ms=0``): while the broker is
  away, librdkafka holds up to ``buffer_messages`` records and delivers them when it returns,
  and the shipper reads no further, so the rest waits on disk. Deliveries that fail anyway
  (purged at stop, a fatal producer error) make the shipper rewind the log to its cursor once
  the producer holds nothing, and send again.
* On stop, what is in memory is written, and the shipper sends until the broker has
  everything or ``flush_timeout`` passes; what the broker has not acknowledged stays in the
  spool for the next run.
* Records are dropped only when the unacknowledged spool would pass ``spool_max_bytes``; they
  are counted in ``svc_pdp_decision_log_records_total{state="dropped"}``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message

from svc._pdp_core import DecisionLog, LogBatch
from svc.broker import Producer
from svc.common.topics import DECISIONS_TOPIC

__all__ = ["Shipper", "producer_config"]


log = logging.getLogger("svc.pdp.decision_log")


def producer_config(bootstrap: str, buffer_messages: int = 10_000) -> dict[str, Any]:
    """The producer settings of the decision log (see the module docs for why each).

    Args:
        bootstrap: bootstrap servers (``host:port`` list).
        buffer_messages: records librdkafka may hold unacknowledged (the shipper reads no
            further past it).

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


class _Batch:
    """Delivery state of one batch read from the log."""

    def __init__(self, shipper: Shipper, handle: LogBatch, size: int) -> None:
        self.shipper = shipper
        self.handle = handle
        self.size = size
        self.acked = 0
        self.failed = 0

    def done(self, err: KafkaError | None, _msg: Message) -> None:
        """Delivery callback of one record; acknowledges the batch to the log when complete."""
        if err is not None:
            self.failed += 1
            return
        self.acked += 1
        self.shipper.delivered()
        if self.acked == self.size:
            self.shipper.log.ack(self.handle)

    @property
    def settled(self) -> bool:
        """Whether every record of the batch is delivered or failed."""
        return self.acked + self.failed == self.size


class Shipper:
    """Moves records from a ``DecisionLog``'s spool to Kafka in a daemon thread.

    Args:
        decision_log: the log the server pushes into.
        bootstrap: Kafka bootstrap servers (``host:port`` list; see ``bootstrap_servers``).
        topic: destination topic (``svc.decisions.v1``).
        batch: records read from the log per step.
        buffer_messages: records the producer may hold unacknowledged; past it the shipper
            reads no further and records wait in the spool.
        flush_timeout: seconds ``stop()`` keeps sending before leaving the rest in the spool.
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
        self.batch = max(1, batch)
        self.buffer_messages = max(1, buffer_messages)
        self.flush_timeout = flush_timeout
        conf = producer_config(bootstrap, buffer_messages)
        conf["error_cb"] = self._on_error
        conf.update(extra_config or {})
        self.producer = Producer(conf)
        self._in_flight: list[_Batch] = []
        self._left: tuple[_Batch, list[tuple[bytes, bytes]]] | None = None
        self._broker_down = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="svc-decision-log", daemon=True)

    # -- librdkafka callbacks (run inside poll/flush on the shipper thread)

    def _on_error(self, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError._ALL_BROKERS_DOWN:
            if not self._broker_down:
                log.warning("decision log: broker unreachable; records wait in the spool")
            self._broker_down = True
        elif code == KafkaError._TRANSPORT:
            # Repeats every reconnect attempt while the broker is away; the state change above
            # is what operators need.
            log.debug("decision log: %s", err)
        else:
            log.warning("decision log: producer error: %s", err)

    def delivered(self) -> None:
        """Notes one acknowledged record (logs the broker's return after an outage)."""
        if self._broker_down:
            log.info("decision log: broker reachable again")
            self._broker_down = False

    # -- the loop

    def _produce(self, state: _Batch, records: list[tuple[bytes, bytes]]) -> None:
        """Produces records in order; keeps those the producer refuses for the next step."""
        for i, (key, value) in enumerate(records):
            try:
                self.producer.produce(self.topic, value=value, key=key, on_delivery=state.done)
            except BufferError:
                self._left = (state, records[i:])
                return
        self._left = None

    def run_once(self, wait: float = 0.1) -> None:
        """One step: serve callbacks, rewind after failures, then read and produce a batch.

        Waits up to `wait` seconds: for written records, or for the producer to make room.
        """
        self.producer.poll(0)
        if any(b.failed for b in self._in_flight):
            if len(self.producer) == 0:
                failed = sum(b.failed for b in self._in_flight)
                log.warning("decision log: %d records failed delivery; sending again", failed)
                self.log.rewind()
                self._in_flight = []
                self._left = None
            else:
                self.producer.poll(wait)
            return
        self._in_flight = [b for b in self._in_flight if not b.settled]
        if self._left is not None:
            self._produce(*self._left)
            if self._left is not None:
                self.producer.poll(wait)
            return
        room = self.buffer_messages - len(self.producer)
        if room <= 0:
            self.producer.poll(wait)
            return
        records, handle = self.log.read(min(self.batch, room), wait)
        if records:
            state = _Batch(self, handle, len(records))
            self._in_flight.append(state)
            self._produce(state, records)
            self.producer.poll(0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the shipper must outlive any one bad step
                log.exception("decision log: shipper step failed; retrying")
                time.sleep(0.5)
        self._shutdown()

    def _caught_up(self) -> bool:
        """Whether the broker has acknowledged everything written so far."""
        s = self.log.stats
        return s["queued_now"] == 0 and s["spool_pending"] == 0

    def _shutdown(self) -> None:
        """Writes what is in memory and sends until caught up or `flush_timeout` passes."""
        self.log.flush()
        deadline = time.monotonic() + self.flush_timeout
        while time.monotonic() < deadline and not self._caught_up():
            try:
                self.run_once(wait=0.05)
            except Exception:
                log.exception("decision log: shipper step failed at stop")
                break
        if self.producer.flush(max(0.0, deadline - time.monotonic())):
            # What is left stays in the spool (unacknowledged) for the next run.
            self.producer.purge(in_queue=True, in_flight=True, blocking=True)
            self.producer.flush(0)
        self.producer.poll(0)

    def start(self) -> None:
        """Starts the shipper thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread after writing, sending and acknowledging what it can."""
        self._stop.set()
        self._thread.join(timeout=self.flush_timeout + 30)
