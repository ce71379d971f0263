"""``svc.authz.v1``: messages (``authz_pb2``) and stubs (``authz_pb2_grpc``).

Generated at build time by ``make proto`` from ``proto/svc/authz/v1/authz.proto``; not in git.
"""
