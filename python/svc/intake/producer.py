"""All-or-nothing batches on ``svc.events.v1``: a small pool of transactional producers.

A batch is one Kafka transaction (a batch is all or nothing,
docs/intake.md#all-or-nothing-transactions):
``begin_transaction``, ``produce`` every record, ``flush``, ``commit_transaction``. The intake
answers 202 only after the commit returned, that is after the broker acknowledged every record
(``acks=all``) and the transaction coordinator committed them. Consumers that read
``read_committed`` (the history loader) see a batch whole or not at all.

Failure handling, and why each step:

* The records are flushed *before* ``commit_transaction``. If the broker does not take them in
  time, the transaction is still open and ``abort_transaction`` is allowed: the queued records
  are purged and the coordinator writes abort markers, so nothing of the batch becomes visible,
  and the intake answers 503. (Had ``commit_transaction`` itself timed out while flushing,
  librdkafka would only allow resuming the commit, never an abort.)
* An abort that cannot reach the broker either is left pending: the producer is set aside and
  the pool's keeper thread finishes the abort once the broker answers (until then the
  coordinator would abort the transaction itself after ``transaction.timeout.ms``).
* After a failure the pool counts the broker as unavailable: batches get 503 at once, without
  waiting, until the keeper sees the broker answer again (a producer recovered, or a metadata
  request succeeded).
* A commit whose answer is lost after the records were delivered (the broker died between the
  last acknowledgement and the coordinator's answer) has an unknown outcome. The intake keeps
  resuming the commit for another ``broker_timeout``; if it stays unknown it answers 503 and
  the keeper resumes it. This is the only case in which a shipper's retry can duplicate a
  batch; cloud records carry ``attributes.cloud_event_id`` so the history can tell.
* A fatal error (the producer was fenced, for example) replaces the producer.

Transactions on one producer are sequential, so the pool holds ``size`` producers, each with
its own ``transactional.id`` (``<prefix>-<n>``), and a batch takes whichever is free.
"""

from __future__ import annotations

import enum
import itertools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from svc.broker import Producer, ProducerLike
from svc.intake.metrics import IntakeMetrics

__all__ = ["BrokerUnavailable", "TransactionalPool", "producer_config"]

log = logging.getLogger("svc.intake.producer")


class _RdkafkaLog:
    """librdkafka's log lines into ``svc.intake.rdkafka``; connection failures at DEBUG.

    While the broker is away every producer logs each reconnect attempt; the pool's own
    "broker unavailable" / "available" lines are what operators need.
    """

    _log = logging.getLogger("svc.intake.rdkafka")

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """Called by librdkafka (through confluent-kafka) for each log line."""
        if args and args[0] in ("FAIL", "CONNECT", "BROKERFAIL"):
            level = logging.DEBUG
        self._log.log(level, fmt, *args)


_POOLS = itertools.count()


class BrokerUnavailable(Exception):
    """The broker could not take a batch; nothing of it is visible (answered with 503)."""


class _State(enum.Enum):
    NEW = "new"  # init_transactions not done yet
    READY = "ready"
    ABORT = "abort"  # an abort is pending
    COMMIT = "commit"  # a commit's outcome is pending
    BROKEN = "broken"  # fatal error: replace the producer


def producer_config(
    bootstrap: str, transactional_id: str, transaction_timeout_ms: int
) -> dict[str, Any]:
    """The librdkafka settings of one intake producer.

    Args:
        bootstrap: bootstrap servers (``host:port`` list).
        transactional_id: this producer's ``transactional.id``.
        transaction_timeout_ms: ``transaction.timeout.ms`` (and the records' delivery timeout).

    """
    return {
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "compression.type": "lz4",
        "transaction.timeout.ms": transaction_timeout_ms,
        "message.timeout.ms": transaction_timeout_ms,
        "reconnect.backoff.max.ms": 1000,
        "client.id": "svc-intake",
    }


