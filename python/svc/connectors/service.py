"""The connectors' service layer: one connector per configured source, each polled in a loop.

``ConnectorsService`` builds the Drive connector when ``drive_url`` is set and the Jira
connector when ``jira_url`` is set (docs/connectors.md), with their HTTP clients and
credentials, the context service's writer and directory, the state file and the metrics. It
has no transport: ``svc.connectors.app`` runs ``run`` in its lifespan and serves the probes.

Each loop polls its source, then waits ``poll_secs`` (a failed poll too: its saved state is
that of the last accepted batch, and the next poll goes on from there). Credentials are read
from files for every call and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from svc.common.health import Readiness
from svc.connectors.client import Caller, ContextWriter, Directory, Metrics
from svc.connectors.drive import DriveConnector
from svc.connectors.jira import JiraConnector
from svc.connectors.settings import ConnectorsSettings
from svc.connectors.state import State

__all__ = [
    "ConnectorStatus",
    "ConnectorsService",
    "FileBasic",
    "FileBearer",
    "GoogleServiceAccount",
]

log = logging.getLogger("svc.connectors")

#: The OAuth scope the Drive connector asks for (read-only metadata and permissions).
DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"


class FileBearer(httpx.Auth):
    """``Authorization: Bearer <the file's content>``, read for every request (RFC 6750)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Adds the header (raises OSError when the file cannot be read)."""
        request.headers["Authorization"] = f"Bearer {self.path.read_text('utf-8').strip()}"
        yield request


