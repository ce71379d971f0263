"""The event intake (svc-intake, docs/intake.md): events from apps and cloud audit logs to Kafka.

``create_app(settings)`` builds the FastAPI app; ``svc intake`` serves it with uvicorn on port
8080. A batch is validated whole (every bad event named, nothing produced), normalized
(docs/intake.md#the-record-on-svceventsv1) and written to ``svc.events.v1`` as one Kafka
transaction; the answer is 202
only after the commit. docs/intake.md is the reference.

Modules: ``models`` (the event, validation, the record, problem details), ``cloudtrail``
(the cloud audit log mapping), ``producer`` (the transactional producers), ``service`` (the two
ingest operations), ``app`` (HTTP), ``settings`` (``SVC_INTAKE_*``), ``metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from svc.intake.settings import IntakeSettings

if TYPE_CHECKING:
    from svc.intake.app import create_app, serve

__all__ = ["IntakeSettings", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    """``create_app`` and ``serve``, loaded on first use (PEP 562).

    So the command line can read ``IntakeSettings`` without loading the web app's modules.
    """
    if name in ("create_app", "serve"):
        from svc.intake import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
