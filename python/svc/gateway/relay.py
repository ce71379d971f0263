"""What an upstream sends on its own, relayed to the agent whose call caused it.

docs/gateway.md#relaying: each upstream has one MCP session shared by every agent, so what the
upstream sends during a forwarded request (progress notifications, ``notifications/message``,
``sampling/createMessage`` and ``elicitation/create``) must be traced back to the agent's
request that the gateway forwarded. The MCP Streamable HTTP transport sends these on the
response stream of the request they relate to
(https://modelcontextprotocol.io/specification/2025-11-25/basic/transports#sending-messages-to-the-server),
but the ``mcp`` SDK's client hands them to its callbacks without saying which request's stream
they came on. So:

* each forwarded request the gateway relays for carries a key of its own in ``_meta``
  (``svc/relay``, ``RELAY_META``; the upstream ignores it, as MCP lets it for ``_meta`` keys it
  does not know);
* ``RelayTagging``, the gateway's ``httpx2`` transport to a Streamable HTTP upstream, reads that
  key from the POST it sends and writes it into the ``_meta`` of every request and
  notification that comes back on that POST's event stream;
* ``UpstreamRelays`` (one per upstream) holds the requests in flight by key (``Relay``, the
  agent's side, made by the proxy in ``svc.gateway.app``) and is the ``ClientSession``'s
  sampling, elicitation, logging and message callbacks: a tagged message goes to its request's
  agent; a server-to-client request that names none, or whose request is over, is answered
  with an MCP error (never left waiting).

Progress needs no tag: the SDK gives the forwarded request a progress token of its own and
calls its ``progress_callback``. A stdio upstream has one stream for everything, so there an
untagged message goes to the one request in flight when there is exactly one, else nowhere.
``notifications/resources/updated`` goes to every agent session subscribed to the resource.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientRequestContext

__all__ = [
    "LEVELS",
    "RELAYED_CAPABILITIES",
    "RELAY_META",
    "Relay",
    "RelayTagging",
    "TaggedEvents",
    "UpstreamRelays",
    "event_data",
    "event_lines",
    "relayed_capabilities",
]

log = logging.getLogger("svc.gateway")

#: The ``_meta`` key of a forwarded request's relay key (module docs).
RELAY_META = "svc/relay"
#: MCP log levels from the most verbose (RFC 5424 severities, as MCP's logging utility says:
#: https://modelcontextprotocol.io/specification/2025-11-25/server/utilities/logging).
LEVELS: tuple[types.LoggingLevel, ...] = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
#: Agent sessions remembered per upstream, for their log levels and to tell them of list changes
#: (the oldest are forgotten first).
MAX_SESSION_LEVELS = 10_000


#: The client capabilities whose requests the gateway relays to the agent (sampling,
#: elicitation, roots): an agent's declared ones of these go upstream with its requests.
RELAYED_CAPABILITIES = ("sampling", "elicitation", "roots")


def relayed_capabilities(declared: Any) -> dict[str, Any]:
    """The relayed part of an agent's declared client capabilities (a JSON object; else none)."""
    if not isinstance(declared, dict):
        return {}
    return {k: declared[k] for k in RELAYED_CAPABILITIES if k in declared}


class Relay(Protocol):
    """The agent's side of one forwarded request: where its upstream's messages go.

    Implemented by ``svc.gateway.app`` over the agent's MCP request context; each method sends
    on the agent request's own response stream (``related_request_id``).

    Attributes:
        min_level: the agent's log level (its session's, or a 2026-07-28 request's opt-in).
        modern: the agent's request is of the 2026-07-28 revision (no requests to it).
        capabilities: the client capabilities the agent declared, of those the gateway relays
            (``relayed_capabilities``; None: unknown, the gateway's own are sent).

    """

    min_level: types.LoggingLevel | None
    modern: bool
    capabilities: dict[str, Any] | None

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Sends a progress notification with the agent's own progress token (none: nothing)."""

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """Sends a ``notifications/message`` when the agent session's level lets it through."""

    async def request(self, request: Any, result_type: Any) -> Any:
        """Sends a server-to-client request to the agent and answers its result.

        Raises:
            mcp.shared.exceptions.MCPError: the agent's error answer, or no way back to it.

        """


