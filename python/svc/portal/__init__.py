"""The portal (svc-portal): the agents API for trusted apps, sign-in, GraphQL, MCP (docs/portal.md).

A client of the other services' APIs holding no state of its own but people's sessions:

* ``settings``: ``PortalSettings`` (``SVC_PORTAL_*``);
* ``clients``: typed clients of the decision point, the context service, the history (HTTP) and
  the challenge and policy services (gRPC);
* ``service``: ``PortalService``, every operation, each person's checked with the decision
  point as ``view`` or ``administer`` on ``PortalArea::"<area>"`` (``authorize``);
* ``apptokens``: the trusted apps' own tokens (the agents API);
* ``sessions``: OpenID Connect sign-in, the session cookie, CSRF;
* ``gql``: the GraphQL schema (strawberry) at ``/graphql``; ``schema.graphql`` is its SDL;
* ``mcp``: the MCP endpoint at ``/mcp`` and its intake events;
* ``app``: the HTTP face (``create_app``, ``serve``, ``PortalServer``); ``cli``: ``svc portal``.
"""
