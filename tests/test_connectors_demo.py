"""The demo company through the connector path (docs/connectors.md#the-local-fakes).

The fakes seeded with the demo company and served as ``svc up`` may (``svc.demo.sources``),
its directory provisioned into a live context service on PostgreSQL as ``svc up`` does it
(``svc.demo.directory.provision_context``), and the connectors run with the settings
docs/connectors.md gives for the demo: every document comes out with the demo's own owner,
department, sensitivity, tags and folder, and every work item with its status and links, so
``svc up`` can take resources and work items from the connectors instead of writing them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from svc.connectors.service import ConnectorsService
from svc.demo import company as demo
from svc.demo.directory import provision_context
from svc.demo.sources import DemoSources
from svc.pdp import Engine
from test_context import SCIM_TOKEN, Live, database_url, live

__all__ = ["database_url", "live"]  # fixtures used by name


def test_the_demo_company_comes_through_the_connectors(live: Live, tmp_path: Path) -> None:
    company = demo.generate(seed=7, people=60)
    provision_context(live.url, company, scim_token=SCIM_TOKEN)
    sources = DemoSources(company, tmp_path / "sources").start()
    settings = sources.connector_settings(
        context_url=live.url, state_path=str(tmp_path / "state.db")
    )
    service = ConnectorsService(settings)

    async def sync() -> None:
        await service.poll_once("drive")
        await service.poll_once("jira")
        await service.aclose()

    try:
        asyncio.run(sync())
    finally:
        sources.stop()

    refs = [{"type": "Document", "id": d.id} for d in company.documents]
    got: dict[str, Any] = {}
    for i in range(0, len(refs), 500):
        r = live.http.post("/v1/resources/get", json={"resources": refs[i : i + 500]})
        assert r.status_code == 200, r.text
        got.update((e["uid"]["id"], e) for e in r.json()["resources"])
    assert len(got) == len(company.documents)
    for d in company.documents:
        e = got[d.id]
        for name in ("owner", "department", "sensitivity", "tags"):
            assert e["attrs"][name] == d.attrs[name], (d.id, name, e["attrs"][name])
        assert e["parents"] == [{"type": "Folder", "id": p} for p in d.parents]
        public = d.attrs["sensitivity"] == "public"
        assert e["attrs"]["link_sharing"] == ("anyone" if public else "none")
        groups = {g["__entity"]["id"] for g in e["attrs"]["shared_with_groups"]}
        assert d.attrs["department"] in groups

    # The demo bundle's schema takes the connector's documents as they are.
    bundle = tmp_path / "bundle"
    demo.write_bundle(company, bundle, entities=False)
    engine = Engine.from_bundle_dir(bundle)
    engine.upsert_entities(list(got.values()))  # RequestError if the schema refused one

    ids = [w.id for w in company.work_items]
    r = live.http.post("/v1/work-items/get", json={"ids": ids})
    assert r.status_code == 200, r.text
    items = {w["id"]: w for w in r.json()["work_items"]}
    assert set(items) == set(ids)
    for w in company.work_items:
        item = items[w.id]
        assert item["status"] == w.status
        assert {(x["type"], x["id"]) for x in item["links"]} == set(w.links), w.id
        assert item["attrs"]["assignee"] == {"__entity": {"type": "Human", "id": w.assignee}}
