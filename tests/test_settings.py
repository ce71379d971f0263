"""The settings base class (svc.common.settings) and the options made from it (svc.common.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import Field, ValidationError
from typer.testing import CliRunner

from svc.cli import app as svc_app
from svc.common.auth import HistoryAuthSettings, PdpAuthSettings
from svc.common.cli import Options, settings_command
from svc.common.settings import ComponentSettings, ServiceSettings, kafka_url_field
from svc.history.loader import HistoryStoreSettings, LoaderHealthSettings, LoaderSettings
from svc.intake.settings import IntakeSettings
from svc.pdp.log_settings import DecisionLogSettings, Durability
from svc.pdp.server import StandaloneOptions
from svc.pdp.settings import PdpSettings


class DemoSettings(ServiceSettings, component="demo-part"):
    """A component's settings as the tests declare them."""

    kafka_url: str | None = kafka_url_field(None)
    """Broker."""
    workers: int = Field(default=2, ge=1, le=8)
    """Worker threads."""
    ratio: float = 0.5
    """A ratio, ``0.5`` by default."""
    fast: bool = False
    """Go fast."""
    label: str = Field(default="x", description="A label.")
    required_thing: str
    """Has no default."""


def test_the_component_keyword_sets_the_prefix_and_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert DemoSettings.component == "svc-demo-part"
    assert DemoSettings.model_config.get("env_prefix") == "SVC_DEMO_PART_"
    assert DemoSettings.env_name("workers") == "SVC_DEMO_PART_WORKERS"
    assert DemoSettings.env_name("kafka_url") == "SVC_KAFKA_URL"
    monkeypatch.setenv("SVC_DEMO_PART_WORKERS", "3")
    monkeypatch.setenv("SVC_DEMO_PART_REQUIRED_THING", "t")
    monkeypatch.setenv("SVC_KAFKA_URL", "kafka://broker:9092")
    s = DemoSettings()
    assert (s.workers, s.required_thing, s.kafka_url) == (3, "t", "kafka://broker:9092")
    assert (s.host, s.port) == ("127.0.0.1", 8080)  # what every listening component shares
    assert DemoSettings(workers=5).workers == 5  # a keyword argument wins over the environment


def test_every_settings_class_derives_from_the_base() -> None:
    for cls, prefix in (
        (IntakeSettings, "SVC_INTAKE_"),
        (PdpSettings, "SVC_PDP_"),
        (DecisionLogSettings, "SVC_PDP_"),
        (PdpAuthSettings, "SVC_PDP_"),
        (HistoryAuthSettings, "SVC_HISTORY_"),
        (LoaderHealthSettings, "SVC_HISTORY_"),
        (LoaderSettings, "SVC_HISTORY_"),
        (HistoryStoreSettings, "SVC_HISTORY_"),
    ):
        assert issubclass(cls, ComponentSettings), cls
        assert cls.model_config.get("env_prefix") == prefix, cls
        assert cls.model_config.get("extra") == "forbid", cls
    assert PdpSettings.env_name("kafka_url") == IntakeSettings.env_name("kafka_url")
    assert LoaderSettings.env_name("retention_days") == "SVC_ANALYTICS_RETENTION_DAYS"


def test_unknown_and_bad_settings_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="nonsense"):
        DemoSettings(required_thing="t", nonsense=1)
    with pytest.raises(ValidationError, match="broker URL"):
        DemoSettings(required_thing="t", kafka_url="http://nope:1")
    monkeypatch.setenv("SVC_KAFKA_URL", "ftp://x")
    with pytest.raises(ValidationError, match="ftp"):
        PdpSettings()
    with pytest.raises(ValidationError, match="log_commit_ms"):
        DecisionLogSettings(log_commit_ms=1001)


def test_standalone_options_take_only_what_they_are_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SVC_PDP_PORT", "9999")
    monkeypatch.setenv("SVC_PDP_LOG_DURABILITY", "durable")
    assert PdpSettings().port == 9999 and PdpSettings().log_durability == Durability.durable
    opts = StandaloneOptions(port=0, watch=False)
    assert opts.port == 0 and opts.log_durability == Durability.window and opts.host == "127.0.0.1"
    assert opts.auth.auth_audience == "svc-pdp"


