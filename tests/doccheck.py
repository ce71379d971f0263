"""Runs the examples of a Markdown page (README.md, docs/*.md) against the real product.

A block is checked when the line before its opening fence is ``<!-- doc-check -->`` (the README
says ``<!-- readme-check -->``), optionally with options: ``<!-- doc-check: exit=2 fresh -->``.

* ```` ```console ```` (or ```` ```sh ````) blocks: each ``$ `` line, with the lines that
  continue it (a trailing ``\\``, an open quote, a ``for ... do`` not closed yet: what ``bash -n``
  calls unfinished), is run with bash from the repository's root; the lines after it, up to the
  next ``$ ``, are its output (standard output and standard error, as a terminal shows them).
  Variables a command sets (``T=$(...)``) are kept for the block's next commands. A command ending
  in `` &`` with ``--port 808N`` is a server the rest of its block talks to: it is started on a
  free port (``808N`` in that block's commands is replaced by it), must accept connections before
  the next command runs, and is stopped (SIGTERM, exit code 0) when the block ends.
  A command's exit code is its last pipeline's, as in a terminal. ``$ make TARGET`` is
  followed by make's output: the build is not run (a release build takes minutes); the
  recipe's last command, the ``.venv/bin/svc ...`` line make printed, is run and the lines
  after it are its output.
* ```` ```python ```` blocks: run with this interpreter; the ```` ```text ```` block right after
  is the output.
* Options: ``exit=N``: the commands exit with N (default 0). ``fresh``: they run on a new, empty
  data directory instead of the install's. ``banner``: the block is the start of ``svc up`` (make
  or build output first, not run); its lines from ``svc up: ready`` to ``Ctrl-C stops`` are what
  the install printed. ``stop``: the block is what Ctrl-C prints; the install is stopped (SIGINT,
  exit code 0) and the block is the end of its standard error.

An output is compared as a sequence of JSON documents (their layout does not matter) and text
lines, with the values that differ on every run masked: ids, times and latencies (in JSON and in
text), the time ``svc up`` took to start, the demo's progress counts. A ``...`` line stands for
any number of lines. The page's ports 8080-8088 (outside a block's own server), the default data
directory and ``$TOKEN`` (a caller token, docs/auth.md) are the test install's; an ``svc up`` or
``svc demo`` without ``--port`` gets the install's port.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from svc.up import PORT_COUNT
from uphelp import Up, free_base_port

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- (?:readme|doc)-check(?::\s*(?P<options>.*?))?\s*-->$")
VOLATILE = {
    "qid",
    "decision_qid",
    "at",
    "received_at",
    "ingest_id",
    "latency_us",
    "challenge_qid",
    "plan_qid",
    # The gateway's blocked calls and challenge waits (docs/gateway.md).
    "svc/decision_qid",
    "svc/challenge_qid",
    "svc/challenge_wait",
    "expires_at",
    "grant_expires_at",
    # Raised by every write to the entity store: under svc up that includes the directory's
    # changes and each resource fetched on a miss, so it depends on what ran before.
    "principals_version",
}
_VOLATILE_TEXT = re.compile(r'"(' + "|".join(sorted(VOLATILE)) + r')": ?("[^"]*"|[0-9.]+)')
_TEXT_MASKS = [
    (_VOLATILE_TEXT, r'"\1": <varies>'),
    (re.compile(r"ready in [0-9.]+ s"), "ready in <n> s"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"), "<time>"),
    (re.compile(r"^demo: [0-9,]+ checks, [0-9,]+ plans, [0-9,]+ events$"), "demo: <progress>"),
]
# svc up's ports, 8080 to 8080 + PORT_COUNT - 1 (svc.up): the group is the offset's digits.
_PORT = re.compile(r"(localhost|127\.0\.0\.1):80(8[0-9]|9[0-9])\b")
_OUTPUT_PORT = re.compile(r"\b80(8[0-9]|9[0-9])\b")
_SERVER_PORT = re.compile(r"--port 808([0-8])\b")
_SVC_UP = re.compile(r"\bsvc (up|demo)\b")
_ASSIGNED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=", re.M)
_DEFAULT_DATA_DIRS = ("/root/.local/share/svc", "~/.local/share/svc")


@dataclass
class Example:
    """One command (or program, or transcript) and the output the page shows for it."""

    line: int
    kind: str  # "shell", "python", "server" (`$ ... &`), "make", "banner" or "stop"
    code: str
    expected: str
    block: int = 0  # page line of the block's first line, shared by the block's examples
    options: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The exit code the page's command has (option ``exit=N``, default 0)."""
        return int(self.options.get("exit", "0"))


