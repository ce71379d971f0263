"""Listening sockets for the HTTP components that bind their port before their server starts.

``svc up`` and the policy service bind each port themselves (so a port in use is reported
before anything starts, and a server never races its first client) and hand the socket to
uvicorn or hypercorn. asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on sockets
whose protocol is ``IPPROTO_TCP`` (``asyncio.base_events._set_nodelay``); a socket made with the
default protocol 0 keeps it on, and every response written in two parts (headers, then body,
as ASGI servers write them) then waits for the peer's delayed ACK: about 40 ms per request on
Linux (RFC 1122 section 4.2.3.2, RFC 896). ``tcp_listener`` makes the socket so that asyncio
turns it off.
"""

from __future__ import annotations

import socket

__all__ = ["tcp_listener"]


def tcp_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (``host``, ``port``) with ``SO_REUSEADDR``, not listening yet.

    Its protocol is ``IPPROTO_TCP``, so asyncio sets ``TCP_NODELAY`` on every connection it
    accepts (module docs); ``TCP_NODELAY`` is also set on the socket itself.

    Args:
        host: an IPv4 or IPv6 address (brackets allowed); IPv6 when it holds a colon.
        port: the port, 0 for any free one.

    Returns:
        The bound socket; the caller listens (or hands it to a server) and closes it.

    Raises:
        OSError: the address cannot be bound (``errno`` ``EADDRINUSE`` when the port is in use,
            ``EACCES`` when it is not allowed); the socket is closed.

    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.bind((host.strip("[]"), port))
    except OSError:
        s.close()
        raise
    return s
