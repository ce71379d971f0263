//! HTTP routes of the decision point (docs/api.md#http-routes), the OpenID AuthZEN Authorization
//! API 1.0 (<https://openid.net/specs/authorization-api-1_0.html>), and the four routes every
//! component serves (docs/architecture.md#what-every-component-serves). Every error is an
//! RFC 9457 problem details document (`application/problem+json`) naming what was wrong;
//! nothing a client sends gets a 5xx.
//! The routes and their shapes are documented in docs/api.md.

use crate::challenges::{State as ChallengeState, Status, WaitError};
use crate::clock::now_ms;
use crate::metrics::Transport;
use crate::problem::{has_h1_body, Problem};
use crate::shared::{FeedReport, Shared};
use crate::waits::{challenge_wait, wait_for_challenge, WaitRefused};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::future::join_all;
use pdp_core::decision::rfc3339_ms;
use pdp_core::request::BodyError;
use pdp_core::search::{SearchError, SearchKind};
use pdp_core::{CheckRequest, Decision, EntityUid, Mode, PlanRequest, RequestError, Verdict};
use serde_json::{json, Map, Value};
use std::sync::Arc;

type St = State<Arc<Shared>>;

/// `X-Request-ID`: the caller's, when it is a valid one ([`valid_request_id`]), else a fresh
/// UUIDv7; set on every response.
static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest `X-Request-ID` taken from a caller, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

/// Whether a caller's `X-Request-ID` is taken as it is: 1 to [`MAX_REQUEST_ID`] characters of
/// `A-Z a-z 0-9 . _ : -` (UUIDs, ULIDs, trace ids and the like). Anything else (control
/// characters, spaces, quotes, over-long values) is replaced, so a request id is safe to log
/// and to echo. Every svc component applies the same rule (docs/api.md, "Request ids").
pub fn valid_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_REQUEST_ID
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A `200` JSON response of `v` (a JSON value or one of the decision model's views, whose
/// serialisation cannot fail: every map key is a string).
fn json_ok(v: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (
        StatusCode::OK,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

/// Builds the whole router: the gRPC routes of `grpc` plus every HTTP route, a fallback that
/// answers unknown paths with 404 problems (gRPC calls with UNIMPLEMENTED), and the middleware
/// that echoes `X-Request-ID` and counts refused requests.
pub fn router(shared: Arc<Shared>, grpc: Router) -> Router {
    let mut http = Router::new()
        .route("/v1/access/evaluation", post(evaluation))
        .route("/v1/access/plan", post(plan))
        .route("/v1/access/challenge", post(challenge))
        .route("/access/v1/evaluation", post(authzen_evaluation))
        .route("/access/v1/evaluations", post(authzen_evaluations))
        .route("/access/v1/search/subject", post(search_subject))
        .route("/access/v1/search/resource", post(search_resource))
        .route("/access/v1/search/action", post(search_action))
        .route(
            "/.well-known/authzen-configuration",
            get(authzen_configuration),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .route("/metrics", get(metrics));
    if shared.config.noop_routes {
        http = http.route("/v1/noop", post(noop));
    }
    let http = http
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared.clone());
    let app = grpc.merge(http).fallback(not_found);
    // Bearer tokens (docs/auth.md) inside `around`, so refusals are counted and echo the id.
    crate::auth::guard(app, shared.config.auth.clone())
        .layer(middleware::from_fn_with_state(shared, around))
}

/// Echoes `X-Request-ID` and counts every 4xx/5xx in `svc_pdp_requests_rejected_total`.
///
/// An HTTP/1 request answered 404, 405, 413 or 415 had its body left unread; hyper then closes
/// the connection (it drains only a small rest), so the answer says `Connection: close`: without
/// it a keep-alive client would send its next request into the closing connection and fail.
async fn around(State(s): St, req: Request, next: Next) -> Response {
    let rid = req
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| valid_request_id(v.as_bytes()))
        .cloned()
        .or_else(|| HeaderValue::from_str(&uuid::Uuid::now_v7().to_string()).ok());
    let h1_body = has_h1_body(&req);
    let mut resp = next.run(req).await;
    let status = resp.status();
    if status.is_client_error() || status.is_server_error() {
        s.metrics.rejected(status.as_u16());
    }
    if h1_body && matches!(status.as_u16(), 404 | 405 | 413 | 415) {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(v) = rid {
        resp.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    resp
}

async fn not_found(req: Request) -> Response {
    let grpc = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unimplemented(format!("no gRPC method at `{}`", req.uri().path()))
            .into_http();
    }
    Problem::new(
        StatusCode::NOT_FOUND,
        "not-found",
        "No such route",
        format!(
            "no route at `{}`; the decision API is POST /v1/access/evaluation, /v1/access/plan, /v1/access/challenge and AuthZEN's POST /access/v1/evaluation(s)",
            req.uri().path()
        ),
    )
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        format!("`{}` does not take {}", req.uri().path(), req.method()),
    )
    .into_response()
}

/// Reads a JSON request body: checks `Content-Type` (JSON or none), the size limit, and parses
/// it, naming line and column of a syntax error.
///
/// # Errors
/// `415` for a non-JSON content type, `413` past `max_body_bytes`, `400` for an unreadable,
/// empty or malformed body.
pub async fn read_json(s: &Shared, headers: &HeaderMap, body: Body) -> Result<Value, Problem> {
    parse_json(&read_body(s, headers, body).await?)
}

/// Reads a JSON request body's bytes, checking `Content-Type` (JSON or none), the size limit
/// and that it is not empty, but not parsing it ([`read_json`] does).
///
/// # Errors
/// As [`read_json`], but for a malformed body.
pub async fn read_body(s: &Shared, headers: &HeaderMap, body: Body) -> Result<Bytes, Problem> {
    if let Some(ct) = headers.get(CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or("").trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "The body must be JSON",
                format!(
                    "`Content-Type: {essence}` is not JSON; send `Content-Type: application/json`"
                ),
            ));
        }
    }
    let limit = s.config.max_body_bytes;
    let too_big = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "The body is too large",
            format!("the body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_big());
    }
    let bytes: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let length_limit = std::error::Error::source(&e)
                .is_some_and(|src| src.is::<http_body_util::LengthLimitError>());
            return Err(if length_limit {
                too_big()
            } else {
                Problem::new(
                    StatusCode::BAD_REQUEST,
                    "unreadable-body",
                    "The body could not be read",
                    format!("the body could not be read: {e}"),
                )
            });
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "The body is not valid JSON",
            "the body is empty; expected a JSON object",
        ));
    }
    Ok(bytes)
}