def examples(text: str) -> list[Example]:
    """The checked examples of a page, in page order (see the module's doc).

    Raises:
        AssertionError: a marked block is malformed (the message names its line).

    """
    lines = text.splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if not m:
            i += 1
            continue
        options = {
            key: value
            for key, _, value in (o.partition("=") for o in (m.group("options") or "").split())
        }
        fence = lines[i + 1].strip()
        j = i + 2
        body: list[str] = []
        while lines[j].strip() != "```":
            body.append(lines[j])
            j += 1
        first = i + 3
        if "banner" in options or "stop" in options:
            kind = "banner" if "banner" in options else "stop"
            out.append(Example(first, kind, "", "\n".join(body), first, options))
        elif fence in ("```console", "```sh"):
            out += _console(body, first, options)
        elif fence == "```python":
            k = j + 1
            while not lines[k].strip():
                k += 1
            assert lines[k].strip() == "```text", f"line {k + 1}: expected ```text output"
            m_ = k + 1
            expected: list[str] = []
            while lines[m_].strip() != "```":
                expected.append(lines[m_])
                m_ += 1
            out.append(
                Example(first, "python", "\n".join(body), "\n".join(expected), first, options)
            )
            j = m_
        else:
            raise AssertionError(f"line {i + 2}: a check mark before {fence}")
        i = j + 1
    return out


def _console(body: list[str], first: int, options: dict[str, str]) -> list[Example]:
    out: list[Example] = []
    k = 0
    while k < len(body):
        assert body[k].startswith("$ "), f"line {first + k}: expected `$ command`"
        start = first + k
        cmd = [body[k][2:]]
        while not _complete("\n".join(cmd)):
            k += 1
            cmd.append(body[k])
        k += 1
        expected: list[str] = []
        while k < len(body) and not body[k].startswith("$ "):
            expected.append(body[k])
            k += 1
        code = "\n".join(cmd)
        want = "\n".join(expected)
        if code.endswith(" &") and not code.endswith("&& &"):
            assert not want.strip(), f"line {start}: output after a server"
            out.append(
                Example(start, "server", code.removesuffix("&").rstrip(), "", first, options)
            )
        elif code.startswith("make "):
            out.append(Example(start, "make", code, want, first, options))
        else:
            out.append(Example(start, "shell", code, want, first, options))
    return out


def _complete(cmd: str) -> bool:
    """Whether a shell command ends here (no trailing backslash, ``bash -n`` finds it whole)."""
    if cmd.endswith("\\"):
        return False
    return subprocess.run(["bash", "-n", "-c", cmd], capture_output=True).returncode == 0


# -- comparing outputs


