"""Policy tests: saved decisions a bundle must still decide as expected (docs/policy.md).

A policy test (docs/policy.md#policy-tests) is a request (principal, action, resource,
context, ``on_behalf_of``), the entities needed to decide it (a snapshot taken when it was
saved, so the test does not drift with the directory), the principals contained then, the
principal's risk score then, and the verdict expected (``allow``, ``deny`` or ``challenge``).
Cerbos's policy tests, AWS Verified Permissions' test bench and Styra DAS's decision replay are
the models.

This module holds what does not need the database: ``check_test`` (every bad field of a test to
save, as ``Violation``s) and ``run_tests`` (deciding tests with the decision core,
``svc._pdp_core.Engine``, loaded from a bundle's files as dry runs load them). ``PolicyService``
(``svc.policy.service``) stores tests and calls these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from svc._pdp_core import Engine, RequestError
from svc.common.errors import Violation
from svc.identifiers import identifier_problem

__all__ = [
    "MAX_ENTITIES",
    "MAX_NAME",
    "MAX_TESTS",
    "MAX_TEST_BYTES",
    "VERDICTS",
    "PolicyTest",
    "TestResult",
    "TestRun",
    "check_test",
    "decide_test",
    "run_tests",
    "whole_numbers",
]

#: The verdicts a test may expect.
VERDICTS = ("allow", "deny", "challenge")
#: Most tests the service keeps (each dry run and publish decides all of them).
MAX_TESTS = 1000
#: Longest test name, in characters.
MAX_NAME = 128
#: Most entities in one test's snapshot.
MAX_ENTITIES = 500
#: Largest test, its request and snapshot as compact JSON, in bytes.
MAX_TEST_BYTES = 1024 * 1024
#: Longest type, id or action, in characters.
_MAX_ID = 256
#: Most contained principals and risk scores in one test.
_MAX_REFS = 16


@dataclass(frozen=True)
class PolicyTest:
    """A saved test (module docs).

    ``request`` is ``{"principal": ref, "action": str, "resource": ref, "context": {...}}`` with
    ``"on_behalf_of": ref`` when the check named a person; refs are ``{"type", "id"}``.
    ``entities`` are Cedar entities (``{"uid", "attrs", "parents"}``); ``contained`` refs;
    ``risk_scores`` ``[{"principal": ref, "score": 0..100}]``. ``saved_by`` is the verified
    caller (``<person> via <portal>`` for the portal acting for a person); ``from_decision`` the
    qid of the decision it was saved from (empty when written by hand).
    """

    name: str
    request: dict[str, Any]
    entities: list[dict[str, Any]]
    expect: str
    saved_by: str
    created_at: datetime
    from_decision: str = ""
    contained: list[dict[str, str]] = field(default_factory=list)
    risk_scores: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class TestResult:
    """One test decided under a bundle.

    ``got`` is the verdict, or ``error`` when the bundle cannot decide the request (with
    ``error`` saying why); ``policies`` are the deciding policies; ``notes`` name snapshot
    entities the bundle's schema refused, left out as "what if" leaves them out.
    """

    __test__ = False  # not a pytest class

    name: str
    passed: bool
    expected: str
    got: str
    policies: list[str]
    error: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TestRun:
    """Every saved test decided under bundle ``version``, in name order."""

    __test__ = False

    version: int
    results: list[TestResult]

    @property
    def passed(self) -> int:
        """How many tests got the verdict they expect."""
        return sum(1 for r in self.results if r.passed)

    @property
    def failed(self) -> list[TestResult]:
        """The tests that did not (a verdict other than expected, or ``error``)."""
        return [r for r in self.results if not r.passed]


def whole_numbers(value: Any) -> Any:
    """JSON `value` with every whole float as an int, recursively.

    ``google.protobuf.Struct`` keeps every number as a double; Cedar has no floats, so a whole
    number read back from a ``Struct`` (an entity attribute, a context field) is a ``Long``,
    as the decision point's gRPC API reads them (docs/api.md).
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def _ident(value: Any, where: str, bad: list[Violation], *, required: bool = True) -> None:
    if not isinstance(value, str):
        bad.append(Violation(where, "expected a string"))
        return
    if not value:
        if required:
            bad.append(Violation(where, "must not be empty"))
        return
    if len(value) > _MAX_ID:
        bad.append(Violation(where, f"{len(value)} characters, more than {_MAX_ID}"))
    elif (why := identifier_problem(value)) is not None:
        bad.append(Violation(where, why))


