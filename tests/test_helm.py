"""The chart (helm/svc) and the image (Containerfile), checked as CI can without a cluster.

helm comes from scripts/dev-helm.sh (built from its Go module, cached under ~/.cache), installed
on first use as tests/conftest.py does for PostgreSQL. The chart is linted (`helm lint
--strict`) and rendered (`helm template`) with its default values and with
helm/svc/ci/production-values.yaml; the rendered manifests are read back and checked against
the project's own sources of truth:

* every component of docs/architecture.md's components table that is on main has its
  Deployment, Service, ServiceAccount and NetworkPolicy, runs a real `svc` command, and
  serves its probes on 8080 (`/healthz`, `/readyz`);
* no container can run as root, escalate or keep a capability;
* every Secret a pod reads is rendered by the chart or named by the values as an existing one;
* every environment variable is one the component's settings classes read, and the classes
  accept the values (docs/architecture.md#code-layout-and-conventions);
* each NetworkPolicy admits exactly the callers docs/architecture.md's callers table lists, and
  each API's `AUTH_CALLERS` names the same service accounts (docs/auth.md, "In Kubernetes");
* the gated components (gateway, connectors, reporter, reasoner, portal) are off by default and
  admit only their own callers; the reporter, scraping every component, may reach nothing but
  the release's pods, DNS and the vendor portal;
* a wrong value fails `helm template` through values.schema.json.

The Containerfile is read, not built (no container engine here): its stages, its non-root
user and its entry point.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml
from pydantic_settings import BaseSettings

from svc import registry
from svc.cli import app as svc_app
from svc.common.roles import roles_of

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "svc"
PRODUCTION = CHART / "ci" / "production-values.yaml"
RELEASE = "prod"
NAMESPACE = "security"

#: The components the chart runs (the component registry, svc.registry: those with a
#: Deployment of their own) and the settings classes that read each one's environment.
SETTINGS: dict[str, tuple[type[BaseSettings], ...]] = {
    r.name: r.settings for r in registry.components(demo=False) if r.chart
}
#: Components whose Deployment is gated by `<name>.enabled`, off by default.
GATED = ("gateway", "connectors", "reporter", "reasoner", "portal")
#: Components the chart has a template for ahead of their registration: each stays planned
#: (off by default, its settings classes read from `svc.<name>.settings`) until the registry
#: lists it, and is then checked like any registered component.
UPCOMING = ("reasoner", "portal")
PLANNED = {c for c in UPCOMING if c not in SETTINGS}
#: Components that run as exactly one replica, replaced (`Recreate`) rather than rolled: two
#: at once would share a state file (the connectors) or a cycle (the reasoner's lease).
SINGLE = ("connectors", "reasoner")


# --- helm --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary of scripts/dev-helm.sh, built on first use (fails, never skips)."""
    script = REPO / "scripts" / "dev-helm.sh"
    done = subprocess.run(
        [str(script), "install"], capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/dev-helm.sh install failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs helm with `args` (HOME-independent: its own config and cache dirs are unused)."""
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )


def _render(helm: str, *args: str) -> list[dict[str, Any]]:
    """The manifests `helm template` renders for release `prod` in `security`, plus `args`."""
    done = _helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _values(*files: Path) -> dict[str, Any]:
    """The chart's values.yaml overlaid with `files` (deep merge, as helm does)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    for f in files:
        values = merge(values, yaml.safe_load(f.read_text()))
    return values


#: The two renders every check runs on: (name, helm args, values).
CASES = {
    "default": ((), _values()),
    "production": (("-f", str(PRODUCTION)), _values(PRODUCTION)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def rendered(request: pytest.FixtureRequest, helm: str) -> tuple[list[dict[str, Any]], dict]:
    """(manifests, values) of one case of `CASES`."""
    args, values = CASES[request.param]
    return _render(helm, *args), values


def _name(component: str) -> str:
    """A component's resource name for the release `prod` (helm/svc/templates/_helpers.tpl)."""
    return f"{RELEASE}-svc-{component}"


def _subject(component: str) -> str:
    """A component's caller subject (docs/auth.md, "In Kubernetes")."""
    return f"system:serviceaccount:{NAMESPACE}:{_name(component)}"


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _pods(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every Deployment and Job."""
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def _component(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["labels"]["app.kubernetes.io/component"])


def _enabled(values: dict[str, Any]) -> list[str]:
    return [
        *(c for c in SETTINGS if c not in GATED),
        *(c for c in GATED if values[c]["enabled"]),
    ]


def test_the_chart_runs_the_registered_components() -> None:
    """The chart's component templates (`{{- $c := "<name>" -}}`) are the registry's
    components that have a Deployment, and the slots of planned ones, nothing else."""
    declared = {
        m.group(1)
        for path in (CHART / "templates").glob("*.yaml")
        for m in re.finditer(r'\$c := "([a-z-]+)"', path.read_text(encoding="utf-8"))
    }
    assert PLANNED <= set(GATED), "a planned component's Deployment must be off by default"
    assert declared == set(SETTINGS) | PLANNED


# --- lint and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_strict(helm: str, case: str) -> None:
    """`helm lint --strict` passes with the default and the production-like values."""
    done = _helm(helm, "lint", "--strict", str(CHART), *CASES[case][0])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("pdp.replicas=two", "at '/pdp/replicas': got string, want integer"),
        ("pdp.replica=2", "additional properties 'replica' not allowed"),
        ("pdp.logDurability=sometimes", "/pdp/logDurability"),
        ("securityContext.runAsNonRoot=false", "/securityContext/runAsNonRoot"),
        ("analytics.retentionDays=-1", "/analytics/retentionDays"),
        ("pdp.clients[0].ipBlock=10.0.0.0/8,pdp.clients[0].serviceAccount=x", "/pdp/clients/0"),
        ("portal.publicUrl=http://svc.example.com", "/portal/publicUrl"),
        ("reporter.installId=install-1", "/reporter/installId"),
        ("reporter.portal.url=portal.vendor.example", "/reporter/portal/url"),
        ("connectors.persistence.enabled=yes", "/connectors/persistence/enabled"),
    ],
)
def test_a_wrong_value_fails_through_the_schema(helm: str, setting: str, message: str) -> None:
    """values.schema.json refuses a wrong type, an unknown key or a value out of its range."""
    set_flag = "--set-string" if "=two" in setting or "=sometimes" in setting else "--set"
    done = _helm(helm, "template", RELEASE, str(CHART), set_flag, setting)
    assert done.returncode != 0
    assert "don't meet the specifications of the schema" in done.stderr
    assert message in done.stderr, done.stderr


def test_schema_is_draft_7_and_defaults_are_valid() -> None:
    """The schema is JSON Schema draft 7 (what helm validates with) and the defaults meet it."""
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    for _, values in CASES.values():
        jsonschema.Draft7Validator(schema).validate(values)


# --- components, commands, probes --------------------------------------------------------------


def _resolves(args: list[str]) -> bool:
    """Whether `svc <args>` names a command of the `svc` CLI (svc.cli): each word a
    subcommand of the one before, ending on a command (or a group that runs without one)."""
    cmd: Any = typer.main.get_command(svc_app)
    for arg in args:
        if arg.startswith("-"):
            break
        sub = getattr(cmd, "commands", {}).get(arg)
        if sub is None:
            return False
        cmd = sub
    return not hasattr(cmd, "commands") or bool(cmd.invoke_without_command)


def _options_envvars(args: list[str]) -> set[str]:
    """The environment variables of the options of `svc <args>`."""
    cmd: Any = typer.main.get_command(svc_app)
    for arg in args:
        if arg.startswith("-"):
            break
        cmd = cmd.commands[arg]
    return {p.envvar for p in cmd.params if isinstance(getattr(p, "envvar", None), str)}


def test_every_component_is_present_and_runs_a_real_command(
    rendered: tuple[list[dict[str, Any]], dict],
) -> None:
    """Each enabled component has a Deployment, Service (8080), ServiceAccount and
    NetworkPolicy; each container and job runs an existing `svc` command (the gated ones only
    once they are on main); the decision point autoscales; the connectors and the reasoner
    are one replica, replaced (`Recreate`)."""
    docs, values = rendered
    deployments = _by_kind(docs, "Deployment")
    for c in _enabled(values):
        for kind in ("Deployment", "Service", "ServiceAccount", "NetworkPolicy"):
            assert _name(c) in _by_kind(docs, kind), (kind, c)
        service = _by_kind(docs, "Service")[_name(c)]
        assert [p["port"] for p in service["spec"]["ports"]] == [8080]
        assert deployments[_name(c)]["spec"]["template"]["spec"]["serviceAccountName"] == _name(c)
    assert {_component(d) for d in deployments.values()} == set(_enabled(values))
    for name, pod in _pods(docs):
        for container in pod["containers"]:
            args = container["args"]
            if args[0] in GATED and not _resolves(args):
                assert not CASES["default"][1][args[0]]["enabled"], f"{args[0]} on by default"
                continue
            assert _resolves(args), f"{name}: `svc {' '.join(args)}` is not a svc command"
    assert deployments[_name("history")]["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "history",
        "load",
    ]
    hpa = _by_kind(docs, "HorizontalPodAutoscaler")[_name("pdp")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == _name("pdp")
    assert hpa["spec"]["minReplicas"] >= 2
    assert "replicas" not in deployments[_name("pdp")]["spec"]  # the autoscaler owns them
    for c in SINGLE:
        if values[c]["enabled"]:
            spec = deployments[_name(c)]["spec"]
            assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate", c


def test_schema_jobs_run_before_each_release(rendered: tuple[list[dict[str, Any]], dict]) -> None:
    """`svc history migrate` and `svc policy|context|challenge migrate` are pre-install and
    pre-upgrade hooks, after the hook-made service account and Secrets they need."""
    docs, _ = rendered
    jobs = _by_kind(docs, "Job")
    expected = {
        _name(f"{c}-migrate"): [c, "migrate"] for c in ("history", "policy", "context", "challenge")
    }
    for name, args in expected.items():
        job = jobs[name]
        notes = job["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert int(notes["helm.sh/hook-weight"]) == 0
        pod = job["spec"]["template"]["spec"]
        assert pod["containers"][0]["args"] == args
        account = _by_kind(docs, "ServiceAccount")[pod["serviceAccountName"]]
        assert int(account["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    for secret in _by_kind(docs, "Secret").values():
        read_by_jobs = any(
            ref["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
            for job in jobs.values()
            for ref in job["spec"]["template"]["spec"]["containers"][0]["env"]
        )
        if read_by_jobs:
            assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0


def test_demo_job_is_optional(helm: str) -> None:
    """`demo.enabled` adds the `svc demo` Job after install and upgrade; off, there is none."""
    assert _name("demo") not in _by_kind(_render(helm), "Job")
    job = _by_kind(_render(helm, "--set", "demo.enabled=true"), "Job")[_name("demo")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "demo" and _resolves(container["args"])


def test_probes_on_every_container(rendered: tuple[list[dict[str, Any]], dict]) -> None:
    """Liveness on /healthz and readiness on /readyz, on the one port 8080."""
    docs, _ = rendered
    for d in _by_kind(docs, "Deployment").values():
        for container in d["spec"]["template"]["spec"]["containers"]:
            assert container["ports"] == [
                {"name": "http", "containerPort": 8080, "protocol": "TCP"}
            ]
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_no_container_runs_as_root(rendered: tuple[list[dict[str, Any]], dict]) -> None:
    """Every pod runs as a non-root user; no container escalates, keeps a capability or writes
    its root filesystem; no pod mounts the API server token it does not need."""
    docs, _ = rendered
    for name, pod in _pods(docs):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc.get("runAsUser", 1) != 0 and sc.get("privileged", False) is False


# --- Secrets -----------------------------------------------------------------------------------


def _existing_secrets(values: Any) -> set[str]:
    """Every non-empty `existingSecret` the values name, and the image pull Secrets."""
    found: set[str] = set()
    if isinstance(values, dict):
        for k, v in values.items():
            if k == "existingSecret" and v:
                found.add(v)
            found |= _existing_secrets(v)
        found |= {s["name"] for s in values.get("imagePullSecrets") or []}
    elif isinstance(values, list):
        for v in values:
            found |= _existing_secrets(v)
    return found


def test_every_secret_referenced_exists(rendered: tuple[list[dict[str, Any]], dict]) -> None:
    """A Secret a pod reads (env, volume, pull secret) is rendered or named by the values."""
    docs, values = rendered
    declared = set(_by_kind(docs, "Secret")) | _existing_secrets(values)
    referenced: set[str] = set()
    for _, pod in _pods(docs):
        referenced |= {s["name"] for s in pod.get("imagePullSecrets", [])}
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                referenced.add(volume["secret"]["secretName"])
        for container in pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.add(ref["name"])
    assert referenced, "no Secret referenced at all"
    assert referenced <= declared, referenced - declared
    for secret in _by_kind(docs, "Secret").values():
        keys = {**secret.get("data", {}), **secret.get("stringData", {})}
        assert keys and all(v not in ("", None) for v in keys.values()), secret["metadata"]


# --- settings ----------------------------------------------------------------------------------


def _env_names(cls: type[BaseSettings]) -> set[str]:
    """The environment variables a settings class reads: its prefix plus each field, or the
    field's own alias choices (SVC_KAFKA_URL, SVC_ANALYTICS_RETENTION_DAYS)."""
    from pydantic import AliasChoices

    names: set[str] = set()
    prefix = str(cls.model_config.get("env_prefix", ""))
    for field, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {str(a).upper() for a in alias.choices if isinstance(a, str)}
        names.add(f"{prefix}{field}".upper())
    return names


#: Stand-ins for values the pods read from Secrets, by variable name (what the Secret holds).
SECRET_STANDINS = {
    "SVC_KAFKA_URL": "kafka://kafka-0:9092,kafka-1:9092",
    "SVC_HISTORY_DSN": "https://svc:password@clickhouse.example.com:8443/svc_history",
    "SVC_POLICY_HISTORY_DSN": "https://svc:password@clickhouse.example.com:8443/svc_history",
    "SVC_POLICY_DATABASE_URL": "postgresql+psycopg://svc:password@pg:5432/svc_policy",
    "SVC_CONTEXT_DATABASE_URL": "postgresql+psycopg://svc:password@pg:5432/svc_context",
    "SVC_CHALLENGE_DATABASE_URL": "postgresql+psycopg://svc:password@pg:5432/svc_challenge",
    "SVC_POLICY_BREAK_GLASS_KEYS": "{}",
    "SVC_CONTEXT_SCIM_TOKEN": "s" * 40,
    "SVC_CHALLENGE_WEBHOOK_URL": "https://chat.example.com/hooks/T0",
    "SVC_REASONER_HISTORY_DSN": "https://svc:password@clickhouse.example.com:8443/svc_history",
    "SVC_REASONER_LEASE_URL": "postgresql+psycopg://svc:password@pg:5432/svc_context",
    "SVC_REPORTER_INSTALL_ID": "0b6a4c1e-8d2f-4a53-9e1b-2f1c3d4e5f60",
}


def _container_env(container: dict[str, Any], files: Path) -> dict[str, str]:
    """The container's environment as the process would see it: literal values, Secret
    stand-ins, and each mounted-secret file (SVC_INTAKE_TOKEN_FILE) as a real file."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = SECRET_STANDINS[e["name"]]
    if "SVC_INTAKE_TOKEN_FILE" in env:
        token = files / "intake-token"
        token.write_text("t" * 40)
        env["SVC_INTAKE_TOKEN_FILE"] = str(token)
    return env


def _landed_settings(component: str) -> tuple[type[BaseSettings], ...] | None:
    """The settings class of a gated component once it is on main (`svc.gateway.settings`'s
    GatewaySettings), else None."""
    try:
        module = importlib.import_module(f"svc.{component}.settings")
    except ImportError:
        return None
    cls = getattr(module, f"{component.capitalize()}Settings", None)
    return (cls,) if cls is not None else None


def test_every_env_var_is_a_setting_the_component_reads(
    rendered: tuple[list[dict[str, Any]], dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each SVC_* variable of a component is one of its settings classes' (unknown ones would
    be ignored silently), and the classes accept the rendered values as they stand."""
    docs, _ = rendered
    for d in _by_kind(docs, "Deployment").values():
        component = _component(d)
        container = d["spec"]["template"]["spec"]["containers"][0]
        classes = SETTINGS.get(component)
        if classes is None:  # planned: their settings classes are on main before them
            classes = _landed_settings(component)
        if classes is None:
            prefix = f"SVC_{component.upper()}_"
            assert all(e["name"].startswith(prefix) for e in container["env"]), component
            continue
        known = set().union(*(_env_names(cls) for cls in classes))
        names = {e["name"] for e in container["env"]}
        assert names <= known, (component, names - known)
        for name, value in _container_env(container, tmp_path).items():
            monkeypatch.setenv(name, value)
        for cls in classes:
            cls()  # raises pydantic.ValidationError on a value the class refuses
        for name in names:
            monkeypatch.delenv(name)
    for _, pod in _pods(docs):
        for container in pod["containers"]:
            if container["args"][0] == "demo":
                names = {e["name"] for e in container["env"]}
                assert names <= _options_envvars(container["args"]), names


# --- callers: NetworkPolicies and AUTH_CALLERS against docs/architecture.md --------------------


#: The role a client of each API's values gets unless it names one (docs/auth.md).
CLIENT_ROLE = {
    "pdp": "app",
    "history": "portal",
    "policy": "operator",
    "context": "connectors",
    "challenge": "operator",
}

#: docs/architecture.md's callers table: the API column to the chart's component.
APIS = {
    "decision point": "pdp",
    "history": "history",
    "intake": "intake",
    "policy service": "policy",
    "context service": "context",
    "challenge service": "challenge",
}

#: Each caller the table names, per API: what admits it, each a component of the chart
#: ("component:<name>", when enabled) or the values list callers outside the chart are named
#: in (the connectors and the portal are both: the chart's own, and any run elsewhere); empty
#: for words that say how, not who.
CALLERS: dict[str, dict[str, tuple[str, ...]]] = {
    "pdp": {
        "enforcement points": ("pdp.clients",),
        "the gateway": ("component:gateway",),
        "the portal": ("component:portal", "pdp.clients"),
        "the challenge service": ("component:challenge",),
    },
    "history": {
        "the portal": ("component:portal", "history.clients"),
        "the reasoner": ("component:reasoner",),
        "the policy service": ("component:policy",),
    },
    "intake": {
        "log shippers": ("intake.clients",),
        "apps": ("intake.clients",),
        "the gateway": ("component:gateway",),
        "the portal's MCP endpoint": ("component:portal", "intake.clients"),
        "with the intake's own token": (),
    },
    "policy": {
        "decision points": ("component:pdp",),
        "gateways": ("component:gateway",),
        "the reasoner": ("component:reasoner",),
        "the portal": ("component:portal", "policy.clients"),
        "the admin CLI": ("policy.clients",),
    },
    "context": {
        "the identity provider": ("context.scim.clients",),
        "connectors": ("component:connectors", "context.clients"),
        "decision points": ("component:pdp",),
        "the reasoner": ("component:reasoner",),
        "the policy service": ("component:policy",),
        "the portal": ("component:portal", "context.clients"),
        "the challenge service": ("component:challenge",),
        "the gateway": ("component:gateway",),
    },
    "challenge": {
        "decision points": ("component:pdp",),
        "the gateway": ("component:gateway",),
        "the reasoner": ("component:reasoner",),
        "the portal": ("component:portal", "challenge.page.clients"),
        "the person through a signed, single-use link plus sign-in": ("challenge.page.clients",),
    },
}


def _callers_table() -> dict[str, list[str]]:
    """docs/architecture.md's "API | Callers" table: chart component to the callers it names.

    Parentheticals are dropped; each known phrase must be there, and nothing but separators
    may be left once they are taken out (so a caller added to the table fails until the chart
    and `CALLERS` follow it).
    """
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Callers and authentication", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    table: dict[str, list[str]] = {}
    for row in rows[1:]:
        api, callers = (cell.strip() for cell in row.strip("|").split("|")[:2])
        component = APIS[re.sub(r"\s*\(.*", "", api)]
        plain = re.sub(r"\s*\([^)]*\)", "", callers)
        found = [p for p in sorted(CALLERS[component], key=len, reverse=True) if p in plain]
        rest = plain
        for phrase in found:
            rest = rest.replace(phrase, "")
        assert not re.sub(r"[,;\s]|\band\b", "", rest), f"{api}: unmapped callers in `{rest}`"
        table[component] = found
    assert set(table) == set(APIS.values())
    return table


def _lookup(values: dict[str, Any], path: str) -> list[dict[str, Any]]:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return list(node)


def _peer_key(peer: dict[str, Any]) -> str:
    """A NetworkPolicy peer as comparable text."""
    return json.dumps(peer, sort_keys=True)


def _client_peer(client: dict[str, Any]) -> dict[str, Any]:
    """The peer a values client becomes (helm/svc/templates/_helpers.tpl, svc.clientPeers)."""
    if "ipBlock" in client:
        return {"ipBlock": {"cidr": client["ipBlock"]}}
    peer: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": client["namespace"]}}
    }
    if client.get("podLabels"):
        peer["podSelector"] = {"matchLabels": client["podLabels"]}
    return peer


def _component_peer(component: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "svc",
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": component,
            }
        }
    }


def _reporter_peer(enabled: set[str] | list[str]) -> list[dict[str, Any]]:
    """The reporter, among the metrics scrapers of every other component when it is enabled
    (it reads their `/version`, `/readyz` and `/metrics`; docs/reporter.md)."""
    return [_component_peer("reporter")] if "reporter" in enabled else []


def test_network_policies_admit_exactly_the_callers_table(
    rendered: tuple[list[dict[str, Any]], dict],
) -> None:
    """Each API's NetworkPolicy admits, on 8080 only, the chart's components the callers table
    names (those enabled), the values' clients for the callers outside the chart, and the
    metrics scrapers; its AUTH_CALLERS are the same components' and clients' service
    accounts."""
    docs, values = rendered
    enabled = set(_enabled(values))
    policies = _by_kind(docs, "NetworkPolicy")
    deployments = _by_kind(docs, "Deployment")
    for component, callers in _callers_table().items():
        targets = [target for c in callers for target in CALLERS[component][c]]
        in_chart = {t.split(":", 1)[1] for t in targets if t and t.startswith("component:")}
        lists = sorted({t for t in targets if t and not t.startswith("component:")})
        clients = [c for path in lists for c in _lookup(values, path)]
        expected = [_component_peer(c) for c in sorted(in_chart & enabled)]
        expected += [_client_peer(c) for c in clients + values["metrics"]["from"]]
        expected += _reporter_peer(enabled)
        spec = policies[_name(component)]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["podSelector"] == {
            "matchLabels": _component_peer(component)["podSelector"]["matchLabels"]
        }
        if not expected:  # nobody may call: no rule at all (a rule without `from` admits all)
            assert spec["ingress"] == []
        else:
            (rule,) = spec["ingress"]
            assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
            assert sorted(map(_peer_key, rule["from"])) == sorted(map(_peer_key, expected))
        env = {
            e["name"]: e.get("value")
            for e in deployments[_name(component)]["spec"]["template"]["spec"]["containers"][0][
                "env"
            ]
        }
        auth = f"SVC_{component.upper()}_AUTH_ROLES"
        if component == "intake":  # its own token, not service accounts (docs/auth.md)
            assert not any(name.startswith("SVC_INTAKE_AUTH") for name in env)
            continue
        # Each component's service account has its own role; only roles the API's methods
        # admit are listed (the policy service and the reasoner read ClickHouse, not the
        # history's routes), and the history always lists the portal's account.
        may = roles_of(component)
        expected_roles = {_subject(c): c for c in in_chart & enabled if c in may}
        if component == "history":
            expected_roles[_subject("portal")] = "portal"
        expected_roles |= {
            f"system:serviceaccount:{c['namespace']}:{c['serviceAccount']}": c.get(
                "role", CLIENT_ROLE[component]
            )
            for c in clients
            if c.get("serviceAccount")
        }
        assert json.loads(env[auth]) == expected_roles
        assert env[f"SVC_{component.upper()}_AUTH"] == "jwt"


def test_registered_callers_are_admitted(rendered: tuple[list[dict[str, Any]], dict]) -> None:
    """Each role a registration admits (`Registration.callers`) that is a component of the
    chart, when enabled, is among its API's AUTH_CALLERS and NetworkPolicy peers: what
    `svc up` lets one component call, the chart lets it call too."""
    docs, values = rendered
    enabled = set(_enabled(values))
    deployments = _by_kind(docs, "Deployment")
    policies = _by_kind(docs, "NetworkPolicy")
    for r in registry.components(demo=False):
        if not r.chart or not r.audience or _name(r.name) not in deployments:
            continue
        if r.name == "reasoner" and not set(r.callers) & enabled:
            # Its only caller is the operator under svc up (svc reasoner cycle --data-dir);
            # the chart's reasoner has no caller and serves the probes only.
            continue
        container = deployments[_name(r.name)]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        listed = json.loads(env[f"SVC_{r.name.upper()}_AUTH_ROLES"])
        (rule,) = policies[_name(r.name)]["spec"]["ingress"]
        peers = set(map(_peer_key, rule["from"]))
        for role in set(r.callers) & enabled:
            assert listed.get(_subject(role)) == role, (r.name, role)
            assert _peer_key(_component_peer(role)) in peers, (r.name, role)


def test_gated_components_admit_only_their_own_callers(helm: str) -> None:
    """The gateway admits the agents its values name and the portal the clients its values
    name (people through the ingress controller, trusted apps); the reasoner, the connectors
    and the reporter (health and metrics only) admit nobody but the metrics scrapers, and the
    reporter (scraping the others); with none listed, no ingress at all (a rule without `from`
    would admit everyone)."""
    gated = ",".join(f"{c}.enabled=true" for c in GATED if c != "reporter")
    docs = _render(helm, "--set", f"{gated},portal.publicUrl=https://portal.example.com")
    policies = _by_kind(docs, "NetworkPolicy")
    for c in GATED:
        if c != "reporter":
            assert policies[_name(c)]["spec"]["ingress"] == [], c
    docs = _render(helm, "-f", str(PRODUCTION))
    policies = _by_kind(docs, "NetworkPolicy")
    values = _values(PRODUCTION)
    scrapers = values["metrics"]["from"]
    own = {"gateway": values["gateway"]["clients"], "portal": values["portal"]["clients"]}
    for c in GATED:
        (rule,) = policies[_name(c)]["spec"]["ingress"]
        expected = [_client_peer(p) for p in own.get(c, []) + scrapers]
        expected += _reporter_peer(_enabled(values)) if c != "reporter" else []
        assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}], c
        assert sorted(map(_peer_key, rule["from"])) == sorted(map(_peer_key, expected)), c


