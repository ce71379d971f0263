//! A challenge wait (docs/architecture.md#challenge-resolution) as both transports take it:
//! `POST /v1/access/challenge` (`crate::http`) and gRPC `WaitForChallenge` (`crate::grpc`) read
//! the same fields, wait through the installed challenge source and refuse alike; each answers
//! in its own form.

use crate::challenges::{Status, WaitError};
use crate::problem::Problem;
use crate::shared::Shared;
use axum::http::StatusCode;
use pdp_core::{EntityUid, RequestError};
use serde_json::Value;

/// Validates a challenge wait (docs/architecture.md#challenge-resolution) as far as it can be
/// without the challenge service.
///
/// # Errors
/// [`RequestError`] naming the field: missing/empty `challenge_qid`, a malformed principal, a
/// `wait_secs` outside 0 to 25, an unknown field.
pub fn check_challenge_wait(v: &Value) -> Result<(), RequestError> {
    let obj = v
        .as_object()
        .ok_or_else(|| RequestError::new("request", "expected a JSON object"))?;
    for k in obj.keys() {
        if !["challenge_qid", "principal", "on_behalf_of", "wait_secs"].contains(&k.as_str()) {
            return Err(RequestError::new(
                k.clone(),
                "unknown field; expected challenge_qid, principal, on_behalf_of, wait_secs",
            ));
        }
    }
    match obj.get("challenge_qid") {
        Some(Value::String(q)) if !q.is_empty() => {}
        _ => {
            return Err(RequestError::new(
                "challenge_qid",
                "is required: the `challenge_qid` of the check's response",
            ))
        }
    }
    pdp_core::request::parse_uid(obj.get("principal").unwrap_or(&Value::Null), "principal")?;
    if let Some(o) = obj.get("on_behalf_of").filter(|o| !o.is_null()) {
        pdp_core::request::parse_uid(o, "on_behalf_of")?;
    }
    if let Some(w) = obj.get("wait_secs") {
        match w.as_u64() {
            Some(n) if n <= 25 => {}
            _ => {
                return Err(RequestError::new(
                    "wait_secs",
                    "expected an integer from 0 to 25",
                ))
            }
        }
    }
    Ok(())
}

/// The problem (and gRPC status text) for a challenge wait while no challenge service is
/// connected (standalone mode).
pub const NO_CHALLENGE_SERVICE: &str = "no challenge service (svc-challenge) is connected to this decision point, so no challenge can be waited for; in standalone mode challenge verdicts carry no challenge_qid";

/// A challenge wait's fields, read from a request [`check_challenge_wait`] accepted.
#[derive(Debug, Clone)]
pub struct ChallengeWait {
    /// The challenge's qid.
    pub challenge_qid: String,
    /// Who waits: the principal of the check.
    pub principal: EntityUid,
    /// The person it acts for, if any.
    pub on_behalf_of: Option<EntityUid>,
    /// Seconds to wait, 0 to 25 (absent: 0, only look).
    pub wait_secs: u64,
}

/// Reads a challenge wait (the JSON of `POST /v1/access/challenge`).
///
/// # Errors
/// As [`check_challenge_wait`].
pub fn challenge_wait(v: &Value) -> Result<ChallengeWait, RequestError> {
    check_challenge_wait(v)?;
    let principal =
        pdp_core::request::parse_uid(v.get("principal").unwrap_or(&Value::Null), "principal")?;
    let on_behalf_of = match v.get("on_behalf_of").filter(|o| !o.is_null()) {
        Some(o) => Some(pdp_core::request::parse_uid(o, "on_behalf_of")?),
        None => None,
    };
    Ok(ChallengeWait {
        challenge_qid: v
            .get("challenge_qid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        principal,
        on_behalf_of,
        wait_secs: v.get("wait_secs").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// The text of a wait on a challenge this decision point cannot find for the caller.
pub const CHALLENGE_NOT_FOUND: &str = "no such challenge for this principal and on_behalf_of: the challenge_qid must be one a check of this principal (acting for this on_behalf_of) was answered with";

/// How a wait ended without a status: no challenge service, not found, or the service
/// did not answer.
#[derive(Debug)]
pub enum WaitRefused {
    /// No challenge service is connected (standalone mode).
    NoService,
    /// [`WaitError`].
    Wait(WaitError),
}

/// Waits as the request says (docs/architecture.md#challenge-resolution), through the
/// installed challenge source.
///
/// # Errors
/// [`WaitRefused`]: no source installed, or the wait's error.
pub async fn wait_for_challenge(s: &Shared, w: &ChallengeWait) -> Result<Status, WaitRefused> {
    let Some(c) = s.challenge_source() else {
        s.metrics.challenge_unavailable();
        return Err(WaitRefused::NoService);
    };
    c.wait(
        &w.challenge_qid,
        &w.principal,
        w.on_behalf_of.as_ref(),
        std::time::Duration::from_secs(w.wait_secs.min(25)),
        &s.metrics,
    )
    .await
    .map_err(WaitRefused::Wait)
}

impl From<WaitRefused> for Problem {
    fn from(e: WaitRefused) -> Self {
        match e {
            WaitRefused::NoService => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "challenge-service-unavailable",
                "The challenge service is not available",
                NO_CHALLENGE_SERVICE,
            ),
            WaitRefused::Wait(WaitError::NotFound) => Problem::new(
                StatusCode::NOT_FOUND,
                "challenge-not-found",
                "No such challenge",
                CHALLENGE_NOT_FOUND,
            ),
            WaitRefused::Wait(WaitError::Unavailable(detail)) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "challenge-service-unavailable",
                "The challenge service is not available",
                format!("the challenge could not be read: {detail}"),
            ),
        }
    }
}

impl From<WaitRefused> for tonic::Status {
    fn from(e: WaitRefused) -> Self {
        match e {
            WaitRefused::NoService => Self::unavailable(NO_CHALLENGE_SERVICE),
            WaitRefused::Wait(WaitError::NotFound) => Self::not_found(CHALLENGE_NOT_FOUND),
            WaitRefused::Wait(WaitError::Unavailable(detail)) => {
                Self::unavailable(format!("the challenge could not be read: {detail}"))
            }
        }
    }
}
