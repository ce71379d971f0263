"""A local stand-in for Google Drive API v3: the calls the Drive connector makes, in their shapes.

An ASGI app (FastAPI) over an in-memory drive, for tests, ``svc up``'s demo and the connectors'
benchmark; it never reaches Google. The shapes are those of the public reference
(https://developers.google.com/workspace/drive/api/reference/rest/v3):

* ``GET /drive/v3/files`` (``files.list``): ``pageSize`` (1 to 1,000, default 100),
  ``pageToken``, ``q`` (only ``trashed = false`` is understood; anything else is a 400),
  ``includeItemsFromAllDrives`` with ``supportsAllDrives`` (files of shared drives are listed
  only with both), ``fields`` (accepted, not applied: every answer carries the fields the
  connector asks for). Answer ``{"kind": "drive#fileList", "files", "nextPageToken"?,
  "incompleteSearch": false}``.
* ``GET /drive/v3/changes/startPageToken`` (``changes.getStartPageToken``):
  ``{"kind": "drive#startPageToken", "startPageToken"}``.
* ``GET /drive/v3/changes`` (``changes.list``): ``pageToken`` (required), ``pageSize`` (1 to
  1,000, default 100), ``includeRemoved`` (default true), ``includeItemsFromAllDrives``,
  ``supportsAllDrives``. Answer ``{"kind": "drive#changeList", "changes": [{"kind":
  "drive#change", "changeType": "file", "time", "removed", "fileId", "file"?}],
  "nextPageToken"? | "newStartPageToken"?}``; a change carries the file's *current* state, as
  Drive's does, so a trashed file is ``removed: false`` with ``file.trashed: true`` and a
  deleted one ``removed: true`` without ``file``. A page token the drive no longer accepts
  (``expire_tokens``) is answered as Drive answers a rejected token: 400 ``invalid`` at
  ``location: pageToken``; the reference says to discard it and start over.
* ``GET /drive/v3/files/{fileId}/permissions`` (``permissions.list``): ``pageSize`` (1 to 100),
  ``pageToken``, ``supportsAllDrives`` (a shared drive's file without it: 404
  ``notFound``). ``{"kind": "drive#permissionList", "permissions": [{"kind":
  "drive#permission", "id", "type": "user"|"group"|"domain"|"anyone", "role", "emailAddress"?,
  "domain"?}], "nextPageToken"?}``. ``files.list`` carries ``permissions`` for My Drive files
  only ("not populated for items in shared drives").
* ``POST /token``: the OAuth 2.0 JWT-bearer grant (RFC 7523) a service-account key's
  ``token_uri`` names, so google-auth's service-account credentials work against the fake: the
  assertion is checked against the key given to ``FakeDrive(service_account_public_key=...)``.

Every ``/drive/v3`` call needs ``Authorization: Bearer <token>`` (the one given, or one the
token route issued), else 401 ``authError``. ``fail_next`` makes the next calls answer a rate
limit (429 ``rateLimitExceeded`` or 403 ``userRateLimitExceeded``, with ``Retry-After``) or a
5xx, in the error shape of the reference (``{"error": {"code", "message", "errors":
[{"domain", "reason", "message"}]}}``). ``requests`` records each call (path and monotonic time).

Changes to the drive (``put_file``, ``set_permissions``, ``trash``, ``delete``) are thread-safe
and each adds one entry to the change log.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jwt
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

__all__ = ["FOLDER_MIME", "Failure", "FakeDrive", "create_app", "from_company"]

Json = dict[str, Any]

#: Drive's MIME type of a folder.
FOLDER_MIME = "application/vnd.google-apps.folder"
DOC_MIME = "application/vnd.google-apps.document"


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{int(ts * 1000) % 1000:03d}Z"
    )


def _error(status: int, reason: str, message: str, **extra: Any) -> JSONResponse:
    err: Json = {"domain": "global", "reason": reason, "message": message, **extra}
    if reason in ("rateLimitExceeded", "userRateLimitExceeded"):
        err["domain"] = "usageLimits"
    return JSONResponse(
        {"error": {"code": status, "message": message, "errors": [err]}}, status_code=status
    )


def _token(n: int) -> str:
    return base64.urlsafe_b64encode(json.dumps(n).encode()).decode().rstrip("=")


def _untoken(text: str) -> int | None:
    try:
        n = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    return n if isinstance(n, int) and n >= 0 else None


@dataclass
class Failure:
    """One injected failure: the HTTP status, its reason and the ``Retry-After`` seconds."""

    status: int
    reason: str
    retry_after: float | None = None


@dataclass
class FakeDrive:
    """An in-memory drive (module docs).

    Attributes:
        token: the bearer token every call must carry (besides ones ``/token`` issued).
        domain: the organization's domain (``domain`` permissions name it).
        files: file id -> the file resource (``id``, ``name``, ``mimeType``, ``parents``,
            ``owners``, ``trashed``, ``modifiedTime``, ``labelInfo``, ``driveId``?).
        permissions: file id -> its permission resources.
        requests: ``(path, monotonic time)`` of every call, in order.

    """

    token: str = "drive-token"
    domain: str = "example.com"
    service_account_public_key: str | None = None
    files: dict[str, Json] = field(default_factory=dict)
    permissions: dict[str, list[Json]] = field(default_factory=dict)
    requests: list[tuple[str, float]] = field(default_factory=list)
    _log: list[tuple[str, float]] = field(default_factory=list)  # (file id, time); seq = index+1
    _min_token: int = 1
    _fail: list[Failure] = field(default_factory=list)
    _issued: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- changing the drive -----------------------------------------------------------

    def _changed(self, file_id: str) -> None:
        self._log.append((file_id, time.time()))

    def put_file(
        self,
        file_id: str,
        name: str,
        *,
        owner: str | None = None,
        mime_type: str = DOC_MIME,
        parents: Iterable[str] = (),
        permissions: Iterable[Json] | None = None,
        labels: Iterable[Json] = (),
        drive_id: str | None = None,
    ) -> Json:
        """Creates or replaces a file, and logs a change of it.

        Args:
            file_id: Drive's file id.
            name: its title.
            owner: its owner's email (My Drive files; shared-drive files have none).
            mime_type: its MIME type (``FOLDER_MIME`` for a folder).
            parents: the ids of the folders holding it.
            permissions: its permissions (``{"type", "role", "emailAddress"?, "domain"?}``);
                None keeps the current ones, or makes the owner's alone for a new file.
            labels: ``labelInfo.labels`` entries (``{"id", "fields": {fieldId: {...}}}``).
            drive_id: the shared drive holding it, None for My Drive.

        Returns:
            The stored file resource.

        """
        with self._lock:
            f: Json = {
                "kind": "drive#file",
                "id": file_id,
                "name": name,
                "mimeType": mime_type,
                "parents": list(parents),
                "trashed": False,
                "modifiedTime": _rfc3339(time.time()),
                "labelInfo": {"labels": [{"kind": "drive#label", **lb} for lb in labels]},
            }
            if owner is not None:
                f["owners"] = [{"kind": "drive#user", "emailAddress": owner}]
            if drive_id is not None:
                f["driveId"] = drive_id
            self.files[file_id] = f
            if permissions is not None:
                self._set_perms(file_id, permissions)
            elif file_id not in self.permissions:
                self._set_perms(
                    file_id,
                    [{"type": "user", "role": "owner", "emailAddress": owner}] if owner else [],
                )
            self._changed(file_id)
            return f

    def _set_perms(self, file_id: str, perms: Iterable[Json]) -> None:
        self.permissions[file_id] = [
            {"kind": "drive#permission", "id": f"p{i}-{file_id}", **p} for i, p in enumerate(perms)
        ]

    def set_permissions(self, file_id: str, perms: Iterable[Json]) -> None:
        """Replaces a file's permissions (a share or an unshare), logging a change of it.

        Raises:
            KeyError: no such file.

        """
        with self._lock:
            f = self.files[file_id]
            self._set_perms(file_id, perms)
            f["modifiedTime"] = _rfc3339(time.time())
            self._changed(file_id)

    def trash(self, file_id: str) -> None:
        """Moves a file to the trash (``trashed: true``), logging a change of it."""
        with self._lock:
            self.files[file_id]["trashed"] = True
            self._changed(file_id)

    def delete(self, file_id: str) -> None:
        """Deletes a file for good, logging a change with ``removed: true``."""
        with self._lock:
            self.files.pop(file_id, None)
            self.permissions.pop(file_id, None)
            self._changed(file_id)

    def expire_tokens(self) -> None:
        """Refuses every change page token issued so far (as Drive may after a long pause)."""
        with self._lock:
            self._min_token = len(self._log) + 1

    def fail_next(self, *failures: Failure) -> None:
        """The next ``len(failures)`` calls to ``/drive/v3`` answer these failures, in order."""
        with self._lock:
            self._fail.extend(failures)

    def calls(self, path_part: str) -> list[float]:
        """The monotonic times of the calls whose path contains ``path_part``."""
        with self._lock:
            return [t for p, t in self.requests if path_part in p]

    # -- answers ------------------------------------------------------------------------

    def _file_out(self, f: Json, with_perms: bool) -> Json:
        out = dict(f)
        if with_perms and "driveId" not in f:
            out["permissions"] = [dict(p) for p in self.permissions.get(f["id"], [])]
        return out


def _page_size(raw: str | None, default: int, most: int) -> int | None:
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        return None
    return n if 1 <= n <= most else None


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() == "true"


def create_app(drive: FakeDrive) -> FastAPI:
    """The fake Drive API over ``drive`` (module docs).

    Returns:
        A FastAPI app; it keeps no state of its own.

    """
    app = FastAPI(title="fake Google Drive API v3", openapi_url=None, docs_url=None)

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Any:
        path = request.url.path
        if not path.startswith("/drive/v3/"):
            return await call_next(request)
        with drive._lock:
            drive.requests.append((path, time.monotonic()))
            failure = drive._fail.pop(0) if drive._fail else None
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else ""
        if given != drive.token and given not in drive._issued:
            return _error(401, "authError", "Invalid Credentials", location="Authorization")
        if failure is not None:
            resp = _error(
                failure.status,
                failure.reason,
                "Rate Limit Exceeded" if failure.status in (403, 429) else "Backend Error",
            )
            if failure.retry_after is not None:
                resp.headers["Retry-After"] = f"{failure.retry_after:g}"
            return resp
        return await call_next(request)

    @app.get("/drive/v3/files")
    def files_list(request: Request) -> Any:
        q = request.query_params
        size = _page_size(q.get("pageSize"), 100, 1000)
        if size is None:
            return _error(400, "invalid", "Invalid Value", location="pageSize")
        query = (q.get("q") or "").strip()
        if query not in ("", "trashed = false", "trashed=false"):
            return _error(400, "invalid", "Invalid Value", location="q")
        all_drives = _truthy(q.get("includeItemsFromAllDrives")) and _truthy(
            q.get("supportsAllDrives")
        )
        start = 0
        if q.get("pageToken"):
            n = _untoken(q["pageToken"])
            if n is None:
                return _error(400, "invalid", "Invalid Value", location="pageToken")
            start = n
        with drive._lock:
            ids = sorted(
                i
                for i, f in drive.files.items()
                if (all_drives or "driveId" not in f) and not (query and f["trashed"])
            )
            page = [drive._file_out(drive.files[i], True) for i in ids[start : start + size]]
        out: Json = {"kind": "drive#fileList", "incompleteSearch": False, "files": page}
        if start + size < len(ids):
            out["nextPageToken"] = _token(start + size)
        return JSONResponse(out)

    @app.get("/drive/v3/changes/startPageToken")
    def start_page_token() -> Any:
        with drive._lock:
            return {"kind": "drive#startPageToken", "startPageToken": str(len(drive._log) + 1)}

    @app.get("/drive/v3/changes")
    def changes_list(request: Request) -> Any:
        q = request.query_params
        size = _page_size(q.get("pageSize"), 100, 1000)
        if size is None:
            return _error(400, "invalid", "Invalid Value", location="pageSize")
        raw = q.get("pageToken")
        if not raw:
            return _error(400, "required", "Required parameter: pageToken", location="pageToken")
        try:
            first = int(raw)
        except ValueError:
            return _error(400, "invalid", "Invalid Value", location="pageToken")
        all_drives = _truthy(q.get("includeItemsFromAllDrives")) and _truthy(
            q.get("supportsAllDrives")
        )
        removed_too = q.get("includeRemoved", "true").lower() != "false"
        with drive._lock:
            if first < drive._min_token or first > len(drive._log) + 1:
                return _error(400, "invalid", "Invalid Value", location="pageToken")
            entries = drive._log[first - 1 : first - 1 + size]
            changes: list[Json] = []
            for file_id, at in entries:
                f = drive.files.get(file_id)
                if f is not None and "driveId" in f and not all_drives:
                    continue
                change: Json = {
                    "kind": "drive#change",
                    "changeType": "file",
                    "time": _rfc3339(at),
                    "fileId": file_id,
                    "removed": f is None,
                }
                if f is not None:
                    change["file"] = drive._file_out(f, True)
                elif not removed_too:
                    continue
                changes.append(change)
            nxt = first + len(entries)
            out: Json = {"kind": "drive#changeList", "changes": changes}
            if nxt <= len(drive._log):
                out["nextPageToken"] = str(nxt)
            else:
                out["newStartPageToken"] = str(nxt)
        return JSONResponse(out)

    @app.get("/drive/v3/files/{file_id}/permissions")
    def permissions_list(file_id: str, request: Request) -> Any:
        q = request.query_params
        size = _page_size(q.get("pageSize"), 100, 100)
        if size is None:
            return _error(400, "invalid", "Invalid Value", location="pageSize")
        start = 0
        if q.get("pageToken"):
            n = _untoken(q["pageToken"])
            if n is None:
                return _error(400, "invalid", "Invalid Value", location="pageToken")
            start = n
        with drive._lock:
            f = drive.files.get(file_id)
            if f is None or ("driveId" in f and not _truthy(q.get("supportsAllDrives"))):
                return _error(404, "notFound", f"File not found: {file_id}.", location="fileId")
            perms = [dict(p) for p in drive.permissions.get(file_id, [])]
        out: Json = {"kind": "drive#permissionList", "permissions": perms[start : start + size]}
        if start + size < len(perms):
            out["nextPageToken"] = _token(start + size)
        return JSONResponse(out)

    @app.post("/token")
    async def token(request: Request) -> Any:
        """RFC 7523 section 2.1: ``grant_type`` JWT bearer and a signed ``assertion``."""
        form = await request.form()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        key = drive.service_account_public_key
        try:
            if key is None:
                raise jwt.InvalidTokenError("no service account is known")
            jwt.decode(
                str(form.get("assertion", "")),
                key,
                algorithms=["RS256"],
                options={"verify_aud": False},
            )
        except jwt.InvalidTokenError:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        issued = secrets.token_urlsafe(24)
        with drive._lock:
            drive._issued.add(issued)
        return {"access_token": issued, "token_type": "Bearer", "expires_in": 3600}

    return app


def from_company(
    company: Any, *, domain: str = "example.com", token: str = "drive-token"
) -> FakeDrive:
    """A drive holding the demo company's documents (``svc.demo.company``).

    Each department is a folder (its id the department's name, as the demo's ``Folder``
    entities); each document a Google Doc of the
    same id in its department's folder, owned by ``<owner>@<domain>``, shared with the
    department's group (``<department>@<domain>``, reader) and, when tagged with another
    department, with that one's group too; ``public`` documents are readable by anyone with
    the link. The label ``demo`` carries the document's sensitivity (field ``sensitivity``) and
    tags (field ``tags``).

    Args:
        company: a ``svc.demo.company.Company``.
        domain: the email domain of people and groups.
        token: the bearer token calls must carry.

    Returns:
        The seeded drive.

    """
    drive = FakeDrive(token=token, domain=domain)
    for dept in company.departments():
        drive.put_file(
            dept,
            dept.title(),
            owner=None,
            mime_type=FOLDER_MIME,
            permissions=[{"type": "group", "role": "reader", "emailAddress": f"{dept}@{domain}"}],
        )
    depts = set(company.departments())
    for d in company.documents:
        attrs = d.attrs
        owner = f"{d.owner}@{domain}"
        perms: list[Json] = [{"type": "user", "role": "owner", "emailAddress": owner}]
        shared = {attrs["department"], *(t for t in attrs["tags"] if t in depts)}
        perms += [
            {"type": "group", "role": "reader", "emailAddress": f"{g}@{domain}"}
            for g in sorted(shared)
        ]
        if attrs["sensitivity"] == "public":
            perms.append({"type": "anyone", "role": "reader"})
        drive.put_file(
            d.id,
            f"{d.id} ({', '.join(attrs['tags']) or 'untagged'})",
            owner=owner,
            parents=list(d.parents),
            permissions=perms,
            labels=[
                {
                    "id": "demo",
                    "fields": {
                        "sensitivity": {
                            "kind": "drive#labelField",
                            "id": "sensitivity",
                            "valueType": "selection",
                            "selection": [attrs["sensitivity"]],
                        },
                        "tags": {
                            "kind": "drive#labelField",
                            "id": "tags",
                            "valueType": "text",
                            "text": list(attrs["tags"]),
                        },
                    },
                }
            ],
        )
    return drive
