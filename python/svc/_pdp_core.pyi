"""Type stubs for `svc._pdp_core`, the Rust decision core (crates/pdp_py over two crates).

The binding (crates/pdp_py) wraps the engine (crates/pdp_core) and its I/O: the listener, the
decision log, reading bundle directories (crates/pdp_server).

Shapes used below (docs/architecture.md#entities-and-the-base-schema, docs/decisions.md#request):

* entity reference: ``{"type": str, "id": str}``; ``'Type::"id"'`` and
  ``{"__entity": {"type", "id"}}`` are accepted too.
* entity: Cedar's _JSON entity shape ``{"uid": ref, "attrs": {...}, "parents": [ref, ...]}``;
  entity-valued attributes are ``{"__entity": ref}``, extension values ``{"__extn": ...}``.
* request: the _JSON of ``POST /v1/access/evaluation``: ``principal``, ``action`` (bare id such as
  ``"read"`` or full uid ``'NS::Action::"read"'``), ``resource``, optional ``context``,
  ``on_behalf_of``, ``human_present`` (default true), ``work_item_id``, ``entities``.
* response: ``svc.pdp.shapes.Decision`` (``evaluate``, ``evaluate_many``),
  ``svc.pdp.shapes.DecisionRecord`` (``decide``) and ``svc.pdp.shapes.Plan`` (``plan``):
  ``TypedDict``s naming every key the engine writes (docs/api.md, docs/history.md#schema,
  docs/plans.md), re-exported by ``svc.pdp``.
"""

from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from typing import Any, Final, Literal, TypeVar, final

from svc.pdp.challenge_client import ChallengeSource
from svc.pdp.outline_shapes import PolicyOutline
from svc.pdp.shapes import Decision, DecisionRecord, Plan

__all__ = [
    "BundleError",
    "DecisionLog",
    "Engine",
    "LogBatch",
    "RequestError",
    "Server",
    "__version__",
    "outline_policies",
    "set_limits",
]

__version__: Final[str]

# A request of a batch: any mapping, so that a ``list[dict[str, Any]]`` is accepted as it is
# (``list`` is invariant, so ``list[Mapping[str, Any]]`` would refuse it).
_Request = TypeVar("_Request", bound=Mapping[str, Any])
_Ref = Mapping[str, str] | str

def set_limits(
    max_entity_depth: int | None = None, max_inline_entities: int | None = None
) -> tuple[int, int]:
    """Sets the decision core's process-wide limits (docs/decisions.md, "Limits").

    Args:
        max_entity_depth: longest parent chain (links to the farthest ancestor, at least 1) of
            inline entities, entity-store writes and bundles' ``entities.json`` loaded from then
            on; ``None`` keeps it (default 64).
        max_inline_entities: most inline entities one check may carry; ``None`` keeps it
            (default 1,000).

    Returns:
        The limits now in force, ``(max_entity_depth, max_inline_entities)``.

    """

def outline_policies(
    text: str, file: str = "policies.cedar", first_index: int = 0
) -> list[PolicyOutline]:
    """Outlines every policy and template of one ``.cedar`` file, from Cedar's own parse.

    The Rust decision core parses the text with ``cedar-policy`` and walks each statement's AST
    (``pdp_core::outline``, docs/portal.md#explanations); no text is scanned.

    Args:
        text: the file's text.
        file: its name, for errors.
        first_index: how many statements the bundle's earlier ``.cedar`` files hold (in file-name
            order), so an unnamed policy gets its bundle name ``policyN``
            (docs/bundles.md#policy-names).

    Returns:
        One ``PolicyOutline`` (``svc.pdp.outline_shapes``) per statement, in file order: its
        name, effect, text as written, lines, scope, the attribute paths it reads (whole:
        ``resource.owner.manager``) and the entity literals it names.

    Raises:
        BundleError: the text does not parse; ``errors`` holds Cedar's errors with ``file``,
            ``line`` and ``column``.

    """

class BundleError(Exception):
    """A policy bundle could not be loaded.

    ``errors`` lists every problem found, each a dict with ``file`` (str), ``line`` and
    ``column`` (1-based int or None), ``policy`` (policy name or None) and ``message`` (str).
    """

    errors: list[dict[str, Any]]

