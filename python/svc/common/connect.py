"""What every gRPC control-plane service shares: endpoints, callers' tokens, one port.

docs/architecture.md#code-layout-and-conventions.

The policy service and the challenge service are each a ``google.protobuf`` service served by
connectrpc (gRPC, gRPC-Web and Connect) beside the shared probe routes on one port, by
hypercorn (HTTP/1.1 and HTTP/2 cleartext), in this process or a thread of its own:

* ``endpoints``: one connectrpc endpoint per method of a service descriptor. There is no
  connectrpc code generator for the runtime grpcio-tools generates, so the table is made from
  the descriptor; a method without a handler is an error at start, never a silent gap.
* ``BearerInterceptor``: the callers' bearer tokens (docs/auth.md), checked before a message
  is read.
* ``status_error``: a service layer's ``svc.common.errors.ServiceError`` as a gRPC status,
  its violations as a ``google.rpc.BadRequest`` detail; message and violations bounded
  (``MAX_STATUS_CHARS``, ``MAX_VIOLATIONS``), so a huge bad value never comes back whole.
* ``safe_codecs``: the binary and JSON codecs, whose refusals are ``INVALID_ARGUMENT`` with a
  short fixed text (never a Python repr nor the input); JSON bodies pass
  ``svc.common.limits.parse_json`` (UTF-8, depth, no lone surrogate) first.
* ``timestamp``: an aware ``datetime`` as ``google.protobuf.Timestamp``.
* ``ServiceHandlers`` and ``ServiceApp``: the base of a service's handlers (each blocking
  service call in a worker thread, counted by method and outcome, its ``ServiceError`` as a
  gRPC status, any other exception an ``INTERNAL`` status naming no internals) and the
  connectrpc app over them (endpoints, codecs, the bearer check).
* ``serve_asgi``: binds the port (``svc.common.net.tcp_listener``) and runs hypercorn until a
  stop event or a signal; ``ThreadedServer``: the same in a thread, ``start()`` returning once
  the port listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, Self, TypeVar

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.codec import Codec
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from prometheus_client import Counter
from protobuf.wkt import Any as AnyDetail
from starlette.types import ASGIApp, Receive, Scope, Send

from svc.common.auth import (
    MISSING_TOKEN,
    PERSON_HEADER,
    AuthConfigError,
    AuthError,
    Verifier,
    set_current_caller,
)
from svc.common.auth_settings import AuthSettings
from svc.common.errors import Code as ErrorCode
from svc.common.errors import ServiceError
from svc.common.limits import JsonRejected, bounded, parse_json
from svc.common.net import tcp_listener

__all__ = [
    "METRICS_CONTENT_TYPE",
    "BearerInterceptor",
    "ServiceApp",
    "ServiceHandlers",
    "ThreadedServer",
    "endpoints",
    "one_port",
    "safe_codecs",
    "serve_asgi",
    "status_error",
    "timestamp",
    "verifier_of",
]

log = logging.getLogger("svc.common.connect")

#: The Prometheus text exposition format's content type (version 0.0.4).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def timestamp(t: datetime | None) -> Timestamp | None:
    """A ``google.protobuf.Timestamp`` of an aware time (any zone, stored as UTC), or None."""
    if t is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(t.astimezone(UTC))
    return ts


_CODES: dict[ErrorCode, Code] = {
    "invalid_argument": Code.INVALID_ARGUMENT,
    "not_found": Code.NOT_FOUND,
    "failed_precondition": Code.FAILED_PRECONDITION,
    "permission_denied": Code.PERMISSION_DENIED,
    "unavailable": Code.UNAVAILABLE,
}


#: The most characters of a status message, and of a violation's field or description.
MAX_STATUS_CHARS = 512
#: The most field violations one status carries.
MAX_VIOLATIONS = 50


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 24]}...({len(text)} chars)"


def status_error(e: ServiceError) -> ConnectError:
    """``e`` as the gRPC status a transport answers (https://grpc.io/docs/guides/error/).

    Args:
        e: the service layer's refusal.

    Returns:
        A ``ConnectError`` with ``e.code``'s status and ``e.message`` (at most
        ``MAX_STATUS_CHARS`` characters); ``e.violations``, when there are any, as one
        ``google.rpc.BadRequest`` detail of field violations (at most ``MAX_VIOLATIONS``, each
        part at most ``MAX_STATUS_CHARS`` characters).

    """
    details = []
    if e.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=_cap(v.field, MAX_STATUS_CHARS),
                    description=_cap(v.description, MAX_STATUS_CHARS),
                )
                for v in e.violations[:MAX_VIOLATIONS]
            ]
        )
        details.append(
            AnyDetail(
                type_url="type.googleapis.com/google.rpc.BadRequest",
                value=bad.SerializeToString(),
            )
        )
    return ConnectError(_CODES[e.code], _cap(e.message, MAX_STATUS_CHARS), details=details)


_FAILED_FIELD = re.compile(r"Failed to parse ([A-Za-z_][\w.\[\]]{0,128}) field")


class _BinaryCodec(Codec[Message, Any]):
    """Protobuf binary, refusing a bad message with a fixed ``INVALID_ARGUMENT`` text."""

    def name(self) -> str:
        return "proto"

    def encode(self, message: Message) -> bytes:
        return bytes(message.SerializeToString())

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return message_class.FromString(bytes(data))
        except (DecodeError, ValueError, RecursionError):
            raise ConnectError(
                Code.INVALID_ARGUMENT,
                f"the request is not a valid {message_class.DESCRIPTOR.name} (protobuf binary)",
            ) from None


class _JsonCodec(Codec[Message, Any]):
    """Protobuf's JSON mapping over ``parse_json``: bad input is a short ``INVALID_ARGUMENT``.

    Unknown fields are ignored (as connectrpc's own JSON codec does).
    """

    def name(self) -> str:
        return "json"

    def encode(self, message: Message) -> bytes:
        return str(json_format.MessageToJson(message)).encode()

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        kind = message_class.DESCRIPTOR.name
        try:
            value = parse_json(bytes(data)) if data else {}
        except JsonRejected as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        if not isinstance(value, dict):
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"the request is not a valid {kind}: expected a JSON object"
            )
        message = message_class()
        try:
            json_format.ParseDict(value, message, ignore_unknown_fields=True)
        except Exception as e:  # ParseError, and TypeError/ValueError from inside json_format
            found = _FAILED_FIELD.match(str(e))
            where = (
                f": field `{bounded(found.group(1))}` has the wrong type or value" if found else ""
            )
            raise ConnectError(
                Code.INVALID_ARGUMENT,
                f"the request is not a valid {kind} (protobuf JSON mapping){where}",
            ) from None
        return message


def safe_codecs() -> list[Codec[Any, Any]]:
    """The codecs of every svc Connect app: protobuf binary and JSON (module docs).

    Returns:
        ``[binary, json]``; their ``decode`` raises ``ConnectError(INVALID_ARGUMENT)`` with a
        short text naming the message type (and the bad field when protobuf names it), never
        the input nor a Python repr.

    """
    return [_BinaryCodec(), _JsonCodec()]


def endpoints(pb: ModuleType, service: str, handlers: object) -> dict[str, Any]:
    """One connectrpc endpoint per method of a proto service, keyed by its gRPC path.

    Args:
        pb: the grpcio-tools module of the proto (``*_pb2``) holding the service and its
            messages.
        service: the service's full name (``svc.policy.v1.PolicyService``).
        handlers: an object with one coroutine method per unary method (request -> response)
            and one async-generator method per server-streaming method, named as in the
            proto.

    Returns:
        ``{"/<service>/<Method>": Endpoint}`` for ``ConnectASGIApplication``.

    Raises:
        RuntimeError: a method of the proto has no handler.

    """
    desc = pb.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[-1]]
    out: dict[str, Any] = {}
    for m in desc.methods:
        fn = getattr(handlers, m.name, None)
        if fn is None:
            raise RuntimeError(f"no handler for {service}/{m.name}")
        streaming = m.server_streaming
        info: MethodInfo[Any, Any] = MethodInfo(
            name=m.name,
            service_name=service,
            input=getattr(pb, m.input_type.name),
            output=getattr(pb, m.output_type.name),
            idempotency_level=IdempotencyLevel.UNKNOWN,
            stream_type=StreamType.SERVER_STREAM if streaming else StreamType.UNARY,
        )
        path = f"/{service}/{m.name}"
        if streaming:
            out[path] = Endpoint.server_stream(method=info, function=_drop_ctx_stream(fn))
        else:
            out[path] = Endpoint.unary(method=info, function=_drop_ctx(fn))
    return out


T = TypeVar("T")
H = TypeVar("H", bound="ServiceHandlers")


class ServiceHandlers:
    """The base of a control-plane service's connectrpc handlers (one coroutine per method).

    Args:
        calls: the service's calls counter, labelled ``method`` and ``code`` (``ok`` or the
            ``ServiceError`` code).

    """

    def __init__(self, calls: Counter) -> None:
        self._calls = calls

    async def _call(self, method: str, fn: Callable[[], T]) -> T:
        """Runs the blocking service call ``fn`` in a worker thread and counts it.

        Returns:
            What ``fn`` returns.

        Raises:
            ConnectError: ``fn`` raised a ``ServiceError`` (``status_error``'s status), or any
                other exception (``INTERNAL``, the exception logged, never answered).

        """
        try:
            out = await anyio.to_thread.run_sync(fn)
        except ServiceError as e:
            self._calls.labels(method, e.code).inc()
            raise status_error(e) from None
        except ConnectError:
            self._calls.labels(method, "connect_error").inc()
            raise
        except Exception:
            log.exception("%s failed", method)
            self._calls.labels(method, "internal").inc()
            raise ConnectError(Code.INTERNAL, _INTERNAL) from None
        self._calls.labels(method, "ok").inc()
        return out


class ServiceApp(ConnectASGIApplication[H]):
    """The ASGI app serving one proto service's handlers (gRPC, gRPC-Web and Connect).

    Args:
        handlers: the service's handlers, one per method of the proto (``endpoints``).
        pb: the proto's grpcio-tools module (``*_pb2``).
        service: the service's full name (``svc.policy.v1.PolicyService``).
        max_message_bytes: largest request message.
        verifier: checks every call's bearer token (``BearerInterceptor``); None admits every
            caller (a loopback bind only).

    Raises:
        RuntimeError: a method of the proto has no handler.

    """

    def __init__(
        self,
        handlers: H,
        pb: ModuleType,
        service: str,
        max_message_bytes: int,
        verifier: Verifier | None = None,
    ) -> None:
        self._service_name = service
        super().__init__(
            service=handlers,
            endpoints=lambda h: endpoints(pb, service, h),
            read_max_bytes=max_message_bytes,
            codecs=safe_codecs(),
            interceptors=[BearerInterceptor(verifier)] if verifier is not None else (),
        )

    @property
    def path(self) -> str:
        """``/<service>``: the prefix of every method's path."""
        return f"/{self._service_name}"


#: The status of an exception a handler let escape: nothing of it reaches the caller.
_INTERNAL = "the service failed to answer this call; its log has the error"


def _drop_ctx(
    fn: Callable[[Any], Awaitable[Any]],
) -> Callable[[Any, RequestContext[Any, Any]], Awaitable[Any]]:
    """A unary handler as connectrpc calls it; an escaped exception is ``INTERNAL``, logged."""

    async def call(req: Any, ctx: RequestContext[Any, Any]) -> Any:
        try:
            return await fn(req)
        except ConnectError:
            raise
        except ServiceError as e:
            raise status_error(e) from None
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", "a call"))
            raise ConnectError(Code.INTERNAL, _INTERNAL) from None

    return call


def _drop_ctx_stream(
    fn: Callable[[Any], AsyncIterator[Any]],
) -> Callable[[Any, RequestContext[Any, Any]], AsyncIterator[Any]]:
    """A streaming handler as connectrpc calls it; an escaped exception ends it ``INTERNAL``."""

    async def call(req: Any, ctx: RequestContext[Any, Any]) -> AsyncIterator[Any]:
        stream = fn(req)
        try:
            async for item in stream:
                yield item
        except ConnectError:
            raise
        except ServiceError as e:
            raise status_error(e) from None
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", "a stream"))
            raise ConnectError(Code.INTERNAL, _INTERNAL) from None
        finally:  # the handler's own cleanup (unsubscribing) runs now, not when collected
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    return call


def verifier_of(auth: AuthSettings | None) -> Verifier | None:
    """The ``Verifier`` of a service's caller settings, its issuer's keys loaded now.

    Args:
        auth: the service's ``AuthSettings``; None or auth off: no verifier.

    Returns:
        The verifier for ``BearerInterceptor``, or None (every caller admitted; a loopback
        bind only, ``AuthSettings.check_bind``).

    Raises:
        AuthConfigError: the issuer's keys cannot be loaded (at start, not on the first call).

    """
    if auth is None or not auth.enabled:
        return None
    verifier = Verifier(auth)
    verifier.source.keys()
    return verifier


def one_port(grpc_app: ASGIApp, http_app: ASGIApp, service: str) -> ASGIApp:
    """One ASGI app: the gRPC paths of ``service`` to ``grpc_app``, the rest to ``http_app``.

    Args:
        grpc_app: the connectrpc app (``/<service>/<Method>``).
        http_app: the probes' FastAPI app; it also gets the lifespan events.
        service: the service's full name (``svc.policy.v1.PolicyService``).

    Returns:
        An ASGI 3 callable.

    """
    prefix = f"/{service}/"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix):
            await grpc_app(scope, receive, send)
        else:
            await http_app(scope, receive, send)

    return app


