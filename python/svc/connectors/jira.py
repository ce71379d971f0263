"""The Jira connector: every issue a work item ``jira:<KEY>`` (docs/connectors.md#jira).

Jira Cloud REST v3 (https://developer.atlassian.com/cloud/jira/platform/rest/v3/):

* **Changed issues.** ``GET /rest/api/3/search/jql`` with ``(<jira_jql>) AND updated >=
  "<cursor - overlap>" ORDER BY updated ASC``, page by page (``nextPageToken``), where the cursor
  is the last ``updated`` written. JQL dates have minute precision and an update may become
  searchable a little late, so each poll searches ``jira_overlap_secs`` back; an issue whose
  id and ``updated`` were already written is skipped (no call, no write). After each page's
  work items are accepted, the cursor moves to the page's last ``updated``.
* **Links** of each changed issue: its remote links (``/rest/api/3/issue/{key}/remotelink``;
  a Google Drive or Docs URL becomes a link to the file's resource), its issue links
  (``<jira_issue_link_type>::"<KEY>"``), and the values of ``jira_link_fields``.
* **Deletions.** Jira announces none, so every ``jira_reconcile_secs`` the ids of every issue
  the JQL selects are listed, and the work items of the ones gone are deleted.

Status: ``closed`` when the status category is ``done``, else ``open``; ``attrs.state`` keeps
``open``, ``in_progress`` (category ``indeterminate``) or ``closed``. A closed or deleted issue
assigns nothing from the next decision on (docs/architecture.md#agent-tokens).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from svc.connectors.client import Caller, ContextWriter, Directory, Metrics
from svc.connectors.settings import ConnectorsSettings
from svc.connectors.state import State

__all__ = [
    "DriveLink",
    "JiraConnector",
    "format_jira_time",
    "issue_work_item",
    "parse_jira_time",
]

log = logging.getLogger("svc.connectors.jira")

Json = dict[str, Any]

#: Google Drive and Docs URLs naming a file or folder, and where their id is.
_DRIVE_URL = re.compile(
    r"^https://(?:drive|docs)\.google\.com/(?:"
    r"(?:file|document|spreadsheets|presentation|forms|drawings)/d/(?P<file>[A-Za-z0-9_-]+)"
    r"|drive/(?:u/\d+/)?folders/(?P<folder>[A-Za-z0-9_-]+)"
    r"|open\?id=(?P<open>[A-Za-z0-9_-]+))"
)
_STATES = {"new": "open", "indeterminate": "in_progress", "done": "closed"}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_jira_time(text: str) -> datetime:
    """Jira's ``updated`` (``2026-11-28T08:00:00.123+0000``) as an aware datetime.

    Raises:
        ValueError: not of that form.

    """
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z")


def format_jira_time(d: datetime) -> str:
    """An aware datetime as Jira writes ``updated`` (UTC): ``2026-11-28T08:00:00.123+0000``."""
    u = d.astimezone(UTC)
    return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}+0000"


class DriveLink:
    """Maps Drive URLs to resource references (the Drive connector's types and id prefix)."""

    def __init__(self, settings: ConnectorsSettings) -> None:
        self.settings = settings

    def ref(self, url: str) -> Json | None:
        """The resource a Drive URL names, or None for any other URL."""
        m = _DRIVE_URL.match(url)
        if m is None:
            return None
        s = self.settings
        if m.group("folder"):
            return {"type": s.drive_folder_type, "id": f"{s.drive_id_prefix}{m.group('folder')}"}
        return {
            "type": s.drive_resource_type,
            "id": f"{s.drive_id_prefix}{m.group('file') or m.group('open')}",
        }


def issue_work_item(
    issue: Json,
    remote_links: list[Json],
    directory: Directory,
    settings: ConnectorsSettings,
) -> Json:
    """The work item of a Jira issue (docs/connectors.md#jira).

    Args:
        issue: the search result's issue (``id``, ``key``, ``fields``).
        remote_links: its remote links.
        directory: people by email (the assignee).
        settings: the link fields and types.

    Returns:
        ``{"id", "status", "links", "attrs"}`` for ``POST /v1/work-items``.

    """
    fields = issue.get("fields") or {}
    category = ((fields.get("status") or {}).get("statusCategory") or {}).get("key", "new")
    state = _STATES.get(str(category), "open")
    links: list[Json] = []
    seen: set[tuple[str, str]] = set()

    def add(ref: Json | None) -> None:
        if ref is not None and ref["id"] and (ref["type"], ref["id"]) not in seen:
            seen.add((ref["type"], ref["id"]))
            links.append(ref)

    drive = DriveLink(settings)
    for rl in remote_links:
        url = (rl.get("object") or {}).get("url")
        if isinstance(url, str):
            add(drive.ref(url))
    for il in fields.get("issuelinks") or []:
        other = il.get("outwardIssue") or il.get("inwardIssue") or {}
        if other.get("key"):
            add({"type": settings.jira_issue_link_type, "id": str(other["key"])})
    for name, type_ in settings.jira_link_fields.items():
        value = fields.get(name)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, dict):
                v = v.get("value") or v.get("key") or v.get("id")
            for part in str(v or "").split(","):
                if part.strip():
                    add({"type": type_, "id": part.strip()})
    attrs: Json = {"state": state, "key": str(issue["key"])}
    assignee = fields.get("assignee") or {}
    person = directory.person(assignee.get("emailAddress"))
    if person is not None:
        attrs["assignee"] = {"__entity": {"type": "Human", "id": person.user_name}}
    return {
        "id": f"jira:{issue['key']}",
        "status": "closed" if state == "closed" else "open",
        "links": links,
        "attrs": attrs,
    }


