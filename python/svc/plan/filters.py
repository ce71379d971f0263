"""Typed filter trees: parse, validate and evaluate the query-plan filter (docs/plans.md).

The planner answers "which rows of type T may this principal see?" with a filter tree in JSON
(the filter contract, docs/plans.md "The filter tree"). This module turns that JSON into frozen
node models (`parse_filter`: a pydantic discriminated union on ``op``, errors naming the bad
path), back into JSON (`to_json`), and evaluates a tree over one row in Cedar's entity JSON
shape (`evaluate`) with the contract's SQL three-valued logic: a missing attribute is NULL,
`has` is two-valued, NOT NULL is NULL, AND/OR as in SQL. The evaluator is the reference the SQL
compiler (`svc.plan.sql`) is tested against.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

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
Value = TypeAliasType(
    "Value", "str | int | bool | EntityUid | tuple[Value, ...] | dict[str, Value]"
)


class _Node(BaseModel):
    """What every filter node model shares: frozen, and no field beyond its op's."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _problem(message: str, problems: Sequence[tuple[str, str]] = ()) -> PydanticCustomError:
    """A validation error of the filter contract (pydantic reports it at the field).

    `problems` are ``(sub-path, message)`` pairs below the field (a value's ``[2].x``); default:
    the field itself with `message`.
    """
    return PydanticCustomError(
        "filter", "{message}", {"message": message, "problems": list(problems) or [("", message)]}
    )


def _attr(raw: object) -> tuple[str, ...]:
    if (
        not isinstance(raw, list | tuple)
        or not raw
        or not all(isinstance(a, str) and a for a in raw)
    ):
        raise _problem("must be a non-empty array of non-empty attribute names")
    return tuple(raw)


def _entity(raw: object) -> EntityUid:
    uid = _as_entity(raw)
    if uid is None:
        raise _problem('must be an entity reference {"type": ..., "id": ...}')
    return uid


def _value(raw: object) -> Value:
    problems: list[tuple[str, str]] = []
    value = _parse_value(raw, "", problems)
    if problems or value is None:
        problems = problems or [("", "invalid value")]
        raise _problem(problems[0][1], problems)
    return value


def _values(raw: object) -> tuple[Value, ...]:
    if not isinstance(raw, list | tuple):
        raise _problem(f"must be an array of values, got {_jtype(raw)}")
    problems: list[tuple[str, str]] = []
    values = [_parse_value(v, f"[{i}]", problems) for i, v in enumerate(raw)]
    if problems:
        raise _problem(problems[0][1], problems)
    return tuple(v for v in values if v is not None)


def _string(raw: object) -> str:
    if not isinstance(raw, str):
        raise _problem(f"must be a string, got {_jtype(raw)}")
    return raw


def _optional_string(raw: object) -> str | None:
    return None if raw is None else _string(raw)


def _cmp(raw: object) -> Cmp:
    for c in CMPS:
        if raw == c and isinstance(raw, str):
            return c
    raise _problem(f"unknown comparison {raw!r}")


def _node_list(raw: object) -> object:
    if not isinstance(raw, list | tuple):
        raise _problem(f"must be an array of nodes, got {_jtype(raw)}")
    return raw


#: Field types of the node models, each parsed by a function that names what is wrong.
_Attr = Annotated[tuple[str, ...], PlainValidator(_attr)]
_Entity = Annotated[EntityUid, PlainValidator(_entity)]
_Value = Annotated[Value, PlainValidator(_value)]
_Values = Annotated[tuple[Value, ...], PlainValidator(_values)]
_Pattern = Annotated[str, PlainValidator(_string)]
_Detail = Annotated[str | None, PlainValidator(_optional_string)]
_Cmp = Annotated[Cmp, PlainValidator(_cmp)]
_Args = Annotated["tuple[Node, ...]", BeforeValidator(_node_list)]


class Const(_Node):
    """``{"op":"true"}`` / ``{"op":"false"}``; ``value`` is the truth."""

    __match_args__ = ("value",)

    op: Literal["true", "false"]

    @property
    def value(self) -> bool:
        """True for ``{"op":"true"}``."""
        return self.op == "true"


class And(_Node):
    """``{"op":"and","args":[...]}``: SQL AND (no args: TRUE)."""

    __match_args__ = ("args",)

    op: Literal["and"] = "and"
    args: _Args


