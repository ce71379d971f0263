"""The demo company's tools: a small upstream MCP server of documents and tickets (docs/demo.md).

Agents reach tools through MCP; ``svc gateway`` sits in front of upstream servers and checks
every ``tools/call`` with the decision point. This module is the upstream ``svc up`` runs
behind the gateway so the demo has something to call: the demo company's documents
(``doc-0001``...) and tickets (``TCK-1001``...) of ``svc.demo.company``, kept in memory,
seeded from the company (same seed, same data), changed by the write tools until the process
ends. Built on the ``mcp`` SDK 2.x (``MCPServer``; https://modelcontextprotocol.io/specification).

Tools (``TOOLS`` says, for each, the argument that names the resource it reads or writes, the
resource's type, and whether it only reads; the gateway's per-tool mapping is made from it):

* ``search_documents(query, limit)``: documents whose title, department or tags contain the
  words (read-only; no single resource);
* ``read_document(document_id)``: one document with its text (read);
* ``update_document(document_id, text)``: replaces its text (write);
* ``list_tickets(status, limit)``: tickets, optionally of one status (read-only);
* ``read_ticket(ticket_id)``: one ticket with its comments (read);
* ``comment_ticket(ticket_id, comment)``: adds a comment (write);
* ``close_ticket(ticket_id, resolution)``: closes it (write).

Also a resource template ``demo://documents/{document_id}`` (a document's text), a resource
``demo://company`` (what the server holds) and a prompt ``triage_ticket(ticket_id)``, so
pass-through of resources and prompts can be seen.

Run: ``python -m svc.demo.tools_server`` (stdio, what ``svc up`` starts) or ``python -m
svc.demo.tools_server --http --port 8090`` (Streamable HTTP at ``/mcp``, with ``/healthz`` and
``/readyz``; what ``svc topology`` runs). For the demo only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp_types import ToolAnnotations

from svc.demo.company import Company, Resource, generate

__all__ = ["TOOLS", "DemoData", "ToolResource", "build_server", "main"]

#: The server's name in ``initialize`` (``serverInfo.name``) and the upstream name ``svc up``
#: gives it at the gateway (``/mcp/demo``).
NAME = "demo"

#: Most results a listing tool returns.
MAX_LIMIT = 50


@dataclass(frozen=True)
class ToolResource:
    """What one demo tool reads or writes, for the gateway's per-tool mapping.

    Attributes:
        argument: the argument naming the resource's id, None for a tool that names none.
        type: the resource's entity type (``Document``, ``Ticket``), None with no argument.
        read_only: the tool only reads (the gateway checks ``read``, else ``write``).

    """

    argument: str | None
    type: str | None
    read_only: bool


#: Tool name -> what it touches (module docs).
TOOLS: dict[str, ToolResource] = {
    "search_documents": ToolResource(None, None, True),
    "read_document": ToolResource("document_id", "Document", True),
    "update_document": ToolResource("document_id", "Document", False),
    "list_tickets": ToolResource(None, None, True),
    "read_ticket": ToolResource("ticket_id", "Ticket", True),
    "comment_ticket": ToolResource("ticket_id", "Ticket", False),
    "close_ticket": ToolResource("ticket_id", "Ticket", False),
}


def _ref(value: Any) -> str | None:
    """The id of a Cedar entity reference (``{"__entity": {"type", "id"}}``), else None."""
    if isinstance(value, dict) and isinstance(value.get("__entity"), dict):
        return str(value["__entity"]["id"])
    return None


def _title(r: Resource) -> str:
    """A readable title made from a resource's attributes (no clock, no randomness)."""
    what = "document" if r.type == "Document" else "ticket"
    words = [str(r.attrs.get("department", "")), *map(str, r.attrs.get("tags", [])), what, r.id]
    return " ".join(w for w in words if w)


@dataclass
class DemoData:
    """The documents and tickets the server serves, in memory.

    Attributes:
        documents: document id -> ``{id, title, owner, department, sensitivity, tags, text,
            version}`` (``version`` counts updates, from 1).
        tickets: ticket id -> ``{id, title, owner, assignee, department, status, priority,
            tags, customer, comments}`` (``comments`` a list of strings, oldest first).

    """

    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    tickets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_company(cls, company: Company) -> DemoData:
        """Seeds the data from the demo company's documents and tickets (``svc.demo.company``).

        A document's text is made from its attributes; a ticket starts with no comments.
        """
        data = cls()
        for d in company.documents:
            title = _title(d)
            data.documents[d.id] = {
                "id": d.id,
                "title": title,
                "owner": d.owner,
                "department": d.attrs["department"],
                "sensitivity": d.attrs["sensitivity"],
                "tags": list(d.attrs["tags"]),
                "text": f"{title}.\nOwned by {d.owner}; {d.attrs['sensitivity']}.",
                "version": 1,
            }
        for t in company.tickets:
            data.tickets[t.id] = {
                "id": t.id,
                "title": _title(t),
                "owner": t.owner,
                "assignee": _ref(t.attrs.get("assignee")),
                "department": t.attrs["department"],
                "status": t.attrs["status"],
                "priority": t.attrs["priority"],
                "tags": list(t.attrs["tags"]),
                "customer": _ref(t.attrs.get("customer")),
                "comments": [],
            }
        return data

    def document(self, document_id: str) -> dict[str, Any]:
        """The document; raises ``ToolError`` (a tool error the caller reads) when unknown."""
        try:
            return self.documents[document_id]
        except KeyError:
            raise ToolError(f"no document {document_id!r} (ids look like doc-0001)") from None

    def ticket(self, ticket_id: str) -> dict[str, Any]:
        """The ticket; raises ``ToolError`` when unknown."""
        try:
            return self.tickets[ticket_id]
        except KeyError:
            raise ToolError(f"no ticket {ticket_id!r} (ids look like TCK-1001)") from None


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    """A document without its text (what a search returns)."""
    return {k: v for k, v in doc.items() if k != "text"}


