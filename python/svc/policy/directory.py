"""The directory a dry run decides with: the context service's principals and resources.

A decision point decides with the context service's records (docs/context.md#principals,
``svc.pdp.context_follower``): the principals snapshot (``GET /v1/principals``: people and
groups as Cedar entities, service accounts, risk scores) and the resources its checks name,
read by id on a miss (``POST /v1/resources/get``). A dry run (docs/policy.md#dry-runs) decides
recorded checks again the same way: ``DirectoryClient`` reads those two routes, and
``load_directory`` puts one snapshot and the resources of a dry run's records into the engine
of the bundle under test, once per dry run, before its checks are decided.

The client's caller is the policy service's role, ``policy`` (docs/auth.md#roles-and-methods),
which may read exactly these routes.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from svc._pdp_core import Engine, RequestError
from svc.common.limits import bounded

__all__ = [
    "FETCH_CHUNK",
    "DirectoryClient",
    "DirectoryError",
    "Loaded",
    "bundle_uids",
    "load_directory",
    "token_file",
]

log = logging.getLogger("svc.policy.directory")

#: Resources read by id in one ``POST /v1/resources/get`` (the decision point's batch size).
FETCH_CHUNK = 500
#: The principal kinds of the snapshot that are Cedar entities (as the decision point's).
ENTITY_KINDS = ("Human", "Group")

#: Returns the bearer token of the next call, or None to send none.
TokenSource = Callable[[], str | None]


class DirectoryError(Exception):
    """The context service did not answer as documented; the message says which call and why."""


def _none() -> str | None:
    return None


def token_file(path: Path) -> TokenSource:
    """A token source sending the current content of `path` (re-read at every call).

    A Kubernetes projected service-account token is renewed in place (docs/auth.md).
    """
    return lambda: path.read_text(encoding="utf-8").strip() or None


class DirectoryClient:
    """The context service's routes a dry run reads (module docs).

    Args:
        url: ``http://host:port`` of the context service.
        token: the bearer token source (audience ``svc-context``; the ``policy`` role).
        timeout: seconds per request.

    Every method raises ``DirectoryError`` on a transport failure, a status other than 200, or
    an answer that is not the documented shape.

    """

    def __init__(self, url: str, token: TokenSource = _none, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._token = token

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        try:
            t = self._token()
        except OSError as e:
            raise DirectoryError(f"{method} {path}: the token cannot be read: {e}") from e
        headers = {"Authorization": f"Bearer {t}"} if t else {}
        try:
            r = self._http.request(method, path, headers=headers, json=body)
        except httpx.HTTPError as e:
            raise DirectoryError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise DirectoryError(f"{method} {path}: HTTP {r.status_code}: {bounded(r.text, 300)}")
        paused = gc.isenabled()
        gc.disable()  # a large snapshot is many containers, none cyclic (svc.pdp.context_follower)
        try:
            return json.loads(r.content)
        except ValueError as e:
            raise DirectoryError(f"{method} {path}: the answer is not JSON") from e
        finally:
            if paused:
                gc.enable()

    def principals(self) -> dict[str, Any]:
        """``GET /v1/principals``: ``{"principals_version": int, "principals": [...]}``.

        Raises:
            DirectoryError: the call failed or the answer lacks those members.

        """
        snap = self._call("GET", "/v1/principals")
        if (
            not isinstance(snap, dict)
            or not isinstance(snap.get("principals_version"), int)
            or not isinstance(snap.get("principals"), list)
        ):
            raise DirectoryError("GET /v1/principals: not a principals snapshot")
        return snap

    def resources(self, refs: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        """The Cedar entities of `refs` (``{type, id}``) the service holds, read by id.

        ``POST /v1/resources/get`` in batches of ``FETCH_CHUNK``; what the service does not hold
        is left out.

        Raises:
            DirectoryError: a call failed or an answer lacks ``resources``.

        """
        found: list[dict[str, Any]] = []
        for i in range(0, len(refs), FETCH_CHUNK):
            part = [{"type": r["type"], "id": r["id"]} for r in refs[i : i + FETCH_CHUNK]]
            body = self._call("POST", "/v1/resources/get", {"resources": part})
            if not isinstance(body, dict) or not isinstance(body.get("resources"), list):
                raise DirectoryError("POST /v1/resources/get: no `resources` list")
            found += body["resources"]
        return found

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()


@dataclass(frozen=True)
class Loaded:
    """What ``load_directory`` put into an engine.

    ``version``: the principals snapshot's version; ``entities``: people and groups upserted;
    ``service_accounts``, ``risk_scores``: registered and set; ``resources``: resources
    upserted of ``wanted`` distinct ones the records name; ``refused``: records the bundle's
    schema refused (left out); ``notes``: what was left out and why, for the answer.
    """

    version: int
    entities: int
    service_accounts: int
    risk_scores: int
    resources: int
    wanted: int
    refused: int
    notes: list[str]


def _upsert(engine: Engine, entities: list[dict[str, Any]]) -> list[str]:
    """Upserts `entities`; a refused batch goes one at a time. Returns the refused uids."""
    if not entities:
        return []
    try:
        engine.upsert_entities(entities)
        return []
    except RequestError:
        pass
    refused = []
    for e in entities:
        try:
            engine.upsert_entities([e])
        except RequestError as err:
            uid = e.get("uid") or {}
            refused.append(f"{uid.get('type')}::{uid.get('id')}")
            log.debug("dry run: %s left out: %s", refused[-1], err)
    return refused


def _register(engine: Engine, accounts: list[dict[str, Any]]) -> list[str]:
    """Registers service accounts; a refused batch goes one at a time. Returns refused ids."""
    if not accounts:
        return []
    try:
        engine.register_service_accounts(accounts)
        return []
    except RequestError:
        pass
    refused = []
    for a in accounts:
        try:
            engine.register_service_accounts([a])
        except RequestError:
            refused.append(str(a.get("id")))
    return refused


def bundle_uids(files: Mapping[str, str]) -> set[tuple[str, str]]:
    """``(type, id)`` of the entities a bundle's ``entities.json`` holds (docs/bundles.md).

    Both of its forms: Cedar's entity array (``uid`` as ``{type, id}`` or ``{"__entity":
    ...}``) and the entity map keyed by ``Type::"id"``. A file that does not parse gives none
    (the bundle validated on draft, so it parses).
    """
    text = files.get("entities.json")
    if not text:
        return set()
    try:
        data = json.loads(text)
    except ValueError:
        return set()
    out: set[tuple[str, str]] = set()
    if isinstance(data, list):
        for e in data:
            uid = e.get("uid") if isinstance(e, dict) else None
            if isinstance(uid, dict):
                uid = uid.get("__entity", uid)
                if isinstance(uid, dict) and "type" in uid and "id" in uid:
                    out.add((str(uid["type"]), str(uid["id"])))
    elif isinstance(data, dict):
        for group in data.values():
            for key in group if isinstance(group, dict) else ():
                ty, sep, rest = str(key).partition('::"')
                if sep and rest.endswith('"'):
                    out.add((ty, rest[:-1]))
    return out


def _resource_refs(
    records: Iterable[Mapping[str, Any]], skip: set[tuple[str, str]]
) -> list[dict[str, str]]:
    """The distinct resources the records name, in first-seen order, but those in `skip`."""
    seen: set[tuple[str, str]] = set()
    out = []
    for rec in records:
        res = rec.get("resource") or {}
        t, i = res.get("type"), res.get("id")
        if not t or not i or (t, i) in seen or (t, i) in skip:
            continue
        seen.add((t, i))
        out.append({"type": str(t), "id": str(i)})
    return out


def load_directory(
    engine: Engine,
    client: DirectoryClient,
    records: Sequence[Mapping[str, Any]],
    max_resources: int,
    bundle_held: Iterable[tuple[str, str]] = (),
) -> Loaded:
    """Loads one principals snapshot and the records' resources into `engine`.

    On top of the bundle's own entities, as the decision point holds them
    (``svc.pdp.context_follower``): people and groups upserted (a record the schema refuses is
    left out, counted in ``refused``), service accounts registered, risk scores set; then the
    distinct resources the records name that neither the snapshot nor the bundle holds (the
    bundle's own entities win, as in a decision point's store, which reads resources on a
    miss), at most `max_resources`, read in batches of ``FETCH_CHUNK``. A resources read that
    fails leaves them out and says so in ``notes``; the snapshot is still used.

    Args:
        engine: the engine of the bundle under test (``svc.policy.service.bundle_engine``).
        client: the context service.
        records: the dry run's records (``svc.history.decisions_between``'s dicts).
        max_resources: most resources read (0: none).
        bundle_held: ``(type, id)`` of the bundle's own entities (``bundle_uids``): not read.

    Returns:
        What was loaded (``Loaded``).

    Raises:
        DirectoryError: the snapshot could not be read (nothing was loaded).

    """
    snap = client.principals()
    version = int(snap["principals_version"])
    entities: list[dict[str, Any]] = []
    accounts: list[dict[str, Any]] = []
    scores: list[dict[str, Any]] = []
    for p in snap["principals"]:
        kind, value = p.get("kind"), p.get("value")
        if value is None:
            continue
        if kind in ENTITY_KINDS:
            entities.append(value)
        elif kind == "ServiceAccount":
            accounts.append(value)
        elif kind == "RiskScore":
            scores.append(value)
    refused = _upsert(engine, entities)
    kept = len(entities) - len(refused)
    refused += _register(engine, accounts)
    notes: list[str] = []
    try:
        engine.set_risk_scores(scores, replace=True)
    except RequestError as e:
        notes.append(f"risk scores left out: {bounded(str(e), 200)}")
        scores = []
    if refused:
        notes.append(
            f"{len(refused)} directory records the bundle's schema refuses were left out "
            f"(first {', '.join(refused[:3])})"
        )
    # The decision point reads a resource only on a miss: the bundle's own win.
    held = {(str(e["uid"]["type"]), str(e["uid"]["id"])) for e in entities} | set(bundle_held)
    wanted = _resource_refs(records, held)
    fetched = 0
    if len(wanted) > max_resources:
        notes.append(
            f"the records name {len(wanted)} resources: the first {max_resources} were read "
            "from the context service, the rest decided without their records"
        )
    ask = wanted[:max_resources]
    if ask:
        try:
            found = client.resources(ask)
            bad = _upsert(engine, found)
            fetched = len(found) - len(bad)
            if bad:
                notes.append(f"{len(bad)} resources the bundle's schema refuses were left out")
        except DirectoryError as e:
            notes.append(
                f"the resources could not be read ({bounded(str(e), 200)}): "
                "the checks were decided without their records"
            )
    return Loaded(
        version=version,
        entities=kept,
        service_accounts=len(accounts),
        risk_scores=len(scores),
        resources=fetched,
        wanted=len(wanted),
        refused=len(refused),
        notes=notes,
    )