class Or(_Node):
    """``{"op":"or","args":[...]}``: SQL OR (no args: FALSE)."""

    __match_args__ = ("args",)

    op: Literal["or"] = "or"
    args: _Args


class Not(_Node):
    """``{"op":"not","arg":...}``: SQL NOT (NOT NULL is NULL)."""

    __match_args__ = ("arg",)

    op: Literal["not"] = "not"
    arg: Node


class Compare(_Node):
    """``{"op":"compare","attr":[...],"cmp":...,"value":V}``; lt/le/gt/ge take a Long."""

    __match_args__ = ("attr", "cmp", "value")

    op: Literal["compare"] = "compare"
    attr: _Attr
    cmp: _Cmp
    value: _Value

    @field_validator("value")
    @classmethod
    def _ordered_takes_a_long(cls, value: Value, info: ValidationInfo) -> Value:
        """lt/le/gt/ge compare Longs only (docs/plans.md)."""
        cmp = info.data.get("cmp")
        if cmp is not None and cmp not in ("eq", "ne") and not _is_long(value):
            raise _problem(f"comparison {cmp!r} takes an integer, got {_vtype(value)}")
        return value


class Has(_Node):
    """``{"op":"has","attr":[...]}``: TRUE when the path is present, else FALSE (never NULL)."""

    __match_args__ = ("attr",)

    op: Literal["has"] = "has"
    attr: _Attr


class Contains(_Node):
    """``{"op":"contains","attr":[...],"value":V}``: the set at attr holds the value."""

    __match_args__ = ("attr", "value")

    op: Literal["contains"] = "contains"
    attr: _Attr
    value: _Value


class ContainsAny(_Node):
    """``{"op":"contains_any","attr":[...],"values":[...]}``: the set holds any of the values."""

    __match_args__ = ("attr", "values")

    op: Literal["contains_any"] = "contains_any"
    attr: _Attr
    values: _Values


class ContainsAll(_Node):
    """``{"op":"contains_all","attr":[...],"values":[...]}``: the set holds all of the values."""

    __match_args__ = ("attr", "values")

    op: Literal["contains_all"] = "contains_all"
    attr: _Attr
    values: _Values


class Like(_Node):
    r"""``{"op":"like","attr":[...],"pattern":...}``: ``*`` is any text, ``\*`` a star."""

    __match_args__ = ("attr", "pattern")

    op: Literal["like"] = "like"
    attr: _Attr
    pattern: _Pattern


class In(_Node):
    """``{"op":"in","entity":{...}}``: the row is the entity or a (transitive) descendant of it."""

    __match_args__ = ("entity",)

    op: Literal["in"] = "in"
    entity: _Entity


class Is(_Node):
    """``{"op":"is","entity":{...}}``: the row is exactly that entity."""

    __match_args__ = ("entity",)

    op: Literal["is"] = "is"
    entity: _Entity


class Residual(_Node):
    """``{"op":"unknown"}`` / ``{"op":"unmappable"}``: undecidable here; check rows one by one."""

    __match_args__ = ("op", "detail")

    op: Literal["unknown", "unmappable"]
    detail: _Detail = None


#: A filter node: the pydantic discriminated union of the node models on ``op``
#: (https://docs.pydantic.dev/latest/concepts/unions/#discriminated-unions).
Node: TypeAlias = Annotated[
    Const
    | And
    | Or
    | Not
    | Compare
    | Has
    | Contains
    | ContainsAny
    | ContainsAll
    | Like
    | In
    | Is
    | Residual,
    Field(discriminator="op"),
]

for _model in (And, Or, Not):
    _model.model_rebuild()

_NODE = TypeAdapter(Node)

#: Every ``op`` of the contract (the union's tags).
_OPS = frozenset(
    op
    for model in (
        Const,
        And,
        Or,
        Not,
        Compare,
        Has,
        Contains,
        ContainsAny,
        ContainsAll,
        Like,
        In,
        Is,
        Residual,
    )
    for op in get_args(model.model_fields["op"].annotation)
)

# --------------------------------------------------------------------------------------------
# Parsing


