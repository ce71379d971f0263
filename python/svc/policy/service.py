"""The policy service's logic, free of any transport (docs/policy.md).

``PolicyService`` keeps bundles, the enforcement modes, outage fallbacks and break-glass events
in its relational database (``svc.policy.models``, migrated on start), validates drafts through
the decision core (``svc._pdp_core``), signs bundles on publish (``svc.policy.signing``), decides
recorded decisions again for dry runs (``svc.history``), keeps policy tests and decides them on
every dry run and publish (``svc.policy.policytests``, docs/policy.md#policy-tests), and tells
subscribers (the ``WatchActive`` streams) after every change of the active bundle or a mode.

Errors are ``PolicyError`` with a gRPC-style ``code`` the transport maps
(docs/architecture.md#identifiers-and-errors); an invalid draft lists every problem in
``violations`` (file, line, column).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sqlalchemy import Engine as SqlEngine
from sqlalchemy import create_engine, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from svc._pdp_core import BundleError, Engine, RequestError
from svc.common.errors import ServiceError, Subscribers, Violation
from svc.common.files import private_sqlite
from svc.common.limits import bounded
from svc.policy import signing
from svc.policy.directory import DirectoryClient, DirectoryError, bundle_uids, load_directory
from svc.policy.directory import token_file as _token_file
from svc.policy.migrate import migrate
from svc.policy.models import (
    BreakGlassEvent,
    BundleRow,
    EnforcementChangeRow,
    OutageFallbackRow,
    PolicyTestRow,
    PublishRow,
    utc,
)
from svc.policy.policytests import (
    MAX_TESTS,
    PolicyTest,
    TestResult,
    TestRun,
    check_test,
    run_tests,
)
from svc.policy.settings import PolicySettings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client as HistoryClient

__all__ = [
    "MODES",
    "SCOPES",
    "TIERS",
    "BundleInfo",
    "ChangedDecision",
    "DryRunResult",
    "Enforcement",
    "EnforcementChange",
    "OutageFallback",
    "PolicyError",
    "PolicyService",
    "PolicyTest",
    "TestResult",
    "TestRun",
    "TestsFailed",
    "Violation",
    "bundle_engine",
]

log = logging.getLogger("svc.policy")

MODES = ("enforce", "monitor")
SCOPES = ("install", "containment")
TIERS = ("fail_closed", "cached", "fail_open")


_NONCE = re.compile(r"[A-Za-z0-9._:-]{16,128}")
_TOOL = re.compile(r"^(\*|[A-Za-z0-9._-]+/(\*|[A-Za-z0-9._:-]+))$")
_MAX_LIST = 1000


class PolicyError(ServiceError):
    """A refused operation.

    ``code`` is the gRPC status the transport answers
    (https://grpc.io/docs/guides/status-codes/); ``violations`` names every bad field or bundle
    problem (a ``google.rpc.BadRequest`` on the wire).
    """


class TestsFailed(PolicyError):
    """A publish refused because saved policy tests fail under the bundle.

    ``code`` is ``failed_precondition``; ``violations`` has one entry per failing test not
    accepted (``tests[<name>]``: expected and got); ``run`` is the whole run.
    """

    def __init__(self, run: TestRun, refused: list[TestResult]) -> None:
        names = ", ".join(r.name for r in refused[:10])
        more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
        super().__init__(
            "failed_precondition",
            f"{len(refused)} policy tests fail under version {run.version}: {names}{more}; "
            "name them in `accept_failing_tests` to publish anyway",
            [Violation(f"tests[{r.name}]", _failure_text(r)) for r in refused],
        )
        self.run = run


def _failure_text(r: TestResult) -> str:
    by = f" (by {', '.join(r.policies)})" if r.policies else ""
    why = f": {r.error}" if r.error else ""
    return f"expected {r.expected}, got {r.got}{by}{why}"


@dataclass(frozen=True)
class BundleInfo:
    """A stored bundle.

    ``state`` is ``draft``, ``active`` or ``superseded``; ``files`` maps
    name to text (empty in listings); ``digest`` is hex SHA-256 of the canonical form;
    ``signature`` is empty until the first publish.
    """

    version: int
    state: str
    author: str
    comment: str
    created_at: datetime
    published_at: datetime | None
    files: dict[str, str]
    policies: list[str]
    warnings: list[str]
    digest: str
    signature: bytes
    key_id: str


@dataclass(frozen=True)
class Enforcement:
    """The install's mode and the mode for automated containments (``enforce``/``monitor``)."""

    mode: str
    containment_mode: str


@dataclass(frozen=True)
class EnforcementChange:
    """A recorded mode change (docs/policy.md#enforcement)."""

    id: int
    at: datetime
    author: str
    scope: str
    from_mode: str
    to_mode: str
    reason: str


@dataclass(frozen=True)
class OutageFallback:
    """The outage tier of the tools ``tool`` names (``up/tool``, ``up/*`` or ``*``)."""

    tool: str
    tier: str
    author: str
    updated_at: datetime | None
    reason: str


@dataclass(frozen=True)
class ChangedDecision:
    """A recorded decision the draft decides differently.

    Or cannot decide: ``draft`` is ``error`` and ``error`` says why.
    """

    qid: str
    at: datetime
    principal: str
    action: str
    resource: str
    recorded: str
    draft: str
    error: str = ""


@dataclass
class DryRunResult:
    """Counts of verdict changes of recorded checks decided again under bundle ``version``.

    ``entities`` says what the checks were decided with: ``directory`` (the bundle's entities
    plus the context service's principals snapshot at ``directory_version`` and the resources
    the records name) or ``bundle`` (the bundle's own entities alone: no context service
    configured, or it did not answer); ``notes`` say what was left out and why.
    """

    version: int
    decisions: int = 0
    unchanged: int = 0
    allow_to_deny: int = 0
    deny_to_allow: int = 0
    to_challenge: int = 0
    from_challenge: int = 0
    errors: int = 0
    sample: list[ChangedDecision] = field(default_factory=list)
    truncated: bool = False
    tests: TestRun | None = None
    entities: str = "bundle"
    directory_version: int = 0
    notes: list[str] = field(default_factory=list)


def _now() -> datetime:
    return datetime.now(UTC)


def _bundle_info(row: BundleRow, with_files: bool = True) -> BundleInfo:
    return BundleInfo(
        version=row.version,
        state=row.state,
        author=row.author,
        comment=row.comment,
        created_at=utc(row.created_at) or _now(),
        published_at=utc(row.published_at),
        files=dict(row.files) if with_files else {},
        policies=list(row.policies),
        warnings=list(row.warnings),
        digest=row.digest,
        signature=row.signature or b"",
        key_id=row.key_id,
    )


def _change(row: EnforcementChangeRow) -> EnforcementChange:
    return EnforcementChange(
        id=row.id or 0,
        at=utc(row.at) or _now(),
        author=row.author,
        scope=row.scope,
        from_mode=row.from_mode,
        to_mode=row.to_mode,
        reason=row.reason,
    )


def _fallback(row: OutageFallbackRow) -> OutageFallback:
    return OutageFallback(row.tool, row.tier, row.author, utc(row.updated_at), row.reason)


def _decide_tests(version: int, files: Mapping[str, str], tests: list[PolicyTest]) -> TestRun:
    """`tests` decided under bundle `version`'s files (``policytests.run_tests``).

    No engine is loaded when there are none: a publish or dry run of an install without tests
    pays nothing for them.
    """
    if not tests:
        return TestRun(version, [])
    return run_tests(version, bundle_engine(files), tests)


def _test(row: PolicyTestRow) -> PolicyTest:
    return PolicyTest(
        name=row.name,
        request=dict(row.request),
        entities=list(row.entities),
        expect=row.expect,
        saved_by=row.saved_by,
        created_at=utc(row.created_at) or _now(),
        from_decision=row.from_decision,
        contained=list(row.contained),
        risk_scores=list(row.risk_scores),
    )


def bundle_engine(files: Mapping[str, str]) -> Engine:
    """A decision engine loaded from a bundle's files, as ``svc pdp --bundle DIR`` loads them.

    The files (docs/bundles.md) are written to a temporary directory and read with
    ``Engine.from_bundle_dir``, so problems name the files as the author wrote them.

    Raises:
        BundleError: with every problem (file, line, column).
        ValueError: a file name is not allowed (``signing.check_file_name``).

    """
    with tempfile.TemporaryDirectory(prefix="svc-policy-") as tmp:
        for name, text in files.items():
            signing.check_file_name(name)
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        return Engine.from_bundle_dir(tmp)


def _violations(e: BundleError) -> list[Violation]:
    out = []
    for err in e.errors:
        where = [str(err.get("file") or "bundle")]
        if err.get("line") is not None:
            where.append(str(err["line"]))
            if err.get("column") is not None:
                where.append(str(err["column"]))
        policy = err.get("policy")
        message = str(err.get("message", ""))
        out.append(
            Violation(":".join(where), f"policy `{policy}`: {message}" if policy else message)
        )
    return out


def _require(value: str, name: str) -> None:
    if not value.strip():
        raise PolicyError(
            "invalid_argument", f"`{name}` is required", [Violation(name, "must not be empty")]
        )


def _ref(ref: Mapping[str, Any] | None) -> str:
    if not ref:
        return ""
    return f"{ref.get('type')}::{ref.get('id')}"


class PolicyService:
    """The policy service (docs/policy.md): one per process, safe to call from many threads.

    Args:
        settings: the service's settings (database, signing key, break-glass keys, history).
        db: a SQLAlchemy engine to use instead of ``settings.database_url`` (tests).
        clock: Unix time in seconds (tests of the break-glass window).
        history: a connected history client (``svc.history.connect``) for dry runs, used
            instead of ``settings.history_dsn``: ``svc up``, whose process already holds the
            one chDB engine a process may have.
        directory: the context service dry runs decide with (``svc.policy.directory``), used
            instead of ``settings.context_url``: ``svc up``, whose tokens are minted.

    On construction the database is migrated (``svc.policy.migrate``) and the signing key is
    read, or made at ``settings.signing_key_path`` when that file does not exist; an active
    bundle signed by another key (a rotation) is signed again with this one.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or migrated.
        OSError, ValueError: the signing key cannot be read or is not an Ed25519 key.

    """

    def __init__(
        self,
        settings: PolicySettings,
        db: SqlEngine | None = None,
        clock: Callable[[], float] = time.time,
        history: HistoryClient | None = None,
        directory: DirectoryClient | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._history = history
        if directory is None and settings.context_url:
            tf = settings.context_token_file
            directory = DirectoryClient(
                settings.context_url, _token_file(tf) if tf else lambda: None
            )
        self.directory = directory
        if db is None:
            connect_args = (
                {"check_same_thread": False} if settings.database_url.startswith("sqlite") else {}
            )
            private_sqlite(settings.database_url)  # 0600 in 0700 (svc.common.files)
            db = create_engine(settings.database_url, connect_args=connect_args, pool_pre_ping=True)
        self.db = db
        self.revision = migrate(db)
        path = settings.signing_key_path
        if not path.exists():
            signing.generate_keypair(path)
            log.info("made a new bundle signing key at %s", path)
        self._key = signing.load_private_key(path)
        self.public_key = self._key.public_key()
        self.key_id = signing.key_id(self.public_key)
        self._admins = {
            name: signing.load_public_key(text) for name, text in settings.break_glass_keys.items()
        }
        self._subscribers = Subscribers()
        self._write = threading.Lock()
        self.break_glass_refused = 0
        self._resign_active()

    def _resign_active(self) -> None:
        """Signs the active bundle again when another key signed it (a key rotation).

        Decision points given the new public key can then verify what they are sent.
        """
        with self._write, Session(self.db) as s:
            row = s.exec(select(BundleRow).where(BundleRow.state == "active")).first()
            if row is None or row.key_id == self.key_id:
                return
            row.signature = signing.sign_bundle(self._key, row.version, dict(row.files))
            row.key_id = self.key_id
            s.add(row)
            s.commit()
            log.warning(
                "the active bundle %d is signed again with key %s", row.version, self.key_id
            )

    # -- subscribers

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback()`` after every change of the active bundle or a mode.

        The callback runs in the changing thread; returns the function that unsubscribes it.
        """
        return self._subscribers.subscribe(callback)

    def _notify(self) -> None:
        self._subscribers.notify()

    # -- bundles

    def create_draft(self, files: Mapping[str, str], author: str, comment: str = "") -> BundleInfo:
        """Validates a bundle and stores it as a draft with the next version.

        Args:
            files: file name to UTF-8 text (docs/bundles.md's layout; flat names).
            author: who writes it.
            comment: free text.

        Returns:
            The stored draft, with its files, policy names and warnings.

        Raises:
            PolicyError: ``invalid_argument`` for a missing author, no files, a bad file name,
                a bundle over ``max_bundle_bytes``, or a bundle the decision core refuses (one
                violation per problem, ``file:line:column``).

        """
        _require(author, "author")
        if not files:
            raise PolicyError(
                "invalid_argument", "a draft needs files", [Violation("files", "empty")]
            )
        bad = []
        for i, name in enumerate(files):
            try:
                signing.check_file_name(name)
            except ValueError as e:
                bad.append(Violation(f"files[{i}].name", str(e)))
        if bad:
            raise PolicyError("invalid_argument", "bad file names", bad)
        size = sum(len(t.encode()) for t in files.values())
        if size > self.settings.max_bundle_bytes:
            raise PolicyError(
                "invalid_argument",
                f"the bundle has {size} bytes, more than `max_bundle_bytes` "
                f"({self.settings.max_bundle_bytes})",
                [Violation("files", "too large")],
            )
        try:
            engine = bundle_engine(files)
        except BundleError as e:
            violations = _violations(e)
            raise PolicyError(
                "invalid_argument", f"invalid bundle: {len(violations)} errors", violations
            ) from None
        policies = sorted(engine.policy_names)
        warnings = list(engine.warnings)
        for _ in range(5):
            try:
                with Session(self.db) as s:
                    top = s.exec(select(func.max(BundleRow.version))).one()
                    version = int(top or 0) + 1
                    row = BundleRow(
                        version=version,
                        state="draft",
                        author=author,
                        comment=comment,
                        created_at=_now(),
                        files=dict(files),
                        policies=policies,
                        warnings=warnings,
                        digest=signing.bundle_digest(version, files).hex(),
                    )
                    s.add(row)
                    s.commit()
                    s.refresh(row)
                    log.info("draft version %d stored (%d files)", version, len(files))
                    return _bundle_info(row)
            except IntegrityError:  # another draft took this version meanwhile
                continue
        raise PolicyError("unavailable", "could not assign a version; try again")

    def publish(
        self, version: int, author: str, accept_failing_tests: Sequence[str] = ()
    ) -> BundleInfo:
        """Signs bundle ``version`` and makes it the active bundle, once its tests pass.

        ``publish_tested`` without the test run in the answer.

        Raises:
            TestsFailed, PolicyError: as ``publish_tested``.

        """
        return self.publish_tested(version, author, accept_failing_tests)[0]

    def publish_tested(
        self, version: int, author: str, accept_failing_tests: Sequence[str] = ()
    ) -> tuple[BundleInfo, TestRun | None]:
        """Signs bundle ``version`` and makes it the active bundle, once its tests pass.

        Every saved policy test is decided under the bundle first (``run_tests``); a test that
        fails and is not named in `accept_failing_tests` refuses the publish. The publish is
        recorded (``publishes``: who, when, how many tests ran, the failures accepted).
        A bundle is signed on its first publish, and again when the service's key changed since
        (key rotation); otherwise its stored signature is kept. The bundle active before becomes
        ``superseded``. Publishing the active version again changes nothing. Watchers are told.

        Args:
            version: the bundle version (a draft, or a superseded version: a rollback).
            author: who publishes (the verified caller).
            accept_failing_tests: names of tests the author knows fail and accepts; names of
                tests that pass or do not exist are ignored.

        Returns:
            The bundle now active, and the tests decided under it (None when it was active
            already and nothing changed).

        Raises:
            TestsFailed: tests fail that `accept_failing_tests` does not name (nothing changes).
            PolicyError: ``invalid_argument`` without an author; ``not_found`` for an unknown
                version.

        """
        _require(author, "author")
        if self.get_bundle(version).state == "active":
            return self._activate(version, expect=("draft", "superseded")), None
        run = self.run_tests(version)
        accepted = set(accept_failing_tests)
        refused = [r for r in run.failed if r.name not in accepted]
        if refused:
            raise TestsFailed(run, refused)
        info = self._activate(version, expect=("draft", "superseded"))
        failures = [{"name": r.name, "expected": r.expected, "got": r.got} for r in run.failed]
        with Session(self.db) as s:
            s.add(
                PublishRow(
                    version=version,
                    at=_now(),
                    author=author,
                    tests_run=len(run.results),
                    accepted_failures=failures,
                )
            )
            s.commit()
        log.info(
            "version %d published by %s (%d tests, %d failures accepted%s)",
            version,
            author,
            len(run.results),
            len(failures),
            f": {', '.join(f['name'] for f in failures)}" if failures else "",
        )
        return info, run

    def publishes(self, version: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Recorded publishes, newest first (of one version, or all for 0).

        Returns:
            ``[{"id", "version", "at", "author", "tests_run", "accepted_failures"}]``, each
            accepted failure ``{"name", "expected", "got"}``.

        """
        with Session(self.db) as s:
            q = select(PublishRow)
            if version:
                q = q.where(PublishRow.version == version)
            rows = s.exec(q.order_by(col(PublishRow.id).desc()).limit(_limit(limit))).all()
            return [
                {
                    "id": r.id,
                    "version": r.version,
                    "at": utc(r.at),
                    "author": r.author,
                    "tests_run": r.tests_run,
                    "accepted_failures": list(r.accepted_failures),
                }
                for r in rows
            ]

    def _activate(self, version: int, expect: Sequence[str]) -> BundleInfo:
        """Makes ``version`` active (signing it when unsigned); returns it."""
        with self._write, Session(self.db) as s:
            row = s.get(BundleRow, version)
            if row is None:
                raise PolicyError("not_found", f"no bundle version {version}")
            if row.state == "active":
                return _bundle_info(row)
            if row.state not in expect:
                raise PolicyError(
                    "failed_precondition",
                    f"bundle version {version} is a {row.state}; only "
                    f"{' or '.join(expect)} versions can be made active this way",
                )
            if not row.signature or row.key_id != self.key_id:  # first publish, or a new key
                files = dict(row.files)
                row.signature = signing.sign_bundle(self._key, version, files)
                row.digest = signing.bundle_digest(version, files).hex()
                row.key_id = self.key_id
            for old in s.exec(select(BundleRow).where(BundleRow.state == "active")).all():
                old.state = "superseded"
                s.add(old)
            s.flush()  # the old one leaves `active` first (one active bundle, a unique index)
            row.state = "active"
            row.published_at = _now()
            s.add(row)
            try:
                s.commit()
            except IntegrityError:  # another replica made a bundle active meanwhile
                raise PolicyError(
                    "unavailable", "another publish happened at the same time; try again"
                ) from None
            s.refresh(row)
            info = _bundle_info(row)
        self._notify()
        return info

    def get_active(self) -> BundleInfo | None:
        """The active bundle with its files, or None before the first publish."""
        with Session(self.db) as s:
            row = s.exec(select(BundleRow).where(BundleRow.state == "active")).first()
            return _bundle_info(row) if row else None

    def active_version(self) -> int:
        """The active version (0 before the first publish); a cheap read for watchers."""
        with Session(self.db) as s:
            v = s.exec(select(BundleRow.version).where(BundleRow.state == "active")).first()
            return int(v or 0)

    def list_bundles(self, limit: int = 100) -> list[BundleInfo]:
        """Bundles newest version first, without files (``limit`` 1 to 1,000; 0 means 100)."""
        limit = _limit(limit)
        with Session(self.db) as s:
            rows = s.exec(
                select(BundleRow).order_by(col(BundleRow.version).desc()).limit(limit)
            ).all()
            return [_bundle_info(r, with_files=False) for r in rows]

    def get_bundle(self, version: int) -> BundleInfo:
        """One bundle with its files.

        Raises:
            PolicyError: ``not_found`` for an unknown version.

        """
        with Session(self.db) as s:
            row = s.get(BundleRow, version)
            if row is None:
                raise PolicyError("not_found", f"no bundle version {version}")
            return _bundle_info(row)

    # -- enforcement

    def get_enforcement(self) -> Enforcement:
        """The modes in force: the latest recorded change per scope, else the default.

        The default is the settings' ``default_mode`` for the install and
        ``default_containment_mode`` for automated containments.
        """
        with Session(self.db) as s:
            modes = {}
            for scope in SCOPES:
                last = s.exec(
                    select(EnforcementChangeRow)
                    .where(EnforcementChangeRow.scope == scope)
                    .order_by(col(EnforcementChangeRow.id).desc())
                    .limit(1)
                ).first()
                default = (
                    self.settings.default_mode
                    if scope == "install"
                    else self.settings.default_containment_mode
                )
                modes[scope] = last.to_mode if last else default
        return Enforcement(modes["install"], modes["containment"])

    def set_enforcement(
        self, scope: str, mode: str, author: str, reason: str = ""
    ) -> tuple[Enforcement, EnforcementChange | None]:
        """Sets one scope's mode and records the change; watchers are told.

        Args:
            scope: ``install`` or ``containment``.
            mode: ``enforce`` or ``monitor``.
            author: who changes it.
            reason: why (free text).

        Returns:
            The modes now, and the recorded change (None when the mode already was ``mode``).

        Raises:
            PolicyError: ``invalid_argument`` for an unknown scope or mode or no author.

        """
        bad = []
        if scope not in SCOPES:
            bad.append(Violation("scope", f"`{scope}`: expected install or containment"))
        if mode not in MODES:
            bad.append(Violation("mode", f"`{mode}`: expected enforce or monitor"))
        if not author.strip():
            bad.append(Violation("author", "must not be empty"))
        if bad:
            raise PolicyError("invalid_argument", "bad enforcement change", bad)
        with self._write:
            before = self.get_enforcement()
            current = before.mode if scope == "install" else before.containment_mode
            if current == mode:
                return before, None
            with Session(self.db) as s:
                row = EnforcementChangeRow(
                    at=_now(),
                    author=author,
                    scope=scope,
                    from_mode=current,
                    to_mode=mode,
                    reason=reason,
                )
                s.add(row)
                s.commit()
                s.refresh(row)
                change = _change(row)
        log.info("%s mode %s -> %s by %s", scope, current, mode, author)
        self._notify()
        return self.get_enforcement(), change

    def list_enforcement_changes(self, limit: int = 100) -> list[EnforcementChange]:
        """Recorded mode changes, newest first (``limit`` 1 to 1,000; 0 means 100)."""
        with Session(self.db) as s:
            rows = s.exec(
                select(EnforcementChangeRow)
                .order_by(col(EnforcementChangeRow.id).desc())
                .limit(_limit(limit))
            ).all()
            return [_change(r) for r in rows]

    # -- outage fallbacks

    def get_outage_fallback(self, tool: str = "") -> list[OutageFallback]:
        """The outage tier of one tool, or every entry when ``tool`` is empty.

        For a tool: its own entry, else ``<upstream>/*``, else ``*``, else the built-in
        ``fail_closed``. Every entry: sorted by pattern.

        Raises:
            PolicyError: ``invalid_argument`` for a tool that is not ``<upstream>/<tool>``.

        """
        with Session(self.db) as s:
            if not tool:
                rows = s.exec(select(OutageFallbackRow).order_by(col(OutageFallbackRow.tool)))
                return [_fallback(r) for r in rows.all()]
            if not _TOOL.match(tool) or tool.endswith("/*") or tool == "*":
                raise PolicyError(
                    "invalid_argument",
                    f"tool `{tool}`: expected <upstream>/<tool>",
                    [Violation("tool", "expected <upstream>/<tool>")],
                )
            upstream = tool.split("/", 1)[0]
            for pattern in (tool, f"{upstream}/*", "*"):
                row = s.get(OutageFallbackRow, pattern)
                if row is not None:
                    return [_fallback(row)]
        return [OutageFallback("*", "fail_closed", "", None, "built-in default")]

    def set_outage_fallback(
        self, tool: str, tier: str, author: str, reason: str = ""
    ) -> OutageFallback:
        """Sets the tier of a tool pattern (``<upstream>/<tool>``, ``<upstream>/*``, ``*``).

        Raises:
            PolicyError: ``invalid_argument`` for a bad pattern, tier or missing author.

        """
        bad = []
        if not _TOOL.match(tool):
            bad.append(
                Violation("tool", f"`{tool}`: expected <upstream>/<tool>, <upstream>/* or *")
            )
        if tier not in TIERS:
            bad.append(Violation("tier", f"`{tier}`: expected one of {', '.join(TIERS)}"))
        if not author.strip():
            bad.append(Violation("author", "must not be empty"))
        if bad:
            raise PolicyError("invalid_argument", "bad outage fallback", bad)
        with Session(self.db) as s:
            row = s.get(OutageFallbackRow, tool) or OutageFallbackRow(
                tool=tool, tier=tier, author=author, updated_at=_now()
            )
            row.tier, row.author, row.updated_at, row.reason = tier, author, _now(), reason
            s.add(row)
            s.commit()
            s.refresh(row)
            return _fallback(row)

    # -- break glass

    def break_glass_rollback(
        self,
        version: int,
        admin: str,
        nonce: str,
        issued_at: int,
        reason: str,
        signature: bytes,
    ) -> tuple[BundleInfo, int]:
        """Makes an earlier published version active on an admin's signed request.

        Checks, in order: the admin's key is listed (``break_glass_keys``), the signature
        verifies over the request's canonical form (``signing.break_glass_message``),
        ``issued_at`` lies within ``break_glass_window_secs`` of the clock, the nonce is
        well-formed and never used. The event is recorded with the nonce (unique), so a replay
        is refused even after a restart. Watchers are told.

        Returns:
            The bundle now active, and the version active before (0 if none).

        Raises:
            PolicyError: ``permission_denied`` for an unknown admin, a bad signature, a stale or
                future ``issued_at`` or a used nonce; ``invalid_argument`` for a malformed
                nonce; ``not_found`` for an unknown version; ``failed_precondition`` for a
                version never published.

        """
        key = self._admins.get(admin)
        if key is None:
            self._refuse(f"no break-glass key for admin `{admin}`")
        try:
            signing.verify_break_glass(key, version, admin, nonce, issued_at, reason, signature)
        except signing.SignatureError as e:
            self._refuse(str(e))
        skew = abs(self.clock() - issued_at)
        if skew > self.settings.break_glass_window_secs:
            self._refuse(
                f"`issued_at` is {int(skew)} s from the service's clock, outside "
                f"`break_glass_window_secs` ({self.settings.break_glass_window_secs})"
            )
        if not _NONCE.fullmatch(nonce):
            raise PolicyError(
                "invalid_argument",
                "bad nonce",
                [Violation("nonce", "16 to 128 characters of A-Z a-z 0-9 . _ : -")],
            )
        with Session(self.db) as s:
            used = s.exec(select(BreakGlassEvent).where(BreakGlassEvent.nonce == nonce)).first()
            if used is not None:
                self._refuse(f"nonce `{nonce}` was used already (a replay)")
        before = self.active_version()
        if before == version:
            raise PolicyError("failed_precondition", f"version {version} is already active")
        info = self._activate(version, expect=("superseded",))
        try:
            with Session(self.db) as s:
                s.add(
                    BreakGlassEvent(
                        at=_now(),
                        admin=admin,
                        nonce=nonce,
                        version=version,
                        from_version=before,
                        issued_at=issued_at,
                        reason=reason,
                        signature=signature,
                    )
                )
                s.commit()
        except IntegrityError:  # the same nonce raced in: undo ours
            if before:
                self._activate(before, expect=("superseded",))
            self._refuse(f"nonce `{nonce}` was used already (a replay)")
        log.warning(
            "BREAK GLASS: admin %s made version %d active (was %d): %s",
            admin,
            version,
            before,
            reason,
        )
        return info, before

    def _refuse(self, message: str) -> NoReturn:
        self.break_glass_refused += 1
        log.warning("break-glass refused: %s", message)
        raise PolicyError("permission_denied", message)

    # -- dry runs

    def dry_run(
        self,
        version: int,
        since: datetime,
        until: datetime | None = None,
        sample: int = 20,
        limit: int = 100_000,
    ) -> DryRunResult:
        """Decides the recorded checks of ``[since, until)`` again under bundle ``version``.

        The records come from the history (``settings.history_dsn``,
        ``svc.history.decisions_between``). Each is decided again from what it recorded
        (principal, action, resource, ``on_behalf_of``) as the decision point decides it: with
        the bundle's entities plus the context service's directory, one principals snapshot
        for the whole run and the resources the records name, read by id
        (``svc.policy.directory.load_directory``). Without a context service, or when it does
        not answer, the bundle's own entities alone (``entities == "bundle"``, with a note);
        the dry run never fails for it. The context the caller sent is not recorded, so a
        policy reading caller-sent context sees none (docs/policy.md#dry-runs).

        Returns:
            Counts of verdict changes and up to ``sample`` changed decisions, oldest first,
            and every saved policy test decided under the bundle (``tests``).

        Raises:
            PolicyError: ``not_found`` for an unknown version; ``invalid_argument`` for an empty
                range or a bad sample/limit; ``unavailable`` without a history store or when it
                does not answer.

        """
        if self._history is None and not self.settings.history_dsn:
            raise PolicyError("unavailable", "no history store configured (`history_dsn`)")
        if not 0 <= sample <= _MAX_LIST:
            raise PolicyError("invalid_argument", "bad sample", [Violation("sample", "0..1000")])
        if limit < 0:
            raise PolicyError("invalid_argument", "bad limit", [Violation("limit", ">= 0")])
        sample = sample or 20
        limit = limit or 100_000
        until = until or _now()
        if until <= since:
            raise PolicyError(
                "invalid_argument", "empty time range", [Violation("until", "must be after since")]
            )
        bundle = self.get_bundle(version)
        engine = bundle_engine(bundle.files)
        tests = _decide_tests(version, bundle.files, self.list_tests())
        from clickhouse_connect.driver.exceptions import ClickHouseError

        from svc import history

        try:
            client = self._history or history.connect(self.settings.history_dsn or "")
            records = history.decisions_between(client, since, until, limit=limit + 1)
        except (ClickHouseError, OSError) as e:
            log.error("dry run: the history store failed: %s", e)
            raise PolicyError("unavailable", "the history store does not answer") from None
        out = DryRunResult(version=version, truncated=len(records) > limit, tests=tests)
        records = records[:limit]
        self._with_directory(engine, bundle.files, records, out)
        for rec in records:
            recorded = rec.get("verdict") or ""
            request: dict[str, Any] = {
                "principal": rec["principal"],
                "action": rec["action"],
                "resource": rec["resource"],
            }
            if rec.get("on_behalf_of"):
                request["on_behalf_of"] = rec["on_behalf_of"]
            error = ""
            try:
                verdict = str(engine.evaluate(request)["verdict"])
            except RequestError as e:
                verdict, error = "error", str(e)
            out.decisions += 1
            if verdict == recorded:
                out.unchanged += 1
                continue
            if verdict == "error":
                out.errors += 1
            elif verdict == "challenge":
                out.to_challenge += 1
            elif recorded == "challenge":
                out.from_challenge += 1
            elif recorded == "allow" and verdict == "deny":
                out.allow_to_deny += 1
            elif recorded == "deny" and verdict == "allow":
                out.deny_to_allow += 1
            if len(out.sample) < sample:
                out.sample.append(
                    ChangedDecision(
                        qid=str(rec["qid"]),
                        at=rec["at"],
                        principal=_ref(rec["principal"]),
                        action=str(rec["action"]),
                        resource=_ref(rec["resource"]),
                        recorded=recorded,
                        draft=verdict,
                        error=error,
                    )
                )
        return out

    def _with_directory(
        self,
        engine: Engine,
        files: Mapping[str, str],
        records: Sequence[Mapping[str, Any]],
        out: DryRunResult,
    ) -> None:
        """Loads the directory into `engine` for a dry run; sets ``out.entities`` and notes."""
        if self.directory is None:
            out.notes.append(
                "no context service is configured (`context_url`): decided with the bundle's "
                "own entities, so policies on people's groups or attributes see none"
            )
            return
        t0 = time.perf_counter()
        try:
            loaded = load_directory(
                engine,
                self.directory,
                records,
                self.settings.dry_run_max_resources,
                bundle_uids(files),
            )
        except DirectoryError as e:
            log.warning("dry run: the context service did not answer: %s", e)
            out.notes.append(
                f"the context service did not answer ({bounded(str(e), 200)}): decided with "
                "the bundle's own entities, so policies on people's groups or attributes see none"
            )
            return
        out.entities = "directory"
        out.directory_version = loaded.version
        out.notes += loaded.notes
        log.info(
            "dry run of %d records: directory at version %d loaded in %.0f ms (%d entities, "
            "%d service accounts, %d risk scores, %d of %d resources)",
            len(records),
            loaded.version,
            (time.perf_counter() - t0) * 1000,
            loaded.entities,
            loaded.service_accounts,
            loaded.risk_scores,
            loaded.resources,
            loaded.wanted,
        )

    # -- policy tests

    def save_test(
        self,
        name: str,
        request: Mapping[str, Any],
        entities: Sequence[Mapping[str, Any]],
        expect: str,
        saved_by: str,
        from_decision: str = "",
        contained: Sequence[Mapping[str, str]] = (),
        risk_scores: Sequence[Mapping[str, Any]] = (),
    ) -> tuple[PolicyTest, TestResult | None]:
        """Saves a policy test (docs/policy.md#policy-tests) and decides it under the active bundle.

        Args:
            name: the test's name, unique (``policytests.check_test`` says what is allowed).
            request: ``{principal, action, resource, context?, on_behalf_of?}``.
            entities: the Cedar entities to decide it with (a snapshot; the bundle's own
                ``entities.json`` is loaded under them).
            expect: ``allow``, ``deny`` or ``challenge``.
            saved_by: the verified caller (``svc.common.auth.author_of``).
            from_decision: the qid of the decision it was saved from, if any.
            contained: principals contained when it was saved.
            risk_scores: ``[{principal, score}]`` when it was saved.

        Returns:
            The stored test, and its result under the active bundle (None before the first
            publish), so the caller sees at once whether it passes today.

        Raises:
            PolicyError: ``invalid_argument`` naming every bad field;
                ``failed_precondition`` for a name in use (field ``name``) or when
                ``MAX_TESTS`` tests are kept already.

        """
        bad = check_test(name, request, entities, expect, from_decision, contained, risk_scores)
        if not saved_by.strip():
            bad.append(Violation("saved_by", "must not be empty"))
        if bad:
            raise PolicyError("invalid_argument", f"bad policy test: {len(bad)} problems", bad)
        req = {k: request[k] for k in ("principal", "action", "resource") if k in request}
        req["context"] = dict(request.get("context") or {})
        if request.get("on_behalf_of"):
            req["on_behalf_of"] = dict(request["on_behalf_of"])
        row = PolicyTestRow(
            name=name,
            request=req,
            entities=[dict(e) for e in entities],
            contained=[dict(c) for c in contained],
            risk_scores=[dict(r) for r in risk_scores],
            expect=expect,
            saved_by=saved_by,
            from_decision=from_decision,
            created_at=_now(),
        )
        with self._write, Session(self.db) as s:
            count = s.exec(select(func.count()).select_from(PolicyTestRow)).one()
            if int(count) >= MAX_TESTS:
                raise PolicyError(
                    "failed_precondition",
                    f"{MAX_TESTS} policy tests are kept already: delete one first",
                )
            if s.get(PolicyTestRow, name) is not None:
                raise PolicyError(
                    "failed_precondition",
                    f"a policy test named `{name}` exists",
                    [Violation("name", "in use: delete that test first or pick another name")],
                )
            s.add(row)
            try:
                s.commit()
            except IntegrityError:  # another replica saved the same name meanwhile
                raise PolicyError(
                    "failed_precondition",
                    f"a policy test named `{name}` exists",
                    [Violation("name", "in use")],
                ) from None
            s.refresh(row)
            test = _test(row)
        log.info("policy test %r saved by %s (expects %s)", name, saved_by, expect)
        active = self.get_active()
        if active is None:
            return test, None
        return test, run_tests(active.version, bundle_engine(active.files), [test]).results[0]

    def list_tests(self) -> list[PolicyTest]:
        """Every saved policy test, by name."""
        with Session(self.db) as s:
            rows = s.exec(select(PolicyTestRow).order_by(col(PolicyTestRow.name))).all()
            return [_test(r) for r in rows]

    def delete_test(self, name: str, author: str) -> None:
        """Deletes a policy test.

        Raises:
            PolicyError: ``not_found`` for an unknown name.

        """
        with self._write, Session(self.db) as s:
            row = s.get(PolicyTestRow, name)
            if row is None:
                raise PolicyError(
                    "not_found", f"no policy test named `{name}`", [Violation("name", "unknown")]
                )
            s.delete(row)
            s.commit()
        log.info("policy test %r deleted by %s", name, author)

    def run_tests(self, version: int = 0) -> TestRun:
        """Decides every saved test under bundle `version` (0: the active one).

        Each test is decided with the decision core loaded from the bundle's files, the test's
        entity snapshot on top of the bundle's own entities (``policytests.decide_test``).

        Raises:
            PolicyError: ``not_found`` for an unknown version, or 0 before the first publish.

        """
        if version == 0:
            active = self.get_active()
            if active is None:
                raise PolicyError("not_found", "nothing is published yet")
            bundle = active
        else:
            bundle = self.get_bundle(version)
        return _decide_tests(bundle.version, bundle.files, self.list_tests())

    def state(self) -> tuple[BundleInfo | None, Enforcement]:
        """The active bundle (with files) and the modes: what ``WatchActive`` sends."""
        return self.get_active(), self.get_enforcement()

    def state_token(self) -> tuple[int, str, str]:
        """(active version, mode, containment mode): cheap to compare, for watchers' polls."""
        e = self.get_enforcement()
        return self.active_version(), e.mode, e.containment_mode

    def close(self) -> None:
        """Releases the database connections (and the context service's client)."""
        self.db.dispose()
        if self.directory is not None:
            self.directory.close()


def _limit(limit: int) -> int:
    if limit < 0 or limit > _MAX_LIST:
        raise PolicyError(
            "invalid_argument", f"limit {limit}", [Violation("limit", "0 to 1000 (0 means 100)")]
        )
    return limit or 100
