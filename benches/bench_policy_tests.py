"""Policy tests (docs/policy.md#policy-tests): deciding every saved test, against a shared engine.

Every dry run and every publish decides all saved tests (``PolicyService.run_tests``): the
bundle is loaded into the decision core once, then each test's entity snapshot replaces the
engine's store (so tests never see each other's entities) before its check. The peer is the way
a dry run decides recorded checks (``PolicyService.dry_run``): one engine, every entity loaded
once, one check per request, nothing replaced in between. Both decide the same ``--tests``
requests (1,000 by default, the most the service keeps) under the same bundle, alternately in
the same process, so the machine's load falls on both alike.

Each test is a person (with a group) reading a document (with an owner and a visibility) under
a bundle of ``--policies`` policies; the service runs on SQLite in a temporary directory.

Prints p50 / p99 of one whole run for each design, the tests decided per second, and their
ratio; the load average before and after.

Run: ``.venv/bin/python benches/bench_policy_tests.py [--tests 1000] [--runs 20]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _support import pct
from svc.policy.service import PolicyService, bundle_engine
from svc.policy.settings import PolicySettings

SCHEMA = """
entity Group;
entity Human in [Group] = { department: String };
entity Document = { owner: Human, public: Bool, department: String };
action read, write appliesTo { principal: [Human], resource: [Document] };
"""


def policies(n: int) -> str:
    """`n` policies: the owner writes, public documents are read, a department reads its own,
    and groups read what they are granted, one permit per group."""
    out = [
        '@id("owner-writes")\npermit (principal, action == Action::"write", resource)\n'
        "when { resource.owner == principal };",
        '@id("public-read")\npermit (principal, action == Action::"read", resource)\n'
        "when { resource.public };",
        '@id("department-reads")\npermit (principal, action == Action::"read", resource)\n'
        "when { resource.department == principal.department };",
    ]
    for g in range(max(0, n - 3)):
        out.append(
            f'@id("group-{g}-reads")\npermit (principal in Group::"g{g}", '
            f'action == Action::"read", resource) when {{ resource.department == "d{g % 7}" }};'
        )
    return "\n\n".join(out) + "\n"


def snapshot(i: int, groups: int) -> list[dict[str, object]]:
    """Test `i`'s entities: a person in one group and a document someone else owns."""
    return [
        {
            "uid": {"type": "Human", "id": f"u{i}"},
            "attrs": {"department": f"d{i % 5}"},
            "parents": [{"type": "Group", "id": f"g{i % groups}"}],
        },
        {
            "uid": {"type": "Document", "id": f"doc{i}"},
            "attrs": {
                "owner": {"__entity": {"type": "Human", "id": f"o{i}"}},
                "public": i % 11 == 0,
                "department": f"d{i % 7}",
            },
            "parents": [],
        },
    ]


def main() -> None:
    """Saves the tests, then times both designs (module docs)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--policies", type=int, default=100)
    args = ap.parse_args()
    load_before = os.getloadavg()
    groups = max(1, args.policies - 3)
    files = {"schema.cedarschema": SCHEMA, "policies.cedar": policies(args.policies)}
    with tempfile.TemporaryDirectory(prefix="bench-policy-tests-") as tmp:
        settings = PolicySettings(data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/p.db")
        service = PolicyService(settings)
        version = service.create_draft(files, "bench").version
        requests = []
        for i in range(args.tests):
            request = {
                "principal": {"type": "Human", "id": f"u{i}"},
                "action": "read",
                "resource": {"type": "Document", "id": f"doc{i}"},
            }
            requests.append(request)
            engine = bundle_engine(files)
            engine.upsert_entities(snapshot(i, groups))
            expect = str(engine.evaluate(request)["verdict"])
            service.save_test(f"test {i:05d}", request, snapshot(i, groups), expect, "bench")
        tests_runs: list[float] = []
        shared_runs: list[float] = []
        run = service.run_tests(version)
        assert run.passed == args.tests, run.failed[:3]
        for _ in range(args.runs):
            t0 = time.perf_counter()
            run = service.run_tests(version)
            tests_runs.append(time.perf_counter() - t0)
            assert run.passed == args.tests
            t0 = time.perf_counter()
            engine = bundle_engine(files)
            engine.upsert_entities([e for i in range(args.tests) for e in snapshot(i, groups)])
            verdicts = [engine.evaluate(r)["verdict"] for r in requests]
            shared_runs.append(time.perf_counter() - t0)
            assert len(verdicts) == args.tests
        service.close()
    load_after = os.getloadavg()
    print(
        f"{args.tests} tests, {args.policies} policies, {args.runs} runs; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    for name, runs in (
        ("run_tests (a snapshot per test)", tests_runs),
        ("shared engine (dry run's way)", shared_runs),
    ):
        p50, p99 = pct(runs, 0.5), pct(runs, 0.99)
        print(
            f"  {name:34} p50 {p50 * 1000:8.1f} ms  p99 {p99 * 1000:8.1f} ms  "
            f"{args.tests / p50:10,.0f} tests/s"
        )
    print(f"  ratio (p50): {pct(tests_runs, 0.5) / pct(shared_runs, 0.5):.2f}x")


if __name__ == "__main__":
    main()