/// Parses a JSON document from bytes.
///
/// # Errors
/// `400 malformed-json` naming the line, column and what the parser expected.
pub fn parse_json(bytes: &[u8]) -> Result<Value, Problem> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "The body is not valid JSON",
            "the body is empty; expected a JSON object",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| malformed(&e))
}

/// `400 malformed-json` for a JSON syntax error, naming its line and column.
fn malformed(e: &serde_json::Error) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "malformed-json",
        "The body is not valid JSON",
        format!(
            "malformed JSON at line {} column {}: {e}",
            e.line(),
            e.column()
        ),
    )
}

/// The problem for a check or plan body that could not be read
/// (`pdp_core::request::BodyError`): `400 malformed-json` or the request error's problem.
fn body_problem(e: &BodyError) -> Problem {
    match e {
        BodyError::Json(e) => malformed(e),
        BodyError::Request(e) => Problem::request(e),
    }
}

async fn evaluation(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    let bytes = read_body(&s, &headers, body).await?;
    let req = CheckRequest::from_slice(&bytes).map_err(|e| body_problem(&e))?;
    s.ensure_resources(&[&req.resource], req.work_item_id.as_deref().as_slice())
        .await;
    let mut d = s.engine.decide(&req).map_err(|e| Problem::request(&e))?;
    let challenge_qid = s.resolve_challenge(&mut d).await;
    s.decided(&d, Transport::Http, challenge_qid.as_deref())
        .written()
        .await?;
    Ok(json_ok(&CheckAnswer {
        base: d.response(),
        challenge_qid: challenge_qid.as_deref(),
    }))
}