def mask(value: Any) -> Any:
    """`value` (parsed JSON) with the values of ``VOLATILE`` keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: "<varies>" if k in VOLATILE else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


@dataclass(frozen=True)
class _Text:
    """One line of an output that is not (the start of) a JSON document, masked."""

    line: str


_DECODER = json.JSONDecoder()


def items(text: str) -> list[Any]:
    """An output as a list of JSON documents (masked) and ``_Text`` lines, in order.

    A JSON document may span lines and its layout does not matter; a line that does not start
    a whole JSON document (text, or JSON cut short by ``head``) is a text line, masked.
    """
    out: list[Any] = []
    pos, end = 0, len(text)
    while pos < end:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            break
        eol = text.find("\n", pos)
        eol = end if eol < 0 else eol
        if text[pos] in "{[":
            try:
                value, after = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError:
                pass
            else:
                if not text[after:].split("\n", 1)[0].strip():  # nothing after it on its line
                    out.append(mask(value))
                    pos = after
                    continue
        line = text[pos:eol].rstrip()
        for pattern, repl in _TEXT_MASKS:
            line = pattern.sub(repl, line)
        out.append(_Text(line))
        pos = eol
    return out


def _match(got: list[Any], want: list[Any]) -> bool:
    """Whether `got` matches `want`, where a ``...`` line of `want` stands for any items."""
    if not want:
        return not got
    if want[0] == _Text("..."):
        return any(_match(got[i:], want[1:]) for i in range(len(got) + 1))
    return bool(got) and got[0] == want[0] and _match(got[1:], want[1:])


def same(got: str, want: str) -> bool:
    """Whether the output `got` is what the page shows (`want`, already localised)."""
    return _match(items(got), items(want))


# -- running a page


def localise(code: str, up: Up, ports: dict[int, int] | None = None) -> str:
    """`code` with the page's port 808N replaced by `ports[N]` (a block's own server) or else by
    the test install's port N, the default data directory by the test install's, and ``--port``
    added to an ``svc up``/``svc demo`` without one."""
    own = ports or {}

    def port(m: re.Match[str]) -> str:
        n = int(m.group(2)) - 80
        if n >= PORT_COUNT:
            return m.group(0)
        return f"{m.group(1)}:{own.get(n, up.port + n)}"

    code = _PORT.sub(port, code)
    if "--port" not in code:
        code = _SVC_UP.sub(lambda m: f"{m.group(0)} --port {up.port}", code)
    for d in _DEFAULT_DATA_DIRS:
        code = code.replace(d, str(up.data_dir))
    return code


def localise_output(text: str, up: Up, data_dir: Path) -> str:
    """A page's output with port 808N replaced by the install's port N and the default data
    directory by `data_dir`."""

    def port(m: re.Match[str]) -> str:
        n = int(m.group(1)) - 80
        return str(up.port + n) if n < PORT_COUNT else m.group(0)

    text = _OUTPUT_PORT.sub(port, text)
    for d in _DEFAULT_DATA_DIRS:
        text = text.replace(d, str(data_dir))
    return text


@contextmanager
def background(ex: Example, ports: dict[int, int], env: dict[str, str]) -> Iterator[None]:
    """Runs a page's `$ ... --port 808N &` server on a free port (recorded in `ports[N]`) until
    the block ends: yields once it accepts TCP connections on 127.0.0.1; then SIGTERM, and its
    exit code must be 0. Raises AssertionError when it exits before accepting or stops badly."""
    m = _SERVER_PORT.search(ex.code)
    assert m, f"line {ex.line}: a background server needs --port 808N"
    port = free_base_port()
    ports[int(m.group(1))] = port
    code = ex.code[: m.start()] + f"--port {port}" + ex.code[m.end() :]
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {code}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"line {ex.line}: exited with {proc.returncode}: {proc.communicate()[1]}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"line {ex.line}: never listened"
                time.sleep(0.1)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, f"line {ex.line}: stopped with {proc.returncode}: {err}"


class Page:
    """Runs the checked examples of one page, in order, against a running ``svc up``.

    Args:
        path: the Markdown file.
        up: the test install the examples talk to.
        scratch: a directory for the shell state and ``fresh`` data directories.

    """

    def __init__(self, path: Path, up: Up, scratch: Path) -> None:
        self.path = path
        self.up = up
        self.scratch = scratch
        self.examples = examples(path.read_text())
        venv_bin = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
            "SVC_DATA_DIR": str(up.data_dir),
        }

    def where(self, ex: Example) -> str:
        """``docs/x.md line N``, for messages."""
        return f"{self.path.relative_to(ROOT)} line {ex.line}"

    def run(self) -> None:
        """Runs every example; raises AssertionError at the first that does not answer as
        the page shows."""
        with ExitStack() as servers:
            ports: dict[int, int] = {}
            block = -1
            state = self.scratch / "state-0.sh"
            for ex in self.examples:
                if ex.block != block:
                    servers.close()  # the previous block's servers stop with it
                    ports, block = {}, ex.block
                    state = self.scratch / f"state-{block}.sh"
                if ex.kind == "server":
                    servers.enter_context(background(ex, ports, self.env))
                elif ex.kind == "banner":
                    self.check_banner(ex)
                elif ex.kind == "stop":
                    self.check_stop(ex)
                else:
                    self.check(ex, ports, state)

    def check_banner(self, ex: Example) -> None:
        """The install's standard output up to ``Ctrl-C stops`` is the block's from
        ``svc up: ready`` on."""
        lines = ex.expected.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("svc up: ready"))
        want = localise_output("\n".join(lines[start:]), self.up, self.up.data_dir)
        got = "".join(self.up.stdout)
        assert same(got, want), f"{self.where(ex)}:\ngot  {got}\nwant {want}"

    def check_stop(self, ex: Example) -> None:
        """Ctrl-C: the install stops with 0 and its standard error ends as the block shows."""
        code, _, err = self.up.stop()
        assert code == 0, err
        want = localise_output(ex.expected.removeprefix("^C"), self.up, self.up.data_dir)
        tail = "\n".join(err.strip().splitlines()[-len(want.strip().splitlines()) :])
        assert same(tail, want), f"{self.where(ex)}:\ngot  {err}\nwant {want}"

    def check(self, ex: Example, ports: dict[int, int], state: Path) -> None:
        """Runs one command or program from the repository's root and compares its output
        (standard output and error together) with the page's."""
        data_dir = self.up.data_dir
        env = dict(self.env, TOKEN=self.up.caller_token)
        if "fresh" in ex.options:
            data_dir = self.scratch / f"fresh-{ex.line}"
            env["SVC_DATA_DIR"] = str(data_dir)
        want = ex.expected
        if ex.kind == "make":
            # make's output: the build (not run), then the recipe's `.venv/bin/svc ...` line.
            lines = want.splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/svc "))
            code, want = lines[at], "\n".join(lines[at + 1 :])
        else:
            code = ex.code
        code = localise(code, self.up, ports)
        want = localise_output(want, self.up, data_dir)
        if ex.kind == "python":
            argv = [sys.executable, "-c", code]
        else:
            keep = "".join(f"; declare -p {v} >> {state}" for v in _ASSIGNED.findall(code))
            # As a terminal runs it: a pipeline's status is its last command's (`| head` may
            # cut the one before it short).
            script = f"[ -f {state} ] && source {state}\n{code}"
            argv = ["bash", "-c", f"{script}\n__rc=$?{keep}; exit $__rc"]
        for _ in range(20):
            r = subprocess.run(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=600,
                cwd=ROOT,
                env=env,
            )
            # A read of the history (808 2) may come before the loader stored the row.
            if same(r.stdout, want) or ex.kind != "shell" or ":8082" not in ex.code:
                break
            time.sleep(0.5)
        assert r.returncode == ex.exit_code, f"{self.where(ex)}: exit {r.returncode}: {r.stdout}"
        assert same(r.stdout, want), f"{self.where(ex)}:\n{ex.code}\ngot  {r.stdout}\nwant {want}"