def test_gated_components_refuse_what_they_cannot_run_with(helm: str) -> None:
    """The portal needs its https address; the connectors need the Secret their credentials'
    keys are in; either missing fails `helm template` with the value to set."""
    done = _helm(helm, "template", RELEASE, str(CHART), "--set", "portal.enabled=true")
    assert done.returncode != 0 and "portal.publicUrl" in done.stderr, done.stderr
    jira = "connectors.jira.url=https://example.atlassian.net,connectors.jira.apiTokenKey=jira"
    done = _helm(helm, "template", RELEASE, str(CHART), "--set", f"connectors.enabled=true,{jira}")
    assert done.returncode != 0, done.stdout
    assert "connectors.credentials.existingSecret" in done.stderr, done.stderr


def test_the_connectors_state_is_a_claim_or_an_empty_dir(helm: str) -> None:
    """The connectors' state file is on their PersistentVolumeClaim (ReadWriteOnce, the size
    of the values), or on an emptyDir with `connectors.persistence.enabled: false`; the
    credentials Secret's named keys become the files the settings point at."""
    claim = _name("connectors-state")
    values = _values(PRODUCTION)["connectors"]
    docs = _render(helm, "-f", str(PRODUCTION))
    pvc = _by_kind(docs, "PersistentVolumeClaim")[claim]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == values["persistence"]["size"]
    pod = _by_kind(docs, "Deployment")[_name("connectors")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"] == {"claimName": claim}
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(env["SVC_CONNECTORS_STATE_PATH"]).parent == Path(mounts["state"])
    assert volumes["credentials"]["secret"]["secretName"] == values["credentials"]["existingSecret"]
    files = {
        i["key"]: f"{mounts['credentials']}/{i['path']}"
        for i in volumes["credentials"]["secret"]["items"]
    }
    assert files == {
        values["drive"]["serviceAccountKey"]: env["SVC_CONNECTORS_DRIVE_SERVICE_ACCOUNT_FILE"],
        values["jira"]["apiTokenKey"]: env["SVC_CONNECTORS_JIRA_API_TOKEN_FILE"],
    }
    docs = _render(helm, "--set", "connectors.enabled=true,connectors.persistence.enabled=false")
    assert not _by_kind(docs, "PersistentVolumeClaim")
    pod = _by_kind(docs, "Deployment")[_name("connectors")]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["state"] == {"name": "state", "emptyDir": {}}
    assert "credentials" not in {v["name"] for v in pod["volumes"]}


def test_the_portal_ingress_serves_its_public_host(helm: str) -> None:
    """With `portal.ingress.enabled` an Ingress sends `portal.publicUrl`'s host over TLS to the
    portal's Service; without it there is none."""
    values = _values(PRODUCTION)["portal"]
    host = urlsplit(values["publicUrl"]).hostname
    (ingress,) = _by_kind(_render(helm, "-f", str(PRODUCTION)), "Ingress").values()
    spec = ingress["spec"]
    assert spec["ingressClassName"] == values["ingress"]["className"]
    assert spec["tls"] == [{"hosts": [host], "secretName": values["ingress"]["tlsSecret"]}]
    (rule,) = spec["rules"]
    assert rule["host"] == host
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": _name("portal"), "port": {"name": "http"}}
    docs = _render(helm, "--set", "portal.enabled=true,portal.publicUrl=https://svc.example.com")
    assert not _by_kind(docs, "Ingress")


def test_apis_without_caller_tokens_take_no_auth_settings(
    rendered: tuple[list[dict[str, Any]], dict],
) -> None:
    """The connectors, the reporter and the reasoner serve probes only, and the portal checks
    the trusted apps' own tokens and people's sessions (docs/portal.md): none of them lists
    service-account callers, and no API lists one of them but the ones it calls."""
    docs, _ = rendered
    for d in _by_kind(docs, "Deployment").values():
        c = _component(d)
        if c in ("connectors", "reporter", "reasoner", "portal"):
            env = d["spec"]["template"]["spec"]["containers"][0]["env"]
            assert not [e for e in env if e["name"].startswith(f"SVC_{c.upper()}_AUTH")], c
    calls = {
        "connectors": {"context"},
        "reasoner": {"context", "challenge", "policy"},
        "portal": {"pdp", "history", "policy", "context", "challenge"},
        "reporter": set(),
    }
    deployments = _by_kind(docs, "Deployment")
    for api, d in deployments.items():
        env = {
            e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        listed = set(json.loads(env.get(f"SVC_{_component(d).upper()}_AUTH_ROLES") or "{}"))
        for caller, callees in calls.items():
            if _name(caller) in deployments:
                assert (_subject(caller) in listed) == (_component(d) in callees), (api, caller)


def test_the_reporter_watches_every_component_and_sends_only_where_told(
    rendered: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    """The reporter reads every other enabled component at its Service on 8080; it may reach
    those, DNS and (when a portal URL is set) the portal's port, and nothing else; without a
    portal URL it is given none (docs/reporter.md: nothing is sent)."""
    docs, values = rendered
    if not values["reporter"]["enabled"]:
        assert _name("reporter") not in _by_kind(docs, "Deployment")
        return
    container = _by_kind(docs, "Deployment")[_name("reporter")]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e for e in container["env"]}
    watched = json.loads(env["SVC_REPORTER_COMPONENTS"]["value"])
    assert watched == {c: f"http://{_name(c)}:8080" for c in _enabled(values) if c != "reporter"}
    url = values["reporter"]["portal"]["url"]
    assert env.get("SVC_REPORTER_PORTAL_URL", {}).get("value") == (url or None)
    spec = _by_kind(docs, "NetworkPolicy")[_name("reporter")]["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    release = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "svc", "app.kubernetes.io/instance": RELEASE}
        }
    }
    egress = spec["egress"]
    assert {"to": [release], "ports": [{"port": 8080, "protocol": "TCP"}]} in egress
    assert {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]} in egress
    rest = [r for r in egress if r.get("to") != [release] and r["ports"][0]["port"] != 53]
    if not url:
        assert rest == []
    else:
        (rule,) = rest
        port = urlsplit(url).port or (443 if url.startswith("https://") else 80)
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        to = [_client_peer(p) for p in values["reporter"]["portal"]["to"]]
        assert rule.get("to", []) == to


