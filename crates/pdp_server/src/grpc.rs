//! The gRPC `svc.authz.v1.Authorizer` (docs/api.md#grpc-svcauthzv1authorizer) on tonic, with gRPC
//! health checking (`grpc.health.v1.Health`) and server reflection (v1 and v1alpha, for grpcurl and
//! friends).
//!
//! Requests are mapped from their typed messages straight to the engine's request types, each
//! field checked by the same functions the JSON parser uses (`pdp_core::request`), so both
//! transports validate identically and name the same fields; responses are built from the
//! decision model (`pdp_core::decision`). Errors are
//! `INVALID_ARGUMENT` with the same text as the HTTP problem's `detail`, plus a
//! `google.rpc.BadRequest` detail naming the field (tonic-types' rich error model).

use crate::challenges::Status as ChallengeStatus;
use crate::clock::now_ms;
use crate::metrics::Transport;
use crate::pb;
use crate::pb::authorizer_server::{Authorizer, AuthorizerServer};
use crate::pb::noop_authorizer_server::{NoopAuthorizer, NoopAuthorizerServer};
use crate::problem::bounded;
use crate::shared::Shared;
use crate::waits::{challenge_wait, wait_for_challenge};
use futures_util::future::join_all;
use pdp_core::request::{action_text, check_identifier, resource_type_text, uid_from_parts};
use pdp_core::{
    CheckRequest, Decision, EntityUid, Mode, Outcome, PlanOutcome, PlanRequest, QueryPlan,
    RequestError, Verdict,
};
use serde_json::{Map, Number, Value};
use std::sync::Arc;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The service name gRPC health reports on.
pub const SERVICE_NAME: &str = pb::authorizer_server::SERVICE_NAME;

/// The benchmark ceiling's service, served only with `noop_routes`.
pub const NOOP_SERVICE_NAME: &str = pb::noop_authorizer_server::SERVICE_NAME;

/// `INVALID_ARGUMENT` with the error's text and a `BadRequest` field violation (each cut to
/// [`crate::problem::MAX_ERROR_TEXT`], as the HTTP problem's `detail` is).
pub fn invalid(e: &RequestError) -> Status {
    invalid_batch(std::slice::from_ref(e))
}

/// `INVALID_ARGUMENT` naming every error: one `BadRequest` field violation per error (in a
/// batch each field already prefixed with its item, `checks[2].resource`), the first error's
/// text as the message with how many more there are.
fn invalid_batch(errors: &[RequestError]) -> Status {
    let first = errors.first().map(ToString::to_string).unwrap_or_default();
    let message = match errors.len() {
        0 | 1 => first,
        n => format!("{first} (and {} more invalid checks)", n - 1),
    };
    let violations = errors
        .iter()
        .map(|e| {
            tonic_types::FieldViolation::new(bounded(e.field.clone()), bounded(e.message.clone()))
        })
        .collect::<Vec<_>>();
    Status::with_error_details(
        Code::InvalidArgument,
        bounded(message),
        ErrorDetails::with_bad_request(violations),
    )
}

/// `e` with its field under batch item `i` (`checks[i].<field>`).
fn in_item(i: usize, e: &RequestError) -> RequestError {
    RequestError::new(format!("checks[{i}].{}", e.field), e.message.clone())
}

fn uid_json(r: Option<&pb::EntityRef>) -> Value {
    match r {
        None => Value::Null,
        Some(r) => {
            let mut m = Map::new();
            m.insert("type".into(), r.r#type.clone().into());
            m.insert("id".into(), r.id.clone().into());
            Value::Object(m)
        }
    }
}

/// A protobuf `Struct` as a JSON object. Whole numbers within `i64` become integers (Cedar's
/// `Long`); other numbers stay floats, which the schema check then names.
pub fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(struct_map(s))
}

#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && *n >= i64::MIN as f64 && *n < i64::MAX as f64 {
                Value::Number((*n as i64).into())
            } else {
                Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}

/// A JSON value as a protobuf `Value` (numbers become doubles, as protobuf's JSON mapping has
/// it; Cedar `Long`s beyond 2^53 lose precision, so filters on such values are best read over
/// HTTP).
#[allow(clippy::cast_precision_loss)]
pub fn json_value(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A protobuf `Struct` as a JSON object's map ([`struct_json`]).
fn struct_map(s: &prost_types::Struct) -> Map<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_json(v)))
        .collect()
}

