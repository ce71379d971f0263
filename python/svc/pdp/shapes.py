"""The shapes the decision engine returns, as ``TypedDict``s a type checker can hold code to.

``svc.pdp.Engine`` (the Rust core, ``svc._pdp_core``) answers with plain dicts; these types say
exactly which keys those dicts have, which are optional and which strings a field can hold, so
that ``mypy`` catches a misspelt key or an impossible comparison. They are re-exported by
``svc.pdp``; annotate with them, for example ``def show(d: svc.pdp.Decision) -> str``.

* ``Decision``: what ``Engine.evaluate`` returns and each element of ``Engine.evaluate_many``,
  the body of ``POST /v1/access/evaluation`` (docs/api.md#http-routes, docs/decisions.md).
* ``DecisionRecord``: what ``Engine.decide`` returns, the decision-log record of a check
  (docs/history.md#schema).
* ``Plan``: what ``Engine.plan`` returns, the body of ``POST /v1/access/plan``, whose
  ``filter`` is a ``FilterNode`` tree (docs/plans.md, "The filter tree").

The dicts are ordinary ``dict`` objects at run time (``TypedDict`` checks nothing then);
``tests/test_stub_shapes.py`` holds the engine's real answers to these types so they cannot
drift apart. (No ``from __future__ import annotations`` here: on Python 3.11 it hides
``NotRequired`` from ``__required_keys__``; the filter tree's own recursion is quoted instead.)
"""

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

__all__ = [
    "Comparison",
    "Decision",
    "DecisionRecord",
    "EntityRef",
    "FilterCompare",
    "FilterConst",
    "FilterContains",
    "FilterContainsSet",
    "FilterEntity",
    "FilterHas",
    "FilterJunction",
    "FilterLike",
    "FilterNode",
    "FilterNot",
    "FilterResidual",
    "Mode",
    "Outcome",
    "Plan",
    "PlanOutcome",
    "Verdict",
]

Verdict: TypeAlias = Literal["allow", "deny", "challenge"]
"""A check's verdict (docs/decisions.md, "One principal's verdict")."""

Mode: TypeAlias = Literal["monitor", "enforce"]
"""The mode reported with every decision and plan, never applied (docs/decisions.md, "Mode")."""

PlanOutcome: TypeAlias = Literal["always_allowed", "always_denied", "challenge", "conditional"]
"""A plan's outcome (docs/plans.md, "Building a plan")."""

Comparison: TypeAlias = Literal["eq", "ne", "lt", "le", "gt", "ge"]
"""The ``cmp`` of a ``compare`` filter node (docs/plans.md, "The filter tree")."""


class EntityRef(TypedDict):
    """An entity reference as the engine writes it: the type name and the (unescaped) id.

    Cedar's entity-uid JSON (docs/architecture.md#entities-and-the-base-schema), e.g.
    ``{"type": "Human", "id": "alice"}``.
    """

    type: str
    id: str


class Outcome(TypedDict):
    """One principal's own outcome: the ``on_behalf_of`` of a ``Decision``.

    ``challenges`` (kinds, empty unless ``verdict`` is ``challenge``) and ``policies`` (names of
    the policies or built-in reasons such as ``svc:contained`` that decided it, sorted) are as
    in docs/decisions.md, "An agent acting for a person".
    """

    verdict: Verdict
    challenges: list[str]
    policies: list[str]


class Decision(TypedDict):
    """The answer to one check: the response of ``POST /v1/access/evaluation`` (docs/api.md).

    ``qid`` is the decision id (a UUIDv7 string); ``verdict`` the combined verdict enforcement
    points apply; ``challenges`` every challenge kind to pass (both principals' when the verdict
    is ``challenge``); ``policies`` the principal's deciding policies, sorted; ``on_behalf_of``
    the person's own ``Outcome``, present only when the request named one
    (docs/decisions.md, "An agent acting for a person"); ``mode`` the mode in force.
    """

    qid: str
    verdict: Verdict
    challenges: list[str]
    policies: list[str]
    on_behalf_of: NotRequired[Outcome]
    mode: Mode


