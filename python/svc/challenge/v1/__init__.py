"""``svc.challenge.v1``: messages (``challenge_pb2``) and grpcio stubs (``challenge_pb2_grpc``).

Generated at build time by ``make proto`` from ``proto/svc/challenge/v1/challenge.proto``; not in
git.
"""