class BearerInterceptor:
    """A connectrpc metadata interceptor admitting only the callers a ``Verifier`` accepts.

    Runs before the request message is read (connectrpc's ``MetadataInterceptor``). The token is
    the ``authorization`` metadata entry, ``Bearer <JWT>`` (RFC 6750 section 2.1; docs/auth.md),
    verified in a worker thread (a JWKS reload may fetch over the network). The caller's role
    must be one ``svc.common.roles.METHODS`` lists for the method; ``PERSON_HEADER`` is read
    (the portal only), and the caller becomes the call's ``svc.common.auth.current_caller``
    (the handlers run in the same task).

    Args:
        verifier: the service's verifier (``svc.common.auth.Verifier`` of its auth settings).

    Raises (from ``on_start``, answered as the call's status):
        ConnectError: ``UNAUTHENTICATED`` for no token or one that does not verify,
            ``PERMISSION_DENIED`` for a caller not listed or a role the method does not admit
            (the message names the method and the role), ``UNAVAILABLE`` when the issuer's
            keys cannot be loaded; the message is ``AuthError``'s detail (never the token).

    """

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    async def on_start(self, ctx: RequestContext[Any, Any]) -> None:
        """Checks the call's bearer token (class docs)."""
        header = ctx.request_headers.get("authorization", "").strip()
        scheme, _, token = header.partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError(401, MISSING_TOKEN, missing=True)
            caller = await anyio.to_thread.run_sync(self.verifier.verify, token.strip())
            self.verifier.authorize(caller, ctx.method.name)
            caller = self.verifier.acting_for(caller, ctx.request_headers.get(PERSON_HEADER))
            set_current_caller(caller)
        except AuthError as e:
            code = Code.PERMISSION_DENIED if e.status == 403 else Code.UNAUTHENTICATED
            raise ConnectError(code, e.detail) from None
        except AuthConfigError as e:
            log.error("cannot verify bearer tokens: %s", e)
            raise ConnectError(Code.UNAVAILABLE, "the issuer's keys cannot be loaded") from None

    async def on_end(
        self, token: None, ctx: RequestContext[Any, Any], error: Exception | None
    ) -> None:
        """Nothing to do at the end of a call."""