/// An entity reference field of a message (`None` when it is not set), checked as
/// `pdp_core::request::parse_uid` checks `{type, id}`.
fn uid_of(r: Option<&pb::EntityRef>, field: &str) -> Result<Option<EntityUid>, RequestError> {
    r.map(|r| uid_from_parts(&r.r#type, &r.id, field))
        .transpose()
}

/// A required entity reference field ("is required" when it is not set).
fn required_uid(r: Option<&pb::EntityRef>, field: &str) -> Result<EntityUid, RequestError> {
    uid_of(r, field)?.ok_or_else(|| RequestError::new(field, "is required"))
}

/// The check request (docs/decisions.md#request) of its protobuf form, its fields checked in
/// the order and with the errors of `CheckRequest::from_value`: `principal`, `resource`,
/// `action`, `on_behalf_of`, `work_item_id` (an empty `work_item_id` is none; a message has no
/// inline entities).
///
/// # Errors
/// [`RequestError`] naming the first field at fault.
pub fn check_request(r: pb::CheckRequest) -> Result<CheckRequest, RequestError> {
    let principal = required_uid(r.principal.as_ref(), "principal")?;
    let resource = required_uid(r.resource.as_ref(), "resource")?;
    let action = action_text(r.action)?;
    let context = r.context.as_ref().map(struct_map).unwrap_or_default();
    let on_behalf_of = uid_of(r.on_behalf_of.as_ref(), "on_behalf_of")?;
    let work_item_id = if r.work_item_id.is_empty() {
        None
    } else {
        check_identifier(&r.work_item_id, "work_item_id")?;
        Some(r.work_item_id)
    };
    Ok(CheckRequest {
        principal,
        action,
        resource,
        context,
        on_behalf_of,
        human_present: r.human_present.unwrap_or(true),
        work_item_id,
        entities: Vec::new(),
    })
}

/// The plan request (docs/plans.md#building-a-plan-engineplan) of its protobuf form, its fields
/// checked in the order and with the errors of `PlanRequest::from_value` (an empty `plan_qid`
/// is none).
///
/// # Errors
/// [`RequestError`] naming the first field at fault.
pub fn plan_request(r: pb::PlanRequest) -> Result<PlanRequest, RequestError> {
    let principal = required_uid(r.principal.as_ref(), "principal")?;
    let action = action_text(r.action)?;
    let context = r.context.as_ref().map(struct_map).unwrap_or_default();
    let on_behalf_of = uid_of(r.on_behalf_of.as_ref(), "on_behalf_of")?;
    let resource_type = resource_type_text(r.resource_type)?;
    Ok(PlanRequest {
        principal,
        on_behalf_of,
        action,
        context,
        resource_type,
        plan_qid: (!r.plan_qid.is_empty()).then_some(r.plan_qid),
    })
}

fn verdict(v: Verdict) -> i32 {
    match v {
        Verdict::Allow => pb::Verdict::Allow as i32,
        Verdict::Deny => pb::Verdict::Deny as i32,
        Verdict::Challenge => pb::Verdict::Challenge as i32,
    }
}

fn mode(m: Mode) -> i32 {
    match m {
        Mode::Enforce => pb::Mode::Enforce as i32,
        Mode::Monitor => pb::Mode::Monitor as i32,
    }
}

fn outcome(o: &Outcome) -> pb::PrincipalOutcome {
    pb::PrincipalOutcome {
        verdict: verdict(o.verdict),
        challenges: o.challenges.clone(),
        policies: o.policies.clone(),
    }
}

/// The gRPC response of a decision.
pub fn check_response(d: &Decision) -> pb::CheckResponse {
    pb::CheckResponse {
        decision_qid: d.qid.clone(),
        verdict: verdict(d.verdict),
        challenges: d.challenges.clone(),
        policies: d.principal_outcome.policies.clone(),
        mode: mode(d.mode),
        challenge_qid: String::new(),
        on_behalf_of: d.on_behalf_of_outcome.as_ref().map(outcome),
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A filter tree node (the JSON of docs/plans.md#the-filter-tree) as its protobuf message.
pub fn filter_node(v: &Value) -> pb::FilterNode {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    pb::FilterNode {
        op: s("op"),
        args: v
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(filter_node).collect())
            .unwrap_or_default(),
        arg: v.get("arg").map(|a| Box::new(filter_node(a))),
        attr: strings(v.get("attr")),
        cmp: s("cmp"),
        value: v.get("value").map(json_value),
        values: v
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(json_value).collect())
            .unwrap_or_default(),
        pattern: s("pattern"),
        entity: v.get("entity").map(|e| pb::EntityRef {
            r#type: e
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            id: e
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }),
        detail: s("detail"),
    }
}

/// The gRPC response of a plan, from its response view ([`QueryPlan::response`]); the filter
/// through its JSON form (docs/plans.md#the-filter-tree), the one rendering of a filter.
pub fn plan_response(p: &QueryPlan) -> pb::PlanResponse {
    let v = p.response();
    let outcome = match v.outcome {
        PlanOutcome::AlwaysAllowed => pb::PlanOutcome::AlwaysAllowed,
        PlanOutcome::AlwaysDenied => pb::PlanOutcome::AlwaysDenied,
        PlanOutcome::Challenge => pb::PlanOutcome::Challenge,
        PlanOutcome::Conditional => pb::PlanOutcome::Conditional,
    };
    pb::PlanResponse {
        qid: v.qid.to_owned(),
        outcome: outcome as i32,
        filter: v.filter.map(|f| filter_node(&f.to_json())),
        challenges: v.challenges.to_vec(),
        challenge_could_widen: v.challenge_could_widen,
        needs_row_checks: v.needs_row_checks,
        attributes: v.attributes,
        policies: v.policies.to_vec(),
        mode: mode(v.mode),
        policy_version: v.policy_version,
        principals_version: v.principals_version,
        max_age_secs: v.max_age_secs,
        pinned: v.pinned,
    }
}

/// The Authorizer service over the shared engine.
#[derive(Clone)]
pub struct AuthorizerService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Authorizer for AuthorizerService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let s = &self.shared;
        let req = check_request(request.into_inner()).map_err(|e| invalid(&e))?;
        s.ensure_resources(&[&req.resource], req.work_item_id.as_deref().as_slice())
            .await;
        let mut d = s.engine.decide(&req).map_err(|e| invalid(&e))?;
        let challenge_qid = s.resolve_challenge(&mut d).await;
        s.decided(&d, Transport::Grpc, challenge_qid.as_deref())
            .written()
            .await?;
        let mut resp = check_response(&d);
        resp.challenge_qid = challenge_qid.unwrap_or_default();
        Ok(Response::new(resp))
    }

    async fn batch_check(
        &self,
        request: Request<pb::BatchCheckRequest>,
    ) -> Result<Response<pb::BatchCheckResponse>, Status> {
        let s = &self.shared;
        let checks = request.into_inner().checks;
        let max = s.config.max_batch_items;
        if checks.is_empty() || checks.len() > max {
            return Err(invalid(&RequestError::new(
                "checks",
                format!(
                    "{} checks in one request: from 1 to {max} are decided (limit `max_batch_items` = {max}); split the batch",
                    checks.len()
                ),
            )));
        }
        // All or none: every check is read and decided before any is logged or answered, and
        // every bad one is named.
        let parsed: Vec<Result<CheckRequest, RequestError>> =
            checks.into_iter().map(check_request).collect();
        let resources: Vec<&EntityUid> = parsed.iter().flatten().map(|r| &r.resource).collect();
        let work_items: Vec<&str> = parsed
            .iter()
            .flatten()
            .filter_map(|r| r.work_item_id.as_deref())
            .collect();
        s.ensure_resources(&resources, &work_items).await;
        let mut decided = Vec::with_capacity(parsed.len());
        let mut errors = Vec::new();
        for (i, r) in parsed.iter().enumerate() {
            match r {
                Ok(r) => match s.engine.decide(r) {
                    Ok(d) => decided.push(d),
                    Err(e) => errors.push(in_item(i, &e)),
                },
                Err(e) => errors.push(in_item(i, e)),
            }
        }
        if !errors.is_empty() {
            return Err(invalid_batch(&errors));
        }
        // The challenged checks' challenges are resolved together, not one after another.
        let resolutions = join_all(decided.iter_mut().map(|d| s.resolve_challenge(d))).await;
        let logged: Vec<_> = decided
            .iter()
            .zip(&resolutions)
            .map(|(d, qid)| s.decided(d, Transport::Grpc, qid.as_deref()))
            .collect();
        for l in logged {
            l.written().await?;
        }
        let results = decided
            .iter()
            .zip(resolutions)
            .map(|(d, qid)| {
                let mut resp = check_response(d);
                resp.challenge_qid = qid.unwrap_or_default();
                resp
            })
            .collect();
        Ok(Response::new(pb::BatchCheckResponse { results }))
    }

    async fn wait_for_challenge(
        &self,
        request: Request<pb::WaitForChallengeRequest>,
    ) -> Result<Response<pb::WaitForChallengeResponse>, Status> {
        let r = request.get_ref();
        let mut m = Map::new();
        m.insert("challenge_qid".into(), r.challenge_qid.clone().into());
        m.insert("principal".into(), uid_json(r.principal.as_ref()));
        if r.on_behalf_of.is_some() {
            m.insert("on_behalf_of".into(), uid_json(r.on_behalf_of.as_ref()));
        }
        m.insert("wait_secs".into(), r.wait_secs.into());
        let w = challenge_wait(&Value::Object(m)).map_err(|e| invalid(&e))?;
        let st = wait_for_challenge(&self.shared, &w).await?;
        Ok(Response::new(wait_response(&st)))
    }

    async fn plan(
        &self,
        request: Request<pb::PlanRequest>,
    ) -> Result<Response<pb::PlanResponse>, Status> {
        let s = &self.shared;
        let req = plan_request(request.into_inner()).map_err(|e| invalid(&e))?;
        let p = s.engine.plan(&req).map_err(|e| invalid(&e))?;
        s.planned(&p, Transport::Grpc).written().await?;
        Ok(Response::new(plan_response(&p)))
    }
}

/// A protobuf `Timestamp` of epoch milliseconds.
fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        // Below 1,000,000,000: fits.
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// The gRPC answer of a challenge wait: the fields of the HTTP answer (`crate::http::wait_answer`).
pub fn wait_response(st: &ChallengeStatus) -> pb::WaitForChallengeResponse {
    use crate::challenges::State;
    let outcome = match st.state {
        State::Pending => pb::ChallengeOutcome::Pending,
        State::Passed => pb::ChallengeOutcome::Passed,
        State::Rejected => pb::ChallengeOutcome::Rejected,
        State::Expired => pb::ChallengeOutcome::Expired,
    };
    pb::WaitForChallengeResponse {
        outcome: outcome as i32,
        expires_at: st.expires_at_ms.map(timestamp),
        grant_expires_at: st.grant_expires_at_ms.map(timestamp),
        pending: if st.state == State::Pending {
            st.pending.clone()
        } else {
            Vec::new()
        },
        retry: st.retry(now_ms()),
    }
}

/// The benchmark ceiling: decodes a check and answers a fixed allow without deciding.
#[derive(Clone, Copy)]
pub struct NoopService;

#[tonic::async_trait]
impl NoopAuthorizer for NoopService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let _ = request.get_ref().principal.as_ref();
        Ok(Response::new(pb::CheckResponse {
            decision_qid: "00000000-0000-7000-8000-000000000000".into(),
            verdict: pb::Verdict::Allow as i32,
            challenges: Vec::new(),
            policies: vec!["noop".into()],
            mode: pb::Mode::Enforce as i32,
            challenge_qid: String::new(),
            on_behalf_of: None,
        }))
    }
}