def build_server(company: Company | None = None) -> MCPServer[Any]:
    """The demo tools server (module docs) over a fresh copy of the company's data.

    Args:
        company: the demo company; None generates the default one (``generate()``, the one
            ``svc up`` provisions).

    Returns:
        An ``MCPServer`` named ``demo``: run it with ``run("stdio")`` or serve
        ``streamable_http_app()``. Unknown ids and bad arguments answer as tool errors
        (``isError: true``); an unknown resource as an MCP error (``-32602``).

    """
    data = DemoData.from_company(company if company is not None else generate())
    server: MCPServer[Any] = MCPServer(
        NAME,
        title="Demo company documents and tickets",
        instructions="The demo company's documents (doc-0001...) and tickets (TCK-1001...).",
        log_level="WARNING",
    )
    read = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    write = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

    @server.tool(annotations=read)
    def search_documents(query: str, limit: int = 10) -> dict[str, Any]:
        """Documents whose title, department or tags contain every word of the query.

        Returns {"documents": [...]} without their text, at most `limit` (1 to 50).
        """
        if not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit {limit}: between 1 and {MAX_LIMIT}")
        words = query.lower().split()
        hits = [
            _summary(d)
            for d in data.documents.values()
            if all(w in f"{d['title']} {' '.join(d['tags'])}".lower() for w in words)
        ]
        return {"documents": hits[:limit]}

    @server.tool(annotations=read)
    def read_document(document_id: str) -> dict[str, Any]:
        """One document with its text, by id (doc-0001...)."""
        return dict(data.document(document_id))

    @server.tool(annotations=write)
    def update_document(document_id: str, text: str) -> dict[str, Any]:
        """Replaces a document's text; returns the document with its new version."""
        doc = data.document(document_id)
        doc["text"] = text
        doc["version"] += 1
        return dict(doc)

    @server.tool(annotations=read)
    def list_tickets(status: str | None = None, limit: int = 10) -> dict[str, Any]:
        """Tickets, optionally of one status (open, in_progress, closed), at most `limit`."""
        if not 1 <= limit <= MAX_LIMIT:
            raise ToolError(f"limit {limit}: between 1 and {MAX_LIMIT}")
        hits = [
            {k: v for k, v in t.items() if k != "comments"}
            for t in data.tickets.values()
            if status is None or t["status"] == status
        ]
        return {"tickets": hits[:limit]}

    @server.tool(annotations=read)
    def read_ticket(ticket_id: str) -> dict[str, Any]:
        """One ticket with its comments, by id (TCK-1001...)."""
        return dict(data.ticket(ticket_id))

    @server.tool(annotations=write)
    def comment_ticket(ticket_id: str, comment: str) -> dict[str, Any]:
        """Adds a comment to a ticket; returns the ticket."""
        if not comment.strip():
            raise ToolError("an empty comment")
        ticket = data.ticket(ticket_id)
        ticket["comments"].append(comment)
        return dict(ticket)

    @server.tool(annotations=write)
    def close_ticket(ticket_id: str, resolution: str) -> dict[str, Any]:
        """Closes a ticket with a resolution (added as its last comment); returns the ticket."""
        ticket = data.ticket(ticket_id)
        if ticket["status"] == "closed":
            raise ToolError(f"ticket {ticket_id} is closed already")
        ticket["status"] = "closed"
        ticket["comments"].append(f"closed: {resolution}")
        return dict(ticket)

    @server.resource("demo://company", mime_type="application/json")
    def company_resource() -> dict[str, Any]:
        """What the server holds: counts of documents and tickets by status."""
        statuses: dict[str, int] = {}
        for t in data.tickets.values():
            statuses[t["status"]] = statuses.get(t["status"], 0) + 1
        return {"documents": len(data.documents), "tickets": statuses}

    @server.resource("demo://documents/{document_id}", mime_type="text/plain")
    def document_resource(document_id: str) -> str:
        """A document's text."""
        doc = data.documents.get(document_id)
        if doc is None:
            raise ResourceNotFoundError(f"no document {document_id!r}")
        return str(doc["text"])

    @server.prompt()
    def triage_ticket(ticket_id: str) -> str:
        """Asks the model to triage a ticket: read it, comment, close it when it is done."""
        t = data.tickets.get(ticket_id)
        about = f"{t['title']} (status {t['status']}, priority {t['priority']})" if t else ""
        return (
            f"Triage ticket {ticket_id} {about}. Read it with read_ticket, add a comment with "
            "comment_ticket saying what happens next, and close it with close_ticket only "
            "when nothing is left to do."
        )

    return server


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m svc.demo.tools_server [--http --host H --port N] [--seed S --people P]``.

    Serves over stdio by default, over Streamable HTTP at ``/mcp`` with ``--http``; returns 0
    when the transport ends (stdin closed, or Ctrl-C for HTTP).
    """
    p = argparse.ArgumentParser(prog="python -m svc.demo.tools_server", description=__doc__)
    p.add_argument("--http", action="store_true", help="Streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--seed", type=int, default=7, help="the demo company's seed")
    p.add_argument("--people", type=int, default=300, help="the demo company's size")
    args = p.parse_args(argv)
    server = build_server(generate(args.seed, args.people))
    if args.http:
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        async def probe(request: Request) -> JSONResponse:
            """Ready once serving: the company is generated before the port listens."""
            return JSONResponse({"status": "ok"})

        for path in ("/healthz", "/readyz"):
            server.custom_route(path, methods=["GET"])(probe)

        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
