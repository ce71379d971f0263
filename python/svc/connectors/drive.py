"""The Google Drive connector: every file a resource, every change followed.

docs/connectors.md#drive describes it.

The Drive API v3 calls (https://developers.google.com/workspace/drive/api/guides/manage-changes):

1. **First run.** ``changes.getStartPageToken`` is stored *before* the crawl, so every change
   made while ``files.list`` pages through the drive is replayed afterwards. The crawl
   (``q=trashed = false``, all drives) writes each page's files to the context service and then
   saves the page token, so a connector stopped mid-crawl resumes at its last accepted page.
2. **Then** ``changes.list`` from the saved token (``nextPageToken`` while more follow,
   ``newStartPageToken`` at the end): a change with ``removed: true`` or ``file.trashed`` deletes
   the resource, any other writes the file's current state (edits, moves, permission changes).
   The token is saved only after the page's writes are accepted.
3. **A refused token** (400 ``invalid`` at ``pageToken``, or 404/410: the reference says to
   discard it and start over) starts a full resync: a new start token, a new crawl generation,
   and at its end every file the crawl did not see is deleted.

Permissions come with ``files.list``/``changes.list`` for My Drive files; for files of shared
drives (which the API lists without them) from ``permissions.list`` with
``supportsAllDrives=true``, eight files at a time.

A file becomes ``<drive_resource_type>::"<prefix><fileId>"`` (``Document::"gdrive:1a2b"``) with
the attributes of docs/connectors.md#drive; a folder ``<drive_folder_type>::"<prefix><id>"``
without attributes; both have their parent folders as parents.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from svc.connectors.client import Caller, CallFailed, ContextWriter, Directory, Metrics
from svc.connectors.settings import ConnectorsSettings
from svc.connectors.state import State

__all__ = ["FILE_FIELDS", "DriveConnector", "file_resource"]

log = logging.getLogger("svc.connectors.drive")

Json = dict[str, Any]

FOLDER_MIME = "application/vnd.google-apps.folder"
_PERMISSION = "permissions(id,type,role,emailAddress,domain,deleted)"
#: The file fields the connector asks for (``fields``).
FILE_FIELDS = (
    "id,name,mimeType,parents,trashed,modifiedTime,driveId,owners(emailAddress),"
    f"labelInfo,{_PERMISSION}"
)
_SHARED_DRIVES = {"supportsAllDrives": "true", "includeItemsFromAllDrives": "true"}
#: Link-sharing levels, weakest first.
_LINK = ("none", "domain", "anyone")


def _label_values(f: Json, path: str | None) -> list[str]:
    """The values of label field ``<labelId>.<fieldId>`` on file ``f``."""
    if path is None:
        return []
    label_id, field_id = path.split(".", 1)
    for label in (f.get("labelInfo") or {}).get("labels") or []:
        if label.get("id") != label_id:
            continue
        fld = (label.get("fields") or {}).get(field_id) or {}
        for kind in ("selection", "text", "integer", "dateString"):
            if isinstance(fld.get(kind), list):
                return [str(v) for v in fld[kind]]
        users = fld.get("user")
        if isinstance(users, list):
            return [str(u.get("emailAddress", "")) for u in users if isinstance(u, dict)]
    return []


def file_resource(
    f: Json, perms: list[Json], directory: Directory, settings: ConnectorsSettings
) -> Json:
    """The resource of a Drive file (docs/connectors.md#drive).

    Args:
        f: the file resource (``FILE_FIELDS``).
        perms: its permissions (``files.list``'s, or ``permissions.list``'s for shared drives).
        directory: people and groups to match emails with.
        settings: the type names, id prefix and label fields.

    Returns:
        ``{"type", "id", "attrs", "parents"}`` for ``POST /v1/resources``.

    """
    prefix = settings.drive_id_prefix
    parents = [
        {"type": settings.drive_folder_type, "id": f"{prefix}{p}"} for p in f.get("parents") or []
    ]
    if f.get("mimeType") == FOLDER_MIME:
        return {
            "type": settings.drive_folder_type,
            "id": f"{prefix}{f['id']}",
            "attrs": {},
            "parents": parents,
        }
    owner_email = next((o.get("emailAddress") for o in f.get("owners") or []), None)
    if owner_email is None:
        owner_email = next((p.get("emailAddress") for p in perms if p.get("role") == "owner"), None)
    owner = directory.person(owner_email)
    people: set[str] = set()
    groups: set[str] = set()
    link = 0
    for p in perms:
        if p.get("deleted"):
            continue
        kind = p.get("type")
        if kind == "user":
            who = directory.person(p.get("emailAddress"))
            if who is not None and (owner is None or who.user_name != owner.user_name):
                people.add(who.user_name)
        elif kind == "group":
            g = directory.group(p.get("emailAddress"))
            if g is not None:
                groups.add(g)
        elif kind == "domain":
            link = max(link, 1)
        elif kind == "anyone":
            link = 2
    sensitivity = _label_values(f, settings.drive_sensitivity_field)
    attrs: Json = {
        "department": owner.department if owner else "",
        "sensitivity": sensitivity[0] if sensitivity else settings.drive_default_sensitivity,
        "tags": sorted(set(_label_values(f, settings.drive_tags_field))),
        "shared_with": [{"__entity": {"type": "Human", "id": u}} for u in sorted(people)],
        "shared_with_groups": [{"__entity": {"type": "Group", "id": g}} for g in sorted(groups)],
        "link_sharing": _LINK[link],
        "mime_type": str(f.get("mimeType", "")),
        "labels": sorted(
            {str(lb["id"]) for lb in (f.get("labelInfo") or {}).get("labels") or [] if "id" in lb}
        ),
        "modified_at": str(f.get("modifiedTime", "")),
    }
    if owner is not None:
        attrs["owner"] = {"__entity": {"type": "Human", "id": owner.user_name}}
    return {
        "type": settings.drive_resource_type,
        "id": f"{prefix}{f['id']}",
        "attrs": attrs,
        "parents": parents,
    }


class CursorRefused(Exception):
    """Drive refused a saved page token: a full resync follows."""


def _refused(e: CallFailed) -> bool:
    if e.status in (404, 410):
        return True
    if e.status != 400:
        return False
    body = e.body if isinstance(e.body, dict) else {}
    errors = (body.get("error") or {}).get("errors") or []
    return any(isinstance(x, dict) and x.get("location") == "pageToken" for x in errors)


class DriveConnector:
    """Follows one Drive into the context service (module docs).

    Args:
        settings: the component's settings.
        drive: a ``Caller`` whose client's base URL is ``drive_url`` (with its credentials).
        writer: the context service's batch routes.
        directory: people and groups by email.
        state: the state file.
        metrics: the component's metrics.

    """

    name = "drive"

    def __init__(
        self,
        settings: ConnectorsSettings,
        drive: Caller,
        writer: ContextWriter,
        directory: Directory,
        state: State,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.drive = drive
        self.writer = writer
        self.directory = directory
        self.state = state
        self.metrics = metrics
        self.caught_up_at: float | None = None  # monotonic time the head was last reached

    def _get(self, name: str) -> str | None:
        return self.state.get(self.name, name)

    def _gen(self) -> int:
        return int(self._get("gen") or "1")

    async def _permissions(self, f: Json) -> list[Json]:
        if "driveId" not in f and "permissions" in f:
            return list(f["permissions"])
        out: list[Json] = []
        token: str | None = None
        while True:
            params: Json = {"supportsAllDrives": "true", "pageSize": 100, "fields": "*"}
            if token:
                params["pageToken"] = token
            body = await self.drive.json(
                "GET", f"/drive/v3/files/{f['id']}/permissions", params=params
            )
            out += body.get("permissions") or []
            token = body.get("nextPageToken")
            if not token:
                return out

    async def _resources(self, files: list[Json]) -> list[Json]:
        await self.directory.refresh()
        gate = asyncio.Semaphore(8)

        async def one(f: Json) -> Json:
            async with gate:
                return file_resource(f, await self._permissions(f), self.directory, self.settings)

        return list(await asyncio.gather(*(one(f) for f in files)))

    async def _write(self, files: list[Json], gone: list[str], cursor: dict[str, str]) -> None:
        """Writes a page's files and deletes the resources of ``gone`` (file ids).

        Then saves ``cursor`` with the ids written and deleted, in one transaction.
        """
        resources = await self._resources(files)
        if resources:
            await self.writer.put_resources(resources)
        prefix = self.settings.drive_id_prefix
        held = self.state.versions(self.name, [f"{prefix}{g}" for g in gone])
        refs = [{"type": t, "id": i} for i, t in held.items()]
        if refs:
            await self.writer.delete_resources(refs)
        self.state.commit(
            self.name,
            cursor=cursor,
            known={r["id"]: r["type"] for r in resources},
            gen=self._gen(),
            forget=list(held),
        )

    async def _start(self, gen: int) -> None:
        body = await self.drive.json(
            "GET", "/drive/v3/changes/startPageToken", params={"supportsAllDrives": "true"}
        )
        self.state.commit(
            self.name,
            cursor={
                "start_token": str(body["startPageToken"]),
                "phase": "crawl",
                "crawl_page": "",
                "gen": str(gen),
            },
        )

    async def _crawl(self) -> None:
        """``files.list`` from the saved page to the end; then deletes what it did not see."""
        while True:
            page = self._get("crawl_page") or ""
            if page == "-":  # the last page was written
                break
            params: Json = {
                "q": "trashed = false",
                "pageSize": self.settings.drive_page_size,
                "corpora": "allDrives",
                "fields": f"nextPageToken,files({FILE_FIELDS})",
                **_SHARED_DRIVES,
            }
            if page:
                params["pageToken"] = page
            try:
                body = await self.drive.json("GET", "/drive/v3/files", params=params)
            except CallFailed as e:
                if page and _refused(e):  # a stale crawl page: crawl again from the start
                    self.metrics.errors.labels(self.name, "cursor_refused").inc()
                    self.state.commit(self.name, cursor={"crawl_page": ""})
                    continue
                raise
            nxt = body.get("nextPageToken")
            files = [f for f in body.get("files") or [] if not f.get("trashed")]
            await self._write(files, [], {"crawl_page": nxt or "-"})
        stale = self.state.known_ids(self.name, older_than_gen=self._gen())
        if stale:
            held = self.state.versions(self.name, stale)
            await self.writer.delete_resources([{"type": t, "id": i} for i, t in held.items()])
            self.state.commit(self.name, forget=stale)
        self.state.commit(
            self.name,
            cursor={"phase": "changes", "changes_token": self._get("start_token") or ""},
        )

    async def _changes(self) -> None:
        """``changes.list`` from the saved token to ``newStartPageToken``."""
        while True:
            token = self._get("changes_token") or ""
            try:
                body = await self.drive.json(
                    "GET",
                    "/drive/v3/changes",
                    params={
                        "pageToken": token,
                        "pageSize": self.settings.drive_page_size,
                        "includeRemoved": "true",
                        "fields": "nextPageToken,newStartPageToken,changes(fileId,removed,"
                        f"time,changeType,file({FILE_FIELDS}))",
                        **_SHARED_DRIVES,
                    },
                )
            except CallFailed as e:
                if _refused(e):
                    raise CursorRefused(str(e)) from e
                raise
            latest: dict[str, Json] = {}
            for c in body.get("changes") or []:
                if c.get("changeType", "file") == "file" and c.get("fileId"):
                    latest[str(c["fileId"])] = c  # a later change of a file wins
            files: list[Json] = []
            gone: list[str] = []
            for fid, c in latest.items():
                f = c.get("file")
                if c.get("removed") or f is None or f.get("trashed"):
                    gone.append(fid)
                else:
                    files.append(f)
            nxt = body.get("nextPageToken")
            new_start = body.get("newStartPageToken")
            await self._write(files, gone, {"changes_token": str(nxt or new_start or token)})
            if not nxt:
                return

    async def poll(self) -> None:
        """One poll: the first crawl, a resync, or the changes since the saved token.

        Returns when the head is reached (``caught_up_at`` set).

        Raises:
            CallFailed, Retryable: a call failed for good; the saved state stays as it was
                after the last accepted page, and the next poll goes on from there.

        """
        if self._get("start_token") is None:
            await self._start(self._gen())
        if self._get("phase") == "crawl":
            await self._crawl()
        try:
            await self._changes()
        except CursorRefused as e:
            log.warning("drive: the change token was refused (%s); full resync", e)
            self.metrics.errors.labels(self.name, "cursor_refused").inc()
            self.metrics.resyncs.labels(self.name).inc()
            await self._start(self._gen() + 1)
            await self._crawl()
            await self._changes()
        self.caught_up_at = time.monotonic()
