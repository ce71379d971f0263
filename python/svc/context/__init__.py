"""The context service (svc-context), docs/context.md.

A SCIM 2.0 directory, the principals snapshot and its watch, resources, work items, service
accounts, trusted apps, risk scores and investigations.

``serve(settings, auth)`` runs it with uvicorn until SIGINT/SIGTERM; ``ContextService`` is the
service layer and ``create_app`` its FastAPI app.
"""

from __future__ import annotations

from svc.context.settings import ContextAuthSettings, ContextSettings

__all__ = ["ContextAuthSettings", "ContextSettings", "serve"]


def serve(
    settings: ContextSettings, auth: ContextAuthSettings, *, access_log: bool = False
) -> None:
    """Migrates the database and serves the context service until SIGINT or SIGTERM.

    Args:
        settings: the component's settings (address, port, database, SCIM token, limits).
        auth: the ``/v1`` routes' caller settings (docs/auth.md).
        access_log: log one line per request.

    Raises:
        AuthConfigError: auth is off on a non-loopback address, or the JWKS cannot be loaded.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or migrated.

    """
    import uvicorn

    from svc.context.app import create_app
    from svc.context.service import ContextService

    auth.check_bind(settings.host)
    service = ContextService(settings)
    try:
        app = create_app(service, settings, auth)
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            access_log=access_log,
            log_level="info",
        )
    finally:
        service.close()