#: How long a stopped hypercorn server may take past its ``graceful_timeout`` (its app's
#: lifespan shutdown included) before its loop is left (``_serve_until_stopped``).
STOP_BOUND_SECS = 30.0


def _config(fd: int, errorlog: str) -> Config:
    cfg = Config()
    cfg.bind = [f"fd://{fd}"]
    cfg.graceful_timeout = 1.0  # watch streams never end on their own
    # Hypercorn closes a connection after 1,000 requests by default, and on HTTP/2 its GOAWAY
    # fails the call in flight (grpcio reports UNAVAILABLE): gRPC clients keep one connection
    # for everything, so there is no per-connection request limit here.
    cfg.keep_alive_max_requests = 2**62
    # Idle HTTP/2 connections (no stream open) close after this; clients reconnect on use.
    cfg.keep_alive_timeout = 75.0
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger(errorlog)
    return cfg


def serve_asgi(
    app: Any,
    host: str,
    port: int,
    name: str,
    *,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    http1: bool = False,
) -> None:
    """Serves an ASGI app with hypercorn on ``host:port`` in this thread until stopped.

    With ``http1``, uvicorn with its ``httptools`` parser serves instead: HTTP/1.1 only (no
    gRPC), for a component that serves no gRPC and whose requests are many and small (the MCP
    gateway): measured on one small JSON POST, 0.11 ms of the server's CPU against hypercorn's
    0.29 ms (docs/dependencies.md).

    Args:
        app: the ASGI 3 app (gRPC paths and the probe routes, dispatched by the caller's app).
        host: the address to bind (IPv6 in brackets or not).
        port: the port; 0 for a free one.
        name: the component (``svc-policy``): names the log lines, the error logger
            (``svc.<component>.http``) and the stop thread.
        ready: called with the bound port once the socket listens.
        stop: ends the server when set (open streams are ended after one second; with
            hypercorn, a server still shutting down ``STOP_BOUND_SECS`` later is left, logged,
            so that a stop never hangs); without it SIGINT and SIGTERM do (main thread only).
        http1: serve with uvicorn and httptools (above).

    Raises:
        OSError: the port cannot be bound.

    """
    sock = tcp_listener(host, port)
    sock.listen(1024)
    sock.set_inheritable(True)
    bound = int(sock.getsockname()[1])
    if http1:
        _serve_uvicorn(app, sock, name, bound, host, ready, stop)
        return
    # Hypercorn takes the descriptor over (its socket closes it at shutdown).
    cfg = _config(sock.detach(), f"svc.{name.removeprefix('svc-')}.http")
    log.info("%s listening on %s:%d", name, host, bound)
    if ready is not None:
        ready(bound)
    if stop is None:
        asyncio.run(hypercorn_serve(app, cfg))
        return
    _serve_until_stopped(app, cfg, name, stop)


