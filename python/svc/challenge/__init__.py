"""The challenge service (svc-challenge, docs/challenges.md).

Step-up challenges (one per request fingerprint: opened, answered with a security key, a
justification or an approval, expired), the containment list every decision point follows, the
people's security keys (WebAuthn), and chat notifications through an outbox, served as gRPC
``svc.challenge.v1.ChallengeService`` next to the health routes on one port. ``service`` holds the
logic (``ChallengeService``), ``directory`` who answers (owners, managers), ``notify`` the outbox
worker, ``transport`` the gRPC face (connectrpc), ``app`` the ASGI app and server, ``cli`` the
``svc challenge`` commands.
"""
