"""The decision point service (svc-pdp, docs/api.md) and its standalone mode.

The listener itself is Rust (``svc._pdp_core.Server``: tonic + axum on one port, its own Tokio
runtime, the GIL never taken per request). This module is its control plane in standalone
mode: load one bundle directory, serve it, and reload it atomically when its files change; or
follow a policy service's active bundle and mode (``svc.pdp.follower``, docs/policy.md).

``serve_bundle`` is what ``svc pdp --bundle DIR`` and ``svc pdp --policy URL --public-key FILE``
run; with ``--context URL`` (``StandaloneOptions.context``) it also follows the context
service (``svc.pdp.context_follower``, docs/context.md): the principals snapshot and watch fill
the entity store, resources a check lacks are fetched by id, and ``/readyz`` answers 503 until
the snapshot is loaded. A reload that fails (the bundle does
not parse or validate) keeps the previous bundle serving; the error is logged, shown in
``/readyz``'s body and reported by the ``svc_pdp_bundle_error`` metric until a good reload.

Callers (docs/auth.md): with ``StandaloneOptions.auth`` on, every route but the probes needs a
bearer token, checked by the Rust listener against the issuer's JWKS, which this module loads
(``svc.common.auth.JwksSource``) before the listener starts and reloads every
``auth_jwks_refresh_secs`` for key rotation (``JwksRefresher``). With auth off, only a loopback
bind is allowed: ``serve_bundle`` refuses any other host before anything starts.

With ``--challenge URL`` (``StandaloneOptions.challenge``) a challenge verdict is resolved by
the challenge service and answered with its ``challenge_qid``, challenge waits are answered
from its challenges (``svc.pdp.challenge_client``, docs/challenges.md#the-decision-point), and
its containment list is followed (``svc.pdp.containment_follower``,
docs/challenges.md#containments): ``/readyz`` answers 503 until it is loaded. Without it there
is no svc-challenge (docs/architecture.md#components): challenge verdicts carry no
``challenge_qid``, ``POST /v1/access/challenge`` answers 503 naming the missing service, and
the containment list is the (empty) one of the bundle, so it counts as loaded.

Every feed it follows (the policy service's ``bundle``, the context service's ``principals``,
``resources`` and ``work_items``, the challenge service's ``containments``) reports to the
listener through ``svc.pdp.feeds.ServerFeeds``: a feed without a successful sync for longer
than ``feed_max_staleness_secs`` makes ``/readyz`` answer 503 naming it, its last success and
its last error, while the last good state keeps serving (docs/api.md#readiness-and-feeds).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import watchfiles
from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from svc._pdp_core import BundleError, DecisionLog, Engine, Server, set_limits
from svc.common.auth import AuthConfigError, JwksSource, PdpAuthSettings
from svc.common.topics import bootstrap_servers
from svc.pdp.challenge_client import ChallengeClient, follow_challenges
from svc.pdp.containment_follower import ContainmentFollower, follow_containments
from svc.pdp.context_follower import BearerToken, ContextFollower, follow_context
from svc.pdp.decision_log import Shipper
from svc.pdp.feeds import ServerFeeds
from svc.pdp.follower import Follower, bundle_sources, fetch_active
from svc.pdp.settings import PdpSettings
from svc.policy.signing import load_public_key

__all__ = [
    "BundleWatcher",
    "JwksRefresher",
    "StandaloneOptions",
    "challenge_token",
    "context_token",
    "policy_token",
    "run_standalone",
    "serve_bundle",
]

log = logging.getLogger("svc.pdp")

#: What a decision point following a policy service serves before its first verified bundle:
#: nothing is allowed (and ``/readyz`` answers 503 until that bundle is swapped in).
DENY_ALL = "forbid (principal, action, resource);"


def policy_token(path: Path) -> Callable[[], str | None]:
    """Reads the bearer token for the policy service from `path` at each call.

    Args:
        path: a file holding one token (a projected service-account token, ``caller.token``).

    Returns:
        A callable for ``Follower(token=...)``: the file's stripped content, or None (logged)
        when it cannot be read or is empty, so the stream is opened without a token and
        refused by a service that checks callers.

    """

    def read() -> str | None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError as e:
            log.error("cannot read the policy service's token %s: %s", path, e)
            return None

    return read


def context_token(path: Path) -> BearerToken:
    """Sends the bearer token in `path` to the context service, read again for every request.

    Args:
        path: a file holding one token for audience ``svc-context`` (docs/auth.md; a projected
            service-account token, which the kubelet renews in place).

    Returns:
        ``BearerToken.from_file(path)``: a request whose token cannot be read is not sent,
        and the follower retries (``ContextFollower``'s failure handling).

    """
    return BearerToken.from_file(path)


def challenge_token(path: Path) -> Callable[[], str | None]:
    """Reads the bearer token for the challenge service from `path` at each call.

    Args:
        path: a file holding one token for audience ``svc-challenge`` (docs/auth.md).

    Returns:
        A callable for ``svc.pdp.challenge_client.ChallengeClient(token=...)``: the file's
        stripped content, or None (logged) when it cannot be read or is empty, so the call is
        made without a token and refused by a service that checks callers.

    """

    def read() -> str | None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError as e:
            log.error("cannot read the challenge service's token %s: %s", path, e)
            return None

    return read


def _bundle_file(path: Path) -> bool:
    """Whether a change to `path` can change the bundle (docs/bundles.md's layout)."""
    name = path.name
    return (
        name.endswith(".cedar")
        or name.endswith(".cedarschema")
        or name in {"schema.json", "entities.json", "linked"}
    )


class BundleWatcher:
    """Reloads a bundle directory into an engine whenever one of its files changes.

    Args:
        engine: the engine to reload (``Engine.load_bundle_dir``, an atomic swap).
        server: the running server whose ``/readyz`` and metrics report reload errors.
        bundle_dir: the directory to watch (not recursively: a bundle is flat).
        debounce_ms: changes closer together than this are one reload (editors write a file
            in several steps).

    Uses ``watchfiles`` (inotify on Linux) in a daemon thread; ``stop()`` ends it.

    """

    def __init__(
        self, engine: Engine, server: Server, bundle_dir: Path, debounce_ms: int = 300
    ) -> None:
        self.engine = engine
        self.server = server
        self.bundle_dir = bundle_dir
        self.debounce_ms = debounce_ms
        self.reloads = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="svc-bundle-watch", daemon=True)

    def start(self) -> None:
        """Starts watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stops watching and waits for the thread (at most about a second)."""
        self._stop.set()
        self._thread.join(timeout=2)

    def reload(self) -> bool:
        """Loads the bundle directory now; returns whether it loaded.

        On failure the previous bundle keeps serving and the error is logged and reported.
        """
        try:
            self.engine.load_bundle_dir(self.bundle_dir)
        except BundleError as e:
            self.failures += 1
            log.error("bundle reload failed, the previous bundle keeps serving: %s", e)
            self.server.bundle_reloaded(str(e))
            return False
        except OSError as e:
            self.failures += 1
            log.error("bundle reload failed, the previous bundle keeps serving: %s", e)
            self.server.bundle_reloaded(f"cannot read the bundle: {e}")
            return False
        self.reloads += 1
        self.server.bundle_reloaded(None)
        log.info(
            "bundle reloaded from %s (policy_version %d)",
            self.bundle_dir,
            self.engine.versions["policy_version"],
        )
        return True

    def _run(self) -> None:
        for changes in watchfiles.watch(
            self.bundle_dir,
            stop_event=self._stop,
            debounce=self.debounce_ms,
            recursive=False,
            raise_interrupt=False,
        ):
            if any(_bundle_file(Path(p)) for _, p in changes):
                self.reload()


class JwksRefresher:
    """Reloads the issuer's JWKS into a server every ``refresh_secs`` (key rotation).

    Args:
        server: a server made with ``auth_issuer`` (``Server.set_jwks``).
        source: where the keys are (``svc.common.auth.JwksSource``).
        refresh_secs: seconds between reloads.

    A reload that fails (issuer unreachable, a document without usable keys) keeps the keys in
    force and is logged; an unchanged document is not handed over again, so the listener's
    verified-token cache survives it. Runs in a daemon thread; ``stop()`` ends it.

    """

    def __init__(self, server: Server, source: JwksSource, refresh_secs: float) -> None:
        self.server = server
        self.source = source
        self.refresh_secs = refresh_secs
        self.loaded: str | None = None
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="svc-jwks-refresh", daemon=True)

    def load(self) -> int:
        """Loads the JWKS now and hands it to the server when it changed.

        Returns:
            Keys in force (0 when the document is unchanged).

        Raises:
            AuthConfigError: the JWKS cannot be loaded or holds no RS256/ES256 key.

        """
        text = json.dumps(self.source.document(), sort_keys=True)
        if text == self.loaded:
            return 0
        try:
            n = self.server.set_jwks(text)
        except ValueError as e:
            raise AuthConfigError(f"the JWKS at {self.source.url} is not usable: {e}") from e
        self.loaded = text
        log.info("loaded %d signing keys from %s", n, self.source.url)
        return n

    def start(self) -> None:
        """Starts reloading in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stops reloading and waits for the thread."""
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_secs):
            try:
                self.load()
            except AuthConfigError as e:
                self.failures += 1
                log.error("JWKS reload failed, the previous keys stay in force: %s", e)


