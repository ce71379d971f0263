"""Settings of the reasoner (svc-reasoner): ``SVC_REASONER_*`` (docs/reasoner.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions): where
the history is (a DSN: the reasoner reads the rollups with aggregate queries, which the
history's HTTP routes do not serve), the services it calls with a token file each, the cycle,
the model's and the gate's parameters, the lease, and an optional model service.
``ReasonerAuthSettings`` (``SVC_REASONER_AUTH*``, audience ``svc-reasoner``; docs/auth.md)
guards the one route beside the probes, ``POST /v1/cycles`` (run a cycle now).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from svc.common.auth_settings import AuthSettings
from svc.common.settings import ServiceSettings
from svc.reasoner.gate import GateSettings
from svc.reasoner.scoring import Model

__all__ = ["ReasonerAuthSettings", "ReasonerSettings", "read_token"]


class ReasonerSettings(ServiceSettings, component="reasoner"):
    """Settings of svc-reasoner (docs/reasoner.md#settings).

    Read from the environment (``SVC_REASONER_<NAME>``) or given as keyword arguments (tests,
    ``svc reasoner serve`` and ``cycle`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    history_dsn: str | None = None
    """The history store (docs/history.md#engines-and-dsns): ``http(s)://...`` for a ClickHouse
    server, ``chdb:///dir`` only in the process that owns that directory (``svc up`` hands its
    client in instead)."""
    context_url: str = "http://127.0.0.1:8084"
    """The context service: principals (peers), risk scores, investigations."""
    context_token_file: Path | None = None
    """Bearer token for the context service (audience ``svc-context``), read at each call."""
    challenge_url: str = "http://127.0.0.1:8085"
    """The challenge service (gRPC over h2c): ``ListContainments`` and ``Contain``."""
    challenge_token_file: Path | None = None
    """Bearer token for the challenge service (audience ``svc-challenge``), read at each call."""
    policy_url: str = "http://127.0.0.1:8083"
    """The policy service (gRPC over h2c): ``GetEnforcement``, the mode for automated
    containments."""
    policy_token_file: Path | None = None
    """Bearer token for the policy service (audience ``svc-policy``), read at each call."""
    call_timeout_secs: float = Field(default=30.0, gt=0, le=600)
    """Timeout of one call to a service."""

    cycle_secs: float = Field(default=900.0, gt=0, le=86_400)
    """Time between the starts of two cycles (15 minutes); the first runs at start."""
    lease_url: str | None = None
    """Where the one-replica lease is taken: ``postgresql://...`` (a session advisory lock) or
    ``file:///path`` (an exclusive ``flock``); unset: no lease (one process by construction)."""
    lease_key: int = 0x5356435245415330
    """The advisory lock's key (PostgreSQL)."""
    author: str = "svc-reasoner"
    """Who the reasoner's containments and investigations name."""

    window_days: int = Field(default=Model.window_days, ge=8, le=366)
    """Days of history a cycle reads, today included."""
    recent_days: int = Field(default=Model.recent_days, ge=1, le=30)
    """The last days observed; the days before them are the baseline."""
    learning_days: int = Field(default=Model.learning_days, ge=1, le=365)
    """Active baseline days below which a principal is learning (peers only, never contained)."""
    half_life_days: float = Field(default=Model.half_life_days, gt=0, le=30)
    """Age at which a recent day's evidence counts half."""
    investigate_score: int = Field(default=70, ge=1, le=100)
    """A principal scored at least this gets an investigation (one open at a time)."""

    gate_days: int = Field(default=GateSettings.gate_days, ge=1, le=7)
    """The last days whose moving out may contain."""
    moved_out_floor: float = Field(default=GateSettings.moved_out_floor, ge=1)
    """Rows moved out in a day below which nothing is contained."""
    max_containments_per_day: int = Field(default=GateSettings.max_per_day, ge=0, le=10_000)
    """Automated containments (or would-contains in monitor mode) per UTC day at most."""

    model_url: str | None = None
    """An OpenAI-compatible chat-completions API (``http://127.0.0.1:11434/v1``) that writes the
    investigations' summaries from their evidence fields only; unset: a deterministic summary."""
    model_name: str = "gpt-4o-mini"
    """The model asked."""
    model_api_key_file: Path | None = None
    """File holding the model service's API key (read at each call)."""

    def model(self) -> Model:
        """The scoring parameters these settings give (``svc.reasoner.scoring.Model``)."""
        return Model(
            window_days=self.window_days,
            recent_days=self.recent_days,
            learning_days=self.learning_days,
            half_life_days=self.half_life_days,
        )

    def gate(self) -> GateSettings:
        """The gate's parameters these settings give (``svc.reasoner.gate.GateSettings``)."""
        return GateSettings(
            gate_days=self.gate_days,
            moved_out_floor=self.moved_out_floor,
            max_per_day=self.max_containments_per_day,
        )


class ReasonerAuthSettings(AuthSettings, component="reasoner"):
    """Bearer-token settings of ``POST /v1/cycles``: ``SVC_REASONER_AUTH*``, ``svc-reasoner``.

    Callers (docs/reasoner.md#commands): the operator (``svc reasoner cycle --data-dir``).
    With auth off the route is open, which only a loopback bind allows
    (``AuthSettings.check_bind``).
    """

    auth_audience: str = "svc-reasoner"
    """The ``aud`` a token must name."""


def read_token(path: Path | None) -> str | None:
    """The token in `path` (stripped), or None without a path or with an empty file.

    Raises:
        OSError: the file cannot be read.

    """
    if path is None:
        return None
    return path.read_text(encoding="utf-8").strip() or None
