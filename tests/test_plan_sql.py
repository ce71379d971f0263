"""Filter trees to SQL (docs/plans.md): SQLite and a real PostgreSQL against the evaluator.

Every case runs the compiled clause on both databases and compares the matching rows with
`svc.plan.evaluate` over the same rows in Cedar's entity JSON shape; hand-written cases also
pin the expected ids. The property tests draw random trees and rows over a fixed schema.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite

from svc.plan import (
    ArraySet,
    Closure,
    EntityUid,
    FilterError,
    JoinSet,
    JsonAttr,
    MappingError,
    NeedsRowCheck,
    ScalarAttr,
    SqlMapping,
    compile_filter,
    evaluate,
    parse_filter,
    to_json,
)
from svc.plan.filters import like_matches, like_parts
from svc.plan.sql import glob_pattern, like_pattern

DOC = "NS::Doc"
USER = "NS::User"
FOLDER = "NS::Folder"
# Folder hierarchy: f2 is in f1.
FOLDER_PARENTS = {"f1": [], "f2": ["f1"], "f3": []}


def user(i: str, bare: bool = False) -> dict[str, Any]:
    ref = {"type": USER, "id": i}
    return ref if bare else {"__entity": ref}


# --------------------------------------------------------------------------------------------
# Schema, mapping and loading


@dataclass
class Db:
    name: str
    engine: sa.Engine
    docs: sa.Table
    mapping: SqlMapping

    def load(self, rows: Sequence[Mapping[str, Any]]) -> None:
        md = self.docs.metadata
        with self.engine.begin() as conn:
            for t in reversed(md.sorted_tables):
                conn.execute(t.delete())
            for row in rows:
                conn.execute(self.docs.insert().values(**doc_columns(row, self.name)))
                did = row["uid"]["id"]
                readers = row["attrs"].get("readers")
                for r in readers or ():
                    conn.execute(
                        md.tables["doc_readers"].insert().values(doc_id=did, user_id=ref_id(r))
                    )
                for anc in transitive(row):
                    conn.execute(
                        md.tables["doc_ancestors"]
                        .insert()
                        .values(doc_id=did, anc_type=anc.type, anc_id=anc.id)
                    )

    def matching(self, filter: Any, *, superset: bool = False) -> set[str]:
        compiled = compile_filter(
            filter, self.mapping, dialect=self.engine.dialect, superset=superset
        )
        with self.engine.connect() as conn:
            ids = conn.execute(sa.select(self.docs.c.id).where(compiled.where)).scalars()
            return set(ids)


def ref_id(ref: Mapping[str, Any]) -> str:
    inner = ref.get("__entity", ref)
    return str(inner["id"])


def transitive(row: Mapping[str, Any]) -> set[EntityUid]:
    out: set[EntityUid] = set()
    todo = [p.get("__entity", p) for p in row.get("parents", [])]
    while todo:
        p = todo.pop()
        uid = EntityUid(p["type"], p["id"])
        if uid not in out:
            out.add(uid)
            if uid.type == FOLDER:
                todo.extend({"type": FOLDER, "id": f} for f in FOLDER_PARENTS[uid.id])
    return out


def doc_columns(row: Mapping[str, Any], dialect: str) -> dict[str, Any]:
    a = row["attrs"]
    out: dict[str, Any] = {
        "id": row["uid"]["id"],
        "name": a.get("name"),
        "level": a.get("level"),
        "public": a.get("public"),
        "owner": ref_id(a["owner"]) if "owner" in a else None,
        "creator": str(EntityUid(USER, ref_id(a["creator"]))) if "creator" in a else None,
        "meta": a.get("meta"),
        "has_readers": "readers" in a,
    }
    if dialect == "postgresql":
        out["tags"] = a.get("tags")
    else:
        out["tags_json"] = a.get("tags")
    return out


def make_db(name: str, engine: sa.Engine) -> Db:
    md = sa.MetaData()
    json_type = pg.JSONB() if name == "postgresql" else sa.JSON()
    cols: list[sa.Column[Any]] = [
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text),
        sa.Column("level", sa.BigInteger),
        sa.Column("public", sa.Boolean),
        sa.Column("owner", sa.Text),
        sa.Column("creator", sa.Text),
        sa.Column("meta", json_type, nullable=True),
        sa.Column("has_readers", sa.Boolean, nullable=False),
    ]
    if name == "postgresql":
        cols.append(sa.Column("tags", pg.ARRAY(sa.Text)))
    else:
        cols.append(sa.Column("tags_json", sa.JSON(none_as_null=True)))
    docs = sa.Table("plan_docs", md, *cols)
    readers = sa.Table(
        "doc_readers",
        md,
        sa.Column("doc_id", sa.Text, sa.ForeignKey("plan_docs.id"), index=True),
        sa.Column("user_id", sa.Text),
    )
    closure = sa.Table(
        "doc_ancestors",
        md,
        sa.Column("doc_id", sa.Text, sa.ForeignKey("plan_docs.id"), index=True),
        sa.Column("anc_type", sa.Text),
        sa.Column("anc_id", sa.Text),
    )
    # JSON null for a missing document, not the JSON text 'null'.
    docs.c.meta.type.none_as_null = True  # type: ignore[attr-defined]
    md.drop_all(engine)
    md.create_all(engine)
    tags: ArraySet | JsonAttr = (
        ArraySet(docs.c.tags) if name == "postgresql" else JsonAttr(docs.c.tags_json)
    )
    mapping = SqlMapping(
        table=docs,
        entity_type=DOC,
        id_column=docs.c.id,
        columns={
            "name": docs.c.name,
            "level": ScalarAttr(docs.c.level, "long"),
            "public": ScalarAttr(docs.c.public, "bool"),
            "owner": ScalarAttr(docs.c.owner, "entity_id", USER),
            "creator": ScalarAttr(docs.c.creator, "entity_uid"),
        },
        json_columns={"meta": docs.c.meta},
        sets={
            "tags": tags,
            "readers": JoinSet(
                readers,
                readers.c.doc_id,
                readers.c.user_id,
                "entity_id",
                USER,
                present=docs.c.has_readers,
            ),
        },
        closure=Closure(closure, closure.c.doc_id, closure.c.anc_type, closure.c.anc_id),
    )
    return Db(name, engine, docs, mapping)


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Db]:
    engine = sa.create_engine(f"sqlite:///{tmp_path_factory.mktemp('plan') / 'plan.db'}")
    yield make_db("sqlite", engine)
    engine.dispose()


@pytest.fixture(scope="module")
def pg_db(postgres_url: str) -> Iterator[Db]:
    engine = sa.create_engine(postgres_url)
    yield make_db("postgresql", engine)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest) -> Db:
    found: Db = request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")
    return found


def ancestors_of(rows: Sequence[Mapping[str, Any]]) -> dict[EntityUid, set[EntityUid]]:
    return {EntityUid(DOC, r["uid"]["id"]): transitive(r) for r in rows}


def python_matching(filter: Any, rows: Sequence[Mapping[str, Any]], **kw: Any) -> set[str]:
    anc = ancestors_of(rows)
    return {r["uid"]["id"] for r in rows if evaluate(filter, r, ancestors=anc, **kw)}


# --------------------------------------------------------------------------------------------
# Hand-written cases

ROWS: list[dict[str, Any]] = [
    {
        "uid": {"type": DOC, "id": "d1"},
        "attrs": {
            "name": "alpha",
            "level": 3,
            "public": True,
            "owner": user("u1"),
            "creator": user("u1", bare=True),
            "meta": {
                "level": 5,
                "label": "50%_off",
                "flag": True,
                "ref": user("u1"),
                "nums": [1, 2, 3],
                "refs": [user("u2", bare=True)],
            },
            "tags": ["red", "blue"],
            "readers": [user("u1"), user("u2", bare=True)],
        },
        "parents": [{"type": FOLDER, "id": "f2"}],
    },
    {
        "uid": {"type": DOC, "id": "d2"},
        "attrs": {
            "name": "a%b",
            "level": 10,
            "public": False,
            "owner": user("u2", bare=True),
            "creator": user('u"2'),
            "meta": {"label": "a*b", "nums": [], "ref": user("u2", bare=True)},
            "tags": [],
            "readers": [],
        },
        "parents": [{"__entity": {"type": FOLDER, "id": "f1"}}],
    },
    {"uid": {"type": DOC, "id": "d3"}, "attrs": {"name": "a_b"}, "parents": []},
    {
        "uid": {"type": DOC, "id": "d4"},
        "attrs": {
            "name": "A*B",
            "level": -1,
            "meta": {"level": "7", "label": None, "ref": {"type": USER, "id": "u1"}},
            "tags": ["Red"],
            "readers": [user("u3")],
        },
        "parents": [],
    },
    {
        "uid": {"type": DOC, "id": "d5"},
        "attrs": {
            "name": "x\\y",
            "level": 0,
            "meta": {"flag": False, "nums": [4], "label": "abc", "refs": []},
            "tags": ["red"],
        },
        "parents": [{"type": FOLDER, "id": "f3"}],
    },
]


def cmp(attr: list[str], op: str, value: Any) -> dict[str, Any]:
    return {"op": "compare", "attr": attr, "cmp": op, "value": value}


def NOT(node: dict[str, Any]) -> dict[str, Any]:
    return {"op": "not", "arg": node}


ALL = {"d1", "d2", "d3", "d4", "d5"}
CASES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("true", {"op": "true"}, ALL),
    ("false", {"op": "false"}, set()),
    ("eq string", cmp(["name"], "eq", "alpha"), {"d1"}),
    ("ne string skips missing", cmp(["name"], "ne", "alpha"), ALL - {"d1"}),
    ("eq wrong type is false", cmp(["name"], "eq", 3), set()),
    ("not eq wrong type", NOT(cmp(["name"], "eq", 3)), ALL),
    ("lt long", cmp(["level"], "lt", 3), {"d4", "d5"}),
    ("ge long", cmp(["level"], "ge", 3), {"d1", "d2"}),
    ("not lt: NULL stays NULL", NOT(cmp(["level"], "lt", 3)), {"d1", "d2"}),
    ("lt on a string is NULL", NOT(cmp(["name"], "lt", 3)), set()),
    ("eq bool", cmp(["public"], "eq", True), {"d1"}),
    ("not eq bool", NOT(cmp(["public"], "eq", True)), {"d2"}),
    ("bool is not 1", cmp(["public"], "eq", 1), set()),
    ("has", {"op": "has", "attr": ["public"]}, {"d1", "d2"}),
    ("not has is two-valued", NOT({"op": "has", "attr": ["public"]}), {"d3", "d4", "d5"}),
    ("entity id column", cmp(["owner"], "eq", user("u1")), {"d1"}),
    ("entity id column, bare value", cmp(["owner"], "eq", user("u2", bare=True)), {"d2"}),
    (
        "entity id column, other type",
        cmp(["owner"], "eq", {"__entity": {"type": "X", "id": "u1"}}),
        set(),
    ),
    ("entity id column ne", cmp(["owner"], "ne", user("u1")), {"d2"}),
    ("entity uid column", cmp(["creator"], "eq", user("u1")), {"d1"}),
    ("entity uid column, quote in id", cmp(["creator"], "eq", user('u"2')), {"d2"}),
    ("entity ne string", cmp(["creator"], "ne", "u1"), {"d1", "d2"}),
    (
        "and with NULL",
        {"op": "and", "args": [{"op": "true"}, cmp(["level"], "gt", 0)]},
        {"d1", "d2"},
    ),
    (
        "or with NULL",
        NOT({"op": "or", "args": [cmp(["level"], "gt", 5), cmp(["public"], "eq", True)]}),
        set(),
    ),
    (
        "false and NULL is false",
        NOT({"op": "and", "args": [{"op": "false"}, cmp(["level"], "gt", 5)]}),
        ALL,
    ),
    ("like prefix", {"op": "like", "attr": ["name"], "pattern": "a*"}, {"d1", "d2", "d3"}),
    ("like is case-sensitive", {"op": "like", "attr": ["name"], "pattern": "A*"}, {"d4"}),
    ("like percent is literal", {"op": "like", "attr": ["name"], "pattern": "a%b"}, {"d2"}),
    ("like underscore is literal", {"op": "like", "attr": ["name"], "pattern": "a_b"}, {"d3"}),
    ("like escaped star", {"op": "like", "attr": ["name"], "pattern": "A\\*B"}, {"d4"}),
    (
        "like escaped star is not a wildcard",
        {"op": "like", "attr": ["name"], "pattern": "a\\*"},
        set(),
    ),
    ("like backslash literal", {"op": "like", "attr": ["name"], "pattern": "x\\y"}, {"d5"}),
    ("like star matches all", {"op": "like", "attr": ["name"], "pattern": "*"}, ALL),
    ("not like skips missing", NOT({"op": "like", "attr": ["creator"], "pattern": "*"}), set()),
    ("json eq long", cmp(["meta", "level"], "eq", 5), {"d1"}),
    ("json string is not long", cmp(["meta", "level"], "eq", 7), set()),
    ("json ne: missing key is NULL", cmp(["meta", "level"], "ne", 5), {"d4"}),
    ("json lt guards type", cmp(["meta", "level"], "lt", 100), {"d1"}),
    ("json not lt", NOT(cmp(["meta", "level"], "lt", 100)), set()),
    ("json has", {"op": "has", "attr": ["meta", "label"]}, {"d1", "d2", "d5"}),
    ("json null is missing", NOT({"op": "has", "attr": ["meta", "label"]}), {"d3", "d4"}),
    ("json has record", {"op": "has", "attr": ["meta"]}, {"d1", "d2", "d4", "d5"}),
    ("json deep missing", {"op": "has", "attr": ["meta", "level", "x"]}, set()),
    ("json like escapes", {"op": "like", "attr": ["meta", "label"], "pattern": "*%_*"}, {"d1"}),
    ("json like star", {"op": "like", "attr": ["meta", "label"], "pattern": "a\\*b"}, {"d2"}),
    ("json bool", cmp(["meta", "flag"], "eq", False), {"d5"}),
    ("json not bool", NOT(cmp(["meta", "flag"], "eq", False)), {"d1"}),
    ("json entity, both encodings", cmp(["meta", "ref"], "eq", user("u1")), {"d1", "d4"}),
    ("json entity ne", cmp(["meta", "ref"], "ne", user("u1")), {"d2"}),
    ("json contains long", {"op": "contains", "attr": ["meta", "nums"], "value": 2}, {"d1"}),
    (
        "json not contains",
        NOT({"op": "contains", "attr": ["meta", "nums"], "value": 2}),
        {"d2", "d5"},
    ),
    (
        "json contains_any",
        {"op": "contains_any", "attr": ["meta", "nums"], "values": [4, 3]},
        {"d1", "d5"},
    ),
    (
        "json contains_any empty",
        {"op": "contains_any", "attr": ["meta", "nums"], "values": []},
        set(),
    ),
    (
        "json not contains_any empty",
        NOT({"op": "contains_any", "attr": ["meta", "nums"], "values": []}),
        {"d1", "d2", "d5"},
    ),
    (
        "json contains_all",
        {"op": "contains_all", "attr": ["meta", "nums"], "values": [1, 3]},
        {"d1"},
    ),
    (
        "json contains_all empty",
        {"op": "contains_all", "attr": ["meta", "nums"], "values": []},
        {"d1", "d2", "d5"},
    ),
    (
        "json contains entity",
        {"op": "contains", "attr": ["meta", "refs"], "value": user("u2")},
        {"d1"},
    ),
    (
        "json contains on non-set",
        NOT({"op": "contains", "attr": ["meta", "level"], "value": 5}),
        set(),
    ),
    ("array contains", {"op": "contains", "attr": ["tags"], "value": "red"}, {"d1", "d5"}),
    ("array not contains", NOT({"op": "contains", "attr": ["tags"], "value": "red"}), {"d2", "d4"}),
    (
        "array contains wrong type",
        NOT({"op": "contains", "attr": ["tags"], "value": 1}),
        {"d1", "d2", "d4", "d5"},
    ),
    (
        "array contains_any",
        {"op": "contains_any", "attr": ["tags"], "values": ["blue", "Red"]},
        {"d1", "d4"},
    ),
    (
        "array contains_all",
        {"op": "contains_all", "attr": ["tags"], "values": ["blue", "red"]},
        {"d1"},
    ),
    (
        "array contains_all empty",
        {"op": "contains_all", "attr": ["tags"], "values": []},
        {"d1", "d2", "d4", "d5"},
    ),
    ("array has", {"op": "has", "attr": ["tags"]}, {"d1", "d2", "d4", "d5"}),
    ("join contains", {"op": "contains", "attr": ["readers"], "value": user("u2")}, {"d1"}),
    (
        "join not contains",
        NOT({"op": "contains", "attr": ["readers"], "value": user("u2")}),
        {"d2", "d4"},
    ),
    (
        "join contains_any",
        {"op": "contains_any", "attr": ["readers"], "values": [user("u3"), user("u1")]},
        {"d1", "d4"},
    ),
    (
        "join contains_all",
        {"op": "contains_all", "attr": ["readers"], "values": [user("u1"), user("u2")]},
        {"d1"},
    ),
    (
        "join contains other type",
        NOT({"op": "contains", "attr": ["readers"], "value": "u1"}),
        {"d1", "d2", "d4"},
    ),
    ("join has", {"op": "has", "attr": ["readers"]}, {"d1", "d2", "d4"}),
    ("join set eq", cmp(["readers"], "eq", [user("u2"), user("u1"), user("u1")]), {"d1"}),
    ("join set eq empty", cmp(["readers"], "eq", []), {"d2"}),
    ("join set ne", cmp(["readers"], "ne", []), {"d1", "d4"}),
    ("array set eq", cmp(["tags"], "eq", ["blue", "red"]), {"d1"}),
    ("in folder, transitive", {"op": "in", "entity": {"type": FOLDER, "id": "f1"}}, {"d1", "d2"}),
    ("in folder", {"op": "in", "entity": {"type": FOLDER, "id": "f2"}}, {"d1"}),
    ("in self", {"op": "in", "entity": {"type": DOC, "id": "d3"}}, {"d3"}),
    ("not in", NOT({"op": "in", "entity": {"type": FOLDER, "id": "f1"}}), {"d3", "d4", "d5"}),
    ("is", {"op": "is", "entity": {"type": DOC, "id": "d2"}}, {"d2"}),
    ("is other type", {"op": "is", "entity": {"type": FOLDER, "id": "d2"}}, set()),
]


@pytest.mark.parametrize(("label", "filter", "expected"), CASES, ids=[c[0] for c in CASES])
def test_case(db: Db, label: str, filter: dict[str, Any], expected: set[str]) -> None:
    assert python_matching(filter, ROWS) == expected
    db.load(ROWS)
    assert db.matching(filter) == expected
    assert db.matching(parse_filter(filter)) == expected


@pytest.mark.parametrize("op", ["unknown", "unmappable"])
def test_residual_raises_or_supersets(db: Db, op: str) -> None:
    db.load(ROWS)
    tree = {"op": "and", "args": [cmp(["level"], "gt", 0), {"op": op, "detail": "x"}]}
    with pytest.raises(NeedsRowCheck, match="args\\[1\\]"):
        compile_filter(tree, db.mapping, dialect=db.name)
    with pytest.raises(NeedsRowCheck):
        evaluate(tree, ROWS[0])
    compiled = compile_filter(tree, db.mapping, dialect=db.name, superset=True)
    assert not compiled.exact and compiled.row_checks
    assert db.matching(tree, superset=True) == {"d1", "d2"}
    # Under one NOT the residual is FALSE: NOT (x AND FALSE) is TRUE for every row.
    assert db.matching(NOT(tree), superset=True) == ALL
    assert python_matching(NOT(tree), ROWS, unknown="superset") == ALL
    exact = compile_filter(cmp(["level"], "gt", 0), db.mapping, dialect=db.name, superset=True)
    assert exact.exact and not exact.row_checks


def test_unmapped_attribute_needs_row_check(db: Db) -> None:
    tree = NOT(cmp(["nope"], "eq", 1))
    with pytest.raises(NeedsRowCheck, match="nope"):
        compile_filter(tree, db.mapping, dialect=db.name)
    db.load(ROWS)
    assert db.matching(tree, superset=True) == ALL  # under one NOT: FALSE, so NOT is TRUE


def test_in_without_closure_needs_row_check(sqlite_db: Db) -> None:
    m = sqlite_db.mapping
    bare = SqlMapping(m.table, m.entity_type, m.id_column, m.columns)
    with pytest.raises(NeedsRowCheck, match="closure"):
        compile_filter({"op": "in", "entity": {"type": FOLDER, "id": "f1"}}, bare, dialect="sqlite")


def test_array_set_on_sqlite_is_a_mapping_error(sqlite_db: Db) -> None:
    m = sqlite_db.mapping
    arr = SqlMapping(m.table, DOC, m.id_column, sets={"tags": ArraySet(m.table.c.tags_json)})
    with pytest.raises(MappingError):
        compile_filter({"op": "contains", "attr": ["tags"], "value": "a"}, arr, dialect="sqlite")


def test_filter_errors_name_the_path() -> None:
    bad = {"op": "or", "args": [{"op": "true"}, cmp(["a"], "eqq", 1)]}
    with pytest.raises(FilterError, match=r"^args\[1\]\.cmp: unknown comparison 'eqq'$") as e:
        parse_filter(bad)
    assert e.value.path == "args[1].cmp"
    with pytest.raises(FilterError) as e:
        parse_filter(
            {"op": "and", "args": [{"op": "like", "attr": "x", "pattern": 1}, {"op": "zz"}]}
        )
    assert [p for p, _ in e.value.problems] == ["args[0].attr", "args[0].pattern", "args[1].op"]
    with pytest.raises(FilterError, match="takes an integer"):
        parse_filter(cmp(["a"], "lt", "x"))
    with pytest.raises(FilterError, match="extension"):
        parse_filter(cmp(["a"], "eq", {"__extn": {"fn": "ip", "arg": "1.2.3.4"}}))
    with pytest.raises(FilterError, match="unexpected field"):
        parse_filter({"op": "true", "x": 1})


def test_to_json_round_trips() -> None:
    for _, tree, _ in CASES:
        node = parse_filter(tree)
        assert parse_filter(to_json(node)) == node


def test_like_translation() -> None:
    assert like_parts("a\\*b*") == ["a*b", None]
    assert like_pattern("50%_\\*x*") == "50\\%\\_*x%"
    assert like_pattern("a\\b") == "a\\\\b"
    assert glob_pattern("a?[\\**") == "a[?][[][*]*"
    assert like_matches("a\nb", "a*b")


def test_generated_sql_shapes(sqlite_db: Db) -> None:
    tree = {"op": "like", "attr": ["name"], "pattern": "50%*"}
    where = compile_filter(tree, sqlite_db.mapping, dialect="postgresql").where
    assert "LIKE" in str(where.compile(dialect=pg.dialect())) and "ESCAPE" in str(
        where.compile(dialect=pg.dialect())
    )
    where = compile_filter(tree, sqlite_db.mapping, dialect="sqlite").where
    assert "GLOB" in str(where.compile(dialect=sqlite.dialect()))


# --------------------------------------------------------------------------------------------
# Property tests: random trees and rows over the fixed schema

TEXTS = ["", "a", "A", "ab", "a%b", "a_b", "a*b", "a\\b", "ba"]
PATTERNS = st.one_of(
    st.sampled_from(["*", "a*", "A*", "*b", "a%b", "a_b", "a\\*b", "a*b", "", "a\\b", "\\*"]),
    st.text(alphabet="aAb%_*\\", max_size=4),
)
USERS = ["u1", "u2", "u3"]
ent = st.builds(user, st.sampled_from(USERS), st.booleans())
LONGS = st.integers(-3, 3)

SCALARS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("name",): st.sampled_from(TEXTS),
    ("level",): LONGS,
    ("public",): st.booleans(),
    ("owner",): ent,
    ("creator",): ent,
    ("meta", "level"): LONGS,
    ("meta", "label"): st.sampled_from(TEXTS),
    ("meta", "flag"): st.booleans(),
    ("meta", "ref"): ent,
}
SETS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("tags",): st.sampled_from(["a", "A", "b"]),
    ("readers",): ent,
    ("meta", "nums"): LONGS,
    ("meta", "refs"): ent,
}
ANY_VALUE = st.one_of(st.sampled_from(TEXTS), LONGS, st.booleans(), ent)
ENTITIES = st.sampled_from(
    [EntityUid(FOLDER, "f1"), EntityUid(FOLDER, "f2"), EntityUid(FOLDER, "f3")]
    + [EntityUid(DOC, f"d{i}") for i in range(4)]
    + [EntityUid(USER, "d1")]
)


def attr_value(attr: tuple[str, ...]) -> st.SearchStrategy[Any]:
    if attr in SCALARS:
        return st.one_of(SCALARS[attr], ANY_VALUE)
    return st.one_of(SETS[attr], ANY_VALUE)


@st.composite
def leaves(draw: st.DrawFn, residuals: bool) -> dict[str, Any]:
    kinds = ["compare", "order", "has", "like", "contains", "any", "all", "in", "is", "const"]
    if residuals:
        kinds.append("residual")
    kind = draw(st.sampled_from(kinds))
    if kind == "compare":
        attr = draw(st.sampled_from([*SCALARS, *SETS]))
        if attr in SETS and draw(st.booleans()):
            value: Any = draw(st.lists(SETS[attr], max_size=3))
        else:
            value = draw(attr_value(attr))
        return cmp(list(attr), draw(st.sampled_from(["eq", "ne"])), value)
    if kind == "order":
        attr = draw(st.sampled_from([("level",), ("meta", "level"), ("name",), ("tags",)]))
        return cmp(list(attr), draw(st.sampled_from(["lt", "le", "gt", "ge"])), draw(LONGS))
    if kind == "has":
        attr = draw(st.sampled_from([*SCALARS, *SETS, ("meta",), ("meta", "level", "x")]))
        return {"op": "has", "attr": list(attr)}
    if kind == "like":
        attr = draw(st.sampled_from([("name",), ("meta", "label"), ("creator",), ("level",)]))
        return {"op": "like", "attr": list(attr), "pattern": draw(PATTERNS)}
    if kind in ("contains", "any", "all"):
        attr = draw(st.sampled_from([*SETS, ("name",), ("meta", "level")]))
        elem = SETS.get(attr, ANY_VALUE)
        values = draw(st.lists(st.one_of(elem, elem, ANY_VALUE), max_size=3))
        if kind == "contains":
            return {"op": "contains", "attr": list(attr), "value": values[0] if values else 1}
        op = "contains_any" if kind == "any" else "contains_all"
        return {"op": op, "attr": list(attr), "values": values}
    if kind in ("in", "is"):
        e = draw(ENTITIES)
        return {"op": kind, "entity": {"type": e.type, "id": e.id}}
    if kind == "residual":
        return {"op": draw(st.sampled_from(["unknown", "unmappable"]))}
    return {"op": draw(st.sampled_from(["true", "false"]))}


def trees(residuals: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.recursive(
        leaves(residuals),
        lambda sub: st.one_of(
            st.builds(lambda a: {"op": "not", "arg": a}, sub),
            st.builds(lambda a: {"op": "and", "args": a}, st.lists(sub, min_size=2, max_size=3)),
            st.builds(lambda a: {"op": "or", "args": a}, st.lists(sub, min_size=2, max_size=3)),
        ),
        max_leaves=6,
    )


def maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


@st.composite
def rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        attrs: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for attr, strat in SCALARS.items():
            v = draw(maybe(strat))
            if v is not None:
                (meta if attr[0] == "meta" else attrs)[attr[-1]] = v
        for attr, strat in SETS.items():
            v = draw(maybe(st.lists(strat, max_size=3)))
            if v is not None:
                (meta if attr[0] == "meta" else attrs)[attr[-1]] = v
        if meta or draw(st.booleans()):
            attrs["meta"] = meta
        parents = draw(st.lists(st.sampled_from(["f1", "f2", "f3"]), max_size=2, unique=True))
        out.append(
            {
                "uid": {"type": DOC, "id": f"d{i}"},
                "attrs": attrs,
                "parents": [{"type": FOLDER, "id": p} for p in parents],
            }
        )
    return out


PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(tree=trees(residuals=False), data=rows())
def test_sqlite_postgres_and_python_agree(
    sqlite_db: Db, pg_db: Db, tree: dict[str, Any], data: list[dict[str, Any]]
) -> None:
    expected = python_matching(tree, data)
    for db in (sqlite_db, pg_db):
        db.load(data)
        assert db.matching(tree) == expected, (db.name, json.dumps(tree), json.dumps(data))


def substitute(tree: Any, values: Iterator[bool]) -> Any:
    """The tree with each residual node replaced by the next constant from `values`."""
    if tree["op"] in ("unknown", "unmappable"):
        return {"op": "true" if next(values) else "false"}
    if tree["op"] in ("and", "or"):
        return {"op": tree["op"], "args": [substitute(a, values) for a in tree["args"]]}
    if tree["op"] == "not":
        return {"op": "not", "arg": substitute(tree["arg"], values)}
    return tree


@PROPERTY
@given(tree=trees(residuals=True), data=rows())
def test_superset_covers_every_reading(
    sqlite_db: Db, pg_db: Db, tree: dict[str, Any], data: list[dict[str, Any]]
) -> None:
    n = sum(1 for _ in json.dumps(tree).split('"unknown"')[1:]) + sum(
        1 for _ in json.dumps(tree).split('"unmappable"')[1:]
    )
    superset = python_matching(tree, data, unknown="superset")
    for assignment in itertools.product([False, True], repeat=min(n, 6)):
        if n > 6:
            break
        exact = python_matching(substitute(tree, iter(assignment)), data)
        assert exact <= superset
    for db in (sqlite_db, pg_db):
        db.load(data)
        assert db.matching(tree, superset=True) == superset, db.name
