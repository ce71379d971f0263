"""The portal's subscriptions' websocket: persisted operations and the session's lifetime.

GraphQL subscriptions (``svc.portal.gql.Subscription``) run over strawberry's
``graphql-transport-ws`` protocol on a websocket to ``/graphql`` (the protocol:
https://github.com/enisdenjo/graphql-ws/blob/master/PROTOCOL.md). The upgrade itself is checked
in ``svc.portal.app`` (``Origin`` must be ``PUBLIC_URL``'s, the session cookie must sign in);
this handler adds the two rules that hold while the socket is open (docs/portal.md#live-updates):

* **Persisted operations, as over HTTP.** A ``subscribe`` message names the web app's operation
  by hash (``payload.extensions.persistedQuery.sha256Hash`` or ``payload.extensions.documentId``;
  its ``query`` may then be empty), and the operation's text is taken from the build's manifest
  (``svc.portal.webapp.PersistedOperations.resolve``, the rule ``POST /graphql`` follows). An
  unknown hash, or a text of its own where only the app's operations run, is an ``error``
  message for that subscription (``extensions.code`` ``PERSISTED_QUERY_NOT_FOUND`` or
  ``PERSISTED_QUERY_REQUIRED``); the socket stays open.
* **The session's lifetime.** The socket lives only as long as the session that opened it: once
  a second (and at its expiry) the session cookie the upgrade carried is looked up again, and
  when it is signed out, expired or evicted every subscription ends and the socket is closed
  with ``4401`` (the protocol's "Unauthorized", which the reference client does not retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from strawberry.http import GraphQLRequestData
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import SubscribeMessage

from svc.common.problems import Problem
from svc.portal.sessions import COOKIE, SessionStore
from svc.portal.webapp import PersistedOperations

__all__ = ["SESSION_CHECK_SECS", "SESSION_ENDED", "LiveHandler", "live_handler"]

log = logging.getLogger("svc.portal.live")

#: How often an open socket's session is looked up again (seconds).
SESSION_CHECK_SECS = 1.0
#: The close code and reason once the session has ended.
SESSION_ENDED = (4401, "the session ended: sign in again")


class LiveHandler(BaseGraphQLTransportWSHandler[Any, Any]):
    """strawberry's ``graphql-transport-ws`` handler with the portal's rules (module docs).

    ``persisted`` and ``sessions`` are bound by ``live_handler``; the context is the portal's
    ``svc.portal.gql.Context`` (its ``request`` the websocket, its ``session`` the session).
    """

    persisted: PersistedOperations
    sessions: SessionStore

    async def handle(self) -> None:
        """Serves the socket while its session lives (module docs)."""
        watcher = asyncio.create_task(self._end_with_the_session())
        try:
            await super().handle()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _end_with_the_session(self) -> None:
        request = getattr(self.context, "request", None)
        cookie = request.cookies.get(COOKIE) if request is not None else None
        while True:
            session = self.sessions.get(cookie)
            if session is None:
                break
            left = session.expires_at - time.time()
            await asyncio.sleep(max(0.0, min(SESSION_CHECK_SECS, left + 0.01)))
        user = getattr(getattr(self.context, "session", None), "user", "?")
        log.info("%s's session ended: closing their subscriptions", user)
        for operation_id in list(self.operations):
            await self.cleanup_operation(operation_id)
        with contextlib.suppress(Exception):  # the socket may be closing already
            await self.websocket.close(*SESSION_ENDED)

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        """Puts the persisted operation's text in, or refuses it with an ``error`` message."""
        payload: Any = message.get("payload")
        if self.connection_acknowledged and message.get("id") not in self.operations:
            if not isinstance(payload, dict):
                await self.handle_invalid_message("Failed to parse message")
                return
            query = payload.get("query")
            extensions = payload.get("extensions")
            data = GraphQLRequestData(
                query=query if isinstance(query, str) and query else None,
                variables=None,
                operation_name=None,
                extensions=extensions if isinstance(extensions, dict) else None,
            )
            try:
                data = self.persisted.resolve(data)
            except Problem as p:
                code = p.slug.upper().replace("-", "_")
                await self.send_message(
                    {
                        "id": message["id"],
                        "type": "error",
                        "payload": [{"message": p.detail, "extensions": {"code": code}}],
                    }
                )
                return
            if data.query is None:
                await self.handle_invalid_message("Failed to parse message")
                return
            payload["query"] = data.query
        await super().handle_subscribe(message)


def live_handler(operations: PersistedOperations, sessions: SessionStore) -> type[LiveHandler]:
    """A ``LiveHandler`` class bound to the build's `operations` and the portal's `sessions`.

    Set it as the router's ``graphql_transport_ws_handler_class``.
    """
    return type("BoundLiveHandler", (LiveHandler,), {"persisted": operations, "sessions": sessions})
