"""The AuthZEN 1.0 searches (docs/search.md) against a real `svc pdp` process.

* Over HTTP on the corp bundle: every subject, resource and action search, read page by page
  with every page limit from 1 to past the whole result, equals brute force over all
  (subject, action, resource) triples decided with `Engine.evaluate`; challenge verdicts are
  listed in `context.challenges`, never among the results.
* `Engine.search_subjects`, `search_resources` and `search_actions` answer the same; subject
  search on its plan answers as one check per principal, with risk scores and containment.
* The metadata names the three endpoints; bad requests are RFC 9457 problems naming the field;
  a token sent with another request is a 400; a token issued before a bundle reload is a 410,
  and paging while the bundle is reloaded over and over still reads the whole result once
  restarted; each search call writes one decision record (`call` `search`, with its count).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serverkit import assert_problem, wait_until
from svc.broker import LocalLog
from svc.common.topics import DECISIONS_TOPIC
from svc.pdp import Engine, RequestError

CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
SVC = Path(sys.executable).parent / "svc"
ACTIONS = ["delete", "edit", "share", "view"]


def _ids(kind: str) -> list[str]:
    entities = json.loads((CORP / "entities.json").read_text())
    return sorted(e["uid"]["id"] for e in entities if e["uid"]["type"] == kind)


HUMANS = _ids("Human")
DOCS = _ids("Document")


class Pdp:
    """`svc pdp --bundle DIR` as a child process with a local decision-log broker."""

    def __init__(self, bundle: Path, tmp: Path, *extra: str) -> None:
        self.broker = tmp / "broker.db"
        log = LocalLog.open(self.broker)
        log.create_topics([DECISIONS_TOPIC])
        log.close()
        self.proc = subprocess.Popen(
            [
                str(SVC),
                "pdp",
                "--bundle",
                str(bundle),
                "--port",
                "0",
                "--kafka",
                f"local://{self.broker}",
                "--spool-dir",
                str(tmp / "spool"),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

        def bound() -> int | None:
            assert self.proc.poll() is None, "".join(self.lines)
            for line in list(self.lines):
                if "svc-pdp serving" in line and "http://127.0.0.1:" in line:
                    return int(line.split("http://127.0.0.1:")[1].split()[0].strip("/"))
            return None

        port = int(wait_until(bound, timeout=30))
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        wait_until(lambda: self.http.get("/readyz").status_code == 200, timeout=30)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def post(self, kind: str, body: Any) -> httpx.Response:
        return self.http.post(f"/access/v1/search/{kind}", json=body)

    def records(self) -> list[dict[str, Any]]:
        from svc.broker import Consumer

        c = Consumer(
            {
                "bootstrap.servers": f"local://{self.broker}",
                "group.id": f"t{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([DECISIONS_TOPIC])
        out = []
        try:
            while True:
                msgs = c.consume(num_messages=1000, timeout=1.0)
                if not msgs:
                    return out
                out.extend(json.loads(m.value()) for m in msgs if m.error() is None)
        finally:
            c.close()

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._reader.join(timeout=5)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    dst = tmp_path / "corp"
    shutil.copytree(CORP, dst)
    return dst


@pytest.fixture
def pdp(bundle: Path, tmp_path: Path) -> Iterator[Pdp]:
    p = Pdp(bundle, tmp_path)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_bundle_dir(CORP)


def _verdict(engine: Engine, subject: str, action: str, doc: str) -> str:
    try:
        d = engine.evaluate(
            {
                "principal": {"type": "Human", "id": subject},
                "action": action,
                "resource": {"type": "Document", "id": doc},
            }
        )
    except RequestError as e:
        # `export` requires context attributes a search without context does not give.
        assert e.field == "context", e
        return "error"
    return str(d["verdict"])


def _key(v: dict[str, Any]) -> str:
    return str(v.get("id", v.get("name")))


def _read_all(search: Any, body: dict[str, Any], limit: int) -> tuple[list[str], list[str]]:
    """Every page of a search (`search(body) -> response dict`) with `limit`: the result and
    challenge keys in order."""
    results: list[str] = []
    challenges: list[str] = []
    token = ""
    while True:
        page = search({**body, "page": {"limit": limit, "token": token}})
        assert page["page"]["count"] == len(page["results"]) <= limit
        results += [_key(r) for r in page["results"]]
        challenges += [_key(c) for c in page["context"]["challenges"]]
        assert all(c["challenges"] for c in page["context"]["challenges"])
        token = page["page"]["next_token"]
        if token == "":
            return results, challenges
        assert len(page["results"]) == limit


def _want(verdicts: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    return (
        [k for k, v in verdicts if v == "allow"],
        [k for k, v in verdicts if v == "challenge"],
    )


def _http(pdp: Pdp, kind: str) -> Any:
    def run(body: dict[str, Any]) -> dict[str, Any]:
        r = pdp.post(kind, body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    return run


def _cases(
    engine: Engine,
) -> Iterator[tuple[str, dict[str, Any], tuple[list[str], list[str]], int]]:
    """(kind, body, brute-force answer, number of candidates) for every search of corp."""
    for a in ACTIONS:
        for h in HUMANS:
            yield (
                "resource",
                {
                    "subject": {"type": "Human", "id": h},
                    "action": {"name": a},
                    "resource": {"type": "Document"},
                },
                _want([(d, _verdict(engine, h, a, d)) for d in DOCS]),
                len(DOCS),
            )
        for d in DOCS:
            yield (
                "subject",
                {
                    "subject": {"type": "Human"},
                    "action": {"name": a},
                    "resource": {"type": "Document", "id": d},
                },
                _want([(h, _verdict(engine, h, a, d)) for h in HUMANS]),
                len(HUMANS),
            )
    for h in HUMANS:
        for d in DOCS:
            yield (
                "action",
                {"subject": {"type": "Human", "id": h}, "resource": {"type": "Document", "id": d}},
                _want([(a, _verdict(engine, h, a, d)) for a in [*ACTIONS, "export"]]),
                len(ACTIONS) + 1,
            )


def test_every_search_equals_brute_force_over_http(pdp: Pdp, engine: Engine) -> None:
    allowed_somewhere = challenged_somewhere = 0
    for kind, body, want, n in _cases(engine):
        allowed_somewhere += bool(want[0])
        challenged_somewhere += bool(want[1])
        for limit in range(1, n + 2):
            assert _read_all(_http(pdp, kind), body, limit) == want, (kind, body, limit)
    # The scenario exercises both allowed results and challenges.
    assert allowed_somewhere and challenged_somewhere


def test_engine_searches_answer_as_the_routes(pdp: Pdp, engine: Engine) -> None:
    local = {
        "subject": engine.search_subjects,
        "resource": engine.search_resources,
        "action": engine.search_actions,
    }
    for kind, body, want, n in _cases(engine):
        for limit in (1, n):
            assert _read_all(local[kind], body, limit) == want, (kind, body, limit)
        http = pdp.post(kind, body).json()
        mine = local[kind](body)
        for r in (http, mine):
            del r["context"]["qid"]
        assert http == mine


def test_subject_search_plans_per_principal_state() -> None:
    """Subject search's plan (principal unknown) against one check per principal, with the
    principals' own state in play: risk scores on both sides of `risky-needs-approval`'s
    threshold, one principal with none, a contained one; every action and document."""
    e = Engine.from_bundle_dir(CORP)
    scores = [10, 95, 40, 71, 100, 0]
    e.set_risk_scores(
        [
            {"principal": {"type": "Human", "id": h}, "score": scores[i % len(scores)]}
            for i, h in enumerate(HUMANS[1:])
        ]
    )
    e.set_containments([{"type": "Human", "id": HUMANS[2]}])
    seen = {"allow": 0, "challenge": 0}
    for a in ACTIONS:
        for d in DOCS:
            body = {
                "subject": {"type": "Human"},
                "action": {"name": a},
                "resource": {"type": "Document", "id": d},
            }
            want = _want([(h, _verdict(e, h, a, d)) for h in HUMANS])
            seen["allow"] += len(want[0])
            seen["challenge"] += len(want[1])
            assert e.search_subjects(body)["context"]["method"] == "plan"
            for limit in (1, 2, len(HUMANS)):
                assert _read_all(e.search_subjects, body, limit) == want, (a, d, limit)
            e.configure_search(subject_plans=False)
            try:
                assert e.search_subjects(body)["context"]["method"] == "checks"
                assert _read_all(e.search_subjects, body, len(HUMANS)) == want, (a, d)
            finally:
                e.configure_search(subject_plans=True)
    assert seen["allow"] and seen["challenge"]
    assert HUMANS[2] not in [
        r["id"]
        for r in e.search_subjects(
            {
                "subject": {"type": "Human"},
                "action": {"name": "view"},
                "resource": {"type": "Document", "id": DOCS[0]},
                "page": {"limit": 1000},
            }
        )["results"]
    ]


def test_the_largest_page_is_a_setting(bundle: Path, tmp_path: Path, engine: Engine) -> None:
    """`svc pdp --search-max-limit N`: a page.limit of 100 is lowered to N, and reading the
    pages to the end still lists the whole result."""
    kind, body, want, _ = max(_cases(engine), key=lambda c: len(c[2][0]))
    most = len(want[0]) // 2
    assert most >= 1, "the case must need more than one page"
    p = Pdp(bundle, tmp_path, "--search-max-limit", str(most))
    try:
        pages: list[int] = []
        token = ""
        while True:
            page: dict[str, Any] = {"limit": 100, **({"token": token} if token else {})}
            r = p.post(kind, {**body, "page": page})
            assert r.status_code == 200, r.text
            pages.append(r.json()["page"]["count"])
            token = r.json()["page"]["next_token"]
            if not token:
                break
        assert max(pages) == most and sum(pages) == len(want[0]) and len(pages) >= 2
    finally:
        p.stop()


def test_action_search_lists_actions_the_context_does_not_fit(pdp: Pdp) -> None:
    body = {
        "subject": {"type": "Human", "id": "alice"},
        "resource": {"type": "Document", "id": "design"},
    }
    ctx = pdp.post("action", body).json()["context"]
    assert [u["name"] for u in ctx["undecided"]] == ["export"]
    assert "destination" in ctx["undecided"][0]["error"]
    # With the context `export` needs, `export` is decided and the others (whose context type
    # has no `destination`) are listed instead.
    full = {**body, "context": {"risk_score": 10, "destination": "s3"}}
    ctx = pdp.post("action", full).json()["context"]
    assert [u["name"] for u in ctx["undecided"]] == ACTIONS


def test_metadata_names_the_search_endpoints(pdp: Pdp) -> None:
    meta = pdp.http.get("/.well-known/authzen-configuration").json()
    base = meta["policy_decision_point"]
    for kind in ("subject", "resource", "action"):
        assert meta[f"search_{kind}_endpoint"] == f"{base}/access/v1/search/{kind}"


RESOURCE_SEARCH = {
    "subject": {"type": "Human", "id": "alice"},
    "action": {"name": "view"},
    "resource": {"type": "Document"},
}


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (
            "resource",
            {**RESOURCE_SEARCH, "resource": {"type": "Document", "id": "x"}},
            "resource.id",
        ),
        ("resource", {**RESOURCE_SEARCH, "subject": {"type": "Human"}}, "subject.id"),
        ("resource", {**RESOURCE_SEARCH, "action": {"name": "fly"}}, "action.name"),
        ("resource", {**RESOURCE_SEARCH, "action": {}}, "action.name"),
        ("resource", {**RESOURCE_SEARCH, "resource": {"type": "Nope"}}, "resource.type"),
        ("resource", {**RESOURCE_SEARCH, "page": {"limit": 0}}, "page.limit"),
        ("resource", {**RESOURCE_SEARCH, "page": {"limit": "ten"}}, "page.limit"),
        ("resource", {**RESOURCE_SEARCH, "page": {"token": "garbage"}}, "page.token"),
        ("resource", {**RESOURCE_SEARCH, "page": {"size": 3}}, "page.size"),
        ("resource", {**RESOURCE_SEARCH, "context": []}, "context"),
        ("resource", {**RESOURCE_SEARCH, "contxt": {}}, "contxt"),
        (
            "subject",
            {**RESOURCE_SEARCH, "resource": {"type": "Document", "id": "design"}},
            "subject.id",
        ),
        (
            "action",
            {
                "subject": {"type": "Human", "id": "alice"},
                "action": {"name": "view"},
                "resource": {"type": "Document", "id": "design"},
            },
            "action",
        ),
        (
            "action",
            {
                "subject": {"type": "Human", "id": "alice"},
                "resource": {"type": "Document", "id": "design", "properties": {"a": 1}},
            },
            "resource.properties",
        ),
    ],
)
def test_bad_requests_are_problems_naming_the_field(
    pdp: Pdp, kind: str, body: dict[str, Any], field: str
) -> None:
    r = pdp.post(kind, body)
    assert assert_problem(r, 400, field)["type"] == "urn:svc:problem:invalid-request"


def test_a_token_belongs_to_its_request(pdp: Pdp) -> None:
    first = pdp.post("resource", {**RESOURCE_SEARCH, "page": {"limit": 1}}).json()
    token = first["page"]["next_token"]
    assert token
    other = {**RESOURCE_SEARCH, "subject": {"type": "Human", "id": "bob"}, "page": {"token": token}}
    r = pdp.post("resource", other)
    assert assert_problem(r, 400, "page.token")["type"] == "urn:svc:problem:invalid-request"
    # The same request goes on with it, under another limit.
    r = pdp.post("resource", {**RESOURCE_SEARCH, "page": {"token": token, "limit": 5}})
    assert r.status_code == 200, r.text
    assert first["results"][0] not in r.json()["results"]


def _touch_policies(bundle: Path, n: int) -> None:
    """Rewrites a policy file with a new comment: the same policies, a new bundle version."""
    p = bundle / "documents.cedar"
    text = p.read_text().split("\n// reload ")[0]
    p.write_text(f"{text}\n// reload {n}\n")


def test_a_token_from_before_a_reload_is_gone(pdp: Pdp, bundle: Path) -> None:
    first = pdp.post("resource", {**RESOURCE_SEARCH, "page": {"limit": 1}}).json()
    token = first["page"]["next_token"]
    _touch_policies(bundle, 1)

    def gone() -> bool:
        r = pdp.post("resource", {**RESOURCE_SEARCH, "page": {"token": token, "limit": 1}})
        return r.status_code == 410

    wait_until(gone, timeout=30)
    r = pdp.post("resource", {**RESOURCE_SEARCH, "page": {"token": token, "limit": 1}})
    p = assert_problem(r, 410, "page.token")
    assert p["type"] == "urn:svc:problem:search-restart"
    assert "start the search again" in p["detail"]


def test_paging_under_concurrent_bundle_reloads(pdp: Pdp, bundle: Path, engine: Engine) -> None:
    body = {
        "subject": {"type": "Human"},
        "action": {"name": "view"},
        "resource": {"type": "Document", "id": "design"},
    }
    want = _want([(h, _verdict(engine, h, "view", "design")) for h in HUMANS])
    stop = threading.Event()

    def reload() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            _touch_policies(bundle, n)
            # Longer than the reload debounce (300 ms), so each write is a reload.
            time.sleep(0.4)

    t = threading.Thread(target=reload, daemon=True)
    t.start()
    restarts = 0
    complete = 0
    try:
        # Until the reloads have cut a few searches short (and some have read to their end).
        while (restarts < 3 or complete < 3) and restarts + complete < 20_000:
            results: list[str] = []
            challenges: list[str] = []
            token = ""
            while True:
                r = pdp.post("subject", {**body, "page": {"limit": 1, "token": token}})
                if r.status_code == 410:
                    assert_problem(r, 410, "page.token")
                    restarts += 1
                    break
                assert r.status_code == 200, r.text
                page = r.json()
                results += [x["id"] for x in page["results"]]
                challenges += [x["id"] for x in page["context"]["challenges"]]
                token = page["page"]["next_token"]
                if token == "":
                    # A search read to its end without a restart is the whole result, once.
                    assert (results, challenges) == want
                    complete += 1
                    break
    finally:
        stop.set()
        t.join(timeout=10)
    assert restarts >= 3 and complete >= 3, (restarts, complete)
    # After the reloads stop, a search reads to its end.
    time.sleep(1.5)
    assert _read_all(_http(pdp, "subject"), body, 1) == want


def test_each_search_writes_one_decision_record(pdp: Pdp) -> None:
    qids = []
    for kind, body in [
        ("resource", {**RESOURCE_SEARCH, "page": {"limit": 1}}),
        (
            "subject",
            {
                **RESOURCE_SEARCH,
                "subject": {"type": "Human"},
                "resource": {"type": "Document", "id": "design"},
            },
        ),
        (
            "action",
            {
                "subject": {"type": "Human", "id": "alice"},
                "resource": {"type": "Document", "id": "design"},
            },
        ),
    ]:
        r = pdp.post(kind, body)
        assert r.status_code == 200, r.text
        qids.append((kind, r.json()["context"]["qid"], len(r.json()["results"])))

    def records() -> dict[str, Any] | None:
        recs = {r["qid"]: r for r in pdp.records() if r.get("call") == "search"}
        return recs if all(q in recs for _, q, _ in qids) else None

    recs = wait_until(records, timeout=30)
    assert len(recs) == 3
    for kind, qid, count in qids:
        rec = recs[qid]
        assert rec["search"] == kind
        assert rec["count"] == count
        assert rec["verdict"] is None
    assert recs[qids[0][1]]["resource"] == {"type": "Document", "id": None}
    assert recs[qids[1][1]]["principal"] == {"type": "Human", "id": None}