/// The answer of `POST /v1/access/evaluation`: the check response
/// ([`pdp_core::decision::CheckResponse`]) plus `challenge_qid` when a `challenge` verdict was
/// resolved by the challenge service (left out otherwise, docs/api.md#http-routes).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckAnswer<'a> {
    /// `qid`, `verdict`, `challenges`, `policies`, `on_behalf_of`, `mode`.
    #[serde(flatten)]
    pub base: pdp_core::decision::CheckResponse<'a>,
    /// The challenge to pass before retrying; left out when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge_qid: Option<&'a str>,
}

async fn plan(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    let bytes = read_body(&s, &headers, body).await?;
    let req = PlanRequest::from_slice(&bytes).map_err(|e| body_problem(&e))?;
    let p = s.engine.plan(&req).map_err(|e| Problem::request(&e))?;
    s.planned(&p, Transport::Http).written().await?;
    Ok(json_ok(&p.response()))
}

/// The answer of a challenge wait (docs/api.md#challenge-waits): `outcome` (`pending`,
/// `passed`, `rejected`, `expired`), `expires_at` and `grant_expires_at` (RFC 3339 or
/// `null`), `retry` (whether retrying the check now gets another answer) and `pending` (the
/// kinds not answered yet, when known).
pub fn wait_answer(qid: &str, st: &Status) -> Value {
    let now = now_ms();
    let t = |ms: Option<u64>| ms.map(pdp_core::decision::rfc3339_ms);
    json!({
        "challenge_qid": qid,
        "outcome": st.state.as_str(),
        "expires_at": t(st.expires_at_ms),
        "grant_expires_at": t(st.grant_expires_at_ms),
        "retry": st.retry(now),
        "pending": if st.state == ChallengeState::Pending { st.pending.clone() } else { Vec::new() },
    })
}

async fn challenge(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    let v = read_json(&s, &headers, body).await?;
    let w = challenge_wait(&v).map_err(|e| Problem::request(&e))?;
    match wait_for_challenge(&s, &w).await {
        Ok(st) => Ok(json_ok(&wait_answer(&w.challenge_qid, &st))),
        Err(e) => {
            let retry_after = match &e {
                WaitRefused::NoService => Some("30"),
                WaitRefused::Wait(WaitError::Unavailable(_)) => Some("1"),
                WaitRefused::Wait(_) => None,
            };
            let mut resp = Problem::from(e).into_response();
            if let Some(r) = retry_after {
                resp.headers_mut()
                    .insert("retry-after", HeaderValue::from_static(r));
            }
            Ok(resp)
        }
    }
}

async fn noop(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    let v = read_json(&s, &headers, body).await?;
    let _ = v.as_object();
    Ok(json_ok(&json!({
        "qid": "00000000-0000-7000-8000-000000000000",
        "verdict": "allow",
        "challenges": [],
        "policies": ["noop"],
        "mode": "enforce",
    })))
}

// ---------------------------------------------------------------- AuthZEN 1.0

/// Maps AuthZEN field paths back from the engine's: `principal` is AuthZEN's `subject`, the
/// action is `action.name`, inline entity `i` is the subject's or resource's `properties`.
fn authzen_field(field: &str, entity_fields: &[&'static str]) -> String {
    if let Some(rest) = field.strip_prefix("principal") {
        return format!("subject{rest}");
    }
    if field == "action" {
        return "action.name".to_owned();
    }
    if let Some(rest) = field.strip_prefix("entities[") {
        let (idx, tail) = rest.split_once(']').unwrap_or((rest, ""));
        if let Some(name) = idx.parse::<usize>().ok().and_then(|i| entity_fields.get(i)) {
            return format!("{name}.properties{}", tail.replacen(".attrs", "", 1));
        }
    }
    field.to_owned()
}

/// An AuthZEN entity's `type`, `id` and `properties`.
type AuthzenEntity<'a> = (&'a str, &'a str, Option<&'a Map<String, Value>>);

/// One AuthZEN entity (`subject` or `resource`): `{type, id, properties?}`.
fn authzen_entity<'a>(
    v: Option<&'a Value>,
    field: &str,
) -> Result<AuthzenEntity<'a>, RequestError> {
    let obj = v
        .and_then(Value::as_object)
        .ok_or_else(|| RequestError::new(field, "is required: an object with `type` and `id`"))?;
    let ty = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| RequestError::new(format!("{field}.type"), "expected a string"))?;
    let id = obj
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RequestError::new(format!("{field}.id"), "expected a string"))?;
    let props = match obj.get("properties") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => {
            return Err(RequestError::new(
                format!("{field}.properties"),
                "expected an object of attributes",
            ))
        }
    };
    Ok((ty, id, props))
}

