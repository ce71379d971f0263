"""Code every svc component shares (docs/architecture.md#code-layout-and-conventions).

``settings``: ``ComponentSettings``, the base of every settings class; ``cli``: command-line
options made from a settings class; ``auth_settings`` and ``auth``: caller authentication
(docs/auth.md); ``health``: the ``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` routes;
``problems``: RFC 9457 problem details and their FastAPI handlers; ``topics``: topic names and
the broker setting.
"""
