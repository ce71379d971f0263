"""What caller tokens cost the decision point (docs/auth.md, docs/benchmarks.md).

`svc pdp` serves the load bench's TinyTodo bundle (benches/load/workload.py, the same world and
16-request mix as run.py), pinned to core 0 with one Tokio worker, in three settings:

* ``off``: no authentication (what run.py measures);
* ``cached``: bearer tokens checked, verified tokens cached (the default; one ES256 token, as an
  enforcement point sends the same token until it renews it);
* ``uncached``: ``--auth-cache-entries 0``, so every request verifies the ES256 signature.

Each is loaded at full speed by ``oha`` (a Rust HTTP load generator from crates.io, pinned to
core 1): HTTP/1.1 ``POST /v1/access/evaluation`` over 64 connections, cycling through the mix's
bodies (``-Z``), and gRPC ``Authorizer/Check`` over HTTP/2 (16 connections of 4 streams, one
length-prefixed body, ``content-type: application/grpc``). The figures are the rate and the
server's CPU time per request (``/proc/<pid>/stat``), which moves less than the rate when other
work shares the core; the cost of a setting is its CPU per request minus ``off``'s. Settings
alternate within each round, the order reversed every other round, and the tables give the
median of the rounds.

Before timing, every request of the mix is sent with the token to each authenticated server and
must get the verdict ``off`` gives, and without a token must get 401 (gRPC UNAUTHENTICATED).

Run: ``cargo install oha`` once, then ``.venv/bin/python benches/load/auth_cost.py`` (Cedar's
example apps from ``tests/testdata/cedar-examples``, or ``--examples DIR``; ``--oha PATH`` when
oha is not on ``PATH``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run as load
import workload

from svc.common.auth import LocalIssuer

SETTINGS = ("off", "cached", "uncached")
CALLER = "bench.app"


def oha(
    oha_bin: str, url: str, seconds: int, args: list[str], headers: list[str]
) -> dict[str, Any]:
    """One ``oha`` run; its JSON summary."""
    argv = [oha_bin, "--no-tui", "--output-format", "json", "-z", f"{seconds}s", *args]
    for h in headers:
        argv += ["-H", h]
    argv.append(url)
    out = subprocess.run(load.client(argv), capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


class AuthBench:
    """One session: three servers, HTTP and gRPC on each, in rounds."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.pb = importlib.import_module("svc.authz.v1.authz_pb2")
        world = workload.build_world()
        self.mix = workload.build_mix(world)
        self.bundle = tmp / "bundle"
        self.bundle.mkdir()
        shutil.copy(
            args.examples / "tinytodo" / "tinytodo.cedarschema",
            self.bundle / "tinytodo.cedarschema",
        )
        shutil.copy(load.HERE / "tinytodo.cedar", self.bundle / "policies.cedar")
        (self.bundle / "entities.json").write_text(json.dumps(world.entities))
        self.jsonl = tmp / "svc.jsonl"
        self.jsonl.write_text(workload.jsonl([c.svc_json() for c in self.mix]))
        self.grpc_body = tmp / "check.grpc"
        self.grpc_body.write_bytes(workload.grpc_frame(self.mix[0].svc_grpc(self.pb)))
        self.issuer = LocalIssuer(tmp / "issuer")
        self.token = self.issuer.mint(CALLER, "svc-pdp", 24 * 3600)
        self.base = ""
        self.results: list[dict[str, Any]] = []

    def start(self, setting: str) -> load.Server:
        port = load.free_port()
        self.base = f"http://127.0.0.1:{port}"
        argv = [
            str(Path(sys.executable).parent / "svc"), "pdp", "--bundle", str(self.bundle),
            "--port", str(port), "--workers", "1", "--no-watch",
        ]  # fmt: skip
        if setting != "off":
            argv += [
                "--auth-issuer", self.issuer.issuer, "--auth-jwks", self.issuer.jwks_url,
                "--auth-callers", CALLER,
            ]  # fmt: skip
        if setting == "uncached":
            argv += ["--auth-cache-entries", "0"]
        return load.Server(f"svc {setting}", argv, f"{self.base}/readyz", self.tmp / "svc.log")

    def verdicts(self, token: str | None) -> tuple[list[str], list[str]]:
        """Every request of the mix over HTTP and gRPC; verdicts, or HTTP status / gRPC code."""
        import grpc
        import httpx

        headers = {"authorization": f"Bearer {token}"} if token else {}
        md = list(headers.items())
        http, grpc_v = [], []
        with httpx.Client(base_url=self.base, timeout=5) as h:
            for c in self.mix:
                r = h.post("/v1/access/evaluation", json=c.svc_json(), headers=headers)
                http.append(r.json()["verdict"] if r.status_code == 200 else str(r.status_code))
        with grpc.insecure_channel(self.base.removeprefix("http://")) as ch:
            check = ch.unary_unary(
                load.SVC_CHECK,
                request_serializer=None,
                response_deserializer=self.pb.CheckResponse.FromString,
            )
            for c in self.mix:
                try:
                    resp = check(c.svc_grpc(self.pb), metadata=md, timeout=5)
                    grpc_v.append(self.pb.Verdict.Name(resp.verdict))
                except grpc.RpcError as e:
                    grpc_v.append(str(e.code()))
        return http, grpc_v

    def timed(self, srv: load.Server, setting: str, target: str, rnd: int) -> None:
        d = self.args.duration
        auth = [f"authorization: Bearer {self.token}"] if setting != "off" else []
        if target == "http":
            url = f"{self.base}/v1/access/evaluation"
            args = ["-c", "64", "-m", "POST", "-T", "application/json", "-Z", str(self.jsonl)]
        else:
            url = f"{self.base}{load.SVC_CHECK}"
            args = ["--http2", "-c", "16", "-p", "4", "-m", "POST", "-D", str(self.grpc_body)]
            auth = [*auth, "content-type: application/grpc", "te: trailers"]
        oha(self.args.oha, url, 1, args, auth)  # warm-up
        cpu0 = srv.cpu()
        got = oha(self.args.oha, url, d, args, auth)
        cpu = srv.cpu() - cpu0
        codes = got.get("statusCodeDistribution") or {}
        ok = int(codes.get("200", 0))
        total = sum(int(v) for v in codes.values())
        # Requests still in flight when the run ends are cut off, not failed.
        failed = {
            k: int(v)
            for k, v in (got.get("errorDistribution") or {}).items()
            if k != "aborted due to deadline"
        }
        summary = got["summary"]
        self.results.append(
            {
                "round": rnd,
                "setting": setting,
                "target": target,
                "rps": ok / d,
                "requests": ok,
                "errors": total - ok + sum(failed.values()),
                "server_us_per_req": cpu / max(1, ok) * 1e6,
                "server_cpu": cpu / d,
                "p50_ms": (got.get("latencyPercentiles") or {}).get("p50", 0) * 1e3,
                "p99_ms": (got.get("latencyPercentiles") or {}).get("p99", 0) * 1e3,
                "success_rate": summary.get("successRate"),
            }
        )
        r = self.results[-1]
        print(
            f"  round {rnd} {setting:8} {target:4}: {r['rps']:9.0f} req/s "
            f"{r['server_us_per_req']:6.1f} us/req  cpu {r['server_cpu']:.0%}  "
            f"errors {r['errors']}",
            flush=True,
        )

    def run(self) -> None:
        with load.serving(lambda: self.start("off")):
            want = self.verdicts(None)
        if want[1] != ["VERDICT_" + v.upper() for v in want[0]]:
            raise SystemExit(f"HTTP and gRPC disagree without auth: {want}")
        for setting in ("cached", "uncached"):
            with load.serving(lambda s=setting: self.start(s)):
                if self.verdicts(self.token) != want:
                    raise SystemExit(f"{setting}: verdicts differ from the server without auth")
                refused = self.verdicts(None)
                if set(refused[0]) != {"401"} or set(refused[1]) != {"StatusCode.UNAUTHENTICATED"}:
                    raise SystemExit(f"{setting}: requests without a token were not refused")
        print(f"equivalence: {len(self.mix)} requests, same verdicts with and without auth")
        for rnd in range(1, self.args.rounds + 1):
            order = SETTINGS if rnd % 2 else tuple(reversed(SETTINGS))
            for setting in order:
                with load.serving(lambda s=setting: self.start(s)) as srv:
                    for target in ("http", "grpc"):
                        self.timed(srv, setting, target, rnd)

    def report(self) -> dict[str, Any]:
        def med(setting: str, target: str, key: str) -> float:
            return statistics.median(
                r[key] for r in self.results if r["setting"] == setting and r["target"] == target
            )

        table: dict[str, Any] = {}
        print("\n| setting | target | req/s | server us/req | cost us/req | p50 ms | p99 ms |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for target in ("http", "grpc"):
            base = med("off", target, "server_us_per_req")
            for setting in SETTINGS:
                us = med(setting, target, "server_us_per_req")
                row = {
                    "rps": med(setting, target, "rps"),
                    "server_us_per_req": us,
                    "cost_us_per_req": us - base,
                    "p50_ms": med(setting, target, "p50_ms"),
                    "p99_ms": med(setting, target, "p99_ms"),
                }
                table[f"{setting} {target}"] = row
                print(
                    f"| {setting} | {target} | {row['rps']:.0f} | {us:.1f} | "
                    f"{row['cost_us_per_req']:+.1f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |"
                )
        return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per timed run (10)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    ap.add_argument("--oha", default=shutil.which("oha") or "oha", help="the oha binary")
    ap.add_argument("--examples", type=Path, default=load.DEFAULT_EXAMPLES)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="svc-auth-bench-") as tmp:
        bench = AuthBench(args, Path(tmp))
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        load_before = list(os.getloadavg())
        bench.run()
        table = bench.report()
    load.RESULTS.mkdir(parents=True, exist_ok=True)
    out = load.RESULTS / f"auth-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "started": started,
                "commit": load.git_commit(),
                "loadavg_before": load_before,
                "loadavg_after": list(os.getloadavg()),
                "settings": vars(args) | {"examples": str(args.examples)},
                "runs": bench.results,
                "medians": table,
            },
            indent=2,
        )
    )
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
