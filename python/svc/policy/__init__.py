"""The policy service (svc-policy, docs/policy.md).

Validated drafts, signed bundles, the enforcement modes, outage fallbacks per MCP tool,
break-glass rollbacks and dry runs, served as gRPC ``svc.policy.v1.PolicyService`` next to the
health routes on one port. ``service`` holds the logic (``PolicyService``), ``transport`` the
gRPC face (connectrpc), ``app`` the ASGI app and server, ``signing`` the Ed25519 signatures a
decision point verifies (``svc.pdp.follower``), ``cli`` the ``svc policy`` commands.
"""
