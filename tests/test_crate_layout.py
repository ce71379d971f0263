"""The decision core's modules form no import cycle (docs/architecture.md#code-layout-and-conventions).

Each top-level module of ``crates/pdp_core/src`` (a file, or a directory with its ``mod.rs``)
is a node; an edge A -> B when A's code (comments, strings and ``#[cfg(test)]`` modules left
out) names ``crate::B``, or ``super::B`` from a file one level down. The standard library's
``graphlib`` refuses a graph with a cycle and names it. The crate root (``lib.rs``) only declares
and re-exports, so it is not a node.
"""

from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "crates" / "pdp_core" / "src"

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_CRATE_PATH = re.compile(r"\bcrate::(\w+)")
_CRATE_TREE = re.compile(r"\bcrate::\{([^;]*?)\}\s*;", re.S)
_SUPER_PATH = re.compile(r"\bsuper::(\w+)")


def _code(path: Path) -> str:
    """A file's code without comments, string contents and its `#[cfg(test)]` tail."""
    text = _STRING.sub('""', _COMMENT.sub("", path.read_text(encoding="utf-8")))
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


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
            used = set(_CRATE_PATH.findall(code))
            for tree in _CRATE_TREE.findall(code):
                used.update(p.strip().split("::")[0].strip("{} ") for p in tree.split(","))
            if depth == 2 and path.name != "mod.rs":
                # `super::x` in engine/check.rs is engine's own item or a crate-level module.
                used.update(m for m in _SUPER_PATH.findall(code) if m in files)
            graph[name].update(m for m in used if m in files and m != name)
    return graph


def test_the_graph_sees_the_modules_and_their_uses() -> None:
    graph = module_graph()
    assert {"engine", "bundle", "store", "request", "decision"} <= graph.keys()
    # The engine decides with bundles, the store and requests: the reader sees real edges.
    assert {"bundle", "store", "request", "decision"} <= graph["engine"]


def test_the_decision_core_has_no_module_cycle() -> None:
    graph = module_graph()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"pdp_core modules form a cycle: {' -> '.join(e.args[1])}")
    assert set(order) == graph.keys()


def test_a_cycle_is_found(tmp_path: Path) -> None:
    """The check itself: two modules naming each other are a cycle."""
    (tmp_path / "a.rs").write_text("use crate::b::B;\n// crate::c in a comment\n")
    (tmp_path / "b.rs").write_text("pub fn f() { crate::a::g(); }\n")
    (tmp_path / "c.rs").write_text('const S: &str = "crate::a";\n')
    graph = module_graph(tmp_path)
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    with pytest.raises(CycleError):
        list(TopologicalSorter(graph).static_order())