def _join(path: str, part: str) -> str:
    if part.startswith("["):
        return f"{path}{part}"
    return f"{path}.{part}" if path else part


def _problems(error: ValidationError) -> list[tuple[str, str]]:
    """The pydantic errors of a tree as ``(path, message)`` in the contract's words.

    Pydantic's location of an error alternates the tag of each node (its ``op``) and the field
    below it (``("or", "args", 1, "compare", "cmp")``); the path drops the tags
    (``args[1].cmp``) and the message names the op where that helps.
    """
    out: list[tuple[str, str]] = []
    for err in error.errors():
        loc, path, tag, op, i = err["loc"], "", None, None, 0
        while i < len(loc):
            part = loc[i]
            i += 1
            if isinstance(part, str) and part in _OPS and tag is None:
                tag = part  # the op of the node at `path`
                continue
            if isinstance(part, int):
                path = f"{path}[{part}]"
            else:
                path, op = _join(path, part), tag  # a field of the node tagged `tag`
            if part in ("args", "arg") or isinstance(part, int):
                tag = None  # a node follows
        kind, raw = err["type"], err.get("input")
        if kind == "filter":
            ctx = err.get("ctx") or {}
            out.extend((_join(path, sub) if sub else path, m) for sub, m in ctx["problems"])
        elif kind == "union_tag_invalid" and isinstance(raw, Mapping):
            tag = raw.get("op")
            if isinstance(tag, str):
                out.append((_join(path, "op"), f"unknown op {tag!r}"))
            else:
                out.append((_join(path, "op"), "missing or not a string"))
        elif kind == "union_tag_not_found":
            out.append((_join(path, "op"), "missing or not a string"))
        elif kind in ("model_attributes_type", "model_type", "dict_type"):
            out.append((path, f"a filter node must be an object, got {_jtype(raw)}"))
        elif kind == "extra_forbidden":
            out.append((path, f"unexpected field for op {op!r}"))
        elif kind == "missing":
            out.append((path, f"missing (required by op {op!r})"))
        else:
            out.append((path, str(err["msg"])))
    return out


def _parse_value(raw: object, path: str, problems: list[tuple[str, str]]) -> Value | None:
    """One Cedar JSON value of the contract, or None with what is wrong added to `problems`."""
    if isinstance(raw, bool | str):
        return raw
    if isinstance(raw, int):
        if not LONG_MIN <= raw <= LONG_MAX:
            problems.append((path, f"integer {raw} is out of Cedar's Long range"))
            return None
        return raw
    if isinstance(raw, list):
        items = [_parse_value(v, f"{path}[{i}]", problems) for i, v in enumerate(raw)]
        if any(v is None for v in items):
            return None
        return tuple(v for v in items if v is not None)
    if isinstance(raw, Mapping):
        if "__extn" in raw:
            problems.append((path, "extension values are not part of the filter contract"))
            return None
        uid = _as_entity(raw)
        if uid is not None:
            return uid
        if "__entity" in raw:
            problems.append((path, "malformed entity reference"))
            return None
        fields: dict[str, Value] = {}
        ok = True
        for k, v in raw.items():
            fv = _parse_value(v, _join(path, str(k)), problems)
            if fv is None:
                ok = False
            else:
                fields[str(k)] = fv
        return fields if ok else None
    problems.append((path, f"not a Cedar value: {_jtype(raw)}"))
    return None


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

    Takes the decoded JSON (a dict) and returns the root `Node`, validated as the pydantic
    discriminated union `Node` (on ``op``). Entity references are accepted as
    ``{"__entity": {...}}`` or bare ``{"type","id"}``; `and`/`or` may have any number of args.
    Raises `FilterError` naming every bad path (e.g. ``args[1].cmp: unknown comparison 'eqq'``).
    """
    try:
        return _NODE.validate_python(obj)
    except ValidationError as e:
        raise FilterError(_problems(e) or [("", "invalid filter")]) from None


def parse_value(obj: object) -> Value:
    """Parse one Cedar JSON value (string, Long, bool, entity, set, record).

    Raises `FilterError` when `obj` is not a Cedar value of the filter contract.
    """
    problems: list[tuple[str, str]] = []
    value = _parse_value(obj, "", problems)
    if problems or value is None:
        raise FilterError(problems or [("", "invalid value")])
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