/// The uid of an AuthZEN `resource` (`{type, id}`), for fetching it when the engine lacks it
/// (`crate::resources`); `None` when it is malformed (the check reports that).
fn authzen_resource(v: Option<&Value>) -> Option<EntityUid> {
    let (ty, id, _) = authzen_entity(v, "resource").ok()?;
    pdp_core::request::uid_from_parts(ty, id, "resource").ok()
}

/// The inline entity for an AuthZEN entity with `properties`: those attributes and no
/// parents. Like every inline entity it describes, for one request, an entity the directory and
/// the store do not hold; for one they hold (and for every `Human`, `ServiceAccount` and
/// `Group`) the engine ignores it and the decision record names it (docs/api.md, "AuthZEN").
fn with_properties(ty: &str, id: &str, props: &Map<String, Value>) -> Value {
    json!({"uid": {"type": ty, "id": id}, "attrs": props, "parents": []})
}

/// Translates one AuthZEN evaluation (`subject`, `action`, `resource`, `context`) into the
/// engine's check request and decides it. Errors name AuthZEN's fields.
fn authzen_decide(
    s: &Shared,
    subject: Option<&Value>,
    action: Option<&Value>,
    resource: Option<&Value>,
    context: Option<&Value>,
) -> Result<Decision, RequestError> {
    let (sty, sid, sprops) = authzen_entity(subject, "subject")?;
    let (rty, rid, rprops) = authzen_entity(resource, "resource")?;
    let name = action
        .and_then(Value::as_object)
        .and_then(|a| a.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| RequestError::new("action.name", "is required: the action's name"))?;
    let mut entities = Vec::new();
    let mut entity_fields = Vec::new();
    if let Some(p) = sprops {
        entities.push(with_properties(sty, sid, p));
        entity_fields.push("subject");
    }
    if let Some(p) = rprops {
        entities.push(with_properties(rty, rid, p));
        entity_fields.push("resource");
    }
    let mut req = Map::new();
    req.insert("principal".into(), json!({"type": sty, "id": sid}));
    req.insert("action".into(), name.into());
    req.insert("resource".into(), json!({"type": rty, "id": rid}));
    match context {
        None | Some(Value::Null) => {}
        Some(c @ Value::Object(_)) => {
            req.insert("context".into(), c.clone());
        }
        Some(_) => return Err(RequestError::new("context", "expected an object")),
    }
    if !entities.is_empty() {
        req.insert("entities".into(), Value::Array(entities));
    }
    s.engine
        .decide_value(Value::Object(req))
        .map_err(|e| RequestError::new(authzen_field(&e.field, &entity_fields), e.message))
}

/// An AuthZEN evaluation's answer (AuthZEN 1.0 section 6.2), a view of a [`Decision`]: the
/// `decision` and, in `context`, the check response without `on_behalf_of`. Fields in the
/// order the JSON it replaces was written in.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuthzenResponse<'a> {
    /// Whether the caller may proceed (see [`authzen_response`]).
    pub decision: bool,
    /// The check's `qid`, `verdict`, `challenges`, `policies` and `mode`.
    pub context: AuthzenContext<'a>,
}

/// The `context` of an [`AuthzenResponse`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuthzenContext<'a> {
    /// The decision id.
    pub qid: &'a str,
    /// The combined verdict.
    pub verdict: Verdict,
    /// Every challenge that must be passed.
    pub challenges: &'a [String],
    /// The principal's deciding policies.
    pub policies: &'a [String],
    /// The mode in force.
    pub mode: Mode,
    /// The challenge to pass before retrying, when a challenge service resolved one; left
    /// out otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge_qid: Option<&'a str>,
}

/// AuthZEN's decision: `true` when the verdict is allow, or in monitor mode (which allows
/// whatever the verdict says, docs/architecture.md#monitor-and-enforce); the verdict itself is in
/// `context.verdict`, with `challenge_qid` when the challenge service resolved one.
pub fn authzen_response<'a>(
    d: &'a Decision,
    challenge_qid: Option<&'a str>,
) -> AuthzenResponse<'a> {
    AuthzenResponse {
        decision: d.verdict == Verdict::Allow || d.mode == Mode::Monitor,
        context: AuthzenContext {
            qid: &d.qid,
            verdict: d.verdict,
            challenges: &d.challenges,
            policies: &d.principal_outcome.policies,
            mode: d.mode,
            challenge_qid,
        },
    }
}