class StandaloneOptions(PdpSettings):
    """Settings of one ``serve_bundle``: ``PdpSettings`` as given, plus who may call.

    Every field of ``svc.pdp.settings.PdpSettings`` (its docs say what each means, with the
    default), taken from the keyword arguments only: unlike ``PdpSettings`` this class reads
    no environment variable, so ``svc up`` and tests get exactly what they pass. ``svc pdp``
    builds one from a ``PdpSettings`` read from its options and ``SVC_PDP_*``.

    Attributes:
        auth: who may call (docs/auth.md); default ``PdpAuthSettings()``, read from
            ``SVC_PDP_AUTH*``, off without an issuer (then only a loopback ``host`` is
            allowed).

    Raises:
        pydantic.ValidationError: as ``PdpSettings``.

    """

    auth: PdpAuthSettings = Field(default_factory=PdpAuthSettings)
    """Who may call (docs/auth.md)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The keyword arguments only (pydantic-settings' hook for the sources read)."""
        return (init_settings,)


@contextmanager
def serve_bundle(
    bundle_dir: Path | None,
    options: StandaloneOptions | None = None,
    prepare: Callable[[Engine], None] | None = None,
    token: Callable[[], str | None] | None = None,
    context_token: Callable[[], str | None] | None = None,
    context_wait_secs: float | None = None,
    challenge_token: Callable[[], str | None] | None = None,
) -> Iterator[Server]:
    """Serves one bundle directory, or follows a policy service, until the ``with`` block ends.

    Args:
        bundle_dir: a bundle directory (docs/bundles.md); each app of Cedar's examples works.
            None: follow ``options.policy`` (``WatchActive``, ``svc.pdp.follower``) with the
            public key ``options.public_key``; its mode follows the service's.
        options: listener and engine settings (defaults: 127.0.0.1:8080, enforce).
        prepare: called with the engine once the bundle is loaded, before the listener starts:
            loads what a bundle cannot carry (work items, containments, risk scores; ``svc up``
            does so for the demo company). Bundle reloads keep what it loaded. When following
            a policy service, the first verified bundle is awaited before (no time limit).
        token: when following, returns the bearer token for the policy service at each
            (re)connect (default: ``policy_token(options.policy_token_file)`` when that is set,
            else none).
        context_token: with ``options.context``, returns the bearer token for the context
            service (audience ``svc-context``) for every request (default: the content of
            ``options.context_token_file`` when that is set, else none; ``svc up`` passes a
            local-issuer minter). A request without a token is sent bare (a service with auth
            off); a callable returning ``None`` is treated the same.
        context_wait_secs: with ``options.context``, wait up to this many seconds for the
            principals snapshot before yielding (``svc up`` does, so its banner comes once the
            decision point is ready); None: yield at once and let ``/readyz`` say when. With
            ``options.challenge``, the containment list is waited for as long too.
        challenge_token: with ``options.challenge``, returns the bearer token for the
            challenge service (audience ``svc-challenge``) for every call and each
            (re)connect (default: the content of ``options.challenge_token_file`` when that is
            set, else none); ``None`` from it sends no token.

    Yields:
        The running ``Server`` (read ``server.port`` when ``port=0``). Serving a directory, it
        is ready; following, ``/readyz`` answers 503 until the first verified bundle; with
        ``options.context``, also until the principals snapshot is loaded (no time limit:
        the follower retries, docs/context.md); with ``options.challenge``, also until the
        challenge service's containment list is (``svc.pdp.containment_follower``).

    Raises:
        AuthConfigError: auth is off and ``options.host`` is not a loopback address, or the
            issuer's JWKS cannot be loaded (nothing is served).
        BundleError: the bundle does not load at start (nothing is served).
        RequestError: ``options.mode`` is neither ``monitor`` nor ``enforce``.
        OSError: the port cannot be bound, the spool directory cannot be opened, the public
            key cannot be read, or the principals did not load in ``context_wait_secs``.
        ValueError: ``options.kafka_url`` is not a broker URL, ``log_commit_ms`` is over
            1000 or ``log_durability`` is neither ``window`` nor ``durable``; neither a bundle
            directory nor ``options.policy`` is given; the public key is not Ed25519.
        Exception: whatever ``prepare`` raised (nothing is served).

    """
    opts = options or StandaloneOptions()
    auth = opts.auth
    auth.check_bind(opts.host)
    follower: Follower | None = None
    if bundle_dir is None:
        if not opts.policy or opts.public_key is None:
            raise ValueError("svc-pdp: give a bundle directory, or a policy service and its key")
        public_key = load_public_key(opts.public_key.read_bytes())
        if token is None and opts.policy_token_file is not None:
            token = policy_token(opts.policy_token_file)
    decision_log: DecisionLog | None = None
    shipper: Shipper | None = None
    if opts.kafka_url:
        decision_log = DecisionLog(
            opts.spool_dir,
            queue_bound=opts.log_queue_bound,
            spool_max_bytes=opts.spool_max_bytes,
            commit_ms=opts.log_commit_ms,
            fsync=opts.log_fsync,
            durability=str(opts.log_durability),
        )
        shipper = Shipper(
            decision_log, bootstrap_servers(opts.kafka_url), topic=opts.decisions_topic
        )
    set_limits(max_entity_depth=opts.max_entity_depth, max_inline_entities=opts.max_inline_entities)
    first: tuple[int, dict[str, str]] | None = None
    if bundle_dir is not None:
        engine = Engine.from_bundle_dir(bundle_dir)
    else:
        # Start with the active bundle when the service answers with a verified one; else
        # allow nothing until the follower swaps one in.
        assert opts.policy is not None
        target = re.sub(r"^https?://", "", opts.policy).rstrip("/")
        first = fetch_active(target, public_key, token() if token is not None else None)
        engine = Engine(DENY_ALL)
        if first is not None:
            try:
                engine = Engine(*bundle_sources(first[1]))
            except BundleError as e:
                log.error("the active bundle %d does not load: %s", first[0], e)
                first = None
    engine.set_mode(opts.mode)
    engine.configure_plans(max_age_secs=opts.plan_max_age_secs)
    engine.configure_search(max_limit=opts.search_max_limit)
    for w in engine.warnings:
        log.warning("bundle %s: %s", bundle_dir, w)
    server: Server | None = None
    context: ContextFollower | None = None
    challenges: ChallengeClient | None = None
    containments: ContainmentFollower | None = None
    refresher: JwksRefresher | None = None
    watcher: BundleWatcher | None = None
    shipping = False
    try:
        if bundle_dir is None:
            follower = Follower(engine, target, public_key, token=token)
            if first is not None:
                follower.status.version = first[0]
            follower.start()
            if prepare is not None:
                follower.wait_for(lambda s: s.version > 0)
        if prepare is not None:
            prepare(engine)
        server = Server(
            engine,
            host=opts.host,
            port=opts.port,
            max_body_bytes=opts.max_body_bytes,
            workers=opts.workers,
            public_url=opts.public_url,
            noop_routes=opts.noop_routes,
            decision_log=decision_log,
            max_batch_items=opts.max_batch_items,
            auth_issuer=auth.auth_issuer if auth.enabled else None,
            auth_audience=auth.auth_audience,
            auth_callers=auth.auth_callers,
            auth_leeway_secs=auth.auth_leeway_secs,
            auth_cache_entries=auth.auth_cache_entries,
            auth_cache_ttl_secs=auth.auth_cache_ttl_secs,
            await_principals=opts.context is not None,
        )
        jwks: JwksRefresher | None = None
        if auth.enabled:
            jwks = JwksRefresher(
                server, JwksSource.from_settings(auth), auth.auth_jwks_refresh_secs
            )
            jwks.load()
        server.start()
        # Every feed followed below reports to the listener: /readyz answers 503 naming a feed
        # without a successful sync within the bound (docs/api.md#readiness-and-feeds).
        feeds = ServerFeeds(server, opts.feed_max_staleness_secs)
        if jwks is not None:
            jwks.start()
            refresher = jwks  # stopped at the end once started
        if shipper is not None:
            shipper.start()
            shipping = True
        if opts.context:
            context = follow_context(
                engine,
                server,
                opts.context,
                _context_auth(opts, context_token),
                fetch_timeout_ms=opts.context_fetch_timeout_ms,
                feeds=feeds,
                # A healthy feed answers each long poll: a few of them fit in the bound.
                wait_secs=min(10.0, opts.feed_max_staleness_secs / 3),
            )
            if context_wait_secs is not None and not context.loaded.wait(context_wait_secs):
                raise OSError(
                    f"the context service's principals did not load in {context_wait_secs:g} s: "
                    f"{context.status.error or 'no answer yet'}"
                )
        if opts.challenge:
            # Challenge verdicts resolved, waits answered from the challenge service.
            challenge_auth = _challenge_auth(opts, challenge_token)
            challenges = follow_challenges(
                server,
                opts.challenge,
                challenge_auth,
                timeout_ms=opts.challenge_timeout_ms,
            )
            # The containment list is the challenge service's: ready once its list is in.
            containments = follow_containments(
                engine, server, opts.challenge, challenge_auth, feeds=feeds
            )
            if context_wait_secs is not None and not containments.loaded.wait(context_wait_secs):
                raise OSError(
                    f"the challenge service's containment list did not load in "
                    f"{context_wait_secs:g} s: {containments.status.error or 'no answer yet'}"
                )
        if follower is None:
            # Standalone: the bundle is loaded and the containment list is the bundle's own
            # (or the challenge service's, whose follower marks it).
            server.set_ready(bundle=True, containments=True if not opts.challenge else None)
            if opts.watch:
                watcher = BundleWatcher(engine, server, bundle_dir)  # type: ignore[arg-type]
                watcher.start()
        else:
            # The follower reports swaps and refusals to the listener from now on; a bundle
            # verified before it started serving counts as loaded.
            if not opts.challenge:
                server.set_ready(containments=True)
            follower.server = server
            feeds.started("bundle")
            follower.feeds = feeds
            if follower.status.version > 0:
                server.set_ready(bundle=True)
                server.bundle_reloaded(follower.status.error or None)
                follower.synced()
        yield server
    finally:
        if containments is not None:
            containments.stop()
        if challenges is not None:
            if server is not None and server.running:
                server.set_challenge_source(None)
            challenges.stop()
        if context is not None:
            context.stop()
        if follower is not None:
            follower.stop()
        if watcher is not None:
            watcher.stop()
        if refresher is not None:
            refresher.stop()
        if server is not None and server.running:
            server.stop()
        if shipper is not None and shipping:
            shipper.stop()
        if decision_log is not None:
            decision_log.close()


