"""The demo company's sources for the connectors and the reporter's receiver, served on loopback.

What ``svc up`` runs so that the demo's resources and work items come through the connector
path (docs/connectors.md#the-local-fakes) and the heartbeat goes to a local receiver that prints
it (docs/reporter.md):

* ``DemoSources(company)``: the fake Google Drive and Jira APIs seeded with the company
  (``svc.demo.fake_drive.from_company``, ``svc.demo.fake_jira.from_company``), each served by
  ``svc.common.connect.serve_asgi`` in a thread of its own on 127.0.0.1;
  ``connector_settings(...)`` gives the ``ConnectorsSettings`` that read them as the demo needs
  (ids without a prefix, the demo label's sensitivity and tags, the people's
  ``<userName>@example.com``, the demo's projects, customers from ``customfield_10100``), with
  the fakes' credentials written to files under ``data_dir``.
* ``HeartbeatReceiverServer``: ``svc.demo.heartbeat_receiver`` in a thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from svc.common.connect import ThreadedServer, serve_asgi
from svc.connectors.settings import ConnectorsSettings
from svc.demo import fake_drive, fake_jira, heartbeat_receiver
from svc.demo.company import Company

__all__ = ["DEMO_DOMAIN", "AppServer", "DemoSources", "HeartbeatReceiverServer"]

#: The email domain of the demo company's people and groups in the fakes.
DEMO_DOMAIN = "example.com"


class AppServer(ThreadedServer):
    """An ASGI app served on ``host`` (a free port) in a thread of its own (uvicorn, HTTP/1.1).

    Args:
        app: the ASGI app.
        name: the thread's and the log lines' name.
        host: the address to bind (loopback).

    """

    def __init__(self, app: Any, name: str, host: str = "127.0.0.1") -> None:
        super().__init__(host, name)
        self.app = app
        self.name = name

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve_asgi(self.app, self.host, 0, self.name, ready=ready, stop=stop, http1=True)


class DemoSources:
    """The demo company's Drive and Jira fakes (module docs).

    Args:
        company: the demo company.
        data_dir: where the fakes' credential files are written (``drive.token``,
            ``jira.token``).
        host: the loopback address to serve on.

    """

    def __init__(self, company: Company, data_dir: Path, host: str = "127.0.0.1") -> None:
        self.drive = fake_drive.from_company(company, domain=DEMO_DOMAIN)
        self.jira = fake_jira.from_company(company, domain=DEMO_DOMAIN)
        self.data_dir = data_dir
        self.drive_server = AppServer(fake_drive.create_app(self.drive), "demo-drive", host)
        self.jira_server = AppServer(fake_jira.create_app(self.jira), "demo-jira", host)

    def start(self) -> Self:
        """Serves both fakes; returns once they listen.

        Raises:
            OSError: a port cannot be bound, or a credential file cannot be written.

        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "drive.token").write_text(self.drive.token + "\n", "utf-8")
        (self.data_dir / "jira.token").write_text(self.jira.api_token + "\n", "utf-8")
        self.drive_server.start()
        self.jira_server.start()
        return self

    def connector_settings(self, **settings: Any) -> ConnectorsSettings:
        """The connectors' settings for the demo, reading these fakes.

        Args:
            settings: more ``ConnectorsSettings`` fields (``context_url``,
                ``context_token_file``, ``state_path``, ``port``, ...); they win.

        Returns:
            The settings (docs/connectors.md#the-local-fakes lists the demo's).

        """
        demo: dict[str, Any] = {
            "drive_url": self.drive_server.url,
            "drive_token_file": str(self.data_dir / "drive.token"),
            "drive_id_prefix": "",
            "drive_sensitivity_field": "demo.sensitivity",
            "drive_tags_field": "demo.tags",
            "email_domain": DEMO_DOMAIN,
            "jira_url": self.jira_server.url,
            "jira_email": self.jira.email,
            "jira_api_token_file": str(self.data_dir / "jira.token"),
            "jira_jql": "project in (OPS, DOC, CRM)",
            "jira_link_fields": {fake_jira.CUSTOMER_FIELD: "Customer"},
        }
        return ConnectorsSettings(**{**demo, **settings})

    def stop(self) -> None:
        """Stops both fakes."""
        self.drive_server.stop()
        self.jira_server.stop()


class HeartbeatReceiverServer(AppServer):
    """The demo's heartbeat receiver (``svc.demo.heartbeat_receiver``) in a thread of its own.

    Args:
        out: called with each heartbeat taken (default: printed as a JSON line).
        host: the loopback address to serve on.

    """

    def __init__(
        self,
        out: Callable[[dict[str, Any]], None] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        app = heartbeat_receiver.create_app(out) if out else heartbeat_receiver.create_app()
        super().__init__(app, "demo-heartbeats", host)
