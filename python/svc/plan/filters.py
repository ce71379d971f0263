"""Typed filter trees: parse, validate and evaluate the query-plan filter (docs/plans.md).

The planner answers "which rows of type T may this principal see?" with a filter tree in JSON
(the filter contract, docs/plans.md "The filter tree"). This module turns that JSON into frozen
node dataclasses (`parse_filter`), back into JSON (`to_json`), and evaluates a tree over one row
in Cedar's entity JSON shape (`evaluate`) with the contract's SQL three-valued logic: a missing
attribute is NULL, `has` is two-valued, NOT NULL is NULL, AND/OR as in SQL. The evaluator is the
reference the SQL compiler (`svc.plan.sql`) is tested against.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

__all__ = [
    "CMPS",
    "AncestorsLookup",
    "And",
    "Compare",
    "Const",
    "Contains",
    "ContainsAll",
    "ContainsAny",
    "EntityUid",
    "FilterError",
    "Has",
    "In",
    "Is",
    "Like",
    "LikePart",
    "NeedsRowCheck",
    "Node",
    "Not",
    "Or",
    "Residual",
    "Value",
    "evaluate",
    "like_matches",
    "like_parts",
    "parse_filter",
    "parse_value",
    "residuals",
    "to_json",
    "value_key",
]

LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1

Cmp: TypeAlias = Literal["eq", "ne", "lt", "le", "gt", "ge"]
CMPS: tuple[Cmp, ...] = ("eq", "ne", "lt", "le", "gt", "ge")


class FilterError(ValueError):
    """A filter tree that breaks the contract (docs/plans.md#the-filter-tree).

    `path` is where in the tree the (first) problem is, e.g. ``args[1].cmp``; the message lists
    every problem found, each as ``path: what is wrong``. Subclasses `ValueError` (bad input).
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        """Take the problems as ``(path, message)`` pairs, at least one."""
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        self.path = self.problems[0][0] if self.problems else ""
        super().__init__("; ".join(f"{p or '<root>'}: {m}" for p, m in self.problems))


class NeedsRowCheck(FilterError):
    """The filter cannot be decided here, so rows need checking one by one (docs/plans.md).

    Raised for an `unknown`/`unmappable` node or, in SQL, for something the mapping cannot
    express. Callers either fail, or ask for a superset and check the returned rows one by one
    with a decision (``needs_row_checks`` in the plan response).
    """


@dataclass(frozen=True, slots=True)
class EntityUid:
    """A Cedar entity reference: type (``NS::Doc``) and id."""

    type: str
    id: str

    def __str__(self) -> str:
        """Cedar's literal form, ``Type::"id"``, with backslash and quote escaped by a backslash."""
        esc = self.id.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.type}::"{esc}"'


# A Cedar value after parsing: string, Long, bool, entity, set (tuple, order kept as given) or
# record (dict). Note `bool` is a subclass of `int` in Python; use `value_key` to compare.
Value: TypeAlias = "str | int | bool | EntityUid | tuple[Value, ...] | dict[str, Value]"


@dataclass(frozen=True, slots=True)
class Const:
    """``{"op":"true"}`` / ``{"op":"false"}``."""

    value: bool


@dataclass(frozen=True, slots=True)
class And:
    """``{"op":"and","args":[...]}``: SQL AND (no args: TRUE)."""

    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """``{"op":"or","args":[...]}``: SQL OR (no args: FALSE)."""

    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not:
    """``{"op":"not","arg":...}``: SQL NOT (NOT NULL is NULL)."""

    arg: Node


@dataclass(frozen=True, slots=True)
class Compare:
    """``{"op":"compare","attr":[...],"cmp":...,"value":V}``; lt/le/gt/ge take a Long."""

    attr: tuple[str, ...]
    cmp: Cmp
    value: Value


@dataclass(frozen=True, slots=True)
class Has:
    """``{"op":"has","attr":[...]}``: TRUE when the path is present, else FALSE (never NULL)."""

    attr: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Contains:
    """``{"op":"contains","attr":[...],"value":V}``: the set at attr holds the value."""

    attr: tuple[str, ...]
    value: Value


