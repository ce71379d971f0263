"""What clients of ``svc.policy.v1.PolicyService`` share: channel options and mode names.

Kept apart from ``svc.policy.transport`` (the server side: connectrpc, the service layer and its
database) so that the decision point's follower (``svc.pdp.follower``) and the ``svc policy``
client commands load only grpcio and the generated messages (docs/policy.md).
"""

from __future__ import annotations

from typing import Any

from svc.policy.v1 import policy_pb2 as pb

__all__ = ["CHANNEL_OPTIONS", "mode_name", "mode_value"]

#: grpcio refuses messages over 4 MiB by default; a bundle may be larger (the service's
#: ``max_bundle_bytes``, 8 MiB by default, plus framing).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]

_MODES: dict[str, Any] = {"enforce": pb.MODE_ENFORCE, "monitor": pb.MODE_MONITOR}


def mode_value(mode: str) -> Any:
    """``enforce``/``monitor`` as the ``Mode`` enum value (``MODE_UNSPECIFIED`` otherwise)."""
    return _MODES.get(mode, pb.MODE_UNSPECIFIED)


def mode_name(value: int) -> str:
    """A ``Mode`` enum value as ``enforce``/``monitor`` (``""`` for unspecified or unknown)."""
    return {v: k for k, v in _MODES.items()}.get(value, "")
