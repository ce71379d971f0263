"""Input-required rounds for a 2026-07-28 agent whose upstream asks during the call.

docs/gateway.md#protocol-revisions. A handshake-era upstream asks the client for input
(``sampling/createMessage``, ``elicitation/create``, ``roots/list``) with a request *during* the
call, on the call's stream, and waits for the answer. A 2026-07-28 agent has no back channel: the
revision asks for input with an ``InputRequiredResult`` instead (the input requests and an opaque
``requestState``), and the client retries the same call with ``inputResponses`` and that state
(multi-round-trip requests,
https://modelcontextprotocol.io/specification/2026-07-28/changelog; the ``mcp`` SDK's
``Client`` drives these rounds itself).

So for such an agent the gateway holds the forwarded call (``HeldCalls``): while it runs, a
request of the upstream's becomes the answer to the agent's request (``InputRequiredResult``,
``requestState`` naming the held call), and the agent's retry carrying the answers resumes it:
the answers go back to the upstream's waiting request, and the call's next request or its result
is the retry's answer. The retry is the same call going on, so it is not checked again; it must
come from the same caller for the same tool. A held call nobody comes back for is cancelled
after ``upstream_timeout_secs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

__all__ = ["HELD_STATE_PREFIX", "HeldCalls", "HeldRelay"]

log = logging.getLogger("svc.gateway")

#: How a ``requestState`` naming a held call begins (the rest is a random token).
HELD_STATE_PREFIX = "svc-held:"


class HeldRelay:
    """The relay of a held call (``svc.gateway.relay.Relay``).

    Progress and logs go to the agent's latest request; a request for input is handed to the
    round that is waiting for it (``HeldCalls``).

    Args:
        inner: the relay of the agent's request now (``svc.gateway.app.AgentRelay``); replaced
            by each retry's.

    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.min_level: types.LoggingLevel | None = inner.min_level
        self.capabilities: dict[str, Any] | None = getattr(inner, "capabilities", None)
        #: Requests for input go through the gateway's rounds, not to the agent's stream.
        self.modern = False
        self.asks: asyncio.Queue[tuple[str, Any, Any, asyncio.Future[Any]]] = asyncio.Queue()

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress to the agent's latest request (dropped when its stream has ended)."""
        with contextlib.suppress(Exception):
            await self.inner.progress(progress, total, message)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """A log message to the agent's latest request (dropped when its stream has ended)."""
        with contextlib.suppress(Exception):
            await self.inner.log(params)

    async def request(self, request: Any, result_type: Any) -> Any:
        """Waits for the agent's answer to `request`, given in its next round.

        Returns:
            The answer, as `result_type`.

        Raises:
            mcp.shared.exceptions.MCPError: the agent's retry did not answer it.
            asyncio.CancelledError: the held call was given up.

        """
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.asks.put((secrets.token_hex(4), request, result_type, answer))
        return await answer


@dataclass
class _Held:
    owner: tuple[Any, ...]
    tool: str
    relay: HeldRelay
    task: asyncio.Task[Any]
    pending: dict[str, tuple[Any, asyncio.Future[Any]]] = field(default_factory=dict)
    expiry: asyncio.TimerHandle | None = None


class HeldCalls:
    """The held calls of one upstream proxy (module docs).

    Args:
        timeout_secs: how long a held call waits for the agent's next round, and for its
            upstream's next request or result.

    """

    def __init__(self, timeout_secs: float) -> None:
        self.timeout_secs = timeout_secs
        self._held: dict[str, _Held] = {}

    @staticmethod
    def resumes(params: types.CallToolRequestParams) -> bool:
        """Whether `params` is the retry of a held call (its ``requestState`` names one)."""
        return (params.request_state or "").startswith(HELD_STATE_PREFIX)

    async def start(
        self,
        owner: tuple[Any, ...],
        tool: str,
        relay: Any,
        call: Callable[[HeldRelay], Coroutine[Any, Any, Any]],
    ) -> Any:
        """Runs `call` (the checked, forwarded call) with a ``HeldRelay`` over `relay`.

        Args:
            owner: the caller's key (``AgentIdentity.key()``): only it may resume the call.
            tool: the tool's name: a retry must name it.
            relay: the agent request's relay.
            call: forwards the call with the relay it is given; answers its result.

        Returns:
            The call's result, or an ``InputRequiredResult`` when the upstream asked for input
            first.

        """
        held_relay = HeldRelay(relay)
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(call(held_relay))
        return await self._round(_Held(owner, tool, held_relay, task))

    async def resume(
        self, owner: tuple[Any, ...], params: types.CallToolRequestParams, relay: Any
    ) -> Any:
        """Resumes the held call `params` names with the answers it carries.

        Returns:
            As ``start``: the call's result or its next ``InputRequiredResult``.

        Raises:
            mcp.shared.exceptions.MCPError: ``INVALID_PARAMS`` when no held call of this
                caller and tool has that ``requestState`` (unknown, expired, or answered
                already), or an answer is missing or malformed.

        """
        from mcp.shared.exceptions import MCPError

        token = (params.request_state or "").removeprefix(HELD_STATE_PREFIX)
        held = self._held.get(token)
        if held is None or held.owner != owner or held.tool != params.name:
            raise MCPError(
                types.INVALID_PARAMS,
                "the requestState names no call held for this agent and tool (unknown, "
                "expired or already answered): call the tool again",
            )
        answers = params.input_responses or {}
        missing = [key for key in held.pending if key not in answers]
        if missing:
            raise MCPError(
                types.INVALID_PARAMS, f"inputResponses has no answer for {', '.join(missing)}"
            )
        del self._held[token]
        if held.expiry is not None:
            held.expiry.cancel()
        for key, (result_type, future) in held.pending.items():
            raw = answers[key].model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                answer = result_type.model_validate(raw, by_name=False)
            except ValueError as e:  # pydantic's ValidationError
                future.set_exception(MCPError(types.INVALID_PARAMS, f"{key}: {e}"))
            else:
                future.set_result(answer)
        held.pending = {}
        held.relay.inner = relay
        return await self._round(held)

    async def _round(self, held: _Held) -> Any:
        """Waits for the held call's result or its next requests for input."""
        asked = asyncio.get_running_loop().create_task(held.relay.asks.get())
        try:
            done, _ = await asyncio.wait(
                {held.task, asked}, timeout=self.timeout_secs, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            asked.cancel()
            held.task.cancel()
            raise
        if held.task in done:
            asked.cancel()
            return held.task.result()
        if asked not in done:  # neither within the timeout
            held.task.cancel()
            asked.cancel()
            from mcp.shared.exceptions import MCPError

            raise MCPError(types.INTERNAL_ERROR, "the upstream did not answer in time")
        requests = [asked.result()]
        while not held.relay.asks.empty():
            requests.append(held.relay.asks.get_nowait())
        held.pending = {key: (result_type, future) for key, _, result_type, future in requests}
        token = secrets.token_urlsafe(24)
        self._held[token] = held
        held.expiry = asyncio.get_running_loop().call_later(self.timeout_secs, self._expire, token)
        return types.InputRequiredResult(
            input_requests={key: request for key, request, _, _ in requests},
            request_state=HELD_STATE_PREFIX + token,
        )

    def _expire(self, token: str) -> None:
        """Gives up a held call nobody came back for."""
        held = self._held.pop(token, None)
        if held is not None:
            log.info("a held call of %s was not resumed in time: cancelled", held.tool)
            held.task.cancel()
            for _, future in held.pending.values():
                future.cancel()
