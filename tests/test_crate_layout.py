"""The Rust crates' modules are layered: no import cycle (docs/architecture.md#code-layout-and-conventions).

Three module graphs are read from the sources, and the standard library's ``graphlib`` refuses
any of them with a cycle, naming it:

* ``pdp_core``'s top-level modules (a file of ``crates/pdp_core/src``, or a directory with its
  ``mod.rs``); the crate root (``lib.rs``) only declares and re-exports, so it is not a node;
* the engine's files (``crates/pdp_core/src/engine/*.rs``); its ``mod.rs`` only declares and
  re-exports, so it is not a node, and a name it re-exports stands for the file it comes from;
* ``pdp_server``'s modules (``crates/pdp_server/src/*.rs``) and its crate root ``lib.rs``, which
  holds code (it starts the listener): a path to a root item that is not a module is an edge to
  the root, and nothing may use the root.

An edge A -> B when A's code (comments, string and char literals, and its ``#[cfg(test)]`` tail
left out) names B by path: ``crate::B``, ``super::B`` one level down, or B among the items of a
``use crate::{...}`` / ``use super::{...}`` tree. The engine's files also call each other's
``impl Engine`` methods, which no path names: docs/architecture.md states the rule for them.

And ``pdp_core`` does not depend on ``pdp_server`` in any way (normal, dev, build or
target-specific dependency; nor in ``Cargo.lock``): the server sits on the core.
"""

from __future__ import annotations

import re
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "crates" / "pdp_core" / "src"
ENGINE = SRC / "engine"
SERVER_SRC = ROOT / "crates" / "pdp_server" / "src"

#: The name of the crate root's node in a graph that has one.
CRATE_ROOT = "lib"

_RAW_STRING = re.compile(r'(?<!\w)b?r(#*)"')
_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")
_TEST_TAIL = "#[cfg(test)]"


def _strip(text: str) -> str:
    """Rust source `text` without comments (line, block, nested block) and with every string,
    raw string and char literal emptied, so that nothing in them reads as a path."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif (raw := _RAW_STRING.match(text, i)) is not None:
            close = '"' + raw.group(1)
            end = text.find(close, raw.end())
            i = n if end < 0 else end + len(close)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (char := _CHAR.match(text, i)) is not None:
            out.append("' '")
            i = char.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _code(path: Path) -> str:
    """A file's code: comments and literals out (`_strip`), and its `#[cfg(test)]` tail cut."""
    text = _strip(path.read_text(encoding="utf-8"))
    cut = text.find(_TEST_TAIL)
    return text if cut < 0 else text[:cut]


def _tree_items(tree: str) -> list[str]:
    """The top-level items of a `use` tree's braces (`a::{x, y}, b, c as d`), split on commas
    outside nested braces."""
    items, depth, item = [], 0, ""
    for ch in tree:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += (ch == "{") - (ch == "}")
        item += ch
    items.append(item)
    return [i.strip() for i in items if i.strip()]


