"""Settings of the connectors (svc-connectors): ``SVC_CONNECTORS_*`` (docs/connectors.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions),
deriving from ``ServiceSettings`` (``host``, ``port``). A connector runs for each source
configured: Google Drive when ``drive_url`` is set, Jira when ``jira_url`` is set. Secrets are
read from files (``*_file``), never from the environment's plain values, and never logged.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from svc.common.settings import ServiceSettings

__all__ = ["ConnectorsSettings"]


def _json_map(value: Any) -> Any:
    if isinstance(value, str):
        import json

        s = value.strip()
        return json.loads(s) if s else {}
    return value


class ConnectorsSettings(ServiceSettings, component="connectors"):
    """Settings of svc-connectors (docs/connectors.md#settings).

    Read from the environment (``SVC_CONNECTORS_<NAME>``) or given as keyword arguments (tests,
    ``svc connectors serve`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    context_url: str = "http://127.0.0.1:8084"
    """The context service (``http://host:port``) whose batch routes the connectors write to
    (``/v1/resources``, ``/v1/work-items``; docs/context.md)."""
    context_token_file: str | None = None
    """File holding the bearer token sent to the context service (audience ``svc-context``;
    read again for every request, so a renewed token is picked up)."""
    state_path: str = "svc-connectors-state.db"
    """SQLite file holding each connector's cursor and the ids it wrote (docs/connectors.md,
    "State"); one connector replica uses it."""
    poll_secs: float = Field(default=10.0, gt=0, le=3600)
    """Time between two polls of a source once it is caught up."""
    batch_items: int = Field(default=500, ge=1, le=1000)
    """Most items of one batch write to the context service (its ``MAX_BATCH_ITEMS`` is 1,000
    by default)."""
    directory_refresh_secs: float = Field(default=300.0, gt=0, le=86_400)
    """How long the directory (people by email, groups) is used before it is read again; an
    email no person matches reads it again at most this often."""
    email_domain: str | None = None
    """Domain of the people whose SCIM record carries no email: they match
    ``<userName>@<domain>`` (the demo company's people have no emails)."""
    retry_attempts: int = Field(default=6, ge=1, le=50)
    """Tries of one call to a source or to the context service before the poll fails (and is
    tried again at the next poll)."""
    retry_backoff_secs: float = Field(default=0.5, gt=0, le=60)
    """First wait between tries without ``Retry-After``; each next doubles (jittered)."""
    retry_max_wait_secs: float = Field(default=60.0, gt=0, le=3600)
    """Longest wait between tries, ``Retry-After`` included (a longer one fails the poll)."""
    timeout_secs: float = Field(default=30.0, gt=0, le=600)
    """Timeout of one HTTP call."""

    # -- Google Drive -------------------------------------------------------------------

    drive_url: str | None = None
    """Google Drive API's base URL (``https://www.googleapis.com``); unset: no Drive
    connector."""
    drive_token_file: str | None = None
    """File holding an OAuth 2.0 access token for Drive (read for every call)."""
    drive_service_account_file: str | None = None
    """A Google service-account key (JSON) whose credentials google-auth turns into access
    tokens (scope ``drive.readonly``); wins over ``drive_token_file``."""
    drive_subject: str | None = None
    """With a service account: the user it acts as (domain-wide delegation)."""
    drive_id_prefix: str = "gdrive:"
    """Prefix of a file's resource id: ``Document::"gdrive:<fileId>"``."""
    drive_resource_type: str = "Document"
    """Cedar entity type of a file."""
    drive_folder_type: str = "Folder"
    """Cedar entity type of a folder (a file's parents)."""
    drive_sensitivity_field: str | None = None
    """``<labelId>.<fieldId>`` of the Drive label field whose first value becomes the file's
    ``sensitivity``."""
    drive_default_sensitivity: str = "internal"
    """``sensitivity`` of a file without that label field."""
    drive_tags_field: str | None = None
    """``<labelId>.<fieldId>`` of the label field whose values become the file's ``tags``."""
    drive_page_size: int = Field(default=1000, ge=1, le=1000)
    """``pageSize`` of ``files.list`` and ``changes.list`` (Drive allows 1 to 1,000)."""

    # -- Jira -----------------------------------------------------------------------------

    jira_url: str | None = None
    """Jira Cloud's site (``https://example.atlassian.net``); unset: no Jira connector."""
    jira_email: str | None = None
    """The account whose API token ``jira_api_token_file`` holds (HTTP Basic)."""
    jira_api_token_file: str | None = None
    """File holding that account's API token."""
    jira_token_file: str | None = None
    """File holding an OAuth 2.0 access token (Bearer) instead of the API token."""
    jira_jql: str = ""
    """JQL restricting the issues synced (``project in (OPS, DOC)``); empty: every issue the
    account sees."""
    jira_overlap_secs: float = Field(default=120.0, ge=60, le=86_400)
    """How far before the last ``updated`` seen each poll searches again: JQL dates have
    minute precision, and an issue's ``updated`` may become searchable late."""
    jira_reconcile_secs: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    """Time between two reconciliations, which list every issue id to find deleted issues."""
    jira_page_size: int = Field(default=100, ge=1, le=5000)
    """``maxResults`` of one search page."""
    jira_link_fields: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Issue fields naming resources, as ``{"customfield_10100": "Customer"}`` (JSON): each
    comma-separated value becomes a link to ``<Type>::"<value>"``."""
    jira_issue_link_type: str = "Ticket"
    """Cedar entity type a linked issue becomes a link to (``Ticket::"<KEY>"``)."""

    @field_validator("jira_link_fields", mode="before")
    @classmethod
    def _link_fields(cls, v: Any) -> Any:
        return _json_map(v)

    @field_validator("drive_sensitivity_field", "drive_tags_field")
    @classmethod
    def _label_field(cls, v: str | None) -> str | None:
        if v is not None and (v.count(".") != 1 or not all(v.split("."))):
            raise ValueError(f"`{v}`: expected <labelId>.<fieldId>")
        return v
