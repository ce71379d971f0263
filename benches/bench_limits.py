"""What the JSON check of svc.common.limits costs a request body (docs/api.md, limits).

Every JSON body a Python service accepts is parsed once more by ``parse_json`` (UTF-8, depth,
lone surrogates) before the route parses it. This times ``parse_json`` against its peer, the
``json.loads`` the route does anyway, on resource batches of three sizes (the context service's
``POST /v1/resources``), and prints p50/p99 per body and the ratio.

    .venv/bin/python benches/bench_limits.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from svc.common.limits import parse_json


def body(items: int) -> bytes:
    """A ``POST /v1/resources`` body of `items` resources, with nested attrs and some text."""
    resources = [
        {
            "type": "Document",
            "id": f"doc-{i}",
            "attrs": {
                "owner": {"__entity": {"type": "Human", "id": f"user-{i % 97}"}},
                "classification": "internal",
                "title": f"Quarterly report {i} — résumé ✓",
                "tags": ["finance", "q3", str(i)],
                "size": i * 17,
            },
            "parents": [{"type": "Folder", "id": f"folder-{i % 13}"}],
        }
        for i in range(items)
    ]
    return json.dumps({"resources": resources}, ensure_ascii=False).encode()


def timed(fn: Callable[[bytes], Any], data: bytes, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn(data)
        out.append((time.perf_counter() - t) * 1000)
    return out


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min)")
    print(
        f"{'body':>10} {'json.loads p50/p99 ms':>24} {'parse_json p50/p99 ms':>24}",
        f"{'ratio p50':>10}",
    )
    for items in (1, 100, 5000):
        data = body(items)
        for _ in range(3):  # warm up
            parse_json(data)
            json.loads(data)
        peer = timed(json.loads, data, args.rounds)
        ours = timed(parse_json, data, args.rounds)
        ratio = statistics.median(ours) / statistics.median(peer)
        print(
            f"{len(data):>9}B {pct(peer, 0.5):>11.3f} / {pct(peer, 0.99):<10.3f}"
            f" {pct(ours, 0.5):>11.3f} / {pct(ours, 0.99):<10.3f} {ratio:>9.2f}x"
        )


if __name__ == "__main__":
    main()