def named_under(code: str, prefix: str) -> set[str]:
    """The first segments of the paths `code` names under `prefix` (`crate`, `super`,
    `crate::engine`): `prefix::x::...`, and each item of a `prefix::{x::..., y}` tree."""
    p = re.escape(prefix)
    found = set(re.findall(rf"(?<![\w:]){p}::(\w+)", code))
    for m in re.finditer(rf"(?<![\w:]){p}::\{{", code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += (code[i] == "{") - (code[i] == "}")
            i += 1
        for item in _tree_items(code[m.end() : i - 1]):
            if first := re.match(r"\w+", item):
                found.add(first.group())
    return found


def reexports(path: Path) -> dict[str, str]:
    """Names a crate root or `mod.rs` re-exports from one of its own modules (`pub use m::X;`,
    `pub use m::{X, Y as Z};`): name -> module."""
    out: dict[str, str] = {}
    code = _code(path)
    for m in re.finditer(
        r"\bpub\s+use\s+(?:self::)?(\w+)::(\{[^;]*\}|\w+(?:\s+as\s+\w+)?)\s*;", code
    ):
        module, names = m.group(1), m.group(2).strip("{}")
        for item in _tree_items(names):
            name = re.split(r"\s+as\s+", item)[-1].strip()
            if re.fullmatch(r"\w+", name):
                out[name] = module
    return out


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Top-level module name -> the top-level modules its code uses (itself excluded)."""
    files: dict[str, list[tuple[Path, int]]] = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src).with_suffix("").parts
        if rel == ("lib",):
            continue
        files.setdefault(rel[0], []).append((path, len(rel)))
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, paths in files.items():
        for path, depth in paths:
            code = _code(path)
            used = named_under(code, "crate")
            if depth == 2 and path.name != "mod.rs":
                # `super::x` in engine/check.rs is engine's own item or a crate-level module.
                used |= named_under(code, "super")
            graph[name].update(m for m in used if m in files and m != name)
    return graph


def engine_graph(engine: Path = ENGINE) -> dict[str, set[str]]:
    """The engine's file name (`check`, `state`, ...) -> the engine files its code uses: by
    `super::file`, `crate::engine::file`, or a name `mod.rs` re-exports from that file."""
    files = {p.stem: p for p in sorted(engine.glob("*.rs")) if p.name != "mod.rs"}
    mod_rs = engine / "mod.rs"
    exported = reexports(mod_rs) if mod_rs.exists() else {}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        code = _code(path)
        for used in named_under(code, "super") | named_under(code, "crate::engine"):
            target = used if used in files else exported.get(used)
            if target in files and target != name:
                graph[name].add(target)
    return graph


def server_graph(src: Path = SERVER_SRC) -> dict[str, set[str]]:
    """`pdp_server`'s module name, and `lib` for the crate root -> what its code uses: a
    module by `crate::m` or `super::m` (bare `m::` in the root), and the root for any other
    root item unless the root re-exports it from a module (then that module)."""
    files = {p.stem: p for p in sorted(src.glob("*.rs")) if p.stem != CRATE_ROOT}
    lib_rs = src / f"{CRATE_ROOT}.rs"
    exported = reexports(lib_rs)
    graph: dict[str, set[str]] = {name: set() for name in files}
    graph[CRATE_ROOT] = set()
    for name, path in files.items():
        code = _code(path)
        for used in named_under(code, "crate") | named_under(code, "super"):
            target = used if used in files else exported.get(used, CRATE_ROOT)
            if target != name:
                graph[name].add(target)
    root = re.sub(r"\b(?:pub\s+)?mod\s+\w+\s*;", "", _code(lib_rs))
    for used in named_under(root, "crate") | set(re.findall(r"(?<![\w:])(\w+)::", root)):
        if used in files:
            graph[CRATE_ROOT].add(used)
    return graph


def _order(graph: dict[str, set[str]], what: str) -> list[str]:
    """The graph's nodes bottom-up; fails naming the cycle when there is one."""
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"{what} form a cycle: {' -> '.join(e.args[1])}")
    assert set(order) == graph.keys()
    return order


# ---- pdp_core's top-level modules


def test_the_graph_sees_the_modules_and_their_uses() -> None:
    graph = module_graph()
    assert {"engine", "bundle", "store", "request", "decision"} <= graph.keys()
    # The engine decides with bundles, the store and requests: the reader sees real edges.
    assert {"bundle", "store", "request", "decision"} <= graph["engine"]


def test_the_decision_core_has_no_module_cycle() -> None:
    _order(module_graph(), "pdp_core modules")


# ---- the engine's files


def test_the_engine_graph_sees_its_files_and_their_uses() -> None:
    graph = engine_graph()
    assert {"snapshot", "slice", "index", "state", "writes", "check", "plan", "search"} <= (
        graph.keys()
    )
    # Known uses, through `super::file::...` imports: the reader sees real edges.
    assert {"snapshot", "slice", "state"} <= graph["check"]
    assert {"check", "slice", "state"} <= graph["plan"]
    assert {"check", "index", "snapshot", "state"} <= graph["search"]
    assert {"index", "snapshot"} <= graph["state"]
    assert {"snapshot", "state"} <= graph["writes"]
    assert graph["index"] == {"snapshot"}
    assert graph["slice"] == {"snapshot"}


def test_the_engine_files_form_no_cycle() -> None:
    order = _order(engine_graph(), "pdp_core engine files")
    # The snapshot is the bottom: every other file reads it, it reads none of them.
    assert order.index("snapshot") < order.index("state") < order.index("search")


# ---- pdp_server's modules


def test_the_server_graph_sees_its_modules_and_their_uses() -> None:
    graph = server_graph()
    assert {"auth", "http", "grpc", "challenges", "metrics", "resources", "shared"} <= (
        graph.keys()
    )
    assert {"auth", "problem", "shared", "waits"} <= graph["http"]
    assert {"problem", "shared", "waits"} <= graph["grpc"]
    assert {"auth", "challenges", "metrics", "resources"} <= graph["shared"]
    assert "metrics" in graph["challenges"]
    assert "metrics" in graph["resources"]
    assert "problem" in graph["auth"]
    # The root starts the listener: it builds the shared state and both transports.
    assert {"shared", "http", "grpc"} <= graph[CRATE_ROOT]


