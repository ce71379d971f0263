//! The gRPC `svc.authz.v1.Authorizer` (docs/api.md#grpc-svcauthzv1authorizer) on tonic, with gRPC
//! health checking (`grpc.health.v1.Health`) and server reflection (v1 and v1alpha, for grpcurl and
//! friends).
//!
//! Requests are mapped to the same JSON the HTTP API takes and parsed by the engine's one
//! request parser, so both transports validate identically and name the same fields. Errors are
//! `INVALID_ARGUMENT` with the same text as the HTTP problem's `detail`, plus a
//! `google.rpc.BadRequest` detail naming the field (tonic-types' rich error model).

use super::http::{bounded, check_challenge_wait, NO_CHALLENGE_SERVICE};
use super::metrics::Transport;
use super::Shared;
use pdp_core::{Decision, Mode, Outcome, RequestError, Verdict};
use serde_json::{Map, Number, Value};
use std::sync::Arc;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Code generated from proto/svc/authz/v1/authz.proto by build.rs.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("svc.authz.v1");
    /// The encoded file descriptor set served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("authz_descriptor");
}

use pb::authorizer_server::{Authorizer, AuthorizerServer};
use pb::noop_authorizer_server::{NoopAuthorizer, NoopAuthorizerServer};

/// The service name gRPC health reports on.
pub const SERVICE_NAME: &str = "svc.authz.v1.Authorizer";

/// The benchmark ceiling's service, served only with `noop_routes`.
pub const NOOP_SERVICE_NAME: &str = "svc.authz.v1.NoopAuthorizer";

/// `INVALID_ARGUMENT` with the error's text and a `BadRequest` field violation (each cut to
/// [`super::http::MAX_ERROR_TEXT`], as the HTTP problem's `detail` is).
pub fn invalid(e: &RequestError) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        bounded(e.to_string()),
        ErrorDetails::with_bad_request_violation(
            bounded(e.field.clone()),
            bounded(e.message.clone()),
        ),
    )
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
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
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

/// The check request's JSON (docs/decisions.md#request) from its protobuf form.
pub fn check_json(r: &pb::CheckRequest) -> Value {
    let mut m = Map::new();
    m.insert("principal".into(), uid_json(r.principal.as_ref()));
    m.insert("action".into(), r.action.clone().into());
    m.insert("resource".into(), uid_json(r.resource.as_ref()));
    if let Some(c) = &r.context {
        m.insert("context".into(), struct_json(c));
    }
    if r.on_behalf_of.is_some() {
        m.insert("on_behalf_of".into(), uid_json(r.on_behalf_of.as_ref()));
    }
    if let Some(h) = r.human_present {
        m.insert("human_present".into(), h.into());
    }
    if !r.work_item_id.is_empty() {
        m.insert("work_item_id".into(), r.work_item_id.clone().into());
    }
    Value::Object(m)
}

/// The plan request's JSON (docs/plans.md#building-a-plan-engineplan) from its protobuf form.
pub fn plan_json(r: &pb::PlanRequest) -> Value {
    let mut m = Map::new();
    m.insert("principal".into(), uid_json(r.principal.as_ref()));
    m.insert("action".into(), r.action.clone().into());
    m.insert("resource_type".into(), r.resource_type.clone().into());
    if let Some(c) = &r.context {
        m.insert("context".into(), struct_json(c));
    }
    if r.on_behalf_of.is_some() {
        m.insert("on_behalf_of".into(), uid_json(r.on_behalf_of.as_ref()));
    }
    if !r.plan_qid.is_empty() {
        m.insert("plan_qid".into(), r.plan_qid.clone().into());
    }
    Value::Object(m)
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

/// The gRPC response of a plan, from the plan's HTTP JSON (one rendering of the filter).
pub fn plan_response(v: &Value) -> pb::PlanResponse {
    let outcome = match v.get("outcome").and_then(Value::as_str) {
        Some("always_allowed") => pb::PlanOutcome::AlwaysAllowed,
        Some("always_denied") => pb::PlanOutcome::AlwaysDenied,
        Some("challenge") => pb::PlanOutcome::Challenge,
        Some("conditional") => pb::PlanOutcome::Conditional,
        _ => pb::PlanOutcome::Unspecified,
    };
    let u = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let b = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    pb::PlanResponse {
        qid: v
            .get("qid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        outcome: outcome as i32,
        filter: v.get("filter").map(filter_node),
        challenges: strings(v.get("challenges")),
        challenge_could_widen: b("challenge_could_widen"),
        needs_row_checks: b("needs_row_checks"),
        attributes: strings(v.get("attributes")),
        policies: strings(v.get("policies")),
        mode: if v.get("mode").and_then(Value::as_str) == Some("monitor") {
            pb::Mode::Monitor as i32
        } else {
            pb::Mode::Enforce as i32
        },
        policy_version: u("policy_version"),
        principals_version: u("principals_version"),
        max_age_secs: u("max_age_secs"),
        pinned: b("pinned"),
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
        let d = s
            .engine
            .decide_value(check_json(request.get_ref()))
            .map_err(|e| invalid(&e))?;
        s.decided(&d, Transport::Grpc).written().await?;
        Ok(Response::new(check_response(&d)))
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
        check_challenge_wait(&Value::Object(m)).map_err(|e| invalid(&e))?;
        self.shared.metrics.challenge_unavailable();
        Err(Status::unavailable(NO_CHALLENGE_SERVICE))
    }

    async fn plan(
        &self,
        request: Request<pb::PlanRequest>,
    ) -> Result<Response<pb::PlanResponse>, Status> {
        let s = &self.shared;
        let p = s
            .engine
            .plan_value(plan_json(request.get_ref()))
            .map_err(|e| invalid(&e))?;
        s.planned(&p, Transport::Grpc).written().await?;
        Ok(Response::new(plan_response(&p.to_response())))
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
