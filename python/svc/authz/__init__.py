"""Protocol buffers of the decision point API (``svc.authz.v1``).

Generated from ``proto/svc/authz/v1/authz.proto`` by ``make proto`` (grpcio-tools) at build time.
"""