def test_the_server_modules_form_no_cycle_and_none_uses_the_crate_root() -> None:
    graph = server_graph()
    users = sorted(m for m, uses in graph.items() if CRATE_ROOT in uses)
    assert users == [], f"modules using pdp_server's crate root (lib.rs): {users}"
    order = _order(graph, "pdp_server modules")
    assert order[-1] == CRATE_ROOT


# ---- the crates


def _dependency_tables(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dependency table of a Cargo manifest: normal, dev and build, plain and under
    `[target.<cfg>]`."""
    kinds = ("dependencies", "dev-dependencies", "build-dependencies")
    scopes = [manifest, *manifest.get("target", {}).values()]
    return [scope.get(kind, {}) for scope in scopes for kind in kinds]


def test_the_decision_core_does_not_depend_on_the_server() -> None:
    crates = ROOT / "crates"
    core = tomllib.loads((crates / "pdp_core" / "Cargo.toml").read_text(encoding="utf-8"))
    server = tomllib.loads((crates / "pdp_server" / "Cargo.toml").read_text(encoding="utf-8"))
    core_deps = {name for t in _dependency_tables(core) for name in t}
    server_deps = {name for t in _dependency_tables(server) for name in t}
    # The manifests are read: the core's own dependencies, and the server's on the core.
    assert {"cedar-policy", "criterion"} <= core_deps
    assert "pdp_core" in server_deps
    assert "pdp_server" not in core_deps
    # A renamed dependency (`srv = { package = "pdp_server" }`) counts too.
    packages = {
        spec.get("package")
        for t in _dependency_tables(core)
        for spec in t.values()
        if isinstance(spec, dict)
    }
    assert "pdp_server" not in packages
    lock = tomllib.loads((ROOT / "Cargo.lock").read_text(encoding="utf-8"))
    (core_lock,) = [p for p in lock["package"] if p["name"] == "pdp_core"]
    assert "cedar-policy" in {d.split()[0] for d in core_lock["dependencies"]}
    assert "pdp_server" not in {d.split()[0] for d in core_lock["dependencies"]}


# ---- the reader itself


def test_a_cycle_is_found(tmp_path: Path) -> None:
    """Two modules naming each other are a cycle; comments and literals are not uses."""
    (tmp_path / "a.rs").write_text("use crate::b::B;\n// crate::c in a comment\n")
    (tmp_path / "b.rs").write_text("pub fn f() { crate::a::g(); }\n")
    (tmp_path / "c.rs").write_text(
        'const S: &str = "crate::a // not a comment";\nconst Q: char = \'"\';\n'
        'const R: &str = r#"crate::b"#;\n/* crate::a /* nested */ crate::b */\n'
        "fn f<'x>(s: &'x str) -> &'x str { s }\n"
    )
    graph = module_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    with pytest.raises(CycleError):
        list(TopologicalSorter(graph).static_order())


def test_use_trees_and_reexports_are_edges(tmp_path: Path) -> None:
    """An engine file using a sibling through a `use super::{...}` tree, or through a name
    `mod.rs` re-exports, depends on that sibling; a test tail is not read."""
    (tmp_path / "mod.rs").write_text("mod a;\nmod b;\nmod c;\npub use b::{Thing, Other as O};\n")
    (tmp_path / "a.rs").write_text(
        "use super::{c::{X, Y}, Thing};\n#[cfg(test)]\nmod tests { use super::super::b; }\n"
    )
    (tmp_path / "b.rs").write_text("pub struct Thing;\npub struct Other;\n")
    (tmp_path / "c.rs").write_text("pub fn x() -> crate::engine::b::Thing { todo!() }\n")
    assert engine_graph(tmp_path) == {"a": {"b", "c"}, "b": set(), "c": {"b"}}


def test_a_server_module_using_the_crate_root_is_an_edge_to_it(tmp_path: Path) -> None:
    (tmp_path / "lib.rs").write_text(
        "pub mod a;\npub mod b;\npub use a::Config;\npub struct Shared;\n"
        "pub fn start() { b::serve(); }\n"
    )
    (tmp_path / "a.rs").write_text("pub struct Config;\n")
    (tmp_path / "b.rs").write_text("use super::Shared;\nuse crate::Config;\npub fn serve() {}\n")
    graph = server_graph(tmp_path)
    assert graph == {"a": set(), "b": {"a", CRATE_ROOT}, CRATE_ROOT: {"a", "b"}}
    with pytest.raises(CycleError):
        list(TopologicalSorter(graph).static_order())
