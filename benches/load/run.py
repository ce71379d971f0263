"""Load bench of the decision point (svc pdp) against its own no-op ceiling and against Cerbos.

What is measured (issue "Decision point service", item 5), in one session on this 2-core machine,
with every server pinned to core 0 and every load generator to core 1 (``taskset``):

* HTTP: ``wrk -t1 -c64`` with ``post.lua`` (cycles through the mix's 16 bodies) against svc's
  ``POST /v1/access/evaluation``, svc's ``POST /v1/noop`` (parses the body, fixed answer: the
  ceiling) and Cerbos's AuthZEN ``POST /access/v1/evaluation``.
* gRPC: ``h2load`` (HTTP/2 prior knowledge) posting length-prefixed protobuf bodies with
  ``content-type: application/grpc`` and ``te: trailers`` to svc's ``Authorizer/Check``, svc's
  ``NoopAuthorizer/Check`` and Cerbos's ``CerbosService/CheckResources``. h2load sends one body
  per process, so the mix is 16 h2load processes running together, one per body.
* Latency at half of each target's measured maximum rate: h2load ``--rps`` (constant rate per
  connection; HTTP/1.1 with ``--h1`` for the HTTP targets), p50/p99 from its per-request log.

Before anything is timed, every request of the mix is decided by svc over HTTP and over gRPC
(with the exact bytes h2load sends) and by Cerbos over AuthZEN and over gRPC CheckResources; all
four must agree with each other and with the verdict the mix expects, or the bench stops.

svc runs as ``svc pdp --noop-routes --workers 1`` (one Tokio worker: one core); Cerbos
(npm ``@cerbos/cerbos-linux-x64``, installed by ``setup.sh``) with audit and telemetry off; its
Go runtime runs with ``GOMAXPROCS=1``. One server runs at a time: each round times Cerbos, stops
it, then times svc (evaluation and no-op alternating, the order flipped every round), so every
ratio is a median of per-round ratios of rates measured back to back.

Also reported per run: the server's CPU use (share of its core; well below 100% with the generator
near 100% means the load generator, not the server, was the limit) and the server CPU time per
request, which is steadier than the rate when other work shares the machine.

svc runs here without a decision log; ``decision_log.py`` beside this file runs it with one, in
window and in durable mode (``make log-bench``), and reports what durable mode costs.

Run: ``bash benches/load/setup.sh`` once, then ``.venv/bin/python benches/load/run.py`` (full:
3 rounds of 15 s runs, about 6.5 minutes) or ``--quick`` (1 round of 4 s runs, about 1 minute).
Results: a table on stdout and JSON under ``benches/results/``. Targets that are missed print
``MISS``; the script still exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import workload

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = REPO / "benches" / "results"
DEFAULT_EXAMPLES = REPO / "tests" / "testdata" / "cedar-examples"
DEFAULT_CERBOS = (
    Path.home() / ".cache/svc-bench/node_modules/@cerbos/cerbos-linux-x64/cerbos-linux-x64"
)
SERVER_CORE = "0"
CLIENT_CORE = "1"

# Targets of the issue item.
HTTP_VS_NOOP_MIN = 0.70
HTTP_VS_CERBOS_MIN = 2.0
GRPC_VS_NOOP_MIN = 0.60
GRPC_VS_CERBOS_MIN = 1.5
P99_HALF_RATE_MAX_MS = 1.0

SVC_CHECK = "/svc.authz.v1.Authorizer/Check"
SVC_NOOP_CHECK = "/svc.authz.v1.NoopAuthorizer/Check"
CERBOS_CHECK = "/cerbos.svc.v1.CerbosService/CheckResources"
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")
JSON_HEADERS = ("content-type: application/json",)

Json = dict[str, Any]


@dataclass(frozen=True)
class Profile:
    """How long to measure."""

    duration: int  # seconds per timed run
    warmup: int  # seconds of untimed load before each timed run
    rounds: int  # timed runs per target; svc targets alternate within a round
    latency_duration: int  # seconds per constant-rate run


FULL = Profile(duration=15, warmup=2, rounds=3, latency_duration=15)
QUICK = Profile(duration=4, warmup=1, rounds=1, latency_duration=5)


@dataclass
class Run:
    """One timed run against one target."""

    target: str
    tool: str
    rps: float
    requests: int
    seconds: float
    errors: int  # non-2xx responses, socket errors, failed/errored/timed-out requests
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    server_cpu: float = 0.0  # share of one core the server used
    client_cpu: float = 0.0  # share of one core the load generator used
    server_us_per_req: float = 0.0
    offered_rps: float | None = None  # constant-rate runs: the rate asked for
    round: int = 0


@dataclass
class Results:
    """Everything the run writes to JSON."""

    mode: str
    started: str
    machine: dict[str, Any]
    settings: dict[str, Any]
    equivalence: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


# --- helpers ----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def duration_ms(text: str) -> float:
    """``123.45us`` / ``1.2ms`` / ``0.5s`` (wrk and h2load units) in milliseconds."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"cannot read duration `{text}`")
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[m.group(2)]
    return float(m.group(1)) * scale


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank."""
    s = sorted(samples)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU time of this process's waited-for children (the load generators)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def git_commit() -> str:
    """The checkout's commit, with ``+dirty`` when it has changes."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return r.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_state() -> dict[str, Any]:
    """Load average and ``vmstat 1 3``, printed before the run."""
    vm = subprocess.run(["vmstat", "1", "3"], capture_output=True, text=True, check=False).stdout
    return {"loadavg": list(os.getloadavg()), "vmstat": vm}


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Waits until GET `url` answers 200."""
    import httpx

    deadline = time.monotonic() + timeout
    last: Exception | str = "no answer"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=1.0)
            if r.status_code == 200:
                return
            last = f"status {r.status_code}"
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s: {last}")


class Server:
    """A server process pinned to the server core."""

    def __init__(self, name: str, argv: list[str], ready_url: str, log: Path, env: Any = None):
        self.name = name
        self.log = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE, *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            wait_http(ready_url)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(
                f"{name} did not start ({e}); its log:\n{log.read_text()[-3000:]}"
            ) from e

    def cpu(self) -> float:
        """CPU seconds the server has used so far."""
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def serving(server_factory: Callable[[], Server]) -> Iterator[Server]:
    """Starts a server for the block and always stops it."""
    srv = server_factory()
    try:
        yield srv
    finally:
        srv.stop()


# --- load generators --------------------------------------------------------------------------


def client(argv: list[str]) -> list[str]:
    """A load-generator command line pinned to the client core."""
    return ["taskset", "-c", CLIENT_CORE, *argv]


def wrk(url: str, bodies: Path, connections: int, seconds: int) -> dict[str, Any]:
    """One ``wrk -t1`` run with post.lua over `bodies`; the parsed figures."""
    argv = client(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(HERE / "post.lua"),
            url,
            "--",
            str(bodies),
        ]
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    def grab(pattern: str) -> re.Match[str] | None:
        return re.search(pattern, out, re.MULTILINE)

    rps = grab(r"^Requests/sec:\s+([\d.]+)")
    total = grab(r"(\d+) requests in ([\d.]+\w+)")
    if rps is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    errors = 0
    non2xx = grab(r"Non-2xx or 3xx responses: (\d+)")
    if non2xx:
        errors += int(non2xx.group(1))
    sock = grab(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
    if sock:
        errors += sum(int(g) for g in sock.groups())
    p50 = grab(r"^\s+50%\s+(\S+)")
    p99 = grab(r"^\s+99%\s+(\S+)")
    mean = grab(r"^\s+Latency\s+(\S+)")
    return {
        "rps": float(rps.group(1)),
        "requests": int(total.group(1)),
        "seconds": duration_ms(total.group(2)) / 1e3,
        "errors": errors,
        "p50_ms": duration_ms(p50.group(1)) if p50 else None,
        "p99_ms": duration_ms(p99.group(1)) if p99 else None,
        "mean_ms": duration_ms(mean.group(1)) if mean else None,
    }


def h2load(
    url: str,
    bodies: list[Path],
    headers: tuple[str, ...],
    seconds: int,
    clients: int,
    streams: int,
    h1: bool = False,
    rps_per_client: float | None = None,
    log_dir: Path | None = None,
) -> dict[str, Any]:
    """One h2load process per body, all at once; figures summed over the processes.

    With `rps_per_client`, each connection sends at that constant rate and the per-request
    log (`log_dir`) gives the latency percentiles.
    """
    procs = []
    for i, body in enumerate(bodies):
        argv = [
            "h2load",
            "-D",
            str(seconds),
            "-c",
            str(clients),
            "-m",
            str(streams),
            "-d",
            str(body),
        ]
        for h in headers:
            argv += ["-H", h]
        if h1:
            argv.append("--h1")
        if rps_per_client is not None:
            argv.append(f"--rps={rps_per_client:.3f}")
        if log_dir is not None:
            argv.append(f"--log-file={log_dir / f'h2load-{i}.log'}")
        argv.append(url)
        procs.append(
            subprocess.Popen(
                client(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    rps = 0.0
    done = errors = 0
    means: list[tuple[float, int]] = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"h2load failed ({p.returncode}):\n{out}\n{err}")
        fin = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
        reqs = re.search(
            r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
            r"(\d+) errored, (\d+) timeout",
            out,
        )
        codes = re.search(r"status codes: (\d+) 2xx", out)
        tfr = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
        if fin is None or reqs is None or codes is None:
            raise RuntimeError(f"cannot read h2load's output:\n{out}")
        rps += float(fin.group(1))
        succeeded = int(reqs.group(2))
        done += succeeded
        errors += sum(int(reqs.group(k)) for k in (3, 4, 5)) + (succeeded - int(codes.group(1)))
        if tfr:
            means.append((duration_ms(tfr.group(3)), succeeded))
    res: dict[str, Any] = {
        "rps": rps,
        "requests": done,
        "seconds": float(seconds),
        "errors": errors,
        "mean_ms": sum(m * n for m, n in means) / max(1, sum(n for _, n in means)),
    }
    if log_dir is not None:
        lat: list[float] = []
        for i in range(len(bodies)):
            rows = [
                line.split("\t")
                for line in (log_dir / f"h2load-{i}.log").read_text().splitlines()
                if line.strip()
            ]
            lat += [int(r[2]) / 1e3 for r in rows if r[1].startswith("2")]
        if lat:
            res["p50_ms"] = percentile(lat, 50)
            res["p99_ms"] = percentile(lat, 99)
            res["mean_ms"] = statistics.fmean(lat)
    return res


#: vegeta and ghz, built from the Go module proxy by setup.sh into the bench cache.
GO_BIN = Path(os.environ.get("SVC_BENCH_CACHE", Path.home() / ".cache" / "svc-bench")) / "bin"


def vegeta(
    url: str, bodies: list[Path], rate: float, seconds: int, out_dir: Path
) -> dict[str, Any]:
    """An open-loop HTTP/1.1 run: ``vegeta attack`` at a constant `rate` over the bodies.

    vegeta schedules each request at its own instant (``rate`` evenly spaced requests per
    second), whether or not earlier ones were answered, and measures each from that instant:
    queueing in the server counts, and no burst is sent that the schedule did not ask for.
    """
    targets = out_dir / "targets.txt"
    targets.write_text(
        "\n".join(f"POST {url}\nContent-Type: application/json\n@{b}\n" for b in bodies)
    )
    results = out_dir / "vegeta.bin"
    attack = [
        str(GO_BIN / "vegeta"),
        "attack",
        f"-targets={targets}",
        "-format=http",
        f"-rate={rate:.0f}/s",
        f"-duration={seconds}s",
        "-keepalive=true",
        "-workers=16",
        "-max-workers=64",
        f"-output={results}",
    ]
    subprocess.run(client(attack), check=True, capture_output=True)
    rep = subprocess.run(
        [str(GO_BIN / "vegeta"), "report", "-type=json", str(results)],
        check=True,
        capture_output=True,
        text=True,
    )
    r = json.loads(rep.stdout)
    lat = r["latencies"]
    ok = int(r["status_codes"].get("200", 0))
    return {
        "rps": float(r["throughput"]),
        "requests": ok,
        "seconds": float(seconds),
        "errors": int(r["requests"]) - ok,
        "mean_ms": lat["mean"] / 1e6,
        "p50_ms": lat["50th"] / 1e6,
        "p99_ms": lat["99th"] / 1e6,
    }


def ghz(
    target: str, call: str, messages: list[Any], rate: float, seconds: int, out_dir: Path
) -> dict[str, Any]:
    """An open-loop gRPC run: ``ghz --rps`` (constant schedule) over the messages, one connection.

    The method's types come from the server's reflection service; the messages (JSON) are
    sent in turn. Up to 32 calls may be in flight, so a slow answer delays none of the next.
    """
    data = out_dir / "ghz-data.json"
    data.write_text(json.dumps(messages))
    argv = [
        str(GO_BIN / "ghz"),
        "--insecure",
        f"--call={call}",
        f"--data-file={data}",
        f"--rps={rate:.0f}",
        "--load-schedule=const",
        f"--duration={seconds}s",
        "--concurrency=32",
        "--connections=1",
        "--format=json",
        target,
    ]
    out = subprocess.run(client(argv), check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    pct = {int(d["percentage"]): d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
    ok = int((r.get("statusCodeDistribution") or {}).get("OK", 0))
    return {
        "rps": float(r["rps"]),
        "requests": ok,
        "seconds": float(seconds),
        "errors": int(r["count"]) - ok,
        "mean_ms": r["average"] / 1e6,
        "p50_ms": pct.get(50),
        "p99_ms": pct.get(99),
    }


# --- the bench --------------------------------------------------------------------------------


@dataclass
class Files:
    """Everything the generators send, written once per session."""

    bundle: Path
    svc_jsonl: Path
    authzen_jsonl: Path
    svc_json: list[Path]
    authzen_json: list[Path]
    svc_grpc: list[Path]
    cerbos_grpc: list[Path]


class Bench:
    """One session: verify, then time Cerbos, then time svc."""

    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp
        self.profile = QUICK if args.quick else FULL
        if args.duration:
            self.profile = Profile(
                args.duration, self.profile.warmup, self.profile.rounds, args.duration
            )
        if args.rounds:
            self.profile = Profile(
                self.profile.duration,
                self.profile.warmup,
                args.rounds,
                self.profile.latency_duration,
            )
        self.pb = importlib.import_module("svc.authz.v1.authz_pb2")
        self.cpb = self._cerbos_stubs()
        self.world = workload.build_world()
        self.mix = workload.build_mix(self.world)
        self.files = self._write_files()
        self.results = Results(
            mode="quick" if args.quick else "full",
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            machine={},
            settings={
                "profile": asdict(self.profile),
                "connections": args.connections,
                "h2load_streams": args.streams,
                "svc_workers": args.workers,
                "mix": [c.name for c in self.mix],
                "users": workload.USERS,
                "lists": workload.LISTS,
            },
        )

    # --- setup ---------------------------------------------------------------------------

    def _cerbos_stubs(self) -> Any:
        """Compiles cerbos/check.proto (the used subset of Cerbos's API) into a temp dir."""
        from grpc_tools import protoc

        wkt = Path(importlib.import_module("grpc_tools").__file__ or "").parent / "_proto"
        out = self.tmp / "pb"
        out.mkdir()
        rc = protoc.main(
            [
                "protoc",
                f"-I{HERE / 'cerbos'}",
                f"-I{wkt}",
                f"--python_out={out}",
                str(HERE / "cerbos" / "check.proto"),
            ]
        )
        if rc != 0:
            raise RuntimeError("protoc failed on cerbos/check.proto")
        sys.path.insert(0, str(out))
        return importlib.import_module("check_pb2")

    def _write_files(self) -> Files:
        bundle = self.tmp / "bundle"
        bundle.mkdir()
        schema = self.args.examples / "tinytodo" / "tinytodo.cedarschema"
        shutil.copy(schema, bundle / "tinytodo.cedarschema")
        shutil.copy(HERE / "tinytodo.cedar", bundle / "policies.cedar")
        (bundle / "entities.json").write_text(json.dumps(self.world.entities))
        bodies = self.tmp / "bodies"
        bodies.mkdir()
        svc_jsonl = bodies / "svc.jsonl"
        svc_jsonl.write_text(workload.jsonl([c.svc_json() for c in self.mix]))
        authzen_jsonl = bodies / "authzen.jsonl"
        authzen_jsonl.write_text(workload.jsonl([c.authzen_json() for c in self.mix]))
        f = Files(bundle, svc_jsonl, authzen_jsonl, [], [], [], [])
        for i, c in enumerate(self.mix):
            p = bodies / f"svc-{i:02d}.json"
            p.write_text(json.dumps(c.svc_json(), separators=(",", ":")))
            f.svc_json.append(p)
            p = bodies / f"authzen-{i:02d}.json"
            p.write_text(json.dumps(c.authzen_json(), separators=(",", ":")))
            f.authzen_json.append(p)
            p = bodies / f"svc-{i:02d}.grpc"
            p.write_bytes(workload.grpc_frame(c.svc_grpc(self.pb)))
            f.svc_grpc.append(p)
            p = bodies / f"cerbos-{i:02d}.grpc"
            p.write_bytes(workload.grpc_frame(c.cerbos_grpc(self.cpb)))
            f.cerbos_grpc.append(p)
        return f

    def start_svc(self) -> Server:
        """``svc pdp`` over the bundle, with the no-op routes, pinned to the server core."""
        port = free_port()
        self.svc_base = f"http://127.0.0.1:{port}"
        argv = [
            str(Path(sys.executable).parent / "svc"),
            "pdp",
            "--bundle",
            str(self.files.bundle),
            "--port",
            str(port),
            "--noop-routes",
            "--workers",
            str(self.args.workers),
            "--no-watch",
        ]
        return Server("svc", argv, f"{self.svc_base}/readyz", self.tmp / "svc.log")

    def start_cerbos(self) -> Server:
        """Cerbos over cerbos/policies, audit and telemetry off, pinned to the server core."""
        http_port, grpc_port = free_port(), free_port()
        self.cerbos_base = f"http://127.0.0.1:{http_port}"
        self.cerbos_grpc = f"127.0.0.1:{grpc_port}"
        conf = self.tmp / "cerbos.yaml"
        conf.write_text(
            json.dumps(
                {
                    "server": {
                        "httpListenAddr": f"127.0.0.1:{http_port}",
                        "grpcListenAddr": f"127.0.0.1:{grpc_port}",
                    },
                    "storage": {
                        "driver": "disk",
                        "disk": {
                            "directory": str(HERE / "cerbos" / "policies"),
                            "watchForChanges": False,
                        },
                    },
                    "audit": {"enabled": False},
                    "telemetry": {"disabled": True},
                },
                indent=2,
            )
        )
        # GOMAXPROCS=1: what Go derives from the affinity mask anyway, said outright.
        env = {**os.environ, "CERBOS_NO_TELEMETRY": "1", "GOMAXPROCS": "1"}
        argv = [str(self.args.cerbos), "server", f"--config={conf}", "--log-level=warn"]
        return Server(
            "cerbos", argv, f"{self.cerbos_base}/_cerbos/health", self.tmp / "cerbos.log", env
        )

    # --- equivalence ---------------------------------------------------------------------

    def svc_verdicts(self) -> dict[str, list[str]]:
        """Every request of the mix through svc's HTTP and gRPC APIs, and the no-op routes."""
        import grpc
        import httpx

        http, grpc_v = [], []
        with httpx.Client(base_url=self.svc_base, timeout=5) as h:
            for c in self.mix:
                r = h.post("/v1/access/evaluation", json=c.svc_json())
                r.raise_for_status()
                http.append(r.json()["verdict"])
            noop = h.post("/v1/noop", json=self.mix[0].svc_json())
            if noop.status_code != 200:
                raise RuntimeError(f"/v1/noop answered {noop.status_code}: is --noop-routes on?")
        with grpc.insecure_channel(self.svc_base.removeprefix("http://")) as ch:
            check = ch.unary_unary(
                SVC_CHECK,
                request_serializer=None,
                response_deserializer=self.pb.CheckResponse.FromString,
            )
            noop_check = ch.unary_unary(
                SVC_NOOP_CHECK,
                request_serializer=None,
                response_deserializer=self.pb.CheckResponse.FromString,
            )
            for path in self.files.svc_grpc:
                resp = check(path.read_bytes()[5:], timeout=5)
                grpc_v.append(self.pb.Verdict.Name(resp.verdict).removeprefix("VERDICT_").lower())
            noop_check(self.files.svc_grpc[0].read_bytes()[5:], timeout=5)
        return {"svc_http": http, "svc_grpc": grpc_v}

    def cerbos_verdicts(self) -> dict[str, list[str]]:
        """Every request of the mix through Cerbos's AuthZEN endpoint and gRPC CheckResources."""
        import grpc
        import httpx

        authzen, grpc_v = [], []
        with httpx.Client(base_url=self.cerbos_base, timeout=5) as h:
            for c in self.mix:
                r = h.post("/access/v1/evaluation", json=c.authzen_json())
                r.raise_for_status()
                authzen.append("allow" if r.json().get("decision") is True else "deny")
        with grpc.insecure_channel(self.cerbos_grpc) as ch:
            check = ch.unary_unary(
                CERBOS_CHECK,
                request_serializer=None,
                response_deserializer=self.cpb.CheckResourcesResponse.FromString,
            )
            for c, path in zip(self.mix, self.files.cerbos_grpc, strict=True):
                resp = check(path.read_bytes()[5:], timeout=5)
                effect = resp.results[0].actions[c.action]
                grpc_v.append("allow" if effect == self.cpb.EFFECT_ALLOW else "deny")
        return {"cerbos_authzen": authzen, "cerbos_grpc": grpc_v}

    def check_equivalence(self, verdicts: dict[str, list[str]]) -> None:
        """All four paths and the expected verdicts must agree on every request, or stop."""
        expected = [c.expect for c in self.mix]
        agree = sum(
            all(v[i] == expected[i] for v in verdicts.values()) for i in range(len(self.mix))
        )
        allows = expected.count("allow")
        print(
            f"equivalence: {agree}/{len(self.mix)} requests agree across svc HTTP, svc gRPC, "
            f"Cerbos AuthZEN, Cerbos CheckResources and the expected verdicts "
            f"({allows} allow, {len(self.mix) - allows} deny)"
        )
        self.results.equivalence = {
            "agree": agree,
            "requests": len(self.mix),
            "expected": expected,
            **verdicts,
        }
        if agree != len(self.mix):
            for i, c in enumerate(self.mix):
                row = {k: v[i] for k, v in verdicts.items()}
                if any(x != c.expect for x in row.values()):
                    print(f"  DISAGREE {c.name}: expected {c.expect}, got {row}")
            raise SystemExit("svc and Cerbos disagree: the policies are not equivalent; no timing")

    # --- timing --------------------------------------------------------------------------

    def timed(self, srv: Server, target: str, tool: str, go: Callable[[], dict[str, Any]]) -> Run:
        """Runs `go` with the server's and the generators' CPU accounted."""
        s0, c0, t0 = srv.cpu(), children_cpu(), time.monotonic()
        fig = go()
        wall = time.monotonic() - t0
        s1, c1 = srv.cpu(), children_cpu()
        run = Run(target=target, tool=tool, **fig)
        run.server_cpu = (s1 - s0) / wall
        run.client_cpu = (c1 - c0) / wall
        run.server_us_per_req = (s1 - s0) / max(1, run.requests) * 1e6
        self.results.runs.append(run)
        flag = ""
        if run.errors:
            flag += f"  ERRORS {run.errors}"
        if run.server_cpu < 0.9 and run.client_cpu > 0.9 and run.offered_rps is None:
            flag += "  (generator-bound?)"
        lat = (
            f"p50 {run.p50_ms:.3f} p99 {run.p99_ms:.3f} ms"
            if run.p50_ms is not None and run.p99_ms is not None
            else f"mean {run.mean_ms or 0:.3f} ms"
        )
        print(
            f"  {target:<30} {run.rps:>9.0f} req/s  {lat}  server {run.server_cpu:4.0%} "
            f"{run.server_us_per_req:6.1f} us/req  client {run.client_cpu:4.0%}{flag}",
            flush=True,
        )
        return run

    def http_max(self, srv: Server, target: str, url: str, bodies: Path, rnd: int) -> Run:
        """wrk at full speed (after an untimed warm-up)."""
        p, n = self.profile, self.args.connections
        wrk(url, bodies, n, p.warmup)
        run = self.timed(srv, target, "wrk", lambda: wrk(url, bodies, n, p.duration))
        run.round = rnd
        return run

    def grpc_max(self, srv: Server, target: str, url: str, bodies: list[Path], rnd: int) -> Run:
        """h2load at full speed, one process per body (after an untimed warm-up)."""
        p, m = self.profile, self.args.streams
        h2load(url, bodies, GRPC_HEADERS, p.warmup, 1, m)
        run = self.timed(
            srv, target, "h2load", lambda: h2load(url, bodies, GRPC_HEADERS, p.duration, 1, m)
        )
        run.round = rnd
        return run

    def half_rate(self, srv: Server, target: str, url: str, bodies: list[Path]) -> Run:
        """h2load at half of the target's median maximum rate, constant rate per connection.

        p50/p99 come from h2load's per-request log. gRPC: 1 connection x 8 streams per body;
        HTTP/1.1 (``--h1``): 2 connections per body, one request in flight on each. h2load's
        rate timer fires every 100 ms and sends what is due at once, so the "constant" rate
        arrives in bursts; ``open_loop`` measures without them.
        """
        grpc_ = bodies[0].suffix == ".grpc"
        rate = self.median_rps(target) / 2
        clients = 1 if grpc_ else 2
        streams = 8 if grpc_ else 1
        per_client = rate / (len(bodies) * clients)
        log_dir = self.tmp / f"lat-{re.sub(r'[^a-z]+', '_', target)}"
        log_dir.mkdir(exist_ok=True)
        headers = GRPC_HEADERS if grpc_ else JSON_HEADERS
        d = self.profile.latency_duration
        run = self.timed(
            srv,
            f"{target} @half",
            "h2load --rps",
            lambda: h2load(
                url, bodies, headers, d, clients, streams, not grpc_, per_client, log_dir
            ),
        )
        run.offered_rps = rate
        return run

    def open_loop(
        self,
        srv: Server,
        target: str,
        url: str,
        bodies: list[Path] | None = None,
        call: str = "",
        messages: list[Any] | None = None,
    ) -> Run:
        """vegeta (HTTP bodies) or ghz (gRPC messages) at half of the target's maximum rate."""
        rate = self.median_rps(target) / 2
        out_dir = self.tmp / f"open-{re.sub(r'[^a-z]+', '_', target)}"
        out_dir.mkdir(exist_ok=True)
        d = self.profile.latency_duration
        if bodies is not None:
            run = self.timed(
                srv,
                f"{target} @half open",
                "vegeta",
                lambda: vegeta(url, bodies, rate, d, out_dir),
            )
        else:
            run = self.timed(
                srv,
                f"{target} @half open",
                "ghz",
                lambda: ghz(url, call, messages or [], rate, d, out_dir),
            )
        run.offered_rps = rate
        return run

    def run(self) -> None:
        """The whole session."""
        state = machine_state()
        self.results.machine = {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "svc_commit": git_commit(),
            "cerbos": self._version(),
            "before": state,
        }
        print(f"load average before: {' '.join(f'{x:.2f}' for x in state['loadavg'])}")
        print(state["vmstat"].rstrip())
        p = self.profile
        print(
            f"mode {self.results.mode}: {p.rounds} round(s) of {p.duration}s runs (+{p.warmup}s "
            f"warm-up each); wrk -t1 -c{self.args.connections}; h2load {len(self.mix)} processes "
            f"x 1 connection x {self.args.streams} streams; servers on core {SERVER_CORE}, "
            f"generators on core {CLIENT_CORE}; svc {self.results.machine['svc_commit']}, "
            f"Cerbos {self.results.machine['cerbos']}"
        )

        # 1. Equivalence, before anything is timed.
        with serving(self.start_svc):
            verdicts = self.svc_verdicts()
        with serving(self.start_cerbos):
            verdicts |= self.cerbos_verdicts()
        self.check_equivalence(verdicts)

        # 2. Rounds: Cerbos, then svc (one server at a time on the server core), so that each
        # round gives a back-to-back svc / Cerbos pair as well as svc / no-op pairs.
        for r in range(p.rounds):
            with serving(self.start_cerbos) as srv:
                print(f"round {r + 1}/{p.rounds}: Cerbos")
                self.cerbos_max(srv, r)
            with serving(self.start_svc) as srv:
                print(f"round {r + 1}/{p.rounds}: svc pdp --workers {self.args.workers}")
                self.svc_max(srv, r)

        # 3. Latency at half of each target's median maximum rate.
        with serving(self.start_cerbos) as srv:
            print("constant rate, half of the maximum: Cerbos")
            self.half_rate(srv, "cerbos authzen", self.cerbos_authzen_url, self.files.authzen_json)
            self.half_rate(
                srv, "cerbos CheckResources", self.cerbos_grpc_url, self.files.cerbos_grpc
            )
        with serving(self.start_svc) as srv:
            print("constant rate, half of the maximum: svc")
            self.half_rate(srv, "svc http evaluation", self.svc_eval_url, self.files.svc_json)
            self.half_rate(srv, "svc grpc Check", self.svc_check_url, self.files.svc_grpc)

        # 4. The same rates open loop, evenly spaced (vegeta, ghz), when they are installed.
        if (GO_BIN / "vegeta").exists() and (GO_BIN / "ghz").exists():
            with serving(self.start_cerbos) as srv:
                print("open loop, half of the maximum: Cerbos")
                self.open_loop(
                    srv, "cerbos authzen", self.cerbos_authzen_url, self.files.authzen_json
                )
                self.open_loop(
                    srv,
                    "cerbos CheckResources",
                    self.cerbos_grpc,
                    call=CERBOS_CHECK.strip("/"),
                    messages=[c.cerbos_check_json() for c in self.mix],
                )
            with serving(self.start_svc) as srv:
                print("open loop, half of the maximum: svc")
                self.open_loop(srv, "svc http evaluation", self.svc_eval_url, self.files.svc_json)
                self.open_loop(
                    srv,
                    "svc grpc Check",
                    self.svc_base.removeprefix("http://"),
                    call=SVC_CHECK.strip("/"),
                    messages=[
                        {
                            "principal": {"type": "User", "id": c.principal.id},
                            "action": c.action,
                            "resource": c.resource_ref(),
                        }
                        for c in self.mix
                    ],
                )
        self.results.machine["after"] = {"loadavg": list(os.getloadavg())}
        self.report()

    def cerbos_max(self, srv: Server, rnd: int) -> None:
        """Cerbos's AuthZEN endpoint (wrk) and CheckResources (h2load) at full speed."""
        self.http_max(srv, "cerbos authzen", self.cerbos_authzen_url, self.files.authzen_jsonl, rnd)
        self.grpc_max(
            srv, "cerbos CheckResources", self.cerbos_grpc_url, self.files.cerbos_grpc, rnd
        )

    def svc_max(self, srv: Server, rnd: int) -> None:
        """svc's evaluation and no-op routes, HTTP and gRPC; the order flips every round."""
        b = self.svc_base
        steps: list[Callable[[], Run]] = [
            lambda: self.http_max(
                srv, "svc http evaluation", self.svc_eval_url, self.files.svc_jsonl, rnd
            ),
            lambda: self.http_max(srv, "svc http noop", f"{b}/v1/noop", self.files.svc_jsonl, rnd),
            lambda: self.grpc_max(
                srv, "svc grpc Check", self.svc_check_url, self.files.svc_grpc, rnd
            ),
            lambda: self.grpc_max(
                srv, "svc grpc noop", f"{b}{SVC_NOOP_CHECK}", self.files.svc_grpc, rnd
            ),
        ]
        for step in steps if rnd % 2 == 0 else steps[::-1]:
            step()

    @property
    def svc_eval_url(self) -> str:
        """svc's HTTP evaluation route."""
        return f"{self.svc_base}/v1/access/evaluation"

    @property
    def svc_check_url(self) -> str:
        """svc's gRPC Check, as h2load's URL."""
        return f"{self.svc_base}{SVC_CHECK}"

    @property
    def cerbos_authzen_url(self) -> str:
        """Cerbos's AuthZEN access evaluation."""
        return f"{self.cerbos_base}/access/v1/evaluation"

    @property
    def cerbos_grpc_url(self) -> str:
        """Cerbos's gRPC CheckResources, as h2load's URL."""
        return f"http://{self.cerbos_grpc}{CERBOS_CHECK}"

    def _version(self) -> str:
        out = subprocess.run(
            [str(self.args.cerbos), "--version"], capture_output=True, text=True, check=False
        ).stdout
        return out.splitlines()[0] if out else "?"

    # --- report --------------------------------------------------------------------------

    def runs_of(self, target: str) -> list[Run]:
        """The full-speed runs of one target."""
        return [r for r in self.results.runs if r.target == target]

    def median_rps(self, target: str) -> float:
        """Median full-speed rate of a target over the rounds."""
        return statistics.median(r.rps for r in self.runs_of(target))

    def paired_ratio(self, a: str, b: str) -> float:
        """Median over rounds of rps(a) / rps(b), each pair measured back to back."""
        ra, rb = self.runs_of(a), self.runs_of(b)
        return statistics.median(x.rps / y.rps for x, y in zip(ra, rb, strict=True))

    def paired_cpu_ratio(self, a: str, b: str) -> float:
        """Median over rounds of (server CPU per request of b) / (of a)."""
        ra, rb = self.runs_of(a), self.runs_of(b)
        return statistics.median(
            y.server_us_per_req / x.server_us_per_req for x, y in zip(ra, rb, strict=True)
        )

    def report(self) -> None:
        """The table, the ratios against the targets, and the JSON file."""
        targets = [
            "svc http evaluation",
            "svc http noop",
            "cerbos authzen",
            "svc grpc Check",
            "svc grpc noop",
            "cerbos CheckResources",
        ]
        print()
        print(
            f"{'target':<24} {'tool':<6} {'max req/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'srv CPU':>8} {'srv us/req':>10} | {'half rate':>9} {'p50 ms':>7} {'p99 ms':>7}"
        )
        print("-" * 112)
        summary: dict[str, Any] = {}
        for t in targets:
            runs = self.runs_of(t)
            half = next((r for r in self.results.runs if r.target == f"{t} @half"), None)
            p50s = [r.p50_ms for r in runs if r.p50_ms is not None]
            p99s = [r.p99_ms for r in runs if r.p99_ms is not None]
            row = {
                "rps": self.median_rps(t),
                "p50_ms": statistics.median(p50s) if p50s else None,
                "p99_ms": statistics.median(p99s) if p99s else None,
                "mean_ms": statistics.median(r.mean_ms or 0 for r in runs),
                "server_cpu": statistics.median(r.server_cpu for r in runs),
                "server_us_per_req": statistics.median(r.server_us_per_req for r in runs),
                "errors": sum(r.errors for r in runs),
            }
            if half is not None:
                row |= {
                    "half_rps": half.rps,
                    "half_p50_ms": half.p50_ms,
                    "half_p99_ms": half.p99_ms,
                }
            open_ = next((r for r in self.results.runs if r.target == f"{t} @half open"), None)
            if open_ is not None:
                row |= {
                    "open_tool": open_.tool,
                    "open_offered_rps": open_.offered_rps,
                    "open_rps": open_.rps,
                    "open_p50_ms": open_.p50_ms,
                    "open_p99_ms": open_.p99_ms,
                    "open_errors": open_.errors,
                }
            summary[t] = row

            def ms(x: float | None) -> str:
                return f"{x:.3f}" if x is not None else "-"

            at_max = (
                (ms(row["p50_ms"]), ms(row["p99_ms"]))
                if row["p50_ms"] is not None
                else (f"~{row['mean_ms']:.3f}", "-")
            )
            print(
                f"{t:<24} {runs[0].tool:<6} {row['rps']:>10.0f} {at_max[0]:>8} {at_max[1]:>8} "
                f"{row['server_cpu']:>8.0%} {row['server_us_per_req']:>10.1f} | "
                f"{(half.rps if half else 0):>9.0f} {ms(half.p50_ms if half else None):>7} "
                f"{ms(half.p99_ms if half else None):>7}"
            )
        print(
            "(p50/p99 at max rate: wrk's, closed loop; h2load gives only a mean there (~). "
            "Half rate: h2load --rps, per-request log.)"
        )
        if any("open_p99_ms" in summary[t] for t in targets):
            print()
            print(
                f"{'open loop at half rate':<24} {'tool':<7} {'offered':>8} {'done/s':>8} "
                f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
            )
            for t in targets:
                row = summary[t]
                if "open_p99_ms" in row:
                    print(
                        f"{t:<24} {row['open_tool']:<7} {row['open_offered_rps']:>8.0f} "
                        f"{row['open_rps']:>8.0f} {row['open_p50_ms']:>8.3f} "
                        f"{row['open_p99_ms']:>8.3f} {row['open_errors']:>7}"
                    )
            print(
                "(vegeta / ghz: each request at its own scheduled instant, evenly spaced, timed "
                "from that instant; h2load's --rps sends what is due every 100 ms at once.)"
            )

        print()
        print(f"  {'target':<36} {'value':>7}  {'wanted':<8} {'':<5} {'CPU-normalised':>14}")

        def check(name: str, value: float, ok: bool, want: str, cpu: float | None) -> Json:
            extra = f"{cpu:>14.2f}" if cpu is not None else ""
            print(f"  {name:<36} {value:>7.2f}  {want:<8} {'met' if ok else 'MISS':<5} {extra}")
            return {"value": value, "target": want, "met": ok, "cpu_normalised": cpu}

        def ratio(a: str, b: str, lo: float, name: str) -> Json:
            """rps(a) / rps(b) against `lo`; also CPU per request of b / of a."""
            v = self.paired_ratio(a, b)
            return check(name, v, v >= lo, f">= {lo}", self.paired_cpu_ratio(a, b))

        def p99(target: str, name: str) -> Json:
            """The open-loop p99 when measured (evenly spaced arrivals), else h2load's."""
            row = summary[target]
            v = row.get("open_p99_ms") or row.get("half_p99_ms") or float("inf")
            tool = row.get("open_tool", "h2load")
            return check(
                f"{name} ({tool})", v, v <= P99_HALF_RATE_MAX_MS, f"<= {P99_HALF_RATE_MAX_MS}", None
            )

        targets_met = {
            "http_vs_noop": ratio(
                "svc http evaluation", "svc http noop", HTTP_VS_NOOP_MIN, "HTTP svc / no-op"
            ),
            "http_vs_cerbos": ratio(
                "svc http evaluation",
                "cerbos authzen",
                HTTP_VS_CERBOS_MIN,
                "HTTP svc / Cerbos AuthZEN",
            ),
            "grpc_vs_noop": ratio(
                "svc grpc Check", "svc grpc noop", GRPC_VS_NOOP_MIN, "gRPC svc / no-op"
            ),
            "grpc_vs_cerbos": ratio(
                "svc grpc Check",
                "cerbos CheckResources",
                GRPC_VS_CERBOS_MIN,
                "gRPC svc / Cerbos CheckResources",
            ),
            "http_p99_half": p99("svc http evaluation", "HTTP p99 (ms) at half the max rate"),
            "grpc_p99_half": p99("svc grpc Check", "gRPC p99 (ms) at half the max rate"),
        }
        print(
            "  (ratios: medians of per-round ratios of rates measured back to back. "
            "CPU-normalised: the same\n   ratio of server CPU time per request, which other "
            "work on the server core disturbs less.)"
        )
        before = self.results.machine["before"]["loadavg"]
        after = self.results.machine["after"]["loadavg"]
        print(
            f"load average before: {' '.join(f'{x:.2f}' for x in before)}; "
            f"after: {' '.join(f'{x:.2f}' for x in after)}"
        )
        summary["targets"] = targets_met
        self.results.summary = summary
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"load-{self.results.mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(asdict(self.results), indent=2))
        print(f"results: {out.relative_to(REPO)}")


def main() -> None:
    """Parses the options and runs the session."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round of 4 s runs (about 1 minute)")
    ap.add_argument("--duration", type=int, help="seconds per timed run (overrides the mode)")
    ap.add_argument("--rounds", type=int, help="timed runs per target (overrides the mode)")
    ap.add_argument("--connections", type=int, default=64, help="wrk connections (64)")
    ap.add_argument(
        "--streams", type=int, default=4, help="h2load streams per connection, 16 connections (4)"
    )
    ap.add_argument("--workers", type=int, default=1, help="svc pdp --workers (1)")
    ap.add_argument("--cerbos", type=Path, default=DEFAULT_CERBOS, help="the cerbos binary")
    ap.add_argument("--examples", type=Path, default=DEFAULT_EXAMPLES, help="Cedar's example apps")
    args = ap.parse_args()
    missing = [t for t in ("wrk", "h2load", "taskset", "vmstat") if shutil.which(t) is None]
    if missing or not args.cerbos.exists():
        raise SystemExit(
            f"missing: {', '.join(missing + ([] if args.cerbos.exists() else [str(args.cerbos)]))}"
            "; run `bash benches/load/setup.sh` first"
        )
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two cores: the server on core 0, the load generator on core 1")
    with tempfile.TemporaryDirectory(prefix="svc-load-") as tmp:
        Bench(args, Path(tmp)).run()


if __name__ == "__main__":
    main()
