"""The refusal every gRPC service layer raises, and the change subscribers each one keeps.

A service layer (docs/architecture.md#code-layout-and-conventions) knows nothing of its
transport: it raises ``ServiceError`` with a gRPC status name and the bad fields
(``Violation``), which ``svc.common.connect.status_error`` turns into a gRPC status with a
``google.rpc.BadRequest`` (https://grpc.io/docs/guides/error/, the richer error model).
``Subscribers`` is the list of callbacks a service calls after each change it commits, which
its watch streams wait on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Code", "ServiceError", "Subscribers", "Violation"]

log = logging.getLogger("svc.common")

#: The gRPC status codes a service layer answers with (https://grpc.io/docs/guides/status-codes/).
Code = Literal[
    "invalid_argument", "not_found", "failed_precondition", "permission_denied", "unavailable"
]


@dataclass(frozen=True)
class Violation:
    """One problem of a refused request.

    ``field`` is the request field (or ``file:line:column`` of a bundle problem);
    ``description`` says what is wrong with it.
    """

    field: str
    description: str


@dataclass(eq=False)
class ServiceError(Exception):
    """A refused operation.

    ``code`` is the gRPC status the transport answers; ``violations`` names every bad field (a
    ``google.rpc.BadRequest`` on the wire); ``message`` is the status message.
    """

    code: Code
    message: str
    violations: list[Violation] = field(default_factory=list)

    def __str__(self) -> str:
        """``<code>: <message>``."""
        return f"{self.code}: {self.message}"


class Subscribers:
    """Callbacks called after every change a service commits (its watch streams wake on them).

    Thread-safe: ``subscribe`` and ``notify`` may run in any thread; a callback runs in the
    notifying thread, and one that raises is logged and does not fail the change.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Adds ``callback``; returns the function that removes it (idempotent)."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def notify(self) -> None:
        """Calls every callback once, in the order they subscribed."""
        with self._lock:
            callbacks = list(self._callbacks)
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a watcher's failure must not fail the change
                log.exception("a change subscriber failed")