@dataclass(frozen=True, slots=True)
class ContainsAny:
    """``{"op":"contains_any","attr":[...],"values":[...]}``: the set holds any of the values."""

    attr: tuple[str, ...]
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class ContainsAll:
    """``{"op":"contains_all","attr":[...],"values":[...]}``: the set holds all of the values."""

    attr: tuple[str, ...]
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Like:
    r"""``{"op":"like","attr":[...],"pattern":...}``: ``*`` is any text, ``\*`` a star."""

    attr: tuple[str, ...]
    pattern: str


@dataclass(frozen=True, slots=True)
class In:
    """``{"op":"in","entity":{...}}``: the row is the entity or a (transitive) descendant of it."""

    entity: EntityUid


@dataclass(frozen=True, slots=True)
class Is:
    """``{"op":"is","entity":{...}}``: the row is exactly that entity."""

    entity: EntityUid


@dataclass(frozen=True, slots=True)
class Residual:
    """``{"op":"unknown"}`` / ``{"op":"unmappable"}``: undecidable here; check rows one by one."""

    op: Literal["unknown", "unmappable"]
    detail: str | None = None


Node: TypeAlias = (
    "Const | And | Or | Not | Compare | Has | Contains | ContainsAny | ContainsAll | Like | In"
    " | Is | Residual"
)

# --------------------------------------------------------------------------------------------
# Parsing


def _join(path: str, part: str) -> str:
    if part.startswith("["):
        return f"{path}{part}"
    return f"{path}.{part}" if path else part


class _Parser:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def bad(self, path: str, msg: str) -> None:
        self.problems.append((path, msg))

    def node(self, obj: object, path: str) -> Node | None:
        if not isinstance(obj, Mapping):
            self.bad(path, f"a filter node must be an object, got {_jtype(obj)}")
            return None
        op = obj.get("op")
        if not isinstance(op, str):
            self.bad(_join(path, "op"), "missing or not a string")
            return None
        fields = _FIELDS.get(op)
        if fields is None:
            self.bad(_join(path, "op"), f"unknown op {op!r}")
            return None
        required, optional = fields
        for key in obj:
            if key != "op" and key not in required and key not in optional:
                self.bad(_join(path, str(key)), f"unexpected field for op {op!r}")
        missing = [k for k in required if k not in obj]
        for key in missing:
            self.bad(_join(path, key), f"missing (required by op {op!r})")
        if missing:
            return None
        return self._build(op, obj, path)

    def _build(self, op: str, obj: Mapping[str, Any], path: str) -> Node | None:
        if op in ("true", "false"):
            return Const(op == "true")
        if op in ("and", "or"):
            args_path = _join(path, "args")
            raw = obj["args"]
            if not isinstance(raw, list):
                self.bad(args_path, f"must be an array of nodes, got {_jtype(raw)}")
                return None
            parsed = [self.node(a, f"{args_path}[{i}]") for i, a in enumerate(raw)]
            if any(p is None for p in parsed):
                return None
            args = tuple(p for p in parsed if p is not None)
            return And(args) if op == "and" else Or(args)
        if op == "not":
            arg = self.node(obj["arg"], _join(path, "arg"))
            return None if arg is None else Not(arg)
        if op in ("unknown", "unmappable"):
            detail = obj.get("detail")
            if detail is not None and not isinstance(detail, str):
                self.bad(_join(path, "detail"), f"must be a string, got {_jtype(detail)}")
                return None
            return Residual("unknown" if op == "unknown" else "unmappable", detail)
        if op in ("in", "is"):
            ent = self.entity(obj["entity"], _join(path, "entity"))
            if ent is None:
                return None
            return In(ent) if op == "in" else Is(ent)
        attr = self.attr(obj["attr"], _join(path, "attr"))
        if op == "has":
            return None if attr is None else Has(attr)
        if op == "like":
            pattern = obj["pattern"]
            if not isinstance(pattern, str):
                self.bad(_join(path, "pattern"), f"must be a string, got {_jtype(pattern)}")
                return None
            return None if attr is None else Like(attr, pattern)
        if op == "compare":
            cmp = obj["cmp"]
            value = self.value(obj["value"], _join(path, "value"))
            if cmp not in CMPS:
                self.bad(_join(path, "cmp"), f"unknown comparison {cmp!r}")
                return None
            if cmp not in ("eq", "ne") and value is not None and not _is_long(value):
                self.bad(
                    _join(path, "value"),
                    f"comparison {cmp!r} takes an integer, got {_vtype(value)}",
                )
                return None
            if attr is None or value is None:
                return None
            return Compare(attr, cmp, value)
        if op == "contains":
            value = self.value(obj["value"], _join(path, "value"))
            return None if attr is None or value is None else Contains(attr, value)
        # contains_any / contains_all
        values_path = _join(path, "values")
        raw_values = obj["values"]
        if not isinstance(raw_values, list):
            self.bad(values_path, f"must be an array of values, got {_jtype(raw_values)}")
            return None
        values = [self.value(v, f"{values_path}[{i}]") for i, v in enumerate(raw_values)]
        if attr is None or any(v is None for v in values):
            return None
        vals = tuple(v for v in values if v is not None)
        return ContainsAny(attr, vals) if op == "contains_any" else ContainsAll(attr, vals)

    def attr(self, raw: object, path: str) -> tuple[str, ...] | None:
        if not isinstance(raw, list) or not raw or not all(isinstance(a, str) and a for a in raw):
            self.bad(path, "must be a non-empty array of non-empty attribute names")
            return None
        return tuple(raw)

    def entity(self, raw: object, path: str) -> EntityUid | None:
        uid = _as_entity(raw)
        if uid is None:
            self.bad(path, 'must be an entity reference {"type": ..., "id": ...}')
        return uid

    def value(self, raw: object, path: str) -> Value | None:
        if isinstance(raw, bool | str):
            return raw
        if isinstance(raw, int):
            if not LONG_MIN <= raw <= LONG_MAX:
                self.bad(path, f"integer {raw} is out of Cedar's Long range")
                return None
            return raw
        if isinstance(raw, list):
            items = [self.value(v, f"{path}[{i}]") for i, v in enumerate(raw)]
            if any(v is None for v in items):
                return None
            return tuple(v for v in items if v is not None)
        if isinstance(raw, Mapping):
            if "__extn" in raw:
                self.bad(path, "extension values are not part of the filter contract")
                return None
            uid = _as_entity(raw)
            if uid is not None:
                return uid
            if "__entity" in raw:
                self.bad(path, "malformed entity reference")
                return None
            fields: dict[str, Value] = {}
            ok = True
            for k, v in raw.items():
                fv = self.value(v, _join(path, str(k)))
                if fv is None:
                    ok = False
                else:
                    fields[str(k)] = fv
            return fields if ok else None
        self.bad(path, f"not a Cedar value: {_jtype(raw)}")
        return None