class _Abandoned(Exception):
    """The server did not finish within its bound after ``stop``: its loop is left."""


def _serve_until_stopped(app: Any, cfg: Config, name: str, stop: threading.Event) -> None:
    """Hypercorn until `stop` is set, then at most ``graceful_timeout + STOP_BOUND_SECS`` more.

    Hypercorn cancels the connections still open after ``graceful_timeout`` and waits for the
    cancelled tasks to end (Python 3.11's ``asyncio.wait_for``), so one task that swallows its
    cancellation would keep the server, and whoever stops it, waiting for good. Past the bound
    the loop is stopped and closed with whatever is left (logged): stopping never hangs.
    """
    loop = asyncio.new_event_loop()
    done = asyncio.Event()

    def wake() -> None:
        stop.wait()
        with contextlib.suppress(RuntimeError):  # the loop ended on its own and is closed
            loop.call_soon_threadsafe(done.set)

    watcher = threading.Thread(target=wake, name=f"{name}-stop", daemon=True)

    async def main() -> None:
        server = asyncio.ensure_future(hypercorn_serve(app, cfg, shutdown_trigger=done.wait))
        stopped = asyncio.ensure_future(done.wait())
        await asyncio.wait({server, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not server.done():
            ended, _ = await asyncio.wait({server}, timeout=cfg.graceful_timeout + STOP_BOUND_SECS)
            if not ended:
                log.warning(
                    "%s: still shutting down %.0f s after stop; its loop is left with what is "
                    "still open",
                    name,
                    cfg.graceful_timeout + STOP_BOUND_SECS,
                )
                raise _Abandoned
        stopped.cancel()
        server.result()

    watcher.start()
    abandoned = False
    try:
        loop.run_until_complete(main())
    except _Abandoned:
        abandoned = True
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:  # each gets one chance to end; one that will not is left behind
            loop.run_until_complete(asyncio.wait(left, timeout=1.0))
            for task in left:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.debug("%s: a task ended with %r at stop", name, task.exception())
        if not abandoned:  # as asyncio.run ends a loop
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        if stop.is_set():
            watcher.join()  # it has woken the loop already: no thread outlives the server


def _serve_uvicorn(
    app: Any,
    sock: Any,
    name: str,
    bound: int,
    host: str,
    ready: Callable[[int], None] | None,
    stop: threading.Event | None,
) -> None:
    """``serve_asgi`` with ``http1``: uvicorn (httptools) on the listening socket `sock`."""
    import uvicorn

    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)
    log.info("%s listening on %s:%d", name, host, bound)
    if ready is not None:
        ready(bound)

    async def main() -> None:
        watcher = None
        if stop is not None:
            loop = asyncio.get_running_loop()

            def wait() -> None:
                stop.wait()
                loop.call_soon_threadsafe(setattr, server, "should_exit", True)

            watcher = threading.Thread(target=wait, name=f"{name}-stop", daemon=True)
            watcher.start()
        try:
            await server.serve(sockets=[sock])
        finally:
            sock.close()
        if watcher is not None and stop is not None and stop.is_set():
            watcher.join()

    asyncio.run(main())


class ThreadedServer:
    """A service's ``serve`` in a thread of its own: ``start()`` returns once the port listens.

    Subclasses implement ``_serve(ready, stop)``: run the service until ``stop`` is set, calling
    ``ready(port)`` once the socket listens (as ``serve_asgi`` does).

    Args:
        host: the address the service binds (for ``url`` and ``target``).
        name: the thread's name.

    """

    def __init__(self, host: str, name: str) -> None:
        self.host = host
        self.port = 0
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._serve(self._ready, self._stop)
        except BaseException as e:
            self._error = e
            self._listening.set()

    def _ready(self, port: int) -> None:
        self.port = port
        self._listening.set()

    def start(self) -> Self:
        """Starts serving; returns once the socket listens.

        Raises:
            AuthConfigError: the service's caller settings are refused (``check_bind``) or the
                issuer's keys cannot be loaded.
            OSError: the port cannot be bound (or any error that stopped the server).

        """
        self._thread.start()
        self._listening.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """``host:port``, a gRPC channel's target."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Stops the server (open streams end) and waits for its thread."""
        self._stop.set()
        self._thread.join()
