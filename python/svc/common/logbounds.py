"""Log lines of bounded size, whatever a caller sent (docs/architecture.md#logs).

A log line names what a request carried (a tool, a document id, a refusal's text), and a caller
decides how long that is: one 900 KB ``document_id`` made one 900 KB line. ``install_log_bounds``
wraps the process's log-record factory (``logging.setLogRecordFactory``), so every record, from
any logger and to any handler, has each of its fields cut to ``MAX_LOG_FIELD_CHARS`` characters
when it is created: the message template and each ``%`` argument that is text, bytes or an
exception (an exception's text is what a refusal echoes). A cut field ends with
``...(N chars)``, saying how long it was. Numbers and other objects pass unchanged (``%d`` must
still format). ``svc.common.limits.harden`` installs it, so every process serving an app has it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_LOG_FIELD_CHARS", "bound_field", "install_log_bounds"]

#: The most characters one field of a log record keeps.
MAX_LOG_FIELD_CHARS = 2048

_lock = threading.Lock()
_installed = False


def bound_field(value: Any, limit: int = MAX_LOG_FIELD_CHARS) -> Any:
    """``value`` with its text cut to ``limit`` characters, for a log record.

    Args:
        value: a ``%`` argument or message; str, bytes and exceptions are bounded, anything
            else is returned as it is.
        limit: the most characters kept.

    Returns:
        The value, or its cut text (``...(N chars)`` appended) when it was longer.

    """
    if isinstance(value, BaseException):
        text = str(value)
        if len(text) <= limit:
            return value
        return f"{type(value).__name__}: {text[:limit]}...({len(text)} chars)"
    if isinstance(value, bytes | bytearray):
        if len(value) <= limit:
            return value
        return f"{bytes(value[:limit])!r}...({len(value)} bytes)"
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}...({len(value)} chars)"
    return value


def install_log_bounds(limit: int = MAX_LOG_FIELD_CHARS) -> None:
    """Makes every log record of this process bounded (module docs); idempotent.

    Args:
        limit: the most characters of each field (the first call's value holds).

    """
    global _installed
    with _lock:
        if _installed:
            return
        make: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()

        def bounded_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make(*args, **kwargs)
            record.msg = bound_field(record.msg, limit)
            if isinstance(record.args, tuple):
                record.args = tuple(bound_field(a, limit) for a in record.args)
            elif isinstance(record.args, dict):
                record.args = {k: bound_field(v, limit) for k, v in record.args.items()}
            return record

        logging.setLogRecordFactory(bounded_record)
        _installed = True