_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "true": ((), ()),
    "false": ((), ()),
    "and": (("args",), ()),
    "or": (("args",), ()),
    "not": (("arg",), ()),
    "compare": (("attr", "cmp", "value"), ()),
    "has": (("attr",), ()),
    "contains": (("attr", "value"), ()),
    "contains_any": (("attr", "values"), ()),
    "contains_all": (("attr", "values"), ()),
    "like": (("attr", "pattern"), ()),
    "in": (("entity",), ()),
    "is": (("entity",), ()),
    "unknown": ((), ("detail",)),
    "unmappable": ((), ("detail",)),
}


def _jtype(obj: object) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "a boolean"
    if isinstance(obj, int):
        return "an integer"
    if isinstance(obj, float):
        return "a float"
    if isinstance(obj, str):
        return "a string"
    if isinstance(obj, list | tuple):
        return "an array"
    if isinstance(obj, Mapping):
        return "an object"
    return type(obj).__name__


def _vtype(v: Value) -> str:
    if isinstance(v, EntityUid):
        return "an entity"
    if isinstance(v, tuple):
        return "a set"
    if isinstance(v, dict):
        return "a record"
    return _jtype(v)


def _is_long(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_entity(raw: object) -> EntityUid | None:
    """An entity reference in either Cedar JSON form, or None when `raw` is not one.

    Accepted: ``{"__entity": {"type": T, "id": I}}`` and the bare ``{"type": T, "id": I}``
    (exactly those two keys, both strings). `EntityUid` instances pass through.
    """
    if isinstance(raw, EntityUid):
        return raw
    if not isinstance(raw, Mapping):
        return None
    if set(raw) == {"__entity"}:
        raw = raw["__entity"]
        if not isinstance(raw, Mapping):
            return None
    if set(raw) == {"type", "id"} and isinstance(raw["type"], str) and isinstance(raw["id"], str):
        return EntityUid(raw["type"], raw["id"])
    return None


def parse_filter(obj: object) -> Node:
    """Parse and validate a filter tree in the contract's JSON shape (docs/plans.md).

    Takes the decoded JSON (a dict) and returns the root `Node`. Entity references are accepted
    as ``{"__entity": {...}}`` or bare ``{"type","id"}``; `and`/`or` may have any number of args.
    Raises `FilterError` naming every bad path (e.g. ``args[1].cmp: unknown comparison 'eqq'``).
    """
    parser = _Parser()
    node = parser.node(obj, "")
    if parser.problems or node is None:
        raise FilterError(parser.problems or [("", "invalid filter")])
    return node


def parse_value(obj: object) -> Value:
    """Parse one Cedar JSON value (string, Long, bool, entity, set, record).

    Raises `FilterError` when `obj` is not a Cedar value of the filter contract.
    """
    parser = _Parser()
    value = parser.value(obj, "")
    if parser.problems or value is None:
        raise FilterError(parser.problems or [("", "invalid value")])
    return value


def value_to_json(v: Value) -> Any:
    """The contract's JSON for a value (entities as ``{"__entity": ...}``, sets as arrays)."""
    if isinstance(v, EntityUid):
        return {"__entity": {"type": v.type, "id": v.id}}
    if isinstance(v, tuple):
        return [value_to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: value_to_json(x) for k, x in v.items()}
    return v


def to_json(node: Node) -> dict[str, Any]:
    """The contract's JSON for a parsed tree; ``parse_filter(to_json(n)) == n``."""
    match node:
        case Const(value):
            return {"op": "true" if value else "false"}
        case And(args):
            return {"op": "and", "args": [to_json(a) for a in args]}
        case Or(args):
            return {"op": "or", "args": [to_json(a) for a in args]}
        case Not(arg):
            return {"op": "not", "arg": to_json(arg)}
        case Compare(attr, cmp, value):
            return {"op": "compare", "attr": list(attr), "cmp": cmp, "value": value_to_json(value)}
        case Has(attr):
            return {"op": "has", "attr": list(attr)}
        case Contains(attr, value):
            return {"op": "contains", "attr": list(attr), "value": value_to_json(value)}
        case ContainsAny(attr, values):
            return {
                "op": "contains_any",
                "attr": list(attr),
                "values": [value_to_json(v) for v in values],
            }
        case ContainsAll(attr, values):
            return {
                "op": "contains_all",
                "attr": list(attr),
                "values": [value_to_json(v) for v in values],
            }
        case Like(attr, pattern):
            return {"op": "like", "attr": list(attr), "pattern": pattern}
        case In(entity):
            return {"op": "in", "entity": {"type": entity.type, "id": entity.id}}
        case Is(entity):
            return {"op": "is", "entity": {"type": entity.type, "id": entity.id}}
        case Residual(op, detail):
            return {"op": op} if detail is None else {"op": op, "detail": detail}
    raise TypeError(f"not a filter node: {node!r}")  # pragma: no cover


def residuals(node: Node) -> Iterator[Residual]:
    """Yield every `unknown`/`unmappable` node of the tree (``needs_row_checks``, docs/plans.md)."""
    match node:
        case Residual():
            yield node
        case And(args) | Or(args):
            for a in args:
                yield from residuals(a)
        case Not(arg):
            yield from residuals(arg)
        case _:
            pass


# --------------------------------------------------------------------------------------------
# Values: semantic keys (Cedar equality) for both filter values and raw row JSON

# A key is a hashable tagged tuple: ("s", str), ("l", int), ("b", bool), ("e", type, id),
# ("S", frozenset[key]), ("R", frozenset[(name, key)]), ("?", json) for anything else.
Key: TypeAlias = tuple[Any, ...]


def value_key(v: object) -> Key | None:
    """Cedar-equality key of a parsed `Value` or of raw Cedar JSON from a row.

    Two values are equal in Cedar exactly when their keys are equal (sets unordered, entities by
    type and id in either JSON form, ``1 != true``). Returns None for JSON null, which the
    evaluator treats as a missing attribute.
    """
    if v is None:
        return None
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("l", v)
    if isinstance(v, str):
        return ("s", v)
    uid = _as_entity(v)
    if uid is not None:
        return ("e", uid.type, uid.id)
    if isinstance(v, list | tuple):
        return ("S", frozenset(k for k in (value_key(x) for x in v) if k is not None))
    if isinstance(v, Mapping):
        if "__extn" in v:
            return ("?", json.dumps(v, sort_keys=True, default=str))
        return (
            "R",
            frozenset(
                (str(k), kv)
                for k, kv in ((k, value_key(x)) for k, x in v.items())
                if kv is not None
            ),
        )
    return ("?", repr(v))


# --------------------------------------------------------------------------------------------
# Like patterns

LikePart: TypeAlias = "str | None"  # a literal run of text, or None for the `*` wildcard


def like_parts(pattern: str) -> list[LikePart]:
    r"""Split a Cedar pattern into literal runs and wildcards (None), per the filter contract.

    ``*`` is the wildcard; ``\*`` is a literal star; every other character, including a
    backslash not followed by a star, is literal. Adjacent wildcards are merged.
    """
    parts: list[LikePart] = []
    buf: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and pattern[i + 1] == "*":
            buf.append("*")
            i += 2
            continue
        if c == "*":
            if buf:
                parts.append("".join(buf))
                buf = []
            if not parts or parts[-1] is not None:
                parts.append(None)
        else:
            buf.append(c)
        i += 1
    if buf:
        parts.append("".join(buf))
    return parts


def _like_regex(parts: Sequence[LikePart]) -> re.Pattern[str]:
    body = "".join(".*" if p is None else re.escape(p) for p in parts)
    return re.compile(body, re.DOTALL)


def like_matches(text: str, pattern: str) -> bool:
    """Whether `text` matches the Cedar pattern as a whole (see `like_parts`)."""
    return _like_regex(like_parts(pattern)).fullmatch(text) is not None


# --------------------------------------------------------------------------------------------
# Evaluation (SQL three-valued logic; None is NULL)

AncestorsLookup: TypeAlias = (
    "Callable[[EntityUid], Iterable[object]] | Mapping[EntityUid, Iterable[object]]"
)
Truth: TypeAlias = bool | None

_MISSING = object()


def _attr_value(attrs: object, path: Sequence[str]) -> object:
    cur = attrs
    for name in path:
        if not isinstance(cur, Mapping) or _as_entity(cur) is not None or name not in cur:
            return _MISSING
        cur = cur[name]
    return _MISSING if cur is None else cur


def _and(vals: Iterable[Truth]) -> Truth:
    result: Truth = True
    for v in vals:
        if v is False:
            return False
        if v is None:
            result = None
    return result


def _or(vals: Iterable[Truth]) -> Truth:
    result: Truth = False
    for v in vals:
        if v is True:
            return True
        if v is None:
            result = None
    return result


class _Evaluator:
    def __init__(
        self,
        row: Mapping[str, Any],
        ancestors: AncestorsLookup | None,
        superset: bool,
    ) -> None:
        uid = _as_entity(row.get("uid"))
        if uid is None:
            raise ValueError('row has no valid "uid" {"type": ..., "id": ...}')
        self.uid = uid
        attrs = row.get("attrs", {})
        self.attrs: Mapping[str, Any] = attrs if isinstance(attrs, Mapping) else {}
        self.row = row
        self.ancestors_lookup = ancestors
        self.superset = superset
        self._ancestors: set[EntityUid] | None = None

    def ancestors(self) -> set[EntityUid]:
        if self._ancestors is None:
            found: set[EntityUid] = set()
            for p in self.row.get("parents", ()) or ():
                uid = _as_entity(p)
                if uid is not None:
                    found.add(uid)
            lookup = self.ancestors_lookup
            extra: Iterable[object] = ()
            if callable(lookup):
                extra = lookup(self.uid) or ()
            elif lookup is not None:
                extra = lookup.get(self.uid, ())
            for p in extra:
                uid = _as_entity(p)
                if uid is not None:
                    found.add(uid)
            self._ancestors = found
        return self._ancestors

    def eval(self, node: Node, positive: bool) -> Truth:
        match node:
            case Const(value):
                return value
            case And(args):
                return _and(self.eval(a, positive) for a in args)
            case Or(args):
                return _or(self.eval(a, positive) for a in args)
            case Not(arg):
                inner = self.eval(arg, not positive)
                return None if inner is None else not inner
            case Residual():
                # Superset: TRUE under an even number of NOTs, FALSE under an odd number.
                return positive
            case Has(attr):
                return _attr_value(self.attrs, attr) is not _MISSING
            case In(entity):
                return self.uid == entity or entity in self.ancestors()
            case Is(entity):
                return self.uid == entity
        if isinstance(node, Compare | Contains | ContainsAny | ContainsAll | Like):
            return self.eval_attr(node)
        raise TypeError(f"not a filter node: {node!r}")  # pragma: no cover

    def eval_attr(self, node: Compare | Contains | ContainsAny | ContainsAll | Like) -> Truth:
        raw = _attr_value(self.attrs, node.attr)
        if raw is _MISSING:
            return None
        key = value_key(raw)
        if key is None:  # pragma: no cover - _attr_value maps null to missing
            return None
        if isinstance(node, Compare):
            if node.cmp == "eq":
                return key == value_key(node.value)
            if node.cmp == "ne":
                return key != value_key(node.value)
            if key[0] != "l" or not isinstance(node.value, int):
                return None  # ordering on a non-Long is a type error: no match
            left: int = key[1]
            right = node.value
            return {
                "lt": left < right,
                "le": left <= right,
                "gt": left > right,
                "ge": left >= right,
            }[node.cmp]
        if isinstance(node, Like):
            return like_matches(key[1], node.pattern) if key[0] == "s" else None
        if key[0] != "S":
            return None  # not a set: type error, no match
        members: frozenset[Key] = key[1]
        if isinstance(node, Contains):
            return value_key(node.value) in members
        if isinstance(node, ContainsAny):
            return any(value_key(v) in members for v in node.values)
        return all(value_key(v) in members for v in node.values)


def evaluate(
    filter: Node | Mapping[str, Any],
    row: Mapping[str, Any],
    *,
    ancestors: AncestorsLookup | None = None,
    unknown: Literal["raise", "superset"] = "raise",
) -> bool:
    """Whether the filter matches one row (its value is TRUE), per the filter contract.

    Takes a parsed `Node` (or the contract JSON, parsed first) and a row in Cedar's entity JSON
    shape ``{"uid": {"type", "id"}, "attrs": {...}, "parents": [...]}``; entity references may be
    ``{"__entity": {...}}`` or bare ``{"type", "id"}``. A missing attribute (or JSON null) is SQL
    NULL; NULL and FALSE both mean "no match". `ancestors` gives the transitive ancestors of a
    uid (a callable or a mapping keyed by `EntityUid`) for `in`; without it only the row's
    ``parents`` count. Returns True when the filter is TRUE for the row.

    Raises `NeedsRowCheck` when the tree has an `unknown`/`unmappable` node and ``unknown`` is
    ``"raise"``; with ``"superset"`` such nodes are TRUE under an even number of NOTs and FALSE
    under an odd number, so the answer is True for every row that any reading could match.
    Raises `FilterError` for a malformed tree and `ValueError` for a row without a valid uid.
    """
    node = filter if not isinstance(filter, Mapping) else parse_filter(filter)
    if unknown not in ("raise", "superset"):
        raise ValueError(f"unknown must be 'raise' or 'superset', got {unknown!r}")
    if unknown == "raise":
        found = next(residuals(node), None)
        if found is not None:
            detail = f" ({found.detail})" if found.detail else ""
            raise NeedsRowCheck([("", f"filter has an {found.op!r} node{detail}")])
    return _Evaluator(row, ancestors, unknown == "superset").eval(node, True) is True