class RequestError(ValueError):
    """A request or store update is malformed or does not match the schema.

    ``field`` is the dotted path of the field at fault (``"context"``, ``"principal.type"``,
    ``"requests[3].action"``); ``reason`` is the message without the field.
    """

    field: str
    reason: str

@final
class Engine:
    """The in-process decision engine: one policy bundle plus one entity store.

    Every method is safe to call while other threads evaluate; bundle and store changes are
    published atomically (a check sees the old state or the new one, never a mix).
    """

    def __new__(
        cls,
        policies: str | Mapping[str, str],
        schema: str | Mapping[str, Any] | None = None,
        entities: str | Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        links: str | Sequence[Mapping[str, Any]] | None = None,
    ) -> Engine:
        """Builds an engine from texts.

        Args:
            policies: Cedar policy text, or a mapping of file name to text (numbered in name
                order, as a bundle directory's files are).
            schema: Cedar-syntax schema text, _JSON-syntax schema text, or the _JSON schema as a
                dict. Without a schema, policies are not validated.
            entities: base entities: Cedar entity _JSON (list, or its text) or an entity map.
            links: template links in the Cedar CLI's format (see ``link_templates``).

        Raises:
            BundleError: with every parse, validation, entity and link error.
            TypeError: when an argument has the wrong Python type.

        """

    @staticmethod
    def from_bundle_dir(path: str | PathLike[str]) -> Engine:
        """Loads a bundle directory (``*.cedar``, one schema file, ``entities.json``, ``linked``).

        Raises:
            BundleError: with every problem found, each with file, line and column.

        """

    def load_bundle_dir(self, path: str | PathLike[str]) -> None:
        """Replaces the bundle with a directory's, atomically; ``policy_version`` moves.

        Raises:
            BundleError: the directory does not load; the bundle in force keeps serving.

        """

    def load_bundle(
        self,
        policies: str | Mapping[str, str],
        schema: str | Mapping[str, Any] | None = None,
        entities: str | Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        links: str | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replaces the bundle with one built from texts (arguments as for ``Engine()``).

        Raises:
            BundleError: the texts do not load; the bundle in force keeps serving.

        """

    def link_templates(self, links: Sequence[Mapping[str, Any]]) -> None:
        """Links templates, all or nothing.

        ``links`` is the Cedar CLI's template-linked file format: ``[{"template_id", "link_id",
        "args": {"?principal": ref, "?resource": ref}}]``.

        Raises:
            RequestError: a link entry is malformed.
            BundleError: a link names an unknown template, reuses a name, misses a slot or
                fails validation; nothing is linked.

        """

    def evaluate(self, request: Mapping[str, Any]) -> Decision:
        """Decides one check; returns the ``POST /v1/access/evaluation`` response.

        The response is a ``Decision`` (``svc.pdp.shapes``): ``qid``, ``verdict``,
        ``challenges``, ``policies``, ``on_behalf_of`` (only when the request names a person)
        and ``mode`` (docs/api.md#http-routes). The GIL is released while deciding.

        Raises:
            RequestError: unknown field, missing principal/action/resource, unknown or ambiguous
                action, undeclared entity type, misuse of ``on_behalf_of``, bad inline entity, or
                a context that does not match the schema for the action.
            TypeError: the request holds values that are not _JSON.

        """

    def plan(self, request: Mapping[str, Any]) -> Plan:
        """Builds a query plan; returns the ``POST /v1/access/plan`` response (docs/plans.md).

        ``request`` has ``principal``, optional ``on_behalf_of``, ``action``, optional
        ``context``, ``resource_type`` (full or, when unique, bare type name) and optional
        ``plan_qid``. The response is a ``Plan`` (``svc.pdp.shapes``): ``qid``, ``outcome``
        (``always_allowed``, ``always_denied``, ``challenge``, ``conditional``), ``filter``
        (for ``conditional`` and ``challenge`` only; the filter tree of docs/plans.md, a
        ``FilterNode``), ``challenges``,
        ``challenge_could_widen``, ``needs_row_checks``, ``attributes`` (dotted paths),
        ``policies``, ``mode``, ``policy_version``, ``principals_version``, ``max_age_secs`` and
        ``pinned`` (true when ``plan_qid`` named a plan still good for this same question). The
        GIL is released while planning.

        Raises:
            RequestError: unknown field, missing principal/action/resource_type, a bundle
                without a schema, unknown or ambiguous action or resource type, an action that
                does not apply to the type, misuse of ``on_behalf_of``, or a context that does
                not match the schema for the action.
            TypeError: the request holds values that are not _JSON.

        """

    def configure_plans(
        self, max_age_secs: int = 300, capacity: int = 10_000, memo: bool = True
    ) -> None:
        """Sets how plans are kept for paging.

        ``max_age_secs``: seconds a plan may be paged with (the plan's ``max_age_secs``,
        docs/plans.md);
        ``capacity``: how many plans are kept (least recently used dropped first; at least one);
        ``memo``: reuse the filters of an earlier plan whose principal, action, resource type,
        context, principal's entities and policies are all unchanged (never its ``qid``); off,
        every plan runs partial evaluation.
        """

    def configure_checks(self, prune_slices: bool = True) -> None:
        """Sets how checks gather entities.

        ``prune_slices``: a check's entity slice holds, of the entities its principal's,
        resource's, agent's and work item's attributes reference, only those in attributes some
        policy that can apply reads through (``.``, ``has``, tags, left of ``in``); off, all of
        them (one hop). Decisions are identical either way (property-tested); off exists for
        tests and benchmarks. Default on.
        """

    def search_subjects(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """AuthZEN subject search: who may do ``action`` on ``resource`` (docs/search.md).

        ``request`` is the body of ``POST /access/v1/search/subject``: ``subject``
        (``{"type"}`` only), ``action`` (``{"name"}``), ``resource`` (``{"type", "id"}``),
        optional ``context`` and ``page`` (``{"token", "limit"}``). Returns that route's answer:
        ``results`` (``[{"type", "id"}]``, allowed, ascending id), ``page``
        (``{"next_token", "count"}``, ``next_token`` ``""`` on the last page) and ``context``
        (``qid``, ``method``, ``mode``, ``challenges``: ``[{"type", "id", "challenges"}]``).
        Found with a plan made with the principal unknown, evaluated on each principal's
        row; rows it cannot decide are checked one by one. The GIL is released while
        searching.

        Raises:
            RequestError: ``field`` names the AuthZEN field (``subject.type``,
                ``action.name``, ``page.limit``, ...); ``page.token`` when the token belongs to
                another request or the policies or entities changed since the first page.

        """

    def search_resources(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """AuthZEN resource search: the resources the subject may do ``action`` on.

        Which resources of ``resource.type`` (docs/search.md).

        ``request``: ``subject`` (``{"type", "id"}``), ``action``, ``resource``
        (``{"type"}`` only), optional ``context`` and ``page``. Returns the answer of
        ``POST /access/v1/search/resource`` (as ``search_subjects``). Found with the query
        plan (docs/plans.md) evaluated on the stored rows; rows the plan cannot decide are
        checked one by one.

        Raises:
            RequestError: as ``search_subjects``.

        """

    def search_actions(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """AuthZEN action search: what the subject may do to the resource (docs/search.md).

        The actions are the schema's actions for the subject's and resource's types.

        ``request``: ``subject`` and ``resource`` (``{"type", "id"}``), optional ``context``
        and ``page``; no ``action``. Returns the answer of ``POST /access/v1/search/action``
        with ``results`` ``[{"name"}]`` in ascending name order.

        Raises:
            RequestError: as ``search_subjects``; ``request`` when the bundle has no schema.

        """

    def configure_search(self, max_limit: int = 1000, subject_plans: bool = True) -> None:
        """Sets the largest ``page.limit`` a search takes, and how subject search is answered.

        ``max_limit``: at least 1; larger limits are lowered to it. A request without
        ``page.limit`` gets pages of 100, or of ``max_limit`` when that is smaller.

        ``subject_plans``: with it on (the default), subject search evaluates a plan made with
        the principal unknown on each principal's row (``context.method`` ``plan``); off, it
        checks every principal (``checks``). Results are the same; off is for measuring
        (docs/search.md).
        """

    @property
    def plans_cached(self) -> int:
        """Number of plans currently kept for paging."""

    def decide(self, request: Mapping[str, Any]) -> DecisionRecord:
        """Decides one check; returns the decision-log record (docs/history.md#schema).

        The record is a ``DecisionRecord`` (``svc.pdp.shapes``): ``qid``, ``at`` (RFC 3339
        UTC, ms), ``principal``, ``on_behalf_of``, ``action``, ``resource``, ``verdict``,
        ``challenges``, ``policies``, ``on_behalf_of_outcome``, ``mode``, ``challenge_qid``,
        ``work_item``, ``assigned``, ``risk_score``, ``policy_version``,
        ``principals_version``, ``latency_us``, ``not_in_directory``, ``inline_ignored`` and
        ``pdp`` (``in-process``).

        Raises:
            RequestError: as ``evaluate``.

        """

    def evaluate_many(self, requests: list[_Request]) -> list[Decision]:
        """Decides a batch in one call; returns the responses (each a ``Decision``) in order.

        Decisions run with the GIL released, the only parts that hold it being reading each
        request dict and building each response dict. Batches of 64 or more are pipelined over
        the machine's cores in chunks of 16 requests: helper threads decide a chunk as soon as
        it is read, while the calling thread reads the rest and then builds responses (deciding
        a chunk itself whenever the next one is not ready). A decision that panics is reported
        as its request's ``RequestError``.

        Raises:
            RequestError: for the first request (by index) that fails to parse or to decide,
                with ``field`` prefixed ``requests[i].``; no response is returned.
            TypeError: ``requests`` is not a list.

        """

    def upsert_entities(self, entities: Sequence[Mapping[str, Any]]) -> int:
        """Inserts or replaces entities, all or nothing; returns how many.

        Raises:
            RequestError: ``entities[i]`` is malformed, of an undeclared type, breaks the schema,
                or repeats a uid; nothing is stored.

        """

    def replace_entities(self, entities: Sequence[Mapping[str, Any]]) -> int:
        """Replaces the whole entity store atomically (a snapshot); returns how many.

        Raises:
            RequestError: as ``upsert_entities``; the previous snapshot stays.

        """

    def remove_entities(self, uids: Sequence[_Ref]) -> int:
        """Removes entities; returns how many were present.

        Raises:
            RequestError: a reference is malformed; nothing is removed.

        """

    def register_service_accounts(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Registers service accounts; returns how many.

        Records are ``{id, owner, ai, groups, description, app?}``
        (docs/architecture.md#entities-and-the-base-schema); ``app`` defaults
        to the id up to its first dot.

        Raises:
            RequestError: a record is malformed; nothing is registered.

        """

    def unregister_service_accounts(self, ids: Sequence[str]) -> int:
        """Retires service accounts: they are denied everything (``svc:unregistered``)."""

    def upsert_work_items(self, items: Sequence[Mapping[str, Any]]) -> int:
        """Inserts or replaces work items ``{id, status: "open"|"closed", links: [ref], attrs?}``.

        Raises:
            RequestError: an item is malformed; nothing is stored.

        """

    def remove_work_items(self, ids: Sequence[str]) -> int:
        """Removes work items; returns how many were present."""

    def set_containments(self, principals: Sequence[_Ref]) -> int:
        """Replaces the containment list; returns its size.

        Raises:
            RequestError: a reference is malformed; the list is unchanged.

        """

    def contain(self, principals: Sequence[_Ref]) -> int:
        """Adds principals to the containment list; returns its size.

        Raises:
            RequestError: a reference is malformed; nothing changes.

        """

    def lift(self, principals: Sequence[_Ref]) -> int:
        """Removes principals from the containment list; returns its size.

        Raises:
            RequestError: a reference is malformed; nothing changes.

        """

    def set_risk_scores(self, scores: Sequence[Mapping[str, Any]], replace: bool = False) -> int:
        """Sets reasoner scores ``[{"principal": ref, "score": 0..100}]``; returns how many held.

        Raises:
            RequestError: an entry is malformed or its score is outside 0..100.

        """

    def set_mode(self, mode: Literal["monitor", "enforce"] | str) -> None:
        """Sets the mode reported with every decision (never applied by the engine).

        Raises:
            RequestError: the mode is neither ``monitor`` nor ``enforce``.

        """

    @property
    def mode(self) -> str:
        """``"monitor"`` or ``"enforce"``."""

    @property
    def versions(self) -> dict[str, int]:
        """``policy_version``, ``principals_version``, ``resources_version``."""

    @property
    def policy_names(self) -> list[str]:
        """Names of every static and linked policy, sorted."""

    @property
    def warnings(self) -> list[str]:
        """Problems that did not stop the bundle from loading (entities breaking the schema)."""

    @property
    def store_size(self) -> int:
        """Number of entities in the store (bundle entities not counted)."""

@final
class Server:
    """The decision point's listener (docs/api.md, docs/architecture.md#rust-and-python).

    gRPC ``svc.authz.v1.Authorizer`` and the HTTP decision API, AuthZEN 1.0 and ``/healthz``,
    ``/readyz``, ``/version``, ``/metrics`` on one port. Runs on its own Tokio runtime;
    requests never take the GIL.

    Args:
        engine: the engine every request is decided with (shared, not copied: bundle and store
            updates on it are seen by the next request).
        host: address to bind.
        port: port to bind; 0 picks a free one (read it back from ``port``).
        max_body_bytes: largest request body (HTTP) or message (gRPC); larger get 413 /
            ``RESOURCE_EXHAUSTED``.
        workers: Tokio worker threads; 0 means one per core.
        public_url: base URL published by ``/.well-known/authzen-configuration``; by default
            it is derived from the request's ``Host`` header.
        version: release reported by ``/version`` (default: the extension's version).
        noop_routes: also serve the benchmark ceiling (``POST /v1/noop`` and gRPC
            ``svc.authz.v1.NoopAuthorizer``), which parse a request and answer a fixed allow.
        decision_log: where every decision's and plan's record goes
            (docs/architecture.md#how-records-flow); ``None`` logs nothing.
        pdp_name: this decision point's name in records (``pdp``; default ``svc-pdp``).
        max_batch_items: most evaluations one AuthZEN ``evaluations`` request may carry; more
            is a 400 naming the limit (docs/api.md, "Limits").
        auth_issuer: when set, every route but ``/healthz``, ``/readyz``, ``/version``,
            ``/metrics``, AuthZEN discovery and gRPC health needs ``Authorization: Bearer``
            with a JWT of this issuer (``iss``), signed RS256/ES256 by a key loaded with
            ``set_jwks`` (docs/auth.md); ``None`` serves everyone.
        auth_audience: the ``aud`` tokens must name.
        auth_callers: the ``sub`` values allowed to call (others get 403 /
            ``PERMISSION_DENIED``); must not be empty with ``auth_issuer``.
        auth_leeway_secs: clock skew allowed on ``exp`` and ``nbf``, in seconds.
        auth_cache_entries: verified tokens kept in the LRU cache (0 verifies every request).
        auth_cache_ttl_secs: longest trust in a cached verification, in seconds (a token's
            ``exp`` ends it sooner; a new JWKS drops every entry).
        await_principals: the principals come from a feed the control plane loads (the
            context service, docs/context.md): the ``principals`` readiness flag starts unset
            and ``/readyz`` answers 503 until ``set_ready(principals=True)``. Otherwise that
            flag is set at start.

    Raises:
        ValueError: ``auth_issuer`` with an empty issuer, audience or caller list.

    """

    def __new__(
        cls,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 8080,
        max_body_bytes: int = 1_048_576,
        workers: int = 0,
        public_url: str | None = None,
        version: str | None = None,
        noop_routes: bool = False,
        decision_log: DecisionLog | None = None,
        pdp_name: str | None = None,
        max_batch_items: int = 1_000,
        auth_issuer: str | None = None,
        auth_audience: str = "svc-pdp",
        auth_callers: list[str] = ...,
        auth_leeway_secs: int = 30,
        auth_cache_entries: int = 10_000,
        auth_cache_ttl_secs: int = 60,
        await_principals: bool = False,
    ) -> Server: ...
    def set_jwks(self, jwks: str) -> int:
        """Loads the issuer's keys (a JWK Set document as JSON text, RFC 7517 section 5).

        Replaces the keys in force and drops every cached verification; works before and after
        ``start()``. Keys that cannot verify RS256 or ES256 (P-256) are skipped.

        Returns:
            How many keys were taken.

        Raises:
            ValueError: the text is not a JWK Set or holds no usable key (the keys in force
                stay).
            RuntimeError: the server was made without ``auth_issuer``.

        """

    @property
    def auth_enabled(self) -> bool:
        """Whether every route but the probes needs a bearer token (``auth_issuer`` set)."""

    def start(self) -> int:
        """Binds and starts serving; returns the bound port.

        Raises:
            OSError: the address cannot be bound (for example the port is taken).
            RuntimeError: the server is already running.

        """

    def stop(self, grace_secs: float = 5.0) -> None:
        """Stops accepting, lets requests in flight finish (up to ``grace_secs``), and stops."""

    @property
    def port(self) -> int | None:
        """The bound port, or ``None`` when not running."""

    @property
    def running(self) -> bool:
        """Whether the server is running."""

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` answers ready.

        Ready: a bundle, the containment list and the principals loaded, and no followed feed
        stale.
        """

    def set_ready(
        self,
        bundle: bool | None = None,
        containments: bool | None = None,
        principals: bool | None = None,
    ) -> None:
        """Sets the readiness flags behind ``/readyz`` and gRPC health; ``None`` keeps one.

        Ready when all three are set; ``principals`` starts set unless the server was made
        with ``await_principals=True`` (docs/context.md).

        Raises:
            RuntimeError: the server is not running.

        """

    def set_resource_source(
        self,
        fetch: Callable[[list[tuple[str, str]], list[str]], tuple[list[tuple[str, str]], list[str]]]
        | None,
        timeout_ms: int = 200,
        max_absent: int = 100_000,
        load_type: Callable[[str], None] | None = None,
        load_timeout_ms: int = 30_000,
    ) -> None:
        """Installs the source of resources and work items checks name and the engine lacks.

        See docs/context.md#the-decision-point-following-it. Before a check (HTTP, AuthZEN,
        gRPC; an AuthZEN batch's misses together) whose resource (or work item) neither the
        store nor the bundle holds is decided, ``fetch(resources, work_items)`` is called from a
        worker thread with the GIL: ``resources`` are ``(type, id)`` pairs, ``work_items`` ids.
        It writes what it finds into the engine and returns the ``(resources, work_items)`` it
        does not know; those are not asked for again (at most ``max_absent`` remembered, least
        recently asked dropped first) until ``forget_absent`` names them. One id is fetched by
        one request at a time; others wait for it. A call that raises or takes longer than
        ``timeout_ms`` lets the checks be decided without it (counted in
        ``svc_pdp_resource_fetches_total{outcome}``). ``None`` removes the source.

        ``load_type(type)``, when given, reads every resource of the type into the engine and
        keeps the type whole, returning once it is (at once when it already is). An AuthZEN
        resource search calls it first, so its candidates are all the type's resources
        (docs/search.md); when it raises or takes longer than ``load_timeout_ms`` the search
        answers 503. Without it, resource search sees what the engine holds.

        Raises:
            RuntimeError: the server is not running.

        """

    def forget_absent(self, resources: list[tuple[str, str]], work_items: list[str] = ...) -> None:
        """Forgets that these resources (``(type, id)`` pairs) and work items are absent.

        The change feed named them, so they may exist now; the next check naming one fetches
        it. Pairs that are not entity references are skipped; no effect without a source.

        Raises:
            RuntimeError: the server is not running.

        """

    def set_challenge_source(
        self,
        source: ChallengeSource | None,
        timeout_ms: int = 2_000,
        max_entries: int = 100_000,
    ) -> None:
        """Installs the challenge service (docs/challenges.md#the-decision-point).

        ``source`` has ``resolve``, ``get`` and ``follow``
        (``svc.pdp.challenge_client.ChallengeSource``), each called from a worker thread
        with the GIL. ``resolve(principal, on_behalf_of, action, resource, challenges,
        decision_qid)`` is called on a ``challenge`` verdict in enforce mode (entity references
        as ``(type, id)`` pairs, ``on_behalf_of`` possibly ``None``, the sorted kinds) and
        returns ``(qid, state, expires_at_ms, grant_expires_at_ms, pending)``: ``state`` is
        ``pending``, ``passed``, ``rejected`` or ``expired``, times are epoch milliseconds or
        ``None``, ``pending`` the kinds not answered yet. A passed challenge (grant live)
        turns the verdict into ``allow`` (``svc:challenge_passed`` in ``policies``), a
        rejected one into ``deny`` (``svc:challenge_rejected``); the answer and the decision
        record carry ``challenge_qid``. ``get(qid, principal, on_behalf_of)`` answers a wait
        for a challenge the listener does not hold yet: the same tuple, or ``None`` when the
        service does not know it for them (the wait answers NOT_FOUND).
        ``follow(qid, principal, on_behalf_of)`` is called once per pending challenge when its
        first wait starts; it must return at once and push the challenge's changes with
        ``challenge_changed``. A call that raises or takes longer than ``timeout_ms`` leaves
        the verdict ``challenge`` without a qid (a wait answers 503), counted in
        ``svc_pdp_challenge_calls_total{outcome}``. At most ``max_entries`` challenges are
        held. ``None`` removes the source: verdicts carry no qid and waits answer 503. A
        wait whose principal or on_behalf_of the engine holds contained answers ``rejected``
        at once (see ``containments_changed``).

        Raises:
            RuntimeError: the server is not running.

        """

    def challenge_changed(
        self,
        qid: str,
        state: str,
        expires_at_ms: int | None = None,
        grant_expires_at_ms: int | None = None,
        pending: list[str] = ...,
    ) -> bool:
        """Pushes a change of challenge ``qid``, waking its waits at once.

        ``state`` is ``pending``, ``passed``, ``rejected`` or ``expired``; times are epoch
        milliseconds; ``pending`` the kinds not answered yet. Returns whether the listener
        holds that challenge (a change of another is ignored).

        Raises:
            ValueError: an unknown state.
            RuntimeError: the server is not running, or has no challenge source.

        """

    def containments_changed(self) -> int:
        """Tells the listener the engine's containment list changed.

        Every held challenge wait looks again; the waits of a principal (or on_behalf_of)
        now contained answer ``rejected`` at once (docs/challenges.md). Call it after
        ``Engine.contain``, ``lift`` or ``set_containments``. Returns how many held
        challenges belong to a contained principal or on_behalf_of now (0 without a
        challenge source).

        Raises:
            RuntimeError: the server is not running.

        """

    @property
    def challenges_held(self) -> int:
        """How many challenges the listener holds (0 without a challenge source)."""

    def bundle_reloaded(self, error: str | None = None) -> None:
        """Records a bundle reload: ``None`` for success, else the error text.

        ``/readyz`` shows the error (the previous bundle keeps serving) and the
        ``svc_pdp_bundle_error`` metric reports it until a good reload.

        Raises:
            RuntimeError: the server is not running.

        """

    def follow_feed(self, feed: str, max_staleness_secs: float) -> None:
        """Starts following `feed` (docs/api.md#readiness-and-feeds; ``svc.pdp.feeds``).

        From now on ``/readyz`` answers 503 naming `feed`, its last success and its last error
        once it has had no successful sync (``feed_synced``) for longer than
        `max_staleness_secs` (counted from this call while it never synced), and
        ``svc_pdp_feed_*{feed}`` report it. Calling it again restarts the feed.

        Raises:
            ValueError: the name is empty or over 64 bytes, or the bound is not a finite
                number above 0.
            RuntimeError: the server is not running.

        """

    def unfollow_feed(self, feed: str) -> None:
        """Stops following `feed`; an unknown name is ignored.

        The feed no longer counts for readiness, and its series leave ``/metrics``.

        Raises:
            RuntimeError: the server is not running.

        """

    def feed_synced(self, feed: str, version: int | None = None) -> bool:
        """Records a successful sync of `feed` now, and the `version` it applied.

        `version` None keeps the last one. Returns False when `feed` is not followed (nothing
        recorded).

        Raises:
            RuntimeError: the server is not running.
            OverflowError: `version` is negative.

        """

    def feed_failed(self, feed: str, error: str) -> bool:
        """Records a failure of `feed`, counted in ``svc_pdp_feed_errors_total``.

        `error` is cut to 300 bytes on ``/readyz``. Returns False when `feed` is not followed.

        Raises:
            RuntimeError: the server is not running.

        """

    @property
    def feeds(self) -> list[dict[str, Any]]:
        """The followed feeds as ``/readyz`` sees them now, by name.

        Each: ``feed``, ``age_secs``, ``max_staleness_secs``, ``stale``, ``last_success_ms``,
        ``last_error``, ``errors``, ``version``. Empty when the server is not running.
        """

@final
class LogBatch:
    """A batch read from a ``DecisionLog``; pass it to ``ack`` once the broker has all of it."""

@final
class DecisionLog:
    """The decision log's spool on disk and its group-commit writer.

    See docs/architecture.md#how-records-flow and docs/history.md#durability-of-the-decision-log.

    The server pushes one record per decision; a writer thread appends what arrived to the
    spool (a write-ahead log) every ``commit_ms``, and the shipper (``svc.pdp.decision_log``)
    reads written records in spool order and acknowledges each batch once the broker has it.
    A kill of the process loses at most the records of the last commit window; in durable mode
    a push returns only once its record is written. Nothing is dropped unless the
    unacknowledged spool is full, and then it is counted. See docs/history.md, "Durability of
    the decision log".

    Args:
        spool_dir: directory of the spool (created if missing; its contents survive restarts).
        queue_bound: records held in memory for one group commit; when reached, the commit
            starts at once and further pushes wait for it.
        spool_max_bytes: largest spool not yet acknowledged, in bytes; records past it are
            dropped and counted.
        segment_bytes: size of one spool segment file.
        commit_ms: group-commit window in milliseconds, 0 (write as soon as a record arrives)
            to 1000; window mode only (durable mode writes as soon as the writer is free).
        fsync: ``fdatasync`` the spool after every group commit (covers power loss).
        durability: ``window`` (``push`` returns at once) or ``durable`` (``push`` returns
            once the record is written).

    Raises:
        ValueError: ``commit_ms`` is over 1000 or ``durability`` is neither ``window`` nor
            ``durable`` (the message names the setting).
        OSError: the spool directory cannot be created or read.

    """

    def __new__(
        cls,
        spool_dir: str | PathLike[str],
        queue_bound: int = 100_000,
        spool_max_bytes: int = 1_073_741_824,
        segment_bytes: int = 16_777_216,
        commit_ms: int = 5,
        fsync: bool = False,
        durability: str = "window",
    ) -> DecisionLog: ...
    def push(self, key: bytes, value: bytes) -> None:
        """Queues one record (key: principal ``Type::id``; value: the record JSON).

        In durable mode, returns once the record is written (the GIL released meanwhile).

        Raises:
            OSError: durable mode only: the record was dropped (spool full or unwritable).

        """

    def flush(self) -> None:
        """Writes what waits in memory now; returns once it is written."""

    def close(self) -> None:
        """Writes what waits in memory, stops the writer thread and saves the cursor.

        Later pushes are written at once by their caller. Calling it twice is harmless.

        Raises:
            OSError: the cursor file cannot be written.

        """

    def read(
        self, max: int = 5000, timeout: float = 0.1
    ) -> tuple[list[tuple[bytes, bytes]], LogBatch]:
        """Reads up to ``max`` written records in spool order, waiting up to ``timeout`` s.

        Returns ``([(key, value), ...], batch)``; the list is empty when nothing was written
        in time.

        Raises:
            OSError: a spool segment cannot be read.

        """

    def ack(self, batch: LogBatch) -> None:
        """Records that the broker acknowledged all of ``batch``; twice is harmless.

        The cursor moves past it once every batch read before it is acknowledged too.

        Raises:
            OSError: the cursor file cannot be written.

        """

    def rewind(self) -> None:
        """Forgets the batches in flight; the next ``read`` starts again at the cursor."""

    @property
    def commit_ms(self) -> int:
        """The group-commit window in force, in milliseconds (0 in durable mode)."""

    @property
    def durability(self) -> str:
        """``window`` or ``durable``."""

    @property
    def fsync(self) -> bool:
        """Whether every group commit is fsynced."""

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``pushed``, ``queued_now`` (in memory, not yet written), ``spooled``.

        Also ``sent`` (acknowledged by the broker), ``replayed`` (of ``sent``, written by an
        earlier run), ``dropped``, ``spool_pending`` and ``spool_pending_bytes`` (written, not
        yet acknowledged), ``commits`` (group commits) and ``io_errors``.
        """