def _challenge_auth(
    opts: StandaloneOptions, token: Callable[[], str | None] | None
) -> Callable[[], str | None] | None:
    """The challenge service's bearer token: `token`, else the token file, else none."""
    if token is not None:
        return token
    if opts.challenge_token_file is not None:
        return challenge_token(opts.challenge_token_file)
    return None


def _context_auth(
    opts: StandaloneOptions, token: Callable[[], str | None] | None
) -> BearerToken | None:
    """How requests to the context service authenticate: `token`, else the token file."""
    if token is not None:
        minted = token

        def send() -> str:
            return minted() or ""

        return _OptionalBearer(send)
    if opts.context_token_file is not None:
        return context_token(opts.context_token_file)
    return None


class _OptionalBearer(BearerToken):
    """``BearerToken`` that sends no header when the callable returns an empty token."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Adds ``Authorization: Bearer`` unless the token is empty."""
        t = self.token()
        if t:
            request.headers["Authorization"] = f"Bearer {t}"
        yield request


def run_standalone(
    bundle_dir: Path | None, options: StandaloneOptions, stop: threading.Event
) -> None:
    """Serves `bundle_dir` (None: follows ``options.policy``) until `stop` is set (``svc pdp``).

    Raises:
        AuthConfigError, BundleError, RequestError, OSError, ValueError: as ``serve_bundle``.

    Every log field of the process is bounded first (``svc.common.logbounds``): a check's ids
    are the caller's, and reach log lines only cut to a bounded size.

    """
    from svc.common.logbounds import install_log_bounds

    install_log_bounds()
    with serve_bundle(bundle_dir, options) as server:
        a = options.auth
        log.info(
            "svc-pdp serving %s on http://%s:%d (gRPC and HTTP), mode %s, %s",
            (str(bundle_dir) if bundle_dir else f"the active bundle of {options.policy}")
            + (f", principals of the context service {options.context}" if options.context else "")
            + (f", challenges of {options.challenge}" if options.challenge else ""),
            options.host,
            server.port or 0,
            options.mode,
            f"bearer tokens of {a.auth_issuer} for {len(a.auth_callers)} callers"
            if a.enabled
            else "no authentication (loopback only)",
        )
        stop.wait()
