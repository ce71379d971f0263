"""Settings of the event intake (svc-intake): ``SVC_INTAKE_*`` and ``SVC_KAFKA_URL``.

One settings class for the component (docs/architecture.md#code-layout-and-conventions): defaults
that run locally against ``scripts/dev-kafka.sh``, and a refusal to start with a placeholder or
missing intake token outside dev mode. docs/intake.md lists every setting.
"""

from __future__ import annotations

import fnmatch
import os
import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from svc.common.settings import ServiceSettings, kafka_url_field, list_setting
from svc.common.topics import EVENTS_TOPIC, bootstrap_servers

__all__ = ["EVENTS_TOPIC", "PLACEHOLDER_TOKENS", "IntakeSettings"]


#: Tokens that are refused outside dev mode (examples, defaults, obvious stand-ins).
PLACEHOLDER_TOKENS = frozenset(
    {"", "changeme", "change-me", "changethis", "secret", "token", "dev-intake-token", "test"}
)

#: The token dev mode uses when none is configured.
DEV_TOKEN = "dev-intake-token"

#: Shortest token accepted outside dev mode.
MIN_TOKEN_CHARS = 16


class IntakeSettings(ServiceSettings, component="intake"):
    """Settings of svc-intake (docs/intake.md#running-it).

    Read from the environment (``SVC_INTAKE_<NAME>``; the broker from ``SVC_KAFKA_URL``) or
    given as keyword arguments (tests, ``svc intake`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed, or outside dev mode the intake token
            is missing, a placeholder, or shorter than 16 characters.

    """

    kafka_url: str = kafka_url_field("kafka://127.0.0.1:29092")
    """The one broker setting (``kafka://host:port[,host:port]``); default: scripts/dev-kafka.sh."""
    topic: str = EVENTS_TOPIC
    """Destination topic (``svc.events.v1``, docs/architecture.md#versioning)."""
    token: SecretStr | None = None
    """The intake token shippers send as ``Authorization: Bearer``."""
    token_file: Path | None = None
    """A file holding the intake token (a mounted secret); read once at start, trimmed."""
    dev: bool = False
    """Dev mode: accept the placeholder token ``dev-intake-token`` when none is set."""
    human_roles: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Chart setting ``intake.humanRoles``: role names, role ARNs or ``*`` patterns whose
    sessions are people (docs/intake.md#the-caller-by-useridentitytype). JSON list or
    comma-separated."""
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """Largest request body, both as sent and after gzip decompression (413 above)."""
    max_json_depth: int = Field(default=64, ge=8, le=128)
    """Deepest nesting of arrays and objects a body may have (400 ``json-too-deep`` above);
    a body of events nests at most 7 levels, a CloudTrail file about 10. At most 128, below
    the 200 levels at which the JSON decoder itself stops (docs/intake.md, Limits)."""
    producers: int = Field(default=4, ge=1, le=16)
    """Transactional producers (one transaction in flight each); see docs/intake.md."""
    broker_timeout_secs: float = Field(default=5.0, gt=0)
    """How long a batch waits for the broker before the intake answers 503."""
    retry_after_secs: int = Field(default=5, ge=1)
    """``Retry-After`` of a 503."""
    transaction_timeout_ms: int = Field(default=60_000, ge=1_000)
    """Kafka ``transaction.timeout.ms``: the coordinator aborts an abandoned transaction then."""
    transactional_id: str | None = None
    """Prefix of the producers' ``transactional.id``; default ``svc-intake-<host>-<pid>``."""
    max_clock_skew_secs: float = Field(default=300.0, ge=0)
    """How far an event's ``at`` may lie ahead of server time (docs/intake.md#limits)."""
    kafka_config: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka settings (security, for example); they win over the intake's own."""

    @field_validator("human_roles", mode="before")
    @classmethod
    def _split_roles(cls, v: Any) -> Any:
        """Accepts a JSON list or a comma-separated string."""
        return list_setting(v)

    @model_validator(mode="after")
    def _check_token(self) -> IntakeSettings:
        """Reads ``token_file`` and refuses a missing or placeholder token outside dev mode."""
        if self.token_file is not None:
            try:
                text = self.token_file.read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ValueError(f"cannot read `token_file` {self.token_file}: {e.strerror}") from e
            self.token = SecretStr(text)
        value = self.token.get_secret_value() if self.token is not None else ""
        if self.dev:
            if not value:
                self.token = SecretStr(DEV_TOKEN)
            return self
        if not value:
            raise ValueError(
                "no intake token: set SVC_INTAKE_TOKEN or SVC_INTAKE_TOKEN_FILE "
                "(or SVC_INTAKE_DEV=true for the placeholder token)"
            )
        if value.lower() in PLACEHOLDER_TOKENS or len(value) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"the intake token is a placeholder or shorter than {MIN_TOKEN_CHARS} characters; "
                "refused outside dev mode (SVC_INTAKE_DEV=true)"
            )
        return self

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers for librdkafka (``host:port`` list) from ``kafka_url``."""
        return bootstrap_servers(self.kafka_url)

    @property
    def token_bytes(self) -> bytes:
        """The intake token as UTF-8 bytes (for a constant-time comparison)."""
        return (self.token.get_secret_value() if self.token is not None else "").encode()

    def transactional_id_prefix(self) -> str:
        """``transactional_id``, else ``svc-intake-<hostname>-<pid>``.

        Stable across restarts of one container (same pod name, same PID 1), so a restarted
        intake fences its previous incarnation and aborts the transaction it left open.
        """
        if self.transactional_id:
            return self.transactional_id
        return f"svc-intake-{socket.gethostname()}-{os.getpid()}"

    def is_human_role(self, role_name: str, role_arn: str) -> bool:
        """Whether sessions of this role are people by ``intake.humanRoles`` (docs/intake.md).

        Args:
            role_name: the role's name (last segment of its ARN).
            role_arn: the role's ARN (``arn:aws:iam::ACCOUNT:role/PATH/NAME``).

        Returns:
            True when a listed name, ARN or ``fnmatch`` pattern matches either.

        """
        for pattern in self.human_roles:
            if fnmatch.fnmatchcase(role_name, pattern) or fnmatch.fnmatchcase(role_arn, pattern):
                return True
        return False