def _demo_app(seen: list[Any]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @settings_command("demo", settings=Options(DemoSettings, exclude=("label",)))
    def run(
        settings: DemoSettings,
        shout: bool = typer.Option(False, "--shout", help="Not a setting."),
    ) -> None:
        """Run the demo."""
        seen.append((settings, shout))

    @app.command()
    def other() -> None:
        """A second command, so `run` keeps its name."""

    return app


def test_options_come_from_the_fields_with_cli_over_env_over_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    app = _demo_app(seen)
    runner = CliRunner()
    monkeypatch.delenv("SVC_KAFKA_URL", raising=False)
    # Default.
    r = runner.invoke(app, ["run", "--required-thing", "t"])
    assert r.exit_code == 0, r.output
    s, shout = seen.pop()
    assert (s.workers, s.ratio, s.fast, s.label, s.kafka_url, shout) == (
        2,
        0.5,
        False,
        "x",
        None,
        False,
    )
    # Environment over default.
    monkeypatch.setenv("SVC_DEMO_PART_WORKERS", "4")
    monkeypatch.setenv("SVC_DEMO_PART_FAST", "true")
    monkeypatch.setenv("SVC_KAFKA_URL", "kafka://b:1")
    monkeypatch.setenv("SVC_DEMO_PART_LABEL", "from-env")  # not an option: the class reads it
    monkeypatch.setenv("SVC_DEMO_PART_REQUIRED_THING", "env-thing")
    r = runner.invoke(app, ["run"])
    assert r.exit_code == 0, r.output
    s, _ = seen.pop()
    assert (s.workers, s.fast, s.kafka_url, s.label, s.required_thing) == (
        4,
        True,
        "kafka://b:1",
        "from-env",
        "env-thing",
    )
    # Command line over environment.
    r = runner.invoke(
        app,
        ["run", "--workers", "6", "--no-fast", "--ratio", "0.25", "--kafka-url", "h:2", "--shout"],
    )
    assert r.exit_code == 0, r.output
    s, shout = seen.pop()
    assert (s.workers, s.fast, s.ratio, s.kafka_url, shout) == (6, False, 0.25, "h:2", True)


def test_generated_options_carry_help_env_default_and_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SVC_DEMO_PART_REQUIRED_THING", raising=False)
    runner = CliRunner()
    app = _demo_app([])
    help_text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    for text in (
        "--workers",
        "Worker threads.",
        "SVC_DEMO_PART_WORKERS",
        "1<=x<=8",
        "[default: 2]",
        "--fast",
        "--no-fast",
        "A ratio, 0.5 by default.",  # reStructuredText quotes dropped
        "SVC_KAFKA_URL",
        "--required-thing",
        "required",
        "--shout",
    ):
        assert text in help_text, (text, help_text)
    assert "--label" not in help_text
    out_of_range = runner.invoke(app, ["run", "--required-thing", "t", "--workers", "9"])
    assert out_of_range.exit_code == 2 and "--workers" in out_of_range.output
    missing = runner.invoke(app, ["run"])
    assert missing.exit_code == 2 and "--required-thing" in missing.output
    monkeypatch.setenv("SVC_KAFKA_URL", "ftp://x")
    refused = runner.invoke(app, ["run", "--required-thing", "t"])
    assert refused.exit_code == 2 and "demo: bad settings: kafka_url" in refused.output


def test_svc_commands_offer_their_settings_as_options(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"COLUMNS": "250"}
    pdp = runner.invoke(svc_app, ["pdp", "--help"], env=env).output
    for field in PdpSettings.model_fields:
        name = "--kafka" if field == "kafka_url" else f"--{field.replace('_', '-')}"
        assert name in pdp, name
    for field in PdpAuthSettings.model_fields:
        assert f"--{field.replace('_', '-')}" in pdp, field
    assert "SVC_PDP_AUTH_CALLERS" in pdp and "[default: 8080]" in pdp
    intake = runner.invoke(svc_app, ["intake", "--help"], env=env).output
    assert "--dev" in intake and "--no-dev" not in intake and "SVC_INTAKE_PORT" in intake
    load = runner.invoke(svc_app, ["history", "load", "--help"], env=env).output
    assert "SVC_ANALYTICS_RETENTION_DAYS" in load and "--kafka" in load and "--dsn" in load
    migrate = runner.invoke(svc_app, ["history", "migrate", "--help"], env=env).output
    assert "--dsn" in migrate and "SVC_HISTORY_DSN" in migrate
    up = runner.invoke(svc_app, ["up", "--help"], env=env).output
    assert "--log-durability" in up and "SVC_PDP_LOG_DURABILITY" in up
    bad = runner.invoke(
        svc_app,
        ["pdp", "--bundle", str(tmp_path), "--auth", "sometimes"],
        env={"SVC_PDP_AUTH_ISSUER": ""},
    )
    assert bad.exit_code == 2 and "svc pdp: bad settings: auth" in bad.output, bad.output