def _check_ref(value: Any, where: str, bad: list[Violation]) -> None:
    if not isinstance(value, Mapping):
        bad.append(Violation(where, "expected {type, id}"))
        return
    extra = sorted(set(value) - {"type", "id"})
    if extra:
        bad.append(Violation(where, f"unknown fields: {', '.join(extra)}"))
    _ident(value.get("type"), f"{where}.type", bad)
    _ident(value.get("id"), f"{where}.id", bad)


def _check_entity(e: Any, where: str, bad: list[Violation]) -> None:
    if not isinstance(e, Mapping):
        bad.append(Violation(where, "expected a Cedar entity {uid, attrs, parents}"))
        return
    extra = sorted(set(e) - {"uid", "attrs", "parents", "tags"})
    if extra:
        bad.append(Violation(where, f"unknown fields: {', '.join(extra)}"))
    _check_ref(e.get("uid"), f"{where}.uid", bad)
    if not isinstance(e.get("attrs", {}), Mapping):
        bad.append(Violation(f"{where}.attrs", "expected an object"))
    parents = e.get("parents", [])
    if not isinstance(parents, list):
        bad.append(Violation(f"{where}.parents", "expected a list of {type, id}"))
    else:
        for j, p in enumerate(parents):
            _check_ref(p, f"{where}.parents[{j}]", bad)


def check_test(
    name: str,
    request: Mapping[str, Any],
    entities: Sequence[Any],
    expect: str,
    from_decision: str = "",
    contained: Sequence[Any] = (),
    risk_scores: Sequence[Any] = (),
) -> list[Violation]:
    """Every problem of a test to save, one ``Violation`` per bad field.

    Args:
        name: 1 to ``MAX_NAME`` printable characters (``svc.identifiers``), no spaces at
            either end.
        request: ``principal`` and ``resource`` refs and ``action`` (each type, id and action
            1 to 256 printable characters), ``context`` an object, ``on_behalf_of`` a ref or
            absent.
        entities: at most ``MAX_ENTITIES`` Cedar entities (``uid`` a ref, ``attrs`` an
            object, ``parents`` refs), no uid twice.
        expect: ``allow``, ``deny`` or ``challenge``.
        from_decision: a decision's qid, or empty.
        contained: at most 16 refs.
        risk_scores: at most 16 ``{"principal": ref, "score": 0..100}``.

    Returns:
        The violations (empty when the test may be saved); the whole test, as compact JSON,
        must also fit in ``MAX_TEST_BYTES``. Whether the entities fit a bundle's schema is
        checked when the test runs, against the bundle it runs under.

    """
    bad: list[Violation] = []
    if not isinstance(name, str) or not name.strip():
        bad.append(Violation("name", "must not be empty"))
    elif len(name) > MAX_NAME:
        bad.append(Violation("name", f"{len(name)} characters, more than {MAX_NAME}"))
    elif name != name.strip():
        bad.append(Violation("name", "must not start or end with spaces"))
    elif (why := identifier_problem(name)) is not None:
        bad.append(Violation("name", why))
    extra = sorted(set(request) - {"principal", "action", "resource", "context", "on_behalf_of"})
    if extra:
        bad.append(Violation("request", f"unknown fields: {', '.join(extra)}"))
    _check_ref(request.get("principal"), "request.principal", bad)
    _ident(request.get("action"), "request.action", bad)
    _check_ref(request.get("resource"), "request.resource", bad)
    if request.get("on_behalf_of") is not None:
        _check_ref(request["on_behalf_of"], "request.on_behalf_of", bad)
    if not isinstance(request.get("context", {}), Mapping):
        bad.append(Violation("request.context", "expected an object"))
    if len(entities) > MAX_ENTITIES:
        bad.append(Violation("entities", f"{len(entities)} entities, more than {MAX_ENTITIES}"))
    else:
        seen: set[tuple[Any, Any]] = set()
        for i, e in enumerate(entities):
            _check_entity(e, f"entities[{i}]", bad)
            uid = e.get("uid") if isinstance(e, Mapping) else None
            if isinstance(uid, Mapping):
                key = (uid.get("type"), uid.get("id"))
                if key in seen:
                    bad.append(Violation(f"entities[{i}].uid", "this entity appears twice"))
                seen.add(key)
    if expect not in VERDICTS:
        bad.append(Violation("expect", f"`{expect}`: expected allow, deny or challenge"))
    if from_decision:
        _ident(from_decision, "from_decision", bad)
    if len(contained) > _MAX_REFS:
        bad.append(Violation("contained", f"more than {_MAX_REFS}"))
    for i, c in enumerate(contained[:_MAX_REFS]):
        _check_ref(c, f"contained[{i}]", bad)
    if len(risk_scores) > _MAX_REFS:
        bad.append(Violation("risk_scores", f"more than {_MAX_REFS}"))
    for i, r in enumerate(risk_scores[:_MAX_REFS]):
        if not isinstance(r, Mapping):
            bad.append(Violation(f"risk_scores[{i}]", "expected {principal, score}"))
            continue
        _check_ref(r.get("principal"), f"risk_scores[{i}].principal", bad)
        score = r.get("score")
        if not isinstance(score, int) or isinstance(score, bool) or not 0 <= score <= 100:
            bad.append(Violation(f"risk_scores[{i}].score", "expected a whole number 0 to 100"))
    if not bad:
        size = len(
            json.dumps(
                [request, list(entities), list(contained), list(risk_scores)],
                separators=(",", ":"),
            ).encode()
        )
        if size > MAX_TEST_BYTES:
            bad.append(
                Violation("entities", f"the test is {size} bytes, more than {MAX_TEST_BYTES}")
            )
    return bad


