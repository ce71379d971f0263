"""The gateway fast path's answer on the wire (docs/gateway.md#fast-path).

The fast path answers a tool call with one JSON body through the ASGI ``send`` of the server
``svc gateway`` runs (uvicorn with httptools, ``svc.common.connect.serve_asgi(http1=True)``).
uvicorn writes the head and the body separately; the fast path corks the agent's connection
(``TCP_CORK``) around the two writes so that they leave as one segment and the agent's client
wakes once. These tests run the same server on a real socket: the connection is corked while
the answer is written and uncorked after, and the whole answer is in the first read of a raw
client.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from svc.common.connect import ThreadedServer, serve_asgi
from svc.gateway.fastpath import _answer, _corked

BODY = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "x" * 600}]}}


class AsgiServer(ThreadedServer):
    """`app` under ``serve_asgi(http1=True)`` (uvicorn, as ``svc gateway`` runs) in a thread."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Any]) -> None:
        super().__init__("127.0.0.1", "test-gateway-wire")
        self.app = app

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve_asgi(self.app, self.host, 0, "test-gateway-wire", ready=ready, stop=stop, http1=True)


def _cork_state(send: Send) -> int:
    """``TCP_CORK`` of the connection behind uvicorn's `send` (as ``_corked`` finds it)."""
    sock = send.__self__.transport.get_extra_info("socket")  # type: ignore[attr-defined]
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK))


@pytest.fixture
def served() -> Iterator[tuple[AsgiServer, list[tuple[str, int]]]]:
    """A server answering every POST with ``_answer``; it notes the cork state around it."""
    seen: list[tuple[str, int]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": f"{kind}.complete"})
                if kind == "lifespan.shutdown":
                    return
        while (await receive()).get("more_body"):
            pass
        seen.append(("before", _cork_state(send)))
        with _corked(send):
            seen.append(("inside", _cork_state(send)))
        seen.append(("after", _cork_state(send)))
        await _answer(send, "sid-1", BODY)
        seen.append(("answered", _cork_state(send)))

    server = AsgiServer(app).start()
    try:
        yield server, seen
    finally:
        server.stop()


def _post(port: int, sock: socket.socket) -> bytes:
    """One POST on `sock` (connected to `port`); answers the bytes of its first ``recv``."""
    body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t"}}'
    head = (
        f"POST /mcp/demo HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json"
        f"\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock.recv(65536)


def test_the_answer_is_written_corked_and_the_connection_uncorked_after(
    served: tuple[AsgiServer, list[tuple[str, int]]],
) -> None:
    server, seen = served
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        for _ in range(3):  # the same keep-alive connection, answer after answer
            _post(server.port, sock)
    assert seen[:4] == [("before", 0), ("inside", 1), ("after", 0), ("answered", 0)]
    assert len(seen) == 12 and all(state == (name == "inside") for name, state in seen)


def test_the_first_read_holds_the_whole_answer(
    served: tuple[AsgiServer, list[tuple[str, int]]],
) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(20):
            first = _post(server.port, sock)
            head, _, body = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            assert b"mcp-session-id: sid-1" in head.lower()
            assert len(body) == length  # head and body came in one segment


def test_a_send_that_is_not_uvicorns_is_left_alone() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    with _corked(send):
        pass  # no transport to find: nothing to cork, nothing raised
    asyncio.run(_answer(send, "", BODY, 200))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert all(k != b"mcp-session-id" for k, _ in sent[0]["headers"])