/// Refuses a member an AuthZEN evaluation does not have (a misspelt `context` must not be
/// decided as if it were absent).
fn unknown_authzen_member(o: &Map<String, Value>) -> Result<(), RequestError> {
    match o
        .keys()
        .find(|k| !["subject", "action", "resource", "context"].contains(&k.as_str()))
    {
        Some(k) => Err(RequestError::new(
            k.clone(),
            "unknown field; an AuthZEN evaluation has subject, action, resource, context",
        )),
        None => Ok(()),
    }
}

fn authzen_top(v: &Value) -> Result<&Map<String, Value>, Problem> {
    v.as_object()
        .ok_or_else(|| Problem::request(&RequestError::new("request", "expected a JSON object")))
}

async fn authzen_evaluation(
    State(s): St,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let v = read_json(&s, &headers, body).await?;
    let o = authzen_top(&v)?;
    unknown_authzen_member(o).map_err(|e| Problem::request(&e))?;
    authzen_single(&s, o).await
}

/// Decides one AuthZEN evaluation whose members are `o`'s and answers the single response.
async fn authzen_single(s: &Shared, o: &Map<String, Value>) -> Result<Response, Problem> {
    if let Some(uid) = authzen_resource(o.get("resource")) {
        s.ensure_resources(&[&uid], &[]).await;
    }
    let d = authzen_decide(
        s,
        o.get("subject"),
        o.get("action"),
        o.get("resource"),
        o.get("context"),
    )
    .map_err(|e| Problem::request(&e))?;
    let mut d = d;
    let challenge_qid = s.resolve_challenge(&mut d).await;
    s.decided(&d, Transport::Authzen, challenge_qid.as_deref())
        .written()
        .await?;
    Ok(json_ok(&authzen_response(&d, challenge_qid.as_deref())))
}

/// `evaluations_semantic` of AuthZEN 1.0 section 7.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Semantic {
    ExecuteAll,
    DenyOnFirstDeny,
    PermitOnFirstPermit,
}