def _without_key(params: Any) -> Any:
    """`params` (an MCP params model) with ``RELAY_META`` taken out of its ``_meta``."""
    meta = dict(params.meta or {})
    meta.pop(RELAY_META, None)
    return params.model_copy(update={"meta": meta or None})


#: The notifications that say a list changed: each goes to every agent session of the upstream.
LIST_CHANGES = (
    types.ToolListChangedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
)


def _new_bus() -> Any:
    """The ``mcp`` SDK's in-process fan-out to ``subscriptions/listen`` streams."""
    from mcp.server.subscriptions import InMemorySubscriptionBus

    return InMemorySubscriptionBus()


def _list_event(notification: Any) -> Any:
    """The ``subscriptions/listen`` event of a ``list_changed`` notification, or None."""
    from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged

    if isinstance(notification, types.ToolListChangedNotification):
        return ToolsListChanged()
    if isinstance(notification, types.ResourceListChangedNotification):
        return ResourcesListChanged()
    if isinstance(notification, types.PromptListChangedNotification):
        return PromptsListChanged()
    return None


class UpstreamRelays:
    """One upstream's requests in flight, agent sessions and resource subscribers (module docs).

    Args:
        name: the upstream's name (for logs and errors).
        stdio: True for a stdio upstream (untagged messages go to a lone request in flight).

    """

    def __init__(self, name: str, stdio: bool) -> None:
        self.name = name
        self.stdio = stdio
        self._relays: dict[str, Relay] = {}
        self._subscribers: dict[str, dict[str, Any]] = {}
        self._levels: OrderedDict[str, types.LoggingLevel] = OrderedDict()
        self._sessions: OrderedDict[str, Any] = OrderedDict()
        #: The list changes for 2026-07-28 agents' ``subscriptions/listen`` streams (the
        #: revision has no standalone stream: docs/gateway.md#protocol-revisions).
        self.bus: Any = _new_bus()

    @contextlib.contextmanager
    def open(self, relay: Relay) -> Any:
        """Registers `relay` while its request is forwarded; yields its ``_meta`` entry.

        Yields:
            ``{RELAY_META: key}`` to add to the forwarded request's ``_meta``.

        """
        key = uuid.uuid4().hex
        self._relays[key] = relay
        try:
            yield {RELAY_META: key}
        finally:
            self._relays.pop(key, None)

    def _find(self, meta: Any) -> Relay | None:
        key = (meta or {}).get(RELAY_META)
        if isinstance(key, str):
            return self._relays.get(key)
        if key is None and self.stdio and len(self._relays) == 1:
            return next(iter(self._relays.values()))
        return None

    # -- the ClientSession's callbacks ----------------------------------------------------

    async def _ask(self, method: str, params: Any, request: Any, result_type: Any) -> Any:
        relay = self._find(params.meta)
        if relay is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"{method} from upstream `{self.name}` names no agent call in flight "
                "through the gateway; only a request made during a tool call is relayed",
            )
        return await self._ask_relay(relay, method, params, request, result_type)

    async def _ask_relay(
        self, relay: Relay, method: str, params: Any, request: Any, result_type: Any
    ) -> Any:
        from mcp.shared.exceptions import MCPError

        try:
            return await relay.request(request(params=_without_key(params)), result_type)
        except MCPError as e:
            return e.error
        except Exception as e:  # the agent gone, a malformed answer: an error, never a hang
            log.warning("upstream %s: %s not relayed: %s", self.name, method, e)
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the agent did not answer {method}: {e}"
            )

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        """``sampling_callback``: the agent's answer to ``sampling/createMessage``, or an error."""
        result_type = (
            types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        )
        answer: types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData
        answer = await self._ask(
            "sampling/createMessage", params, types.CreateMessageRequest, result_type
        )
        return answer

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """``elicitation_callback``: the agent's answer to ``elicitation/create``, or an error."""
        answer: types.ElicitResult | types.ErrorData
        answer = await self._ask(
            "elicitation/create", params, types.ElicitRequest, types.ElicitResult
        )
        return answer

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        """``logging_callback``: the message to its request's agent (none: dropped)."""
        relay = self._find(params.meta)
        if relay is None:
            log.debug("upstream %s: a log message for no call in flight dropped", self.name)
            return
        try:
            await relay.log(_without_key(params))
        except Exception as e:  # the agent's stream is gone: its call ends anyway
            log.debug("upstream %s: log message not relayed: %s", self.name, e)

    async def message(self, message: Any) -> None:
        """``message_handler``: the upstream's notifications that are not about a call.

        ``notifications/resources/updated`` goes to the resource's subscribers, a
        ``list_changed`` notification to every agent session (``lists_changed``).
        """
        if isinstance(message, LIST_CHANGES):
            await self.lists_changed([message])
        elif isinstance(message, types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            for key, session in list(self._subscribers.get(uri, {}).items()):
                try:
                    await session.send_notification(message)
                except Exception as e:  # that agent session is gone
                    log.debug("upstream %s: %s unsubscribed from %s: %s", self.name, key, uri, e)
                    self.unsubscribe(uri, key)

    # -- one call's own event stream (the fast path's, svc.gateway.fastpath) --------------

    async def follow(
        self,
        upstream_id: str,
        messages: AsyncIterator[dict[str, Any]],
        relay: Relay,
        answer: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> dict[str, Any]:
        """Relays what comes on one forwarded request's own stream until its response.

        The request was POSTed by the gateway itself (``svc.gateway.fastpath``), so its stream
        is known without a tag: progress and ``notifications/message`` go to `relay`,
        ``sampling/createMessage`` and ``elicitation/create`` are asked of `relay` and their
        answers (or an MCP error) sent back with `answer`, ``ping`` is answered at once,
        ``notifications/resources/updated`` goes to its subscribers, and any other request
        gets ``METHOD_NOT_FOUND`` (as the SDK's client session answers it).

        Args:
            upstream_id: the JSON-RPC id of the forwarded request.
            messages: the JSON-RPC messages of its stream, in order (dicts, as sent).
            relay: the agent's side of the call.
            answer: sends a JSON-RPC response back to the upstream.

        Returns:
            The JSON-RPC response to `upstream_id` (with ``result`` or ``error``), as sent.

        Raises:
            ConnectionError: the stream ended before the response.

        """
        async for msg in messages:
            method = msg.get("method")
            if not isinstance(method, str):
                if msg.get("id") == upstream_id:
                    return msg
                log.debug("upstream %s: a response to another request dropped", self.name)
                continue
            if "id" in msg:
                await answer(await self._answer(msg, relay))
                continue
            try:
                if method == "notifications/progress":
                    p = types.ProgressNotificationParams.model_validate(msg.get("params"))
                    await relay.progress(p.progress, p.total, p.message)
                elif method == "notifications/message":
                    await relay.log(
                        types.LoggingMessageNotificationParams.model_validate(msg.get("params"))
                    )
                elif method == "notifications/resources/updated":
                    await self.message(types.ResourceUpdatedNotification.model_validate(msg))
            except Exception as e:  # malformed (pydantic's ValidationError), or the agent gone
                log.warning("upstream %s: %s not relayed: %s", self.name, method, e)
        raise ConnectionError(f"upstream `{self.name}` ended the call's stream without a result")

    async def _answer(self, msg: dict[str, Any], relay: Relay) -> dict[str, Any]:
        """The JSON-RPC response to a request from the upstream on a call's stream."""
        method = msg["method"]
        answer: Any
        try:
            answer = await self._answer_with(method, msg, relay)
        except ValueError as e:  # pydantic's ValidationError: the request is malformed
            answer = types.ErrorData(code=types.INVALID_PARAMS, message=f"{method}: {e}")
        body = answer.model_dump(by_alias=True, exclude_none=True, mode="json")
        key = "error" if isinstance(answer, types.ErrorData) else "result"
        return {"jsonrpc": "2.0", "id": msg["id"], key: body}

    async def _answer_with(self, method: str, msg: dict[str, Any], relay: Relay) -> Any:
        """The result (or ``ErrorData``) of a request on a call's stream; raises when malformed."""
        answer: Any
        if method == "sampling/createMessage":
            req = types.CreateMessageRequest.model_validate(msg)
            with_tools = req.params.tools
            result_type = (
                types.CreateMessageResultWithTools if with_tools else types.CreateMessageResult
            )
            answer = await self._ask_relay(
                relay, method, req.params, types.CreateMessageRequest, result_type
            )
        elif method == "elicitation/create":
            req_e = types.ElicitRequest.model_validate(msg)
            answer = await self._ask_relay(
                relay, method, req_e.params, types.ElicitRequest, types.ElicitResult
            )
        elif method == "ping":
            answer = types.EmptyResult()
        else:
            answer = types.ErrorData(
                code=types.METHOD_NOT_FOUND, message=f"{method} is not relayed by the gateway"
            )
        return answer

    # -- agent sessions -----------------------------------------------------------------

    def note_session(self, key: str, session: Any) -> None:
        """Remembers an agent session, to tell it when a list changes.

        The latest ``MAX_SESSION_LEVELS`` sessions are remembered.

        Args:
            key: its MCP session id (``Mcp-Session-Id``; ``""`` is not remembered).
            session: its ``ServerSession``.

        """
        if not key:
            return
        self._sessions[key] = session
        self._sessions.move_to_end(key)
        while len(self._sessions) > MAX_SESSION_LEVELS:
            self._sessions.popitem(last=False)

    def capabilities(self, key: str) -> dict[str, Any] | None:
        """The client capabilities a remembered agent session declared at ``initialize``.

        Returns:
            Those the gateway relays (``RELAYED_CAPABILITIES``), as JSON; None when the session
            is not remembered.

        """
        session = self._sessions.get(key) if key else None
        caps = getattr(session, "client_capabilities", None)
        if caps is None:
            return None
        return relayed_capabilities(caps.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def lists_changed(self, notifications: list[Any]) -> None:
        """Sends `notifications` (``LIST_CHANGES``) to every remembered agent session.

        Each goes on the session's standalone stream (no related request), as an MCP server's
        own ``list_changed`` would. A session that cannot take it (ended) is forgotten; one
        that takes longer than a second is skipped this time.
        """
        for n in notifications:
            event = _list_event(n)
            if event is not None:  # the 2026-07-28 agents' listen streams
                await self.bus.publish(event)
        for key, session in list(self._sessions.items()):
            for n in notifications:
                try:
                    with anyio.move_on_after(1.0):
                        await session.send_notification(n)
                except Exception as e:  # that agent session is gone
                    log.debug("upstream %s: agent session %s forgotten: %s", self.name, key, e)
                    self._sessions.pop(key, None)
                    break

    # -- subscriptions ------------------------------------------------------------------

    def subscribe(self, uri: str, key: str, session: Any) -> bool:
        """Adds an agent session (`key`, its ``ServerSession``) to `uri`'s subscribers.

        Returns:
            True when it is the resource's first subscriber (subscribe upstream).

        """
        subs = self._subscribers.setdefault(uri, {})
        first = not subs
        subs[key] = session
        return first

    def unsubscribe(self, uri: str, key: str) -> bool:
        """Removes an agent session from `uri`'s subscribers.

        Returns:
            True when none is left (unsubscribe upstream).

        """
        subs = self._subscribers.get(uri)
        if not subs:
            return False
        subs.pop(key, None)
        if subs:
            return False
        del self._subscribers[uri]
        return True

    # -- log levels ---------------------------------------------------------------------

    def set_level(self, key: str, level: types.LoggingLevel) -> types.LoggingLevel:
        """Remembers an agent session's ``logging/setLevel`` (`key`: its MCP session id).

        Returns:
            The level to set upstream: the most verbose any remembered agent session asked
            for (the upstream session is shared).

        """
        self._levels[key] = level
        self._levels.move_to_end(key)
        while len(self._levels) > MAX_SESSION_LEVELS:
            self._levels.popitem(last=False)
        return self.upstream_level() or level

    def level(self, key: str) -> types.LoggingLevel | None:
        """The agent session's level, or None when it set none."""
        return self._levels.get(key)

    def upstream_level(self) -> types.LoggingLevel | None:
        """The most verbose level any agent session asked for, or None (set again on reconnect)."""
        return min(self._levels.values(), key=LEVELS.index) if self._levels else None

    def subscribed(self) -> list[str]:
        """The resources some agent session is subscribed to (subscribed again on reconnect)."""
        return list(self._subscribers)


# ------------------------------------------------------------------ the HTTP transport


def _relay_key(request: httpx2.Request) -> str | None:
    """The ``RELAY_META`` key of a POSTed JSON-RPC request, or None."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    if not isinstance(body, dict):
        return None
    meta = (body.get("params") or {}).get("_meta") if isinstance(body.get("params"), dict) else None
    key = meta.get(RELAY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


class RelayTagging(httpx2.AsyncBaseTransport):
    """The ``httpx2`` transport to a Streamable HTTP upstream: tags what relates to a request.

    A POST whose JSON-RPC request carries ``_meta[RELAY_META]`` and is answered with an event
    stream (``text/event-stream``, https://html.spec.whatwg.org/multipage/server-sent-events.html)
    gets its stream's requests and notifications tagged with the same key (``TaggedEvents``);
    everything else passes unchanged.

    Args:
        inner: the transport that sends (default ``httpx2.AsyncHTTPTransport()``).

    """

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx2.AsyncHTTPTransport()
        #: The upstream's ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` as the SDK's client
        #: last sent them (None until it has): the fast path's requests join the same session.
        self.session_id: str | None = None
        self.protocol_version: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Sends `request`; answers its response, its event stream tagged when it relays."""
        version = request.headers.get("mcp-protocol-version")
        if version is not None:
            self.protocol_version = version
            self.session_id = request.headers.get("mcp-session-id")
        response = await self.inner.handle_async_request(request)
        key = _relay_key(request)
        ctype = response.headers.get("content-type", "").lower()
        if key is None or not ctype.startswith("text/event-stream"):
            return response
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=TaggedEvents(response.stream, key),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Closes the inner transport."""
        await self.inner.aclose()


class TaggedEvents(httpx2.AsyncByteStream):
    """An event stream with ``_meta[RELAY_META] = key`` in its requests and notifications.

    JSON-RPC responses pass as they are.

    Events are cut at blank lines and their ``data`` lines joined, as the event stream format
    says (lines end in CRLF, LF or CR); each event goes on whole, with its ``id``, ``event`` and
    ``retry`` lines, its data re-serialized on one line when tagged.

    Args:
        inner: the response's byte stream.
        key: the relay key.

    """

    def __init__(self, inner: httpx2.AsyncByteStream, key: str) -> None:
        self.inner = inner
        self.key = key

    def _tag(self, lines: list[str]) -> list[str]:
        data = event_data(lines)
        if not data:
            return lines
        try:
            msg = json.loads(data)
        except ValueError:
            return lines
        if not isinstance(msg, dict) or "method" not in msg:
            return lines
        params = msg.get("params")
        params = dict(params) if isinstance(params, dict) else {}
        meta = params.get("_meta")
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), RELAY_META: self.key}
        msg["params"] = params
        out = [line for line in lines if not line.startswith("data:")]
        return [*out, "data: " + json.dumps(msg, separators=(",", ":"))]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The stream's bytes, event by event (module docs)."""
        async for event, ended in event_lines(self.inner):
            # An event the stream ends before its blank line stays unended (never dispatched).
            yield ("\n".join(self._tag(event)) + ("\n\n" if ended else "\n")).encode()

    async def aclose(self) -> None:
        """Closes the response's stream."""
        await self.inner.aclose()


async def event_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[list[str], bool]]:
    """The events of an event stream, each as its lines (without line ends), in order.

    The stream format of https://html.spec.whatwg.org/multipage/server-sent-events.html
    (parsing an event stream): UTF-8, lines end in CRLF, LF or CR, and a blank line ends an
    event.

    Args:
        chunks: the stream's bytes, cut anywhere.

    Yields:
        ``(lines, ended)``: ``ended`` False only for lines the stream ended in before a blank
        line (the format discards such an event; a proxy passes it on as it came).

    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    event: list[str] = []
    async for chunk in chunks:
        pending += decoder.decode(chunk)
        # A CR at the end may be the first half of a CRLF: keep it for the next chunk.
        hold = pending.endswith("\r")
        text, pending = (pending[:-1], "\r") if hold else (pending, "")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        *lines, rest = text.split("\n")
        pending = rest + pending
        for line in lines:
            if line:
                event.append(line)
            elif event:
                yield event, True
                event = []
    tail = (pending + decoder.decode(b"", final=True)).rstrip("\r")
    if tail:
        event.append(tail)
    if event:
        yield event, False


def event_data(lines: list[str]) -> str:
    """An event's data: its ``data`` fields joined with newlines (``""`` when it has none).

    The event stream format's field rules: ``data:value`` or ``data: value`` (one leading space
    dropped), a line starting with ``:`` a comment.
    """
    return "\n".join(
        line[5:].removeprefix(" ") for line in lines if line.startswith("data:") or line == "data"
    )
