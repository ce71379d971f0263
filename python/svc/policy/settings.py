"""Settings of the policy service (svc-policy): ``SVC_POLICY_*`` (docs/policy.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions), deriving
from ``ServiceSettings`` (``host``, ``port``), with defaults that run locally: a SQLite file in the
working directory, a signing key made on first start under the data directory, port 8080 on
127.0.0.1. Who may call is ``svc.common.auth.PolicyAuthSettings`` (``SVC_POLICY_AUTH*``,
docs/auth.md); without it the service binds loopback addresses only (``svc.policy.app.serve``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from svc.common.settings import ServiceSettings
from svc.policy.signing import load_public_key

__all__ = ["PolicySettings"]


class PolicySettings(ServiceSettings, component="policy"):
    """Settings of svc-policy (docs/policy.md#settings).

    Read from the environment (``SVC_POLICY_<NAME>``) or given as keyword arguments (tests,
    ``svc policy`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed, or a break-glass key is not an
            Ed25519 public key.

    """

    database_url: str = "sqlite:///svc-policy.db"
    """SQLAlchemy URL: ``postgresql+psycopg://...`` in production, a SQLite file in ``svc up``."""
    data_dir: Path = Path(".")
    """Where ``signing_key_file`` is made when it is not set."""
    signing_key_file: Path | None = None
    """PKCS #8 PEM Ed25519 private key that signs published bundles (``svc policy keygen``).
    Unset: ``<data_dir>/policy-signing.key``, made on first start when missing."""
    break_glass_keys: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Admins' break-glass public keys: a JSON object of name to key (PEM ``PUBLIC KEY`` or the
    base64 of the raw 32 bytes)."""
    break_glass_window_secs: int = Field(default=300, ge=10, le=3600)
    """How far a break-glass request's ``issued_at`` may lie from the service's clock."""
    default_mode: str = Field(default="enforce", pattern="^(enforce|monitor)$")
    """The install's mode before any recorded change."""
    default_containment_mode: str = Field(default="monitor", pattern="^(enforce|monitor)$")
    """The mode for automated containments before any recorded change: ``monitor``, so a new
    install records the reasoner's would-contains and locks nobody out until an admin switches
    it to ``enforce`` (docs/architecture.md#monitor-and-enforce, docs/reasoner.md)."""
    heartbeat_secs: float = Field(default=5.0, gt=0, le=300)
    """Time between ``WatchActive`` heartbeats while nothing changes."""
    watch_poll_secs: float = Field(default=1.0, gt=0, le=60)
    """How often a watch re-reads the active version and modes from the database, so changes
    made by another replica of the service reach its watchers too."""
    history_dsn: str | None = None
    """The history store of dry runs (``chdb:///dir`` or ``http(s)://host:port/db``,
    docs/history.md#engines-and-dsns); unset: ``DryRun`` answers UNAVAILABLE."""
    context_url: str | None = None
    """The context service dry runs read the directory from (``GET /v1/principals``, resources
    by id; docs/policy.md#dry-runs); unset: dry runs decide with the bundle's own entities."""
    context_token_file: Path | None = None
    """Bearer token for the context service (audience ``svc-context``, the ``policy`` role),
    read at each call."""
    dry_run_max_resources: int = Field(default=20_000, ge=0, le=1_000_000)
    """Most distinct resources a dry run reads from the context service (in batches of 500);
    the checks of the rest are decided without their records, and the answer says so."""
    max_bundle_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest total size of a draft's files."""

    @field_validator("break_glass_keys", mode="before")
    @classmethod
    def _parse_keys(cls, v: Any) -> Any:
        """Accepts a JSON object as text (environment) or a mapping."""
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v

    @field_validator("break_glass_keys")
    @classmethod
    def _check_keys(cls, v: dict[str, str]) -> dict[str, str]:
        """Every key parses as an Ed25519 public key."""
        for name, key in v.items():
            try:
                load_public_key(key)
            except ValueError as e:
                raise ValueError(f"break-glass key of `{name}`: {e}") from None
        return v

    @property
    def signing_key_path(self) -> Path:
        """``signing_key_file``, else ``<data_dir>/policy-signing.key``."""
        return self.signing_key_file or self.data_dir / "policy-signing.key"