def _ref_text(ref: Any) -> str:
    if isinstance(ref, Mapping):
        return f'{ref.get("type")}::"{ref.get("id")}"'
    return str(ref)


def decide_test(engine: Engine, test: PolicyTest) -> TestResult:
    """Decides one test with `engine` (the bundle under test) and compares the verdict.

    The engine's entity store is replaced by the test's snapshot (on top of the bundle's own
    ``entities.json``), its containments and risk scores by the test's, so tests never see each
    other's entities. A snapshot entity the bundle's schema refuses is left out and named in
    ``notes``; a request the bundle cannot decide (a type or action its schema lacks, a context
    that does not match) is ``got == "error"``, a failure.

    Returns:
        The result: ``passed`` when the verdict is the one expected.

    """
    notes: list[str] = []
    try:
        engine.replace_entities(test.entities)
    except RequestError:
        engine.replace_entities([])
        for e in test.entities:
            try:
                engine.upsert_entities([e])
            except RequestError as err:
                notes.append(f"{_ref_text(e.get('uid'))} left out: {err}")
    try:
        engine.set_containments(test.contained)
        engine.set_risk_scores(test.risk_scores, replace=True)
    except RequestError as err:  # refs checked on save; a bundle cannot make these fail
        notes.append(f"containments or risk scores left out: {err}")
        engine.set_containments([])
        engine.set_risk_scores([], replace=True)
    request = {k: v for k, v in test.request.items() if k != "context" or v}
    try:
        d = engine.evaluate(request)
    except RequestError as err:
        return TestResult(test.name, False, test.expect, "error", [], str(err), notes)
    got = str(d["verdict"])
    return TestResult(
        test.name, got == test.expect, test.expect, got, [str(p) for p in d["policies"]], "", notes
    )


def run_tests(version: int, engine: Engine, tests: Sequence[PolicyTest]) -> TestRun:
    """Decides every test with `engine`, loaded from bundle `version` (``decide_test``).

    The engine's entity store, containments and risk scores are changed: give it an engine of
    its own (``svc.policy.service.bundle_engine``).

    Returns:
        The results in the order of `tests`.

    """
    return TestRun(version, [decide_test(engine, t) for t in tests])