async fn authzen_evaluations(
    State(s): St,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let v = read_json(&s, &headers, body).await?;
    let o = authzen_top(&v)?;
    for k in o.keys() {
        if ![
            "subject",
            "action",
            "resource",
            "context",
            "evaluations",
            "options",
        ]
        .contains(&k.as_str())
        {
            return Err(Problem::request(&RequestError::new(
                k.clone(),
                "unknown field; AuthZEN evaluations have subject, action, resource, context, evaluations, options",
            )));
        }
    }
    let semantic = match o
        .get("options")
        .and_then(|op| op.get("evaluations_semantic"))
    {
        None | Some(Value::Null) => Semantic::ExecuteAll,
        Some(Value::String(x)) if x == "execute_all" => Semantic::ExecuteAll,
        Some(Value::String(x)) if x == "deny_on_first_deny" => Semantic::DenyOnFirstDeny,
        Some(Value::String(x)) if x == "permit_on_first_permit" => Semantic::PermitOnFirstPermit,
        Some(other) => {
            return Err(Problem::request(&RequestError::new(
                "options.evaluations_semantic",
                format!(
                "`{other}` is not one of execute_all, deny_on_first_deny, permit_on_first_permit"
            ),
            )))
        }
    };
    if let Some(op) = o.get("options") {
        if !op.is_object() && !op.is_null() {
            return Err(Problem::request(&RequestError::new(
                "options",
                "expected an object",
            )));
        }
    }
    // A default of the wrong type is the request's fault, not each item's: one 400 naming it.
    for k in ["subject", "action", "resource", "context"] {
        if o.get(k).is_some_and(|d| !d.is_object() && !d.is_null()) {
            return Err(Problem::request(&RequestError::new(
                k,
                "expected an object",
            )));
        }
    }
    let items = match o.get("evaluations") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a),
        Some(_) => {
            return Err(Problem::request(&RequestError::new(
                "evaluations",
                "expected an array of evaluations",
            )))
        }
    };
    // Without `evaluations`, the request is a single evaluation (AuthZEN 1.0 section 7.1).
    let Some(items) = items else {
        return authzen_single(&s, o).await;
    };
    let max = s.config.max_batch_items;
    if items.len() > max {
        return Err(Problem::request(&RequestError::new(
            "evaluations",
            format!(
                "{} evaluations in one request: at most {max} are decided (limit `max_batch_items` = {max}); split the batch",
                items.len()
            ),
        )));
    }
    if s.resource_source().is_some() {
        // The misses of the whole batch are fetched together, before any is decided.
        let uids: Vec<EntityUid> = items
            .iter()
            .filter_map(|it| {
                let r = it
                    .get("resource")
                    .filter(|x| !x.is_null())
                    .or_else(|| o.get("resource"));
                authzen_resource(r)
            })
            .collect();
        let refs: Vec<&EntityUid> = uids.iter().collect();
        s.ensure_resources(&refs, &[]).await;
    }
    // Decide the items in order, up to the first that stops the batch (its semantic).
    let mut decided: Vec<Result<Decision, RequestError>> = Vec::with_capacity(items.len());
    let mut resolutions: Vec<Option<String>> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(it) = item.as_object() else {
            return Err(Problem::request(&RequestError::new(
                format!("evaluations[{i}]"),
                "expected an object",
            )));
        };
        let pick = |k: &str| it.get(k).filter(|x| !x.is_null()).or_else(|| o.get(k));
        let mut res = unknown_authzen_member(it).and_then(|()| {
            authzen_decide(
                &s,
                pick("subject"),
                pick("action"),
                pick("resource"),
                pick("context"),
            )
        });
        if semantic == Semantic::ExecuteAll {
            // Every item is decided; their challenges are resolved together below.
            decided.push(res);
            continue;
        }
        // Whether the batch goes on depends on this item's final verdict, which resolving its
        // challenge may change (passed: allow; rejected: deny): resolved now, in order.
        let challenge_qid = match &mut res {
            Ok(d) => s.resolve_challenge(d).await,
            Err(_) => None,
        };
        let allowed = res
            .as_ref()
            .is_ok_and(|d| authzen_response(d, None).decision);
        decided.push(res);
        resolutions.push(challenge_qid);
        let stop = match semantic {
            Semantic::DenyOnFirstDeny => !allowed,
            Semantic::PermitOnFirstPermit => allowed,
            Semantic::ExecuteAll => false,
        };
        if stop {
            break;
        }
    }
    if semantic == Semantic::ExecuteAll {
        // One challenge-service call per challenged item, all at once rather than one after
        // another (each may create a challenge, a round trip to its database).
        let pending = decided.iter_mut().filter_map(|r| r.as_mut().ok()).map(|d| {
            let s = &s;
            async move { s.resolve_challenge(d).await }
        });
        let mut done = join_all(pending).await.into_iter();
        resolutions = decided
            .iter()
            .map(|r| {
                if r.is_ok() {
                    done.next().flatten()
                } else {
                    None
                }
            })
            .collect();
    }
    let mut out = Vec::with_capacity(decided.len());
    let mut logged = Vec::new();
    for (res, challenge_qid) in decided.iter().zip(&resolutions) {
        out.push(match res {
            Ok(d) => {
                logged.push(s.decided(d, Transport::Authzen, challenge_qid.as_deref()));
                // A view of the decision model cannot fail to serialise (string keys only).
                serde_json::to_value(authzen_response(d, challenge_qid.as_deref()))
                    .unwrap_or_default()
            }
            // One bad evaluation does not fail the batch (AuthZEN 1.0 section 7.2): it is a
            // deny carrying the error.
            Err(e) => json!({
                "decision": false,
                "context": {"error": {"status": 400, "field": e.field, "message": e.to_string()}},
            }),
        });
    }
    for l in logged {
        l.written().await?;
    }
    Ok(json_ok(&json!({ "evaluations": out })))
}

// ---------------------------------------------------------------- AuthZEN 1.0 searches

