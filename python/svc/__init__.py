"""svc: an access-decision and audit-intake service.

The decision core is Rust (`svc._pdp_core`, built from `crates/pdp_py`, which binds
`crates/pdp_core` and `crates/pdp_server`); everything else is Python. Public entry points:
`svc.pdp` (the in-process decision engine) and the `svc` command line (`svc.cli`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("svc")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