class FileBasic(httpx.Auth):
    """HTTP Basic with a user and a secret read from a file for every request (RFC 7617).

    Jira Cloud's email and API token.
    """

    def __init__(self, user: str, path: str | Path) -> None:
        self.user = user
        self.path = Path(path)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Adds the header (raises OSError when the file cannot be read)."""
        secret = self.path.read_text("utf-8").strip()
        pair = base64.b64encode(f"{self.user}:{secret}".encode()).decode()
        request.headers["Authorization"] = f"Basic {pair}"
        yield request


class GoogleServiceAccount(httpx.Auth):
    """Access tokens of a Google service account through google-auth, refreshed when expired.

    The OAuth 2.0 JWT-bearer grant (RFC 7523) to the key's ``token_uri``.

    Args:
        key_file: the service-account key (JSON, as the Google Cloud console downloads it;
            its ``token_uri`` is where tokens are asked for).
        subject: the user to act as (domain-wide delegation), or None.

    Raises:
        ValueError, OSError: the key file is unreadable or not a service-account key.

    """

    def __init__(self, key_file: str | Path, subject: str | None = None) -> None:
        from google.oauth2 import service_account

        creds = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            str(key_file), scopes=[DRIVE_SCOPE]
        )
        self.credentials = creds.with_subject(subject) if subject else creds
        self._lock = asyncio.Lock()

    def _refresh(self) -> None:
        import google.auth.transport.requests

        self.credentials.refresh(google.auth.transport.requests.Request())

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        """Adds a current access token, asking for one when there is none or it expired."""
        async with self._lock:
            if not self.credentials.valid:
                await asyncio.to_thread(self._refresh)
        request.headers["Authorization"] = f"Bearer {self.credentials.token}"
        yield request


class _Connector(Protocol):
    name: str
    caught_up_at: float | None

    async def poll(self) -> None: ...


@dataclass
class ConnectorStatus:
    """One connector's loop.

    Polls made and failed, the last error (None after a good poll), and when the last good
    poll ended (monotonic).
    """

    polls: int = 0
    failures: int = 0
    error: str | None = None
    ok_at: float | None = None


class ConnectorsService:
    """The connectors (module docs).

    Args:
        settings: the component's settings.
        state: the state file (default: ``settings.state_path``).
        transports: httpx transports by client (``drive``, ``jira``, ``context``), for tests
            that serve a fake in-process; default: the network.
        sleep: the retries' sleep.

    Raises:
        ValueError, OSError: a credential setting names an unreadable or malformed file.

    """

    def __init__(
        self,
        settings: ConnectorsSettings,
        *,
        state: State | None = None,
        transports: dict[str, httpx.AsyncBaseTransport] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.state = state if state is not None else State(settings.state_path)
        t = transports or {}
        s = settings
        self._clients: list[httpx.AsyncClient] = []

        def caller(name: str, base: str, auth: httpx.Auth | None) -> Caller:
            client = httpx.AsyncClient(
                base_url=base, auth=auth, timeout=s.timeout_secs, transport=t.get(name)
            )
            self._clients.append(client)
            return Caller(
                name,
                client,
                self.metrics,
                attempts=s.retry_attempts,
                backoff_secs=s.retry_backoff_secs,
                max_wait_secs=s.retry_max_wait_secs,
                sleep=sleep,
            )

        ctx_auth = FileBearer(s.context_token_file) if s.context_token_file else None
        context = caller("context", s.context_url, ctx_auth)
        self.directory = Directory(context, s.directory_refresh_secs, s.email_domain)
        self.connectors: list[_Connector] = []
        if s.drive_url:
            drive_auth: httpx.Auth | None = None
            if s.drive_service_account_file:
                drive_auth = GoogleServiceAccount(s.drive_service_account_file, s.drive_subject)
            elif s.drive_token_file:
                drive_auth = FileBearer(s.drive_token_file)
            self.connectors.append(
                DriveConnector(
                    s,
                    caller("drive", s.drive_url, drive_auth),
                    ContextWriter(context, "drive", self.metrics, s.batch_items),
                    self.directory,
                    self.state,
                    self.metrics,
                )
            )
        if s.jira_url:
            jira_auth: httpx.Auth | None = None
            if s.jira_token_file:
                jira_auth = FileBearer(s.jira_token_file)
            elif s.jira_email and s.jira_api_token_file:
                jira_auth = FileBasic(s.jira_email, s.jira_api_token_file)
            self.connectors.append(
                JiraConnector(
                    s,
                    caller("jira", s.jira_url, jira_auth),
                    ContextWriter(context, "jira", self.metrics, s.batch_items),
                    self.directory,
                    self.state,
                    self.metrics,
                )
            )
        self.status = {c.name: ConnectorStatus() for c in self.connectors}

    async def poll_once(self, name: str) -> None:
        """Polls one connector now (tests and the benchmark).

        Raises:
            KeyError: no connector of that name; whatever its poll raises.

        """
        conn = next(c for c in self.connectors if c.name == name)
        await conn.poll()
        self.status[name].ok_at = time.monotonic()

    async def _loop(self, conn: _Connector, stop: asyncio.Event) -> None:
        st = self.status[conn.name]
        while not stop.is_set():
            st.polls += 1
            try:
                await conn.poll()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a poll must never end the loop; it is logged and counted
                st.failures += 1
                st.error = f"{type(e).__name__}: {e}"
                self.metrics.errors.labels(conn.name, "poll").inc()
                log.warning("%s: poll failed: %s", conn.name, st.error)
            else:
                st.error = None
                st.ok_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.poll_secs)

    async def run(self, stop: asyncio.Event) -> None:
        """Runs every connector's loop until ``stop`` is set (then returns)."""
        await asyncio.gather(*(self._loop(c, stop) for c in self.connectors))

    def readiness(self) -> Readiness:
        """Ready once every connector has reached the head of its source since the start.

        And its last poll did not fail; the reasons name the connectors that are not.
        """
        reasons = []
        for c in self.connectors:
            st = self.status[c.name]
            if c.caught_up_at is None:
                reasons.append(f"{c.name}: the first sync has not finished")
            elif st.error is not None:
                reasons.append(f"{c.name}: the last poll failed ({st.error})")
        return Readiness(reasons, {"connectors": [c.name for c in self.connectors]})

    def refresh_metrics(self) -> None:
        """Sets ``svc_connector_lag_seconds`` from each connector's last time at the head."""
        now = time.monotonic()
        for c in self.connectors:
            at = c.caught_up_at
            self.metrics.lag.labels(c.name).set(now - at if at is not None else float("inf"))

    async def aclose(self) -> None:
        """Closes the HTTP clients and the state file."""
        for client in self._clients:
            await client.aclose()
        self.state.close()