def _jql_time(d: datetime) -> str:
    return d.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


class JiraConnector:
    """Follows Jira issues into the context service's work items (module docs).

    Args:
        settings: the component's settings.
        jira: a ``Caller`` whose client's base URL is ``jira_url`` (with its credentials).
        writer: the context service's batch routes.
        directory: people by email.
        state: the state file.
        metrics: the component's metrics.

    """

    name = "jira"

    def __init__(
        self,
        settings: ConnectorsSettings,
        jira: Caller,
        writer: ContextWriter,
        directory: Directory,
        state: State,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.jira = jira
        self.writer = writer
        self.directory = directory
        self.state = state
        self.metrics = metrics
        self.caught_up_at: float | None = None

    def _jql(self, since: datetime | None) -> str:
        """The search's JQL: ``(<jira_jql>) AND updated >= "<since>"``.

        Without ``since``, the epoch: the enhanced search refuses an unbounded query.
        """
        clauses = []
        if self.settings.jira_jql.strip():
            clauses.append(f"({self.settings.jira_jql.strip()})")
        clauses.append(f'updated >= "{_jql_time(since or _EPOCH)}"')
        return " AND ".join(clauses)

    async def _search(self, jql: str, fields: str, token: str | None) -> Json:
        params: Json = {"jql": jql, "maxResults": self.settings.jira_page_size, "fields": fields}
        if token:
            params["nextPageToken"] = token
        body = await self.jira.json("GET", "/rest/api/3/search/jql", params=params)
        return body if isinstance(body, dict) else {}

    async def _remote_links(self, key: str) -> list[Json]:
        body = await self.jira.json("GET", f"/rest/api/3/issue/{key}/remotelink")
        return [x for x in body if isinstance(x, dict)] if isinstance(body, list) else []

    async def _changed(self) -> None:
        started = datetime.now(UTC)
        cursor = self.state.get(self.name, "updated")
        since = None
        if cursor:
            since = parse_jira_time(cursor) - timedelta(seconds=self.settings.jira_overlap_secs)
        fields = ",".join(
            [
                "summary",
                "status",
                "assignee",
                "updated",
                "issuelinks",
                *self.settings.jira_link_fields,
            ]
        )
        jql = self._jql(since) + " ORDER BY updated ASC"
        token: str | None = None
        gate = asyncio.Semaphore(8)
        while True:
            body = await self._search(jql.strip(), fields, token)
            issues = [i for i in body.get("issues") or [] if i.get("key")]
            ids = [f"jira:{i['key']}" for i in issues]
            held = self.state.versions(self.name, ids)
            fresh = [
                i
                for i in issues
                if held.get(f"jira:{i['key']}") != str((i.get("fields") or {}).get("updated"))
            ]
            if fresh:
                await self.directory.refresh()

            async def one(issue: Json) -> Json:
                async with gate:
                    links = await self._remote_links(str(issue["key"]))
                return issue_work_item(issue, links, self.directory, self.settings)

            items = list(await asyncio.gather(*(one(i) for i in fresh)))
            if items:
                await self.writer.put_work_items(items)
            updated = [str((i.get("fields") or {}).get("updated")) for i in issues]
            last = max((u for u in updated if u != "None"), key=parse_jira_time, default=None)
            new_cursor: dict[str, str] = {}
            if last and (cursor is None or parse_jira_time(last) > parse_jira_time(cursor)):
                new_cursor["updated"] = cursor = last
            self.state.commit(
                self.name,
                cursor=new_cursor,
                known={
                    f"jira:{i['key']}": str((i.get("fields") or {}).get("updated")) for i in fresh
                },
            )
            token = body.get("nextPageToken")
            if not token or body.get("isLast") is True:
                break
        # Everything updated before this poll began, less the overlap, has been seen: the
        # cursor moves there even when nothing newer came, so a quiet tracker's next searches
        # stay short (this assumes Jira's clock and this one agree within the overlap).
        floor = started - timedelta(seconds=self.settings.jira_overlap_secs)
        if cursor is None or parse_jira_time(cursor) < floor:
            self.state.commit(self.name, cursor={"updated": format_jira_time(floor)})

    async def reconcile(self) -> list[str]:
        """Deletes the work items of issues the JQL no longer finds (deleted, or moved out).

        Returns:
            The ids deleted.

        Raises:
            CallFailed, Retryable: a search or the deletion failed; nothing is forgotten.

        """
        present: set[str] = set()
        token: str | None = None
        while True:
            body = await self._search(self._jql(None), "updated", token)
            present.update(f"jira:{i['key']}" for i in body.get("issues") or [] if i.get("key"))
            token = body.get("nextPageToken")
            if not token or body.get("isLast") is True:
                break
        gone = [i for i in self.state.known_ids(self.name) if i not in present]
        if gone:
            await self.writer.delete_work_items(gone)
        self.state.commit(self.name, cursor={"reconciled_at": f"{time.time():.3f}"}, forget=gone)
        if gone:
            log.info("jira: %d deleted issues removed", len(gone))
        return gone

    async def poll(self) -> None:
        """One poll: the changed issues, then a reconciliation when one is due.

        Raises:
            CallFailed, Retryable: a call failed for good; the cursor stays at the last page
                accepted.

        """
        first = self.state.get(self.name, "updated") is None
        await self._changed()
        if first:  # the first sync listed every issue: nothing to reconcile yet
            self.state.commit(self.name, cursor={"reconciled_at": f"{time.time():.3f}"})
        last = float(self.state.get(self.name, "reconciled_at") or "0")
        if time.time() - last >= self.settings.jira_reconcile_secs:
            await self.reconcile()
        self.caught_up_at = time.monotonic()