/// The problem for a refused search: `400 invalid-request` naming the field, or
/// `410 search-restart` when its page token was issued on policies or entities that have
/// changed since (docs/search.md#paging).
fn search_problem(e: &SearchError) -> Problem {
    match e {
        SearchError::Request(e) => Problem::request(e),
        SearchError::Stale => Problem {
            status: StatusCode::GONE,
            slug: "search-restart",
            title: "The search must start again",
            detail: pdp_core::search::STALE_MESSAGE.to_owned(),
            field: Some("page.token".to_owned()),
        },
    }
}

/// One AuthZEN search (`POST /access/v1/search/<kind>`, docs/search.md): when a resource
/// source is installed, fetches the known resource, or for a resource search has the source
/// read the whole type first (a 503 when it cannot); answers one page and writes one decision
/// record for it.
async fn search(
    s: &Shared,
    kind: SearchKind,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let v = read_json(s, headers, body).await?;
    if kind != SearchKind::Resource {
        if let Some(uid) = authzen_resource(v.get("resource")) {
            s.ensure_resources(&[&uid], &[]).await;
        }
    } else if let Some(f) = s.resource_source() {
        // The candidates are every resource of the type: the source's too (docs/search.md).
        let ty = v
            .get("resource")
            .and_then(|r| r.get("type"))
            .and_then(Value::as_str)
            .and_then(|t| s.engine.source_type(t));
        if let Some(ty) = ty {
            f.load_type(&ty.to_string()).await.map_err(|e| {
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "resources-unavailable",
                    "The resources of the type are not all held",
                    format!("{e}; the search would miss some, so it is not answered: retry"),
                )
            })?;
        }
    }
    let page = s
        .engine
        .search_json(kind, &v)
        .map_err(|e| search_problem(&e))?;
    s.searched(&page, Transport::Authzen).written().await?;
    Ok(json_ok(&page.to_response()))
}

async fn search_subject(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    search(&s, SearchKind::Subject, &headers, body).await
}

async fn search_resource(
    State(s): St,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    search(&s, SearchKind::Resource, &headers, body).await
}

async fn search_action(State(s): St, headers: HeaderMap, body: Body) -> Result<Response, Problem> {
    search(&s, SearchKind::Action, &headers, body).await
}

async fn authzen_configuration(State(s): St, headers: HeaderMap) -> Response {
    let base = match &s.config.public_url {
        Some(u) => u.clone(),
        // Without a configured public URL the base comes from `Host`, taken only when it is a
        // plain `host[:port]` (RFC 9110 section 7.2; RFC 3986 section 3.2.2 reg-name or IP
        // literal, no user info): nothing a client sends is echoed unchecked.
        None => match headers.get(HOST).map(|h| valid_host(h.as_bytes())) {
            Some(Some(host)) => format!("http://{host}"),
            Some(None) => {
                return Problem::new(
                    StatusCode::BAD_REQUEST,
                    "invalid-host",
                    "The Host header is not valid",
                    "`Host` must be `host[:port]` (letters, digits, `.` and `-`, or a bracketed IPv6 address); set `--public-url` to publish a fixed base URL",
                )
                .into_response()
            }
            None => format!("http://{}:{}", s.config.host, s.config.port),
        },
    };
    let base = base.trim_end_matches('/');
    let mut resp = json_ok(&json!({
        "policy_decision_point": base,
        "access_evaluation_endpoint": format!("{base}/access/v1/evaluation"),
        "access_evaluations_endpoint": format!("{base}/access/v1/evaluations"),
        "search_subject_endpoint": format!("{base}/access/v1/search/subject"),
        "search_resource_endpoint": format!("{base}/access/v1/search/resource"),
        "search_action_endpoint": format!("{base}/access/v1/search/action"),
    }));
    if s.config.public_url.is_none() {
        resp.headers_mut()
            .insert(axum::http::header::VARY, HeaderValue::from_static("host"));
    }
    resp
}

/// `host[:port]` from a `Host` header when it is a DNS name or IPv4 address (ASCII letters,
/// digits, `.`, `-`; at most 253 bytes) or a bracketed IPv6 literal, with an optional decimal
/// port up to 65535; `None` otherwise.
pub fn valid_host(v: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(v).ok()?;
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        ip.parse::<std::net::Ipv6Addr>().ok()?;
        // After the literal: nothing, or `:port`; anything else is not a host.
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (text.get(..ip.len() + 2)?, port)
    } else {
        match text.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let host_ok = host.starts_with('[')
        || (!host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok()
    });
    (host_ok && port_ok).then_some(text)
}