/// The gRPC routes: Authorizer, health, reflection (v1 and v1alpha), and the no-op service
/// when the server runs with `noop_routes`.
///
/// # Errors
/// `std::io::Error` (kind `InvalidData`) when the embedded descriptor sets do not decode, which
/// would be a build bug.
pub fn routes(
    shared: Arc<Shared>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> std::io::Result<axum::Router> {
    let limit = shared.config.max_body_bytes;
    let noop = shared.config.noop_routes;
    let bad = |e: tonic_reflection::server::Error| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
    };
    // Advertise exactly the services served: the descriptor set also holds NoopAuthorizer,
    // which is only served with `noop_routes`.
    let reflection = |own: &str| {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(SERVICE_NAME)
            .with_service_name("grpc.health.v1.Health")
            .with_service_name(own);
        if noop {
            b = b.with_service_name(NOOP_SERVICE_NAME);
        }
        b
    };
    let v1 = reflection("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .map_err(bad)?;
    let v1alpha = reflection("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()
        .map_err(bad)?;
    let mut routes = tonic::service::Routes::new(health)
        .add_service(
            AuthorizerServer::new(AuthorizerService { shared }).max_decoding_message_size(limit),
        )
        .add_service(v1)
        .add_service(v1alpha);
    if noop {
        routes = routes.add_service(NoopAuthorizerServer::new(NoopService));
    }
    Ok(routes
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::map_response(client_fault_statuses)))
}

/// Gives the request errors tonic raises before a handler runs the codes of a client's fault
/// (they are trailers-only responses, so the status is a header):
///
/// * a message over `max_decoding_message_size` is `OUT_OF_RANGE` in tonic; gRPC's own
///   implementations (and docs/api.md) say `RESOURCE_EXHAUSTED`;
/// * a message that does not decode (bad bytes, a `Struct` nested past prost's recursion limit)
///   is `INTERNAL` in tonic; it is the request that is wrong: `INVALID_ARGUMENT`, like the 400
///   of malformed JSON on HTTP.
///
/// No handler here answers `OUT_OF_RANGE` or `INTERNAL` itself. (`grpc-message` is
/// percent-encoded, spaces included.)
async fn client_fault_statuses(mut resp: axum::response::Response) -> axum::response::Response {
    let headers = resp.headers_mut();
    let code = match headers.get("grpc-status").map(|v| v.as_bytes()) {
        Some(b"11") => Some("8"),
        Some(b"13")
            if headers
                .get("grpc-message")
                .is_some_and(|m| m.as_bytes().starts_with(b"failed%20to%20decode")) =>
        {
            Some("3")
        }
        _ => None,
    };
    if let Some(code) = code {
        headers.insert("grpc-status", axum::http::HeaderValue::from_static(code));
    }
    resp
}
