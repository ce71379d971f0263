"""A tiny upstream MCP server for the gateway's tests (tests/test_gateway*.py).

Built with the ``mcp`` SDK's ``MCPServer``: tools that read and write documents held in memory
(``read_doc``, ``write_doc``), two that name no resource (``ping``, ``launch``), a resource
template and a prompt. ``python tests/gwupstream.py http [PORT]`` serves Streamable HTTP on
127.0.0.1 (on PORT, or a free port) and prints ``listening on <port>``;
``python tests/gwupstream.py stdio`` speaks MCP over its standard input and output.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

from svc.common.net import tcp_listener

DOCS: dict[str, str] = {"plan": "the plan", "secret": "the secret"}

server = MCPServer("gwupstream", instructions="Documents for the gateway's tests.")


@server.tool()
def read_doc(doc_id: str) -> str:
    """The document's text."""
    return DOCS.get(doc_id, "")


@server.tool()
def write_doc(doc_id: str, text: str) -> str:
    """Replaces the document's text."""
    DOCS[doc_id] = text
    return f"wrote {doc_id}"


@server.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


@server.tool()
def launch() -> str:
    """Launches the rocket (its policy asks the person for a security key)."""
    return "launched"


@server.resource("doc://{name}")
def doc(name: str) -> str:
    """A document as a resource."""
    return DOCS.get(name, "")


@server.prompt()
def summarize(doc_id: str) -> str:
    """A prompt asking for a summary."""
    return f"Summarize {doc_id}."


def main() -> None:
    """Serves over the transport named by the first argument (module docs)."""
    if sys.argv[1:] == ["stdio"]:
        server.run("stdio")
        return
    sock = tcp_listener("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