// ---------------------------------------------------------------- health, version, metrics

async fn healthz() -> Response {
    json_ok(&json!({"status": "ok"}))
}

async fn readyz(State(s): St) -> Response {
    let err = s.bundle_error();
    let v = s.engine.versions();
    let feeds = s.feeds();
    let flags = s.bundle_loaded() && s.containments_loaded() && s.principals_loaded();
    let stale: Vec<&FeedReport> = feeds.iter().filter(|f| f.stale).collect();
    if flags && stale.is_empty() {
        let mut body = json!({
            "ready": true,
            "policy_version": v.policy_version,
            "principals_version": v.principals_version,
        });
        if let Some(m) = body.as_object_mut() {
            if let Some(e) = err {
                // Still ready: the previous bundle keeps serving.
                m.insert("bundle_error".into(), e.into());
            }
            if !feeds.is_empty() {
                m.insert(
                    "feeds".into(),
                    feeds
                        .iter()
                        .map(|f| (f.name.clone(), feed_json(f)))
                        .collect(),
                );
            }
        }
        return json_ok(&body);
    }
    let mut missing = Vec::new();
    if !s.bundle_loaded() {
        missing.push("a policy bundle");
    }
    if !s.containments_loaded() {
        missing.push("the containment list");
    }
    if !s.principals_loaded() {
        missing.push("the principals snapshot");
    }
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("waiting for {}", missing.join(" and ")));
    }
    for f in &stale {
        parts.push(stale_text(f));
    }
    let mut detail = format!("not ready: {}", parts.join("; "));
    if let Some(e) = err {
        detail.push_str(&format!("; last bundle load failed: {e}"));
    }
    let mut body = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not-ready",
        "The decision point is not ready",
        detail,
    )
    .to_json();
    if let (false, Some(m)) = (stale.is_empty(), body.as_object_mut()) {
        m.insert(
            "stale_feeds".into(),
            stale
                .iter()
                .map(|f| {
                    let mut j = feed_json(f);
                    if let Some(o) = j.as_object_mut() {
                        o.insert("feed".into(), f.name.clone().into());
                    }
                    j
                })
                .collect(),
        );
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        )],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

/// One feed on `/readyz`: its version, age and bound (seconds), last success and last error.
fn feed_json(f: &FeedReport) -> serde_json::Value {
    json!({
        "version": f.version,
        "age_secs": round_ms(f.age.as_secs_f64()),
        "max_staleness_secs": f.max_staleness.as_secs_f64(),
        "last_success": f.last_ok_ms.map(rfc3339_ms),
        "last_error": f.last_error.as_ref().map(|(_, e)| e.clone()),
        "last_error_at": f.last_error.as_ref().map(|(at, _)| rfc3339_ms(*at)),
        "errors": f.errors,
    })
}

/// A stale feed in `/readyz`'s detail: its name, age, bound, last success and last error.
fn stale_text(f: &FeedReport) -> String {
    let since = f.last_ok_ms.map_or_else(|| "never".to_owned(), rfc3339_ms);
    let mut t = format!(
        "feed `{}` is stale: no successful sync for {:.1} s (bound {} s; last success {since}",
        f.name,
        f.age.as_secs_f64(),
        f.max_staleness.as_secs_f64(),
    );
    if let Some((_, e)) = &f.last_error {
        t.push_str(&format!("; last error: {e}"));
    }
    t.push(')');
    t
}

fn round_ms(secs: f64) -> f64 {
    (secs * 1000.0).round() / 1000.0
}

async fn version(State(s): St) -> Response {
    let v = s.engine.versions();
    json_ok(&json!({
        "component": "svc-pdp",
        "version": s.config.version,
        "cedar_policy": "4.14.1",
        "policy_version": v.policy_version,
        "principals_version": v.principals_version,
    }))
}

async fn metrics(State(s): St) -> Response {
    let v = s.engine.versions();
    s.refresh_feed_metrics();
    let text = s.metrics.render(
        v.policy_version,
        v.principals_version,
        s.engine.plans_cached(),
        s.ready(),
        s.log.as_ref().map(|l| l.stats()),
    );
    (
        StatusCode::OK,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
