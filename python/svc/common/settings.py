"""Pieces every component's settings class (pydantic-settings) shares."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["list_setting"]


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