def test_outgoing_tokens_carry_the_callee_audience(
    rendered: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    """A component that calls another sends a projected token whose audience is the callee
    (docs/auth.md: svc-pdp, svc-policy, ...); each *_TOKEN_FILE names such a token file."""
    docs, _ = rendered
    for d in _by_kind(docs, "Deployment").values():
        pod = d["spec"]["template"]["spec"]
        tokens = [v for v in pod["volumes"] if v["name"] == "tokens"]
        sources = tokens[0]["projected"]["sources"] if tokens else []
        audiences = {
            s["serviceAccountToken"]["audience"] for s in sources if "serviceAccountToken" in s
        }
        for s in sources:
            if "serviceAccountToken" in s:
                assert (
                    s["serviceAccountToken"]["path"]
                    == f"{s['serviceAccountToken']['audience']}.token"
                )
        for e in pod["containers"][0]["env"]:
            value = e.get("value") or ""
            if e["name"].endswith("_TOKEN_FILE") and value.startswith("/var/run/svc/tokens/"):
                assert Path(value).stem in audiences, (e["name"], audiences)


# --- the Containerfile -------------------------------------------------------------------------


def test_containerfile_stages_user_and_entrypoint() -> None:
    """A builder stage makes the wheel with maturin; the runtime stage is python:3.11-slim,
    installs that wheel, runs as a numeric non-root user and starts `svc`."""
    text = (REPO / "Containerfile").read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    stages: list[list[str]] = []
    for ln in lines:
        if ln.upper().startswith("FROM "):
            stages.append([ln])
        elif stages:
            stages[-1].append(ln)
    assert len(stages) >= 2
    builder, runtime = stages[0], stages[-1]
    assert re.match(r"FROM \S+ AS build", builder[0], re.IGNORECASE)
    assert any("maturin build" in ln and "--release" in ln for ln in builder)
    assert re.match(r"FROM python:3\.11(\.\d+)?-slim", runtime[0], re.IGNORECASE)
    assert any(ln.startswith("COPY --from=build") for ln in runtime)
    assert any("pip install" in ln and ".whl" in ln for ln in runtime)
    users = [ln.split()[1] for ln in runtime if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    assert users[-1].split(":")[0] == str(_values()["podSecurityContext"]["runAsUser"])
    (entry,) = [ln for ln in runtime if ln.upper().startswith("ENTRYPOINT")]
    assert json.loads(entry.split(None, 1)[1]) == ["svc"]
    assert "EXPOSE 8080" in runtime
    ignore = (REPO / ".containerignore").read_text().split()
    assert {"target", ".venv", "*.so"} <= set(ignore)


def test_dev_helm_pins_a_version() -> None:
    """scripts/dev-helm.sh pins helm v3 (the Go module helm.sh/helm/v3) and caches under ~/.cache."""
    script = (REPO / "scripts" / "dev-helm.sh").read_text()
    version = re.search(r"^VERSION=(v3\.\d+\.\d+)$", script, re.MULTILINE)
    assert version is not None
    assert "helm.sh/helm/v3/cmd/helm@$VERSION" in script
    assert "$HOME/.cache" in script or "${HOME:-/tmp}/.cache" in script
    assert os.access(REPO / "scripts" / "dev-helm.sh", os.X_OK)
