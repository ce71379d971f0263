"""``svc.policy.v1``: messages (``policy_pb2``) and grpcio stubs (``policy_pb2_grpc``).

Generated at build time by ``make proto`` from ``proto/svc/policy/v1/policy.proto``; not in git.
"""
