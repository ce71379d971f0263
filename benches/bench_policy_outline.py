"""Policy outlines of the decision core (``outline_policies``) against the previous design.

An explanation (``PortalService.explain``, docs/portal.md#explanations) outlines the active
bundle's ``.cedar`` files (once per bundle; the portal keeps them): Cedar's parse of each file
and a walk of each policy's AST for its text, lines, reads and entity literals. The previous
design found only each policy's text, with a Python splitter scanning the text for ``;``
outside strings and brackets (``policy_texts``, kept below verbatim as the peer; it is gone
from the portal). Both run
alternately on the same files in the same process, so the machine's load falls on both alike:

* the Cedar example applications of tests/testdata/cedar-examples (2 to 15 policies each);
* a generated file of ``--policies`` policies shaped like an install's (a scope, two or three
  attribute reads, an entity literal), for a large bundle.

Prints per file the policies and p50 / p99 of one call in microseconds for each design, and
their ratio; then what an explanation pays once the active bundle is outlined (the portal keeps
the outlines of the last few bundles, ``svc.portal.service._outlines``).

Run: ``.venv/bin/python benches/bench_policy_outline.py [--runs 200] [--policies 1000]``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable

from _support import REPO, pct
from svc._pdp_core import outline_policies
from svc.portal.service import _outlines

EXAMPLES = REPO / "tests" / "testdata" / "cedar-examples"


def policy_texts(source: str) -> dict[str, str]:
    """The previous design (svc.portal.service before the outline), verbatim: the peer."""
    out: dict[str, str] = {}
    i, n = 0, len(source)
    start = 0
    depth = 0
    while i < n:
        ch = source[i]
        if ch == "/" and source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
            continue
        if ch == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth = max(0, depth - 1)
        elif ch == ";" and depth == 0:
            lines = source[start : i + 1].strip().splitlines()
            while lines and (not lines[0].strip() or lines[0].lstrip().startswith("//")):
                lines.pop(0)
            text = "\n".join(lines)
            m = _POLICY_ID.search(text)
            if m is not None:
                out.setdefault(m.group(1), text)
            start = i + 1
        i += 1
    return out


_POLICY_ID = re.compile(r'@id\(\s*"((?:[^"\\]|\\.)*)"\s*\)')


def generated(n: int) -> str:
    """`n` policies of the shapes an install writes: scopes, attribute reads, literals."""
    parts = []
    for i in range(n):
        parts.append(
            f'@id("team-{i}-reads")\n'
            f'permit (principal in Group::"team-{i % 50}", action in [Action::"read", '
            f'Action::"view"], resource is Document)\n'
            f"when {{\n  resource.owner.department == principal.department &&\n"
            f"  principal has title && context.risk_score < {i % 100}\n}};\n"
        )
    return "\n".join(parts)


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    """Microseconds of each of `runs` calls."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--policies", type=int, default=1000)
    args = ap.parse_args()
    files = {p.parent.name: p.read_text() for p in sorted(EXAMPLES.glob("*/policies.cedar"))}
    files[f"generated ({args.policies})"] = generated(args.policies)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} runs each; p50 / p99 in us")
    print(f"{'file':<22} {'policies':>8} {'outline (new)':>16} {'splitter (previous)':>20} ratio")
    for name, text in files.items():
        count = len(outline_policies(text))
        new: list[float] = []
        old: list[float] = []
        # Alternate in slices, so both see the same load.
        for _ in range(10):
            new += timed(lambda t=text: outline_policies(t), args.runs // 10)
            old += timed(lambda t=text: policy_texts(t), args.runs // 10)
        n50, n99, o50, o99 = pct(new, 0.5), pct(new, 0.99), pct(old, 0.5), pct(old, 0.99)
        print(
            f"{name:<22} {count:>8} {n50:>8.0f} / {n99:<6.0f} {o50:>10.0f} / {o99:<7.0f}"
            f" {n50 / o50:.2f}x"
        )
    # What an explanation pays once the active bundle is outlined: the cache lookup by the
    # files' texts (new strings each call, as the policy service's answer gives them).
    big = files[f"generated ({args.policies})"]
    _outlines((("policies.cedar", big),))
    copies = iter([big.encode().decode() for _ in range(args.runs)])
    hits = timed(lambda: _outlines((("policies.cedar", next(copies)),)), args.runs)
    print(
        f"explain's cached outline of the generated bundle: {pct(hits, 0.5):.0f} / "
        f"{pct(hits, 0.99):.0f} us"
    )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
