"""A local stand-in for Jira Cloud REST API v3: the calls the Jira connector makes, as shaped.

An ASGI app (FastAPI) over in-memory issues, for tests, ``svc up``'s demo and the connectors'
benchmark; it never reaches Atlassian. Shapes from the public reference
(https://developer.atlassian.com/cloud/jira/platform/rest/v3/):

* ``GET /rest/api/3/search/jql`` (enhanced JQL search): ``jql``, ``nextPageToken``,
  ``maxResults`` (1 to 5,000, default 50), ``fields`` (comma-separated; the named fields are
  returned, ``*all`` or none gives every field). Answer ``{"issues": [{"id", "key", "self",
  "fields"}], "nextPageToken"?, "isLast"}``; ``nextPageToken`` is absent on the last page.
  The JQL understood is a conjunction (``AND``) of ``updated >= "yyyy-MM-dd HH:mm"`` (also
  ``yyyy/MM/dd``, or a date alone; minute precision, UTC), ``project = KEY``, ``project in
  (A, B)``, with an optional ``ORDER BY updated ASC|DESC[, key ...]``; anything else is a 400
  ``{"errorMessages": [...], "errors": {}}``, as Jira answers bad JQL. Pages continue after the
  last issue of the previous page in the query's order, so an issue updated between two pages
  is seen again later rather than shifting another past the page boundary.
* ``GET /rest/api/3/issue/{issueIdOrKey}/remotelink``: the issue's remote links, ``[{"id",
  "self", "globalId"?, "relationship"?, "object": {"url", "title"}}]``; 404 for an unknown
  issue.
* Fields: ``summary``, ``status`` (``{"name", "id", "statusCategory": {"id", "key": "new" |
  "indeterminate" | "done", "name"}}``), ``assignee`` (``{"accountId", "emailAddress",
  "displayName", "active"}`` or null), ``updated`` and ``created``
  (``2026-11-28T08:00:00.000+0000``), ``project`` (``{"key"}``), ``issuelinks`` (``[{"id",
  "type": {"name", "inward", "outward"}, "outwardIssue" | "inwardIssue": {"id", "key"}}]``),
  and any custom field given.

Calls need ``Authorization: Basic base64(email:api-token)`` with the configured pair, or
``Bearer <token>`` (OAuth 2.0), else 401. ``fail_next`` makes the next calls answer 429 with
``Retry-After`` (Jira's rate limiting: https://developer.atlassian.com/cloud/jira/platform/rate-limiting/)
or a 5xx. ``requests`` records each call.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

__all__ = ["CATEGORIES", "FakeJira", "create_app", "from_company", "jira_time"]

Json = dict[str, Any]

#: Status category key -> (id, name), Jira's three categories.
CATEGORIES = {"new": (2, "To Do"), "indeterminate": (4, "In Progress"), "done": (3, "Done")}
#: A status name per category, as a default workflow has them.
STATUS_NAMES = {"new": "To Do", "indeterminate": "In Progress", "done": "Done"}


def jira_time(ts: float) -> str:
    """``ts`` (POSIX seconds) as Jira writes ``updated``: ``2026-11-28T08:00:00.123+0000``."""
    d = datetime.fromtimestamp(ts, UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ts * 1000) % 1000:03d}+0000"


def _jql_error(message: str) -> JSONResponse:
    return JSONResponse({"errorMessages": [message], "errors": {}}, status_code=400)


_CLAUSE_UPDATED = re.compile(
    r'^updated\s*>=\s*"(\d{4})[-/](\d{2})[-/](\d{2})(?:\s+(\d{2}):(\d{2}))?"$', re.I
)
_CLAUSE_PROJECT_EQ = re.compile(r"^project\s*=\s*\"?([A-Z][A-Z0-9_]*)\"?$", re.I)
_CLAUSE_PROJECT_IN = re.compile(r"^project\s+in\s*\(([^)]*)\)$", re.I)
_ORDER = re.compile(r"\s+ORDER\s+BY\s+(.+)$", re.I)


@dataclass(frozen=True)
class _Query:
    since: float | None
    projects: frozenset[str] | None
    descending: bool


def _parse_jql(jql: str) -> _Query | str:
    """The query, or the error message Jira would give."""
    text = jql.strip()
    descending = False
    m = _ORDER.search(" " + text)
    if m:
        text = (" " + text)[: m.start()].strip()
        first = m.group(1).split(",")[0].split()
        if not first or first[0].lower() not in ("updated", "key", "id"):
            return f"Not able to sort using field '{first[0] if first else ''}'."
        descending = len(first) > 1 and first[1].upper() == "DESC"
    since: float | None = None
    projects: set[str] | None = None
    for clause in [c.strip() for c in re.split(r"\s+AND\s+", text, flags=re.I)] if text else []:
        while clause.startswith("(") and clause.endswith(")") and clause.count("(") > 1:
            clause = clause[1:-1].strip()  # (project in (A, B))
        if clause.startswith("(") and clause.endswith(")") and "(" not in clause[1:]:
            clause = clause[1:-1].strip()  # (project = A)
        if mu := _CLAUSE_UPDATED.match(clause):
            y, mo, d, h, mi = mu.groups()
            at = datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), tzinfo=UTC)
            since = max(since or 0.0, at.timestamp())
        elif mp := _CLAUSE_PROJECT_EQ.match(clause):
            projects = (projects or set()) | {mp.group(1).upper()}
        elif mp := _CLAUSE_PROJECT_IN.match(clause):
            keys = {k.strip().strip('"').upper() for k in mp.group(1).split(",") if k.strip()}
            projects = (projects or set()) | keys
        else:
            return f"Error in the JQL Query: the clause '{clause}' is not understood."
    return _Query(since, frozenset(projects) if projects is not None else None, descending)


@dataclass
class FakeJira:
    """In-memory issues (module docs).

    Attributes:
        email, api_token: the Basic credentials accepted; ``bearer``: an OAuth token accepted.
        issues: key -> ``{"id", "key", "fields"}``; ``remote_links``: key -> links.
        requests: ``(path, monotonic time)`` of every call, in order.

    """

    email: str = "svc@example.com"
    api_token: str = "jira-token"
    bearer: str | None = None
    base_url: str = "http://jira.invalid"
    issues: dict[str, Json] = field(default_factory=dict)
    remote_links: dict[str, list[Json]] = field(default_factory=dict)
    requests: list[tuple[str, float]] = field(default_factory=list)
    _next_id: int = 10_000
    _fail: list[tuple[int, float | None]] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _clock: float = 0.0

    def _now(self) -> float:
        # Strictly increasing millisecond times, so two updates never share an `updated`.
        t = max(time.time(), self._clock + 0.001)
        self._clock = t
        return t

    def put_issue(
        self,
        key: str,
        *,
        summary: str = "",
        category: str = "new",
        assignee: str | None = None,
        links: Iterable[tuple[str, str, str]] = (),
        remote_links: Iterable[str] | None = None,
        custom: Json | None = None,
        updated: float | None = None,
    ) -> Json:
        """Creates or updates an issue, setting ``updated`` to now (or ``updated``).

        Args:
            key: ``PROJ-123``.
            summary: its title.
            category: its status category: ``new``, ``indeterminate`` or ``done``.
            assignee: the assignee's email, or None.
            links: issue links ``(link type name, "outward"|"inward", other key)``.
            remote_links: URLs of its remote links (None keeps the current ones).
            custom: custom fields (``{"customfield_10100": "cust-001"}``).
            updated: the ``updated`` time (POSIX seconds) instead of now.

        Returns:
            The stored issue.

        Raises:
            KeyError: ``category`` is not one of the three.

        """
        cat_id, cat_name = CATEGORIES[category]
        with self._lock:
            old = self.issues.get(key)
            if old is None:
                self._next_id += 1
                issue_id = str(self._next_id)
            else:
                issue_id = old["id"]
            at = self._now() if updated is None else updated
            fields: Json = {
                "summary": summary,
                "project": {"key": key.split("-", 1)[0]},
                "status": {
                    "name": STATUS_NAMES[category],
                    "id": str(cat_id),
                    "statusCategory": {"id": cat_id, "key": category, "name": cat_name},
                },
                "assignee": None
                if assignee is None
                else {
                    "accountId": f"acc-{assignee.split('@')[0]}",
                    "emailAddress": assignee,
                    "displayName": assignee.split("@")[0],
                    "active": True,
                },
                "created": old["fields"]["created"] if old else jira_time(at),
                "updated": jira_time(at),
                "issuelinks": [
                    {
                        "id": f"{issue_id}-{i}",
                        "type": {"name": kind, "inward": f"is {kind} by", "outward": kind},
                        f"{direction}Issue": {"key": other, "id": self._id_of(other)},
                    }
                    for i, (kind, direction, other) in enumerate(links)
                ],
                **(custom or {}),
            }
            issue = {"id": issue_id, "key": key, "fields": fields, "_at": at}
            self.issues[key] = issue
            if remote_links is not None:
                self.remote_links[key] = [
                    {
                        "id": 20_000 + i,
                        "self": f"{self.base_url}/rest/api/3/issue/{key}/remotelink/{20_000 + i}",
                        "relationship": "mentioned in",
                        "object": {"url": url, "title": url.rsplit("/", 2)[-2]},
                    }
                    for i, url in enumerate(remote_links)
                ]
            return issue

    def _id_of(self, key: str) -> str:
        other = self.issues.get(key)
        return str(other["id"]) if other else "0"

    def delete_issue(self, key: str) -> None:
        """Deletes an issue: it leaves every search (no change is announced, as in Jira)."""
        with self._lock:
            self.issues.pop(key, None)
            self.remote_links.pop(key, None)

    def fail_next(self, *failures: tuple[int, float | None]) -> None:
        """The next calls answer ``(status, Retry-After seconds or None)``, in order."""
        with self._lock:
            self._fail.extend(failures)

    def calls(self, path_part: str) -> list[float]:
        """The monotonic times of the calls whose path contains ``path_part``."""
        with self._lock:
            return [t for p, t in self.requests if path_part in p]

    def _authorized(self, header: str) -> bool:
        if header.lower().startswith("basic "):
            try:
                pair = base64.b64decode(header[6:]).decode()
            except (ValueError, UnicodeDecodeError):
                return False
            return pair == f"{self.email}:{self.api_token}"
        if header.lower().startswith("bearer ") and self.bearer is not None:
            return header[7:] == self.bearer
        return False


def _page_token(at: float, key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([at, key]).encode()).decode()


def create_app(jira: FakeJira) -> FastAPI:
    """The fake Jira REST API over ``jira`` (module docs)."""
    app = FastAPI(title="fake Jira Cloud REST API v3", openapi_url=None, docs_url=None)

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Any:
        with jira._lock:
            jira.requests.append((request.url.path, time.monotonic()))
            failure = jira._fail.pop(0) if jira._fail else None
        if not jira._authorized(request.headers.get("authorization", "")):
            return JSONResponse(
                {"errorMessages": ["Client must be authenticated to access this resource."]},
                status_code=401,
            )
        if failure is not None:
            status, after = failure
            resp = JSONResponse(
                {"errorMessages": ["Rate limit exceeded." if status == 429 else "Internal error"]},
                status_code=status,
            )
            if after is not None:
                resp.headers["Retry-After"] = f"{after:g}"
            return resp
        return await call_next(request)

    @app.get("/rest/api/3/search/jql")
    def search(request: Request) -> Any:
        q = request.query_params
        query = _parse_jql(q.get("jql", ""))
        if isinstance(query, str):
            return _jql_error(query)
        try:
            size = int(q.get("maxResults", "50"))
        except ValueError:
            return _jql_error("maxResults must be a number.")
        size = max(1, min(size, 5000))
        wanted = [f.strip() for f in q.get("fields", "").split(",") if f.strip()]
        after: tuple[float, str] | None = None
        if q.get("nextPageToken"):
            try:
                at, key = json.loads(base64.urlsafe_b64decode(q["nextPageToken"]))
                after = (float(at), str(key))
            except (ValueError, TypeError):
                return _jql_error("The nextPageToken is invalid or has expired.")
        with jira._lock:
            rows = [
                i
                for i in jira.issues.values()
                if (query.since is None or i["_at"] >= query.since)
                and (query.projects is None or i["fields"]["project"]["key"] in query.projects)
            ]
        rows.sort(key=lambda i: (i["_at"], i["key"]), reverse=query.descending)
        if after is not None:
            rows = [
                i
                for i in rows
                if (
                    (i["_at"], i["key"]) < after
                    if query.descending
                    else (i["_at"], i["key"]) > after
                )
            ]
        page, rest = rows[:size], rows[size:]

        def shown(i: Json) -> Json:
            fields = i["fields"]
            if wanted and "*all" not in wanted:
                fields = {k: v for k, v in fields.items() if k in wanted}
            return {
                "id": i["id"],
                "key": i["key"],
                "self": f"{jira.base_url}/rest/api/3/issue/{i['id']}",
                "fields": fields,
            }

        out: Json = {"issues": [shown(i) for i in page], "isLast": not rest}
        if rest:
            out["nextPageToken"] = _page_token(page[-1]["_at"], page[-1]["key"])
        return JSONResponse(out)

    @app.get("/rest/api/3/issue/{id_or_key}/remotelink")
    def remote_links(id_or_key: str) -> Any:
        with jira._lock:
            key = next((k for k, i in jira.issues.items() if id_or_key in (k, i["id"])), None)
            if key is None:
                return JSONResponse(
                    {
                        "errorMessages": [
                            "Issue does not exist or you do not have permission to see it."
                        ],
                        "errors": {},
                    },
                    status_code=404,
                )
            return [dict(x) for x in jira.remote_links.get(key, [])]

    return app


#: The custom field the demo issues carry their customers in.
CUSTOMER_FIELD = "customfield_10100"


def from_company(
    company: Any, *, domain: str = "example.com", drive_url: str = "https://drive.google.com"
) -> FakeJira:
    """Issues holding the demo company's work items (``svc.demo.company``).

    Each work item ``jira:<KEY>`` becomes the issue ``<KEY>`` (``done`` when closed, else
    ``indeterminate``), assigned to ``<assignee>@<domain>``. Its links: a linked document is a
    remote link to ``<drive_url>/file/d/<id>/view``; a linked ticket an issue link to the
    issue of that key (the demo's tickets are issues too, ``TCK-...``, in project ``TCK``);
    linked customers the custom field ``customfield_10100`` (comma-separated ids).
    """
    jira = FakeJira()
    tickets = {t.id for t in company.tickets}
    for t in company.tickets:
        status = t.attrs["status"]
        assignee = t.attrs.get("assignee")
        jira.put_issue(
            t.id,
            summary=f"Ticket {t.id}",
            category={"open": "new", "in_progress": "indeterminate"}.get(status, "done"),
            assignee=f"{assignee['__entity']['id']}@{domain}" if assignee else None,
        )
    for w in company.work_items:
        key = w.id.split(":", 1)[1]
        docs = [i for t, i in w.links if t == "Document"]
        customers = [i for t, i in w.links if t == "Customer"]
        jira.put_issue(
            key,
            summary=f"Work item {key}",
            category="done" if w.status == "closed" else "indeterminate",
            assignee=f"{w.assignee}@{domain}",
            links=[
                ("relates to", "outward", i) for t, i in w.links if t == "Ticket" and i in tickets
            ],
            remote_links=[f"{drive_url}/file/d/{d}/view" for d in docs],
            custom={CUSTOMER_FIELD: ",".join(customers)} if customers else None,
        )
    return jira
