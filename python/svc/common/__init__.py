"""Code every svc component shares: caller authentication (``svc.common.auth``, docs/auth.md)."""
