"""What a client of an install needs to find it: the data directory, the caller token, targets.

Shared by the components' command-line clients (``svc policy``, ``svc challenge``, ...), the
services that call each other over gRPC, ``svc up`` and ``svc topology``, so none of them has
to import another's command-line module or ``svc.up`` (the layers of docs/architecture.md#layers).

* ``default_data_dir``: where ``svc up`` keeps everything (docs/quickstart.md);
* ``caller_token``: the bearer token a client command sends (docs/auth.md): the one it was
  given, else the caller token ``svc up`` writes to its data directory;
* ``grpc_target``: a gRPC target (``host:port``) from a service URL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["caller_token", "default_data_dir", "grpc_target"]

#: The file in ``svc up``'s data directory holding the caller token for the person at the
#: machine (docs/auth.md#svc-up-a-local-issuer-and-a-caller-token).
CALLER_TOKEN_FILE = "caller.token"


def default_data_dir() -> Path:
    """``$SVC_DATA_DIR``, else ``$XDG_DATA_HOME/svc``, else ``~/.local/share/svc``.

    The XDG Base Directory Specification's data home
    (https://specifications.freedesktop.org/basedir-spec/latest/). Nothing is created.
    """
    env = os.environ.get("SVC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "svc"


def caller_token(token: str | None) -> str | None:
    """The bearer token a client command sends (docs/auth.md).

    Args:
        token: the token the command was given (``--token``, an environment variable), or None.

    Returns:
        `token` stripped when given; else the content of ``caller.token`` in ``svc up``'s data
        directory (``default_data_dir()``) when that file exists and is not empty; else None
        (no token is sent, which a service without auth accepts).

    """
    if token:
        return token.strip()
    path = default_data_dir() / CALLER_TOKEN_FILE
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def grpc_target(url: str) -> str:
    """A gRPC target (``host:port``) from ``host:port`` or ``http(s)://host:port[/]``.

    gRPC's name syntax (https://grpc.github.io/grpc/core/md_doc_naming.html) takes no scheme
    for a plain address; the services' settings hold URLs.
    """
    return re.sub(r"^https?://", "", url).rstrip("/")
