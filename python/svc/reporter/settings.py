"""Settings of the reporter (svc-reporter): ``SVC_REPORTER_*`` (docs/reporter.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions),
deriving from ``ServiceSettings`` (``host``, ``port``). Without ``portal_url`` nothing is sent.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from svc.common.settings import ServiceSettings

__all__ = ["ReporterSettings"]

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


class ReporterSettings(ServiceSettings, component="reporter"):
    """Settings of svc-reporter (docs/reporter.md#settings).

    Read from the environment (``SVC_REPORTER_<NAME>``) or given as keyword arguments.

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    portal_url: str | None = None
    """The vendor's corp portal (``https://portal.example``): heartbeats are POSTed to
    ``<portal_url>/v1/heartbeat``. Unset: the reporter sends nothing."""
    portal_token_file: str | None = None
    """File holding a bearer token for the portal (read for every send); unset: none sent."""
    install_id: str | None = None
    """The install's id (a UUID); unset: read from ``install_id_file``, made there once."""
    install_id_file: str = "svc-install-id"
    """Where the install's random id is kept when ``install_id`` is unset."""
    interval_secs: float = Field(default=60.0, gt=0, le=3600)
    """Time between heartbeats (a minute)."""
    components: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """The components watched, ``{"pdp": "http://svc-pdp:8080", ...}`` (JSON): their
    ``/version``, ``/readyz`` and ``/metrics`` are read for each heartbeat. Names are lowercase
    letters, digits and dashes (at most 32)."""
    backlog: int = Field(default=60, ge=1, le=10_000)
    """Most heartbeats kept while the portal does not take them; the oldest is dropped first."""
    attempts: int = Field(default=3, ge=1, le=20)
    """Tries of one send before the heartbeat waits in the backlog for the next minute."""
    backoff_secs: float = Field(default=1.0, gt=0, le=60)
    """First wait between tries (doubling)."""
    timeout_secs: float = Field(default=10.0, gt=0, le=120)
    """Timeout of one call (a probe read or a send)."""

    @field_validator("components", mode="before")
    @classmethod
    def _components(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = json.loads(v) if v.strip() else {}
        if isinstance(v, dict):
            bad = [k for k in v if not isinstance(k, str) or not _NAME.match(k)]
            if bad:
                raise ValueError(f"component names must match {_NAME.pattern}: {bad}")
        return v