class _Slot:
    """One transactional producer and its state."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer: ProducerLike | None = None
        self.state = _State.NEW


class TransactionalPool:
    """Sends batches of records as Kafka transactions (see the module docs).

    Args:
        bootstrap: bootstrap servers (``host:port`` list).
        topic: destination topic (``svc.events.v1``).
        size: producers, that is transactions in flight at once.
        transactional_id_prefix: producer ``n`` uses ``<prefix>-<pool>-<n>``, ``pool`` counting
            the pools made in this process (0 for the first).
        broker_timeout: seconds a batch waits for the broker before ``BrokerUnavailable``.
        transaction_timeout_ms: ``transaction.timeout.ms``.
        extra_config: more librdkafka settings; they win.
        metrics: where transactions and broker state are counted.

    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        size: int = 4,
        transactional_id_prefix: str = "svc-intake",
        broker_timeout: float = 5.0,
        transaction_timeout_ms: int = 60_000,
        extra_config: dict[str, Any] | None = None,
        metrics: IntakeMetrics | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.broker_timeout = broker_timeout
        self.transaction_timeout_ms = transaction_timeout_ms
        self.extra_config = dict(extra_config or {})
        self.metrics = metrics or IntakeMetrics()
        pool = next(_POOLS)
        self._slots = [_Slot(f"{transactional_id_prefix}-{pool}-{n}") for n in range(size)]
        self._free: queue.Queue[_Slot] = queue.Queue()
        self._lock = threading.Lock()
        self._available = False
        self._initialised = False
        self._topic_error: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._became_ready = threading.Event()  # set with ``ready``; ``wait_ready`` waits on it
        self._keeper = threading.Thread(target=self._keep, name="svc-intake-keeper", daemon=True)

    # -- state

    @property
    def ready(self) -> bool:
        """True once a producer initialised transactions and the topic exists."""
        return self._initialised and self._topic_error is None

    def wait_ready(self, timeout: float) -> bool:
        """Waits until ``ready`` or until `timeout` seconds passed (the keeper signals it).

        Returns:
            ``ready`` at return: False after `timeout` (``not_ready_reason`` says why).

        """
        self._became_ready.wait(timeout)
        return self.ready

    @property
    def available(self) -> bool:
        """False after the broker failed a batch, until it answers again."""
        return self._available

    @property
    def not_ready_reason(self) -> str:
        """Why ``ready`` is False (empty when it is True)."""
        if self._topic_error:
            return self._topic_error
        if not self._initialised:
            return f"no transactional producer initialised yet (broker {self.bootstrap})"
        return ""

    def _set_available(self, value: bool) -> None:
        with self._lock:
            changed = self._available != value
            self._available = value
        self.metrics.broker_available.set(1 if value else 0)
        if changed:
            if value:
                log.info("intake: broker %s available", self.bootstrap)
            else:
                log.warning("intake: broker %s unavailable; answering 503", self.bootstrap)
                self._wake.set()

    def _count_ready(self) -> None:
        self.metrics.producers_ready.set(sum(1 for s in self._slots if s.state is _State.READY))

    # -- lifecycle

    def start(self) -> None:
        """Starts the keeper thread, which initialises the producers (broker down: retries)."""
        self._keeper.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stops the keeper and closes every producer (pending aborts get ``timeout``)."""
        self._stop.set()
        self._wake.set()
        self._keeper.join(timeout=timeout + 5)
        for slot in self._slots:
            p = slot.producer
            if p is None:
                continue
            if slot.state is _State.ABORT:
                try:
                    p.abort_transaction(timeout)
                except KafkaException:
                    pass
            p.purge(in_queue=True, in_flight=True, blocking=False)
            p.flush(0)
            slot.producer = None

    # -- the keeper: init, recover, probe

    def _keep(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self._keep_once()
            except Exception:  # the keeper must outlive any one bad step
                log.exception("intake: producer keeper step failed")
                busy = True
            self._wake.wait(0.5 if busy else 5.0)
            self._wake.clear()

    def _keep_once(self) -> bool:
        """One round: init new producers, finish pending aborts/commits, probe the broker.

        Returns:
            True when something is still pending (the keeper comes back soon).

        """
        pending = False
        for slot in self._slots:
            if self._stop.is_set():
                return False
            if slot.state is _State.READY:
                continue
            # Only READY slots are in the free queue; this one is the keeper's.
            if self._recover(slot, timeout=2.0):
                self._free.put(slot)
                self._set_available(True)
            else:
                pending = True
        self._count_ready()
        if not self._available and not pending:
            if self._probe():
                self._set_available(True)
            else:
                pending = True
        return pending or not self._available

    def _recover(self, slot: _Slot, timeout: float) -> bool:
        """Brings one producer back to READY; False when the broker still does not answer."""
        try:
            if slot.state is _State.BROKEN and slot.producer is not None:
                slot.producer.purge(in_queue=True, in_flight=True, blocking=False)
                slot.producer = None
                slot.state = _State.NEW
            if slot.state is _State.NEW:
                if slot.producer is None:
                    conf = producer_config(
                        self.bootstrap, slot.transactional_id, self.transaction_timeout_ms
                    )
                    conf["error_cb"] = _on_error
                    conf["logger"] = _RdkafkaLog()
                    conf.update(self.extra_config)
                    slot.producer = Producer(conf)
                slot.producer.init_transactions(timeout)
                self._check_topic(slot.producer, timeout)
                self._initialised = True
                self._became_ready.set()
                log.info("intake: producer %s ready", slot.transactional_id)
            elif slot.state is _State.ABORT:
                assert slot.producer is not None
                slot.producer.abort_transaction(timeout)
                self.metrics.transactions.labels("aborted").inc()
                log.info("intake: pending abort of %s completed", slot.transactional_id)
            elif slot.state is _State.COMMIT:
                assert slot.producer is not None
                slot.producer.commit_transaction(timeout)
                self.metrics.transactions.labels("committed").inc()
                log.warning(
                    "intake: a commit of %s whose outcome was unknown completed",
                    slot.transactional_id,
                )
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal():
                log.error("intake: producer %s: fatal error %s", slot.transactional_id, err)
                slot.state = _State.BROKEN
            elif slot.state is _State.COMMIT and err.txn_requires_abort():
                slot.state = _State.ABORT
            else:
                log.debug("intake: producer %s not recovered: %s", slot.transactional_id, err)
            return False
        except _TopicMissing as e:
            self._topic_error = str(e)
            self._became_ready.clear()
            log.error("intake: %s", e)
            return False
        slot.state = _State.READY
        return True

    def _check_topic(self, producer: ProducerLike, timeout: float) -> None:
        """Raises ``_TopicMissing`` when the topic does not exist (topics are not auto-created)."""
        md = producer.list_topics(self.topic, timeout=timeout)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None:
            raise _TopicMissing(
                f"topic `{self.topic}` does not exist on {self.bootstrap} "
                f"({t.error if t is not None else 'no metadata'}); create it "
                "(scripts/dev-kafka.sh create-topics)"
            )
        self._topic_error = None

    def _probe(self) -> bool:
        """Whether the broker answers a metadata request now."""
        for slot in self._slots:
            if slot.producer is not None and slot.state is _State.READY:
                try:
                    self._check_topic(slot.producer, 1.0)
                except (KafkaException, _TopicMissing):
                    return False
                return True
        return False

    # -- a batch

    def send(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Produces ``records`` (key, value) as one transaction and waits for its commit.

        Raises:
            BrokerUnavailable: the broker did not take the batch in ``broker_timeout``, or is
                known to be away; nothing of the batch is visible to ``read_committed``
                consumers (except after an unknown commit outcome, see the module docs).

        """
        if not self.ready:
            raise BrokerUnavailable(f"the intake is not ready: {self.not_ready_reason}")
        if not self._available:
            raise BrokerUnavailable(f"the broker {self.bootstrap} is not answering")
        try:
            slot = self._free.get(timeout=self.broker_timeout)
        except queue.Empty:
            raise BrokerUnavailable(f"no producer free within {self.broker_timeout:g} s") from None
        try:
            self._transaction(slot, records)
        finally:
            if slot.state is _State.READY:
                self._free.put(slot)
            else:
                self._count_ready()
                self._wake.set()

    def _transaction(self, slot: _Slot, records: Sequence[tuple[bytes, bytes]]) -> None:
        p = slot.producer
        assert p is not None
        deadline = time.monotonic() + self.broker_timeout
        try:
            p.begin_transaction()
        except KafkaException as e:
            self._failed(slot, e.args[0], "begin")
            raise BrokerUnavailable(f"the broker refused a transaction: {e.args[0]}") from None
        try:
            produce = p.produce
            topic = self.topic
            for key, value in records:
                produce(topic, value, key)
        except (BufferError, KafkaException) as e:
            self._abort(slot, f"the producer refused a record: {e}")
            raise BrokerUnavailable(f"the producer refused a record: {e}") from None
        left = p.flush(max(0.0, deadline - time.monotonic()))
        if left:
            why = (
                f"the broker did not acknowledge {left} of {len(records)} events "
                f"within {self.broker_timeout:g} s"
            )
            self._abort(slot, why)
            raise BrokerUnavailable(why)
        self._commit(slot, deadline)

    def _commit(self, slot: _Slot, deadline: float) -> None:
        p = slot.producer
        assert p is not None
        # Once every record is acknowledged, resuming a slow commit is worth a longer wait:
        # after the commit request went out there is no abort, and answering 503 then could
        # make the shipper's retry a duplicate.
        until = max(deadline, time.monotonic()) + self.broker_timeout
        while True:
            try:
                p.commit_transaction(max(0.1, until - time.monotonic()))
            except KafkaException as e:
                err: KafkaError = e.args[0]
                if err.txn_requires_abort():
                    self._abort(slot, f"the broker refused the commit: {err}")
                    raise BrokerUnavailable(f"the broker refused the commit: {err}") from None
                if err.fatal():
                    self._failed(slot, err, "commit")
                    self.metrics.transactions.labels("unknown").inc()
                    raise BrokerUnavailable(f"the commit failed: {err}") from None
                if time.monotonic() < until:
                    continue
                slot.state = _State.COMMIT
                self.metrics.transactions.labels("unknown").inc()
                self._set_available(False)
                log.error(
                    "intake: commit of %s has no answer from the broker; resuming it in the "
                    "background (the shipper's retry may duplicate this batch)",
                    slot.transactional_id,
                )
                raise BrokerUnavailable(f"the commit has no answer yet: {err}") from None
            self.metrics.transactions.labels("committed").inc()
            return

    def _abort(self, slot: _Slot, why: str) -> None:
        """Aborts the open transaction; a pending abort is left to the keeper."""
        p = slot.producer
        assert p is not None
        log.warning("intake: aborting a batch: %s", why)
        try:
            p.abort_transaction(min(1.0, self.broker_timeout))
        except KafkaException as e:
            err: KafkaError = e.args[0]
            slot.state = _State.BROKEN if err.fatal() else _State.ABORT
        else:
            self.metrics.transactions.labels("aborted").inc()
        # After the slot's state is settled, so the keeper's next round sees it.
        self._set_available(False)

    def _failed(self, slot: _Slot, err: KafkaError, step: str) -> None:
        """Classifies an error outside produce/flush/commit (``begin``, fatal commit)."""
        log.error("intake: %s of %s failed: %s", step, slot.transactional_id, err)
        if err.fatal():
            slot.state = _State.BROKEN
        elif err.txn_requires_abort():
            slot.state = _State.ABORT
        else:
            slot.state = _State.BROKEN
        self._set_available(False)


class _TopicMissing(Exception):
    """The destination topic does not exist."""


def _on_error(err: KafkaError) -> None:
    """The producers' error callback: connection trouble is expected while the broker is away."""
    if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
        log.debug("intake producer: %s", err)
    else:
        log.warning("intake producer: %s", err)
