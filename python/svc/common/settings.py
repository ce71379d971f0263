"""The base class of every component's settings, and the helpers of settings classes.

Every svc setting is read by a pydantic-settings class (docs/architecture.md#code-layout-and-
conventions) deriving from ``ComponentSettings``, which holds what they all share:

* the environment prefix, given once as a class keyword: ``class IntakeSettings(
  ServiceSettings, component="intake")`` reads ``SVC_INTAKE_<NAME>`` and names itself
  ``svc-intake`` in messages (``component`` and ``env_name``);
* unknown keyword arguments are refused (``extra="forbid"``), and each field's docstring is its
  description (the command line's help, ``svc.common.cli``);
* the one broker setting: a field made by ``kafka_url_field`` reads ``SVC_KAFKA_URL`` whatever
  the component, and is checked by ``svc.common.topics.bootstrap_servers``.

``ServiceSettings`` adds what a component that listens shares: ``host`` (``127.0.0.1``) and
``port`` (8080, docs/architecture.md#limits). Keyword arguments win over the environment, which
wins over the defaults (pydantic-settings' order), so a command line passes only the options
it was given.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from svc.common.topics import bootstrap_servers

__all__ = [
    "KAFKA_URL_ENV",
    "ComponentSettings",
    "ServiceSettings",
    "kafka_url_field",
    "list_setting",
]

#: The environment variable of the one broker setting every component reads.
KAFKA_URL_ENV = "SVC_KAFKA_URL"


def kafka_url_field(default: Any, description: str | None = None) -> Any:
    """The ``kafka_url`` field of a settings class: read from ``SVC_KAFKA_URL``.

    Args:
        default: the URL when none is set (None: no broker, where the component allows it;
            ``...``: required).
        description: the field's description (default: its docstring).

    Returns:
        A pydantic ``Field`` whose environment variable is ``SVC_KAFKA_URL`` (not the
        component's prefix) and which still takes ``kafka_url=`` as a keyword argument.
        ``ComponentSettings`` checks the value with ``bootstrap_servers``.

    """
    return Field(
        default=default,
        validation_alias=AliasChoices(KAFKA_URL_ENV, "kafka_url"),
        description=description,
    )


class ComponentSettings(BaseSettings):
    """The base of every settings class (module docs).

    Subclass with ``component="<name>"`` to read ``SVC_<NAME>_<FIELD>`` from the environment;
    a subclass without it keeps its parent's prefix. Keyword arguments win over the
    environment, the environment over the defaults.

    Raises:
        pydantic.ValidationError: a setting is malformed or unknown, or ``kafka_url`` (when the
            class has one) is not a broker URL.

    """

    model_config = SettingsConfigDict(extra="forbid", use_attribute_docstrings=True)

    #: The component's name in messages (``svc-pdp``); set by the ``component`` keyword.
    component: ClassVar[str] = "svc"

    def __init_subclass__(cls, component: str | None = None, **kwargs: Any) -> None:
        """Sets ``component`` and the environment prefix from the class keyword.

        Args:
            component: the component's short name (``pdp``, ``intake``, ``history``); the
                environment prefix becomes ``SVC_<COMPONENT>_``. None keeps the parent's.
            kwargs: passed on.

        """
        super().__init_subclass__(**kwargs)
        if component is not None:
            cls.component = f"svc-{component}"
            cls.model_config = {
                **cls.model_config,
                "env_prefix": f"SVC_{component.upper().replace('-', '_')}_",
            }

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of a setting.

        Args:
            field: a field's name (``auth_callers``).

        Returns:
            ``SVC_<COMPONENT>_<FIELD>`` (``SVC_PDP_AUTH_CALLERS``), or the first name of the
            field's alias choices when it has its own (``SVC_KAFKA_URL``).

        """
        info = cls.model_fields.get(field)
        alias = info.validation_alias if info is not None else None
        if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
            return alias.choices[0].upper()
        if isinstance(alias, str):
            return alias.upper()
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @field_validator("kafka_url", check_fields=False)
    @classmethod
    def _check_kafka_url(cls, v: str | None) -> str | None:
        """The broker URL parses (``svc.common.topics.bootstrap_servers``)."""
        if v is not None:
            bootstrap_servers(v)
        return v


class ServiceSettings(ComponentSettings):
    """What every component that listens shares: the address and port it binds."""

    host: str = "127.0.0.1"
    """Address to bind (``0.0.0.0`` in a container)."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port (8080, docs/architecture.md#limits; 0 picks a free one)."""


def list_setting(value: Any) -> Any:
    """A list-valued setting as an environment variable or a CLI option may give it.

    For a ``field_validator(..., mode="before")`` on a ``list[str]`` field annotated with
    ``NoDecode`` (pydantic-settings then leaves the raw text to the validator).

    Args:
        value: a JSON list (``'["a", "b"]'``), a comma-separated string (``"a, b"``; blank
            items dropped), or an already-parsed value.

    Returns:
        The list for a string; any other value unchanged (the field's type checks it).

    Raises:
        ValueError: a string starting with ``[`` is not valid JSON (pydantic reports it as a
            validation error naming the setting).

    """
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            return json.loads(s)
        return [p.strip() for p in s.split(",") if p.strip()]
    return value
