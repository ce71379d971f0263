"""A local OpenID Connect provider for ``svc up``'s demo and the tests: never for an install.

``DevIdentityProvider`` runs ``oidc-provider-mock`` (a Flask app on Authlib; a dev dependency,
docs/dependencies.md) in a thread on a loopback port, so the challenge page has someone to sign
in with (docs/challenges.md#the-page). Its sign-in form asks only for a user name and trusts
it: anybody can be anybody. A real install sets ``oidc_issuer`` to its own provider.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from svc.common.net import tcp_listener

__all__ = ["DevIdentityProvider"]

log = logging.getLogger("svc.challenge")


class DevIdentityProvider:
    """oidc-provider-mock on ``host:port`` in a thread: ``start()``, ``issuer``, ``stop()``.

    Args:
        host: a loopback address to bind (``127.0.0.1``).
        port: the port, 0 for any free one.
        users: user names known in advance, each with the claims ``preferred_username`` (the
            name) and ``email`` (``<name>@example.com``); a name typed in the sign-in form that
            is not among them gets only ``email``.

    The provider requires a ``nonce`` on every authorization request and accepts any client
    id and secret (oidc-provider-mock's defaults).

    Raises (from ``start``):
        OSError: the port cannot be bound.

    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, users: Sequence[str] = ()) -> None:
        self.host = host
        self.port = port
        self.users = list(users)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def issuer(self) -> str:
        """``http://<host>:<port>``: the issuer URL the provider names itself by."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> DevIdentityProvider:
        """Binds the port and serves in a daemon thread; returns self once it listens."""
        import oidc_provider_mock
        import werkzeug.serving

        app = oidc_provider_mock.app(
            require_nonce=True,
            user_claims=[
                oidc_provider_mock.User(
                    sub=u, claims={"preferred_username": u, "email": f"{u}@example.com"}
                )
                for u in self.users
            ],
        )
        sock = tcp_listener(self.host, self.port)
        try:
            sock.listen(64)
            self._server = werkzeug.serving.make_server(
                self.host, 0, app, threaded=True, fd=sock.fileno()
            )
        finally:
            sock.close()  # the server holds its own duplicate
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.2,), name="svc-dev-idp", daemon=True
        )
        self._thread.start()
        log.info("development OpenID Connect provider at %s", self.issuer)
        return self

    def stop(self) -> None:
        """Stops serving and closes the socket (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
