"""The portal (svc-portal): the agents API for trusted apps, sign-in, GraphQL (docs/portal.md).

A client of the other services' APIs holding no state of its own: ``settings`` (``SVC_PORTAL_*``),
``clients`` (typed clients of the decision point and the context service), ``apptokens`` (the
trusted apps' own tokens), ``service`` (every operation, each person's checked with the decision
point as ``view`` or ``administer`` on ``PortalArea::"<area>"``), ``app`` (the HTTP face),
``cli`` (``svc portal serve``).
"""