class DecisionRecord(TypedDict):
    """The decision-log record of one check, as ``Engine.decide`` returns it.

    The fields of docs/history.md#schema that the engine fills: ``at`` is RFC 3339 UTC with
    milliseconds (``2026-11-22T07:25:00.123Z``); ``on_behalf_of`` and ``on_behalf_of_outcome``
    are ``None`` unless the request named a person; ``action`` is the bare action id;
    ``challenge_qid`` is ``None`` (the challenge service fills it in); ``work_item`` is the
    request's ``work_item_id`` or ``None`` and ``assigned`` whether that work item is open and
    links the resource (docs/decisions.md, "Work items"); ``risk_score`` is the reasoner's
    score 0..100 used, or ``None``; ``latency_us`` is engine time in microseconds;
    ``not_in_directory`` and ``inline_ignored`` are as in docs/decisions.md, "Inline entities";
    ``pdp`` names the decision point (``in-process`` for the embedded engine).
    """

    qid: str
    at: str
    principal: EntityRef
    on_behalf_of: EntityRef | None
    action: str
    resource: EntityRef
    verdict: Verdict
    challenges: list[str]
    policies: list[str]
    on_behalf_of_outcome: Outcome | None
    mode: Mode
    challenge_qid: str | None
    work_item: str | None
    assigned: bool
    risk_score: int | None
    policy_version: int
    principals_version: int
    latency_us: int
    not_in_directory: list[EntityRef]
    inline_ignored: list[EntityRef]
    pdp: str


# The filter tree of docs/plans.md, "The filter tree": one TypedDict per group of operators
# that carry the same fields, told apart by ``op``. ``attr`` is a path of attribute names into
# the resource's attributes; values are Cedar JSON (strings, integers, booleans, entity
# references ``{"__entity": {"type", "id"}}``, sets as lists, records as dicts), hence ``Any``.


class FilterConst(TypedDict):
    """``true`` (every row) or ``false`` (no row)."""

    op: Literal["true", "false"]


class FilterJunction(TypedDict):
    """``and`` / ``or`` of ``args`` (SQL AND / OR; at least two arguments)."""

    op: Literal["and", "or"]
    args: "list[FilterNode]"


class FilterNot(TypedDict):
    """``not`` of ``arg`` (SQL NOT)."""

    op: Literal["not"]
    arg: "FilterNode"


class FilterCompare(TypedDict):
    """The attribute at ``attr`` compares with ``value`` by ``cmp`` (ordering on integers only)."""

    op: Literal["compare"]
    attr: list[str]
    cmp: Comparison
    value: Any


class FilterHas(TypedDict):
    """The row has the attribute at ``attr`` (never NULL)."""

    op: Literal["has"]
    attr: list[str]


class FilterContains(TypedDict):
    """The set at ``attr`` holds ``value``."""

    op: Literal["contains"]
    attr: list[str]
    value: Any


class FilterContainsSet(TypedDict):
    """The set at ``attr`` holds any (``contains_any``) or all (``contains_all``) of ``values``."""

    op: Literal["contains_any", "contains_all"]
    attr: list[str]
    values: list[Any]


class FilterLike(TypedDict):
    r"""The whole text at ``attr`` matches ``pattern`` (``*`` any text, ``\*`` a star)."""

    op: Literal["like"]
    attr: list[str]
    pattern: str


class FilterEntity(TypedDict):
    """The row is ``entity`` or one of its descendants (``in``), or exactly ``entity`` (``is``)."""

    op: Literal["in", "is"]
    entity: EntityRef


class FilterResidual(TypedDict):
    """Cannot be decided from the row's attributes; ``detail`` says why, for humans.

    ``unknown``: it needs data of other entities; ``unmappable``: no filter operator expresses
    it. Either makes the plan's ``needs_row_checks`` true (docs/plans.md, "Superset and row
    checks").
    """

    op: Literal["unknown", "unmappable"]
    detail: str


FilterNode: TypeAlias = (
    FilterConst
    | FilterJunction
    | FilterNot
    | FilterCompare
    | FilterHas
    | FilterContains
    | FilterContainsSet
    | FilterLike
    | FilterEntity
    | FilterResidual
)
"""One node of a plan's filter tree (docs/plans.md, "The filter tree"); narrow it on ``op``."""


class Plan(TypedDict):
    """A query plan: the response of ``POST /v1/access/plan`` (docs/plans.md).

    ``qid`` is the plan id (UUIDv7; send it back as ``plan_qid`` to page with the same plan);
    ``filter`` is present for the ``conditional`` and ``challenge`` outcomes only;
    ``challenges`` are the challenge kinds to pass first (``challenge``) or that could show more
    rows (``conditional`` with ``challenge_could_widen``); ``needs_row_checks`` is true when the
    filter has ``unknown``/``unmappable`` nodes; ``attributes`` are the dotted attribute paths
    the filter reads, sorted; ``policies`` the policies (or built-in reasons) it was built
    from, sorted; ``policy_version`` and ``principals_version`` the versions it was built with;
    ``max_age_secs`` how many seconds it may be paged with; ``pinned`` true when ``plan_qid``
    named a plan still good for this same question.
    """

    qid: str
    outcome: PlanOutcome
    filter: NotRequired[FilterNode]
    challenges: list[str]
    challenge_could_widen: bool
    needs_row_checks: bool
    attributes: list[str]
    policies: list[str]
    mode: Mode
    policy_version: int
    principals_version: int
    max_age_secs: int
    pinned: bool
