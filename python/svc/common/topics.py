"""The broker topics and the one broker setting every component shares.

Topic names are part of the product's interface (docs/architecture.md#how-records-flow,
docs/architecture.md#versioning: topics end in ``.v1``). ``bootstrap_servers`` reads the
broker setting (``SVC_KAFKA_URL``) the decision log, the intake and the history loader all take.
Nothing here imports the decision core's extension, so the intake and the history can use it
without loading it.
"""

from __future__ import annotations

from svc.broker import LOCAL_SCHEME

__all__ = ["DECISIONS_TOPIC", "EVENTS_TOPIC", "bootstrap_servers"]

#: One record per decision and plan, keyed by principal (docs/history.md).
DECISIONS_TOPIC = "svc.decisions.v1"

#: One record per accepted audit event, keyed by principal (docs/intake.md).
EVENTS_TOPIC = "svc.events.v1"


def bootstrap_servers(url: str) -> str:
    """Kafka bootstrap servers from the one broker setting (``SVC_KAFKA_URL``).

    Args:
        url: ``kafka://host:port[,host:port]``, a plain ``host:port[,host:port]`` list, or
            ``local:///path/log.db``, the embedded topic log of ``svc up`` (``svc.broker``).

    Returns:
        The plain ``host:port`` list librdkafka takes; a ``local:///`` URL unchanged
        (``svc.broker``'s clients read it).

    Raises:
        ValueError: the URL is empty, names no file (``local:///``) or has another scheme.

    """
    u = url.strip()
    if u.startswith(LOCAL_SCHEME):
        if len(u) == len(LOCAL_SCHEME):
            raise ValueError(f"broker URL `{url}` names no file; expected local:///path/log.db")
        return u
    if "://" in u:
        scheme, _, rest = u.partition("://")
        if scheme not in ("kafka", "plaintext"):
            raise ValueError(f"broker URL `{url}`: expected kafka://host:port, got `{scheme}://`")
        u = rest.rstrip("/")
    if not u:
        raise ValueError("broker URL is empty; expected kafka://host:port")
    return u
