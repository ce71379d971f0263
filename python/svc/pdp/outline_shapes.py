"""The shape of ``svc._pdp_core.outline_policies``' answer, as ``TypedDict``s.

``outline_policies`` (the Rust decision core's ``pdp_core::outline``) parses one ``.cedar`` file
with ``cedar-policy`` and answers, per policy and template, what it is and what it reads
(docs/portal.md#explanations): plain dicts at run time, these types for the type checker
(``svc.pdp.shapes`` does the same for decisions). ``tests/test_policy_outline.py`` holds real
answers to them.
"""

from typing import Literal, TypedDict

from svc.pdp.shapes import EntityRef

__all__ = ["PolicyOutline", "PolicyRead", "PolicyScope", "ScopeConstraint"]


class ScopeConstraint(TypedDict):
    """One scope constraint: ``op`` and what it compares with.

    ``entities`` are the entity literals (several for ``action in [...]``) as Cedar writes them
    (``Group::"admins"``), ``entity_type`` the type of ``is``/``is in``, ``slot`` a template's
    ``?principal``/``?resource``. ``op`` ``any`` is an unconstrained variable.
    """

    op: Literal["any", "==", "in", "is", "is in"]
    entities: list[str]
    entity_type: str | None
    slot: str | None


class PolicyScope(TypedDict):
    """A policy's scope: its principal, action and resource constraints."""

    principal: ScopeConstraint
    action: ScopeConstraint
    resource: ScopeConstraint


class PolicyRead(TypedDict):
    """One attribute path a policy's conditions read or test with ``has``, kept whole.

    ``path`` as Cedar would write it (``resource.owner.manager``, ``context.risk_score``,
    ``principal["first name"]``, ``Group::"admins".lead``, ``resource.getTag("owner")``);
    ``root`` what it starts at (``root_kind`` ``variable``: ``principal``, ``action``,
    ``resource`` or ``context``; ``entity``: an entity literal; ``expression``: any other
    expression's Cedar text in parentheses); ``root_entity`` that entity literal as a reference
    (its id unescaped), else None; ``attrs`` the attribute names after the root;
    ``tag`` the tag a ``getTag``/``hasTag`` with a literal key reads; ``read`` whether the value
    is read, ``has`` whether its presence is tested; ``lines`` the file's 1-based lines it is on.
    """

    path: str
    root: str
    root_kind: Literal["variable", "entity", "expression"]
    root_entity: EntityRef | None
    attrs: list[str]
    tag: str | None
    read: bool
    has: bool
    lines: list[int]


class PolicyOutline(TypedDict):
    """One policy or template of a ``.cedar`` file.

    ``name`` is its bundle name (``@id``, else ``policyN``; docs/bundles.md#policy-names),
    ``text`` the statement exactly as written from its first annotation to its ``;``,
    ``start_line``/``end_line`` its 1-based lines in the file, ``entities`` the entity literals
    it names (scope included), each once in order of first appearance.
    """

    name: str
    effect: Literal["permit", "forbid"]
    template: bool
    text: str
    start_line: int
    end_line: int
    scope: PolicyScope
    reads: list[PolicyRead]
    entities: list[str]
