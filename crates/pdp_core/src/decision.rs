//! The decision model: what a check ([`Decision`]) or a plan ([`QueryPlan`]) decided, and the
//! typed views every answer and record is serialised from.
//!
//! One value, several projections: the HTTP response of a check ([`CheckResponse`],
//! docs/api.md#http-routes), the response of a plan ([`PlanResponse`], docs/plans.md), and
//! the decision-log records of both ([`DecisionRecord`], [`PlanRecord`];
//! docs/history.md#schema). Each view borrows from its decision and derives
//! `serde::Serialize`, so a response or record is one serialisation, not a hand-built map.
//!
//! Every view lists its fields in the order the responses and records have always been written
//! in (serde_json keeps a map's insertion order here: Cedar turns on its `preserve_order`), so
//! serialising a view writes the bytes the hand-built JSON did; the tests below pin that.
//! Optional fields that a view leaves out when unset say so (`skip_serializing_if`); the others
//! are written as `null`.

use crate::error::RequestError;
use crate::residual_filter::Filter;
use cedar_policy::{EntityTypeName, EntityUid};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// A verdict, ordered by strictness (`Allow < Challenge < Deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The action may proceed.
    Allow,
    /// The action may proceed once every listed challenge is passed.
    Challenge,
    /// The action must not proceed.
    Deny,
}

impl Verdict {
    /// Lowercase wire name (`allow`, `challenge`, `deny`), as it is serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Challenge => "challenge",
            Self::Deny => "deny",
        }
    }
}

/// Enforcement mode (docs/architecture.md#monitor-and-enforce): reported with every decision, never
/// applied by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Enforcement points allow whatever the verdict; history records would-deny/challenge.
    Monitor,
    /// Enforcement points apply the verdict.
    Enforce,
}

impl Mode {
    /// Lowercase wire name (`monitor`, `enforce`), as it is serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Monitor => "monitor",
            Self::Enforce => "enforce",
        }
    }

    /// Parses `monitor` / `enforce` (case-insensitive).
    ///
    /// # Errors
    /// [`RequestError`] on `mode` for any other value.
    pub fn parse(s: &str) -> Result<Self, RequestError> {
        match s.to_ascii_lowercase().as_str() {
            "monitor" => Ok(Self::Monitor),
            "enforce" => Ok(Self::Enforce),
            _ => Err(RequestError::new(
                "mode",
                format!("unknown mode `{s}`: expected `monitor` or `enforce`"),
            )),
        }
    }
}

/// The verdict of one principal; serialised as `{verdict, challenges, policies}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Verdict.
    pub verdict: Verdict,
    /// Challenge kinds that must be passed (empty unless the verdict is `challenge`).
    pub challenges: Vec<String>,
    /// Names of the policies (or built-in reasons) that decided it, sorted.
    pub policies: Vec<String>,
}

impl Outcome {
    /// A denial by a built-in reason (`svc:contained`, ...; docs/architecture.md#built-in-denials).
    pub(crate) fn builtin(reason: &str) -> Self {
        Self {
            verdict: Verdict::Deny,
            challenges: Vec::new(),
            policies: vec![reason.to_owned()],
        }
    }
}

/// What was asked, in a decision-log record's `call` (docs/history.md#schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Call {
    /// A check ([`Decision`]).
    Check,
    /// A query plan ([`QueryPlan`]).
    Plan,
}

/// One decision: the response of a check and the record the decision log keeps
/// (docs/history.md#schema).
#[derive(Debug, Clone)]
pub struct Decision {
    /// Decision id (UUIDv7).
    pub qid: String,
    /// When it was decided, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The actor.
    pub principal: EntityUid,
    /// The person the actor acted for.
    pub on_behalf_of: Option<EntityUid>,
    /// Resolved action.
    pub action: EntityUid,
    /// The resource.
    pub resource: EntityUid,
    /// Combined verdict (the one enforcement points apply).
    pub verdict: Verdict,
    /// Every challenge that must be passed (both principals' when the verdict is `challenge`).
    pub challenges: Vec<String>,
    /// The principal's own outcome.
    pub principal_outcome: Outcome,
    /// The person's own outcome, when the request names one.
    pub on_behalf_of_outcome: Option<Outcome>,
    /// Mode at decision time.
    pub mode: Mode,
    /// The work item the request named, if any.
    pub work_item: Option<String>,
    /// Whether that work item is open and links the resource.
    pub assigned: bool,
    /// The principal's reasoner risk score, if one was used.
    pub risk_score: Option<i64>,
    /// Version of the bundle that decided.
    pub policy_version: u64,
    /// Version of the principals snapshot that decided.
    pub principals_version: u64,
    /// Time spent deciding, microseconds.
    pub latency_us: u64,
    /// The principal and the person it acted for, whichever the directory (store or bundle)
    /// does not hold: decided with no attributes and no parents.
    pub not_in_directory: Vec<EntityUid>,
    /// Inline entities the check ignored: of a directory type, or held by the store or bundle
    /// (`Engine::decide`).
    pub inline_ignored: Vec<EntityUid>,
}

/// An entity uid as records write it: `{"type": type, "id": id}`, the id unescaped
/// (docs/history.md#schema).
#[derive(Debug, Clone, Copy)]
pub struct Uid<'a>(pub &'a EntityUid);

impl Serialize for Uid<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", &self.0.type_name().to_string())?;
        m.serialize_entry("id", self.0.id().unescaped())?;
        m.end()
    }
}

/// A list of entity uids, each as [`Uid`].
#[derive(Debug, Clone, Copy)]
pub struct Uids<'a>(pub &'a [EntityUid]);

impl Serialize for Uids<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Uid))
    }
}

/// The resource of a plan's record: `{"type": T, "id": null}` (a plan names only the type).
#[derive(Debug, Clone, Copy)]
pub struct TypeOnly<'a>(pub &'a EntityTypeName);

impl Serialize for TypeOnly<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", &self.0.to_string())?;
        m.serialize_entry("id", &())?;
        m.end()
    }
}

/// `Type::"id"` with the id unescaped, the key form of the decision log
/// (docs/architecture.md#how-records-flow).
pub fn uid_key(u: &EntityUid) -> String {
    format!("{}::{}", u.type_name(), u.id().unescaped())
}

/// Formats epoch milliseconds as RFC 3339 UTC with milliseconds (`2026-11-22T07:25:00.123Z`;
/// RFC 3339 section 5.6, always three fractional digits and `Z`). Instants past the latest
/// one `jiff` represents are written as that one (`9999-12-30T22:00:00.999Z`).
pub fn rfc3339_ms(ms: u64) -> String {
    let ts = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    format!("{ts:.3}")
}

/// The response of a check, `POST /v1/access/evaluation` (docs/api.md#http-routes): `qid`,
/// `verdict`, `challenges`, `policies` (the principal's), `on_behalf_of` (the person's outcome,
/// only when the request named a person), `mode`. Made by [`Decision::response`].
#[derive(Debug, Clone, Serialize)]
pub struct CheckResponse<'a> {
    /// The decision id.
    pub qid: &'a str,
    /// The combined verdict.
    pub verdict: Verdict,
    /// Every challenge that must be passed.
    pub challenges: &'a [String],
    /// The principal's deciding policies.
    pub policies: &'a [String],
    /// The person's outcome; left out when the request named none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<&'a Outcome>,
    /// The mode in force.
    pub mode: Mode,
}

/// A check's decision-log record (docs/history.md#schema). Made by [`Decision::record`];
/// `call` and `transport` are set by the network front (left out when unset, as in the
/// in-process binding's record), `challenge_qid` is always `null` here (the service layer fills
/// it in).
#[derive(Debug, Clone, Serialize)]
pub struct DecisionRecord<'a> {
    /// The decision id.
    pub qid: &'a str,
    /// RFC 3339 time of the decision ([`rfc3339_ms`]).
    pub at: String,
    /// The principal.
    pub principal: Uid<'a>,
    /// The person the principal acted for, or `null`.
    pub on_behalf_of: Option<Uid<'a>>,
    /// The resolved action's id.
    pub action: &'a str,
    /// The resource.
    pub resource: Uid<'a>,
    /// The combined verdict.
    pub verdict: Verdict,
    /// Every challenge that must be passed.
    pub challenges: &'a [String],
    /// The principal's deciding policies.
    pub policies: &'a [String],
    /// The person's outcome, or `null`.
    pub on_behalf_of_outcome: Option<&'a Outcome>,
    /// The mode in force.
    pub mode: Mode,
    /// The challenge this decision answers: `null`.
    pub challenge_qid: Option<&'a str>,
    /// The work item named, or `null`.
    pub work_item: Option<&'a str>,
    /// Whether the work item is open and links the resource.
    pub assigned: bool,
    /// The reasoner's risk score, or `null`.
    pub risk_score: Option<i64>,
    /// The bundle version.
    pub policy_version: u64,
    /// The principals snapshot version.
    pub principals_version: u64,
    /// Time spent deciding, microseconds.
    pub latency_us: u64,
    /// Principals the directory does not hold.
    pub not_in_directory: Uids<'a>,
    /// Inline entities the check ignored.
    pub inline_ignored: Uids<'a>,
    /// The decision point's name.
    pub pdp: &'a str,
    /// `check`; left out when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<Call>,
    /// The transport the check came by (`http`, `grpc`, `authzen`); left out when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<&'a str>,
}

impl Decision {
    /// The check response view ([`CheckResponse`]).
    pub fn response(&self) -> CheckResponse<'_> {
        CheckResponse {
            qid: &self.qid,
            verdict: self.verdict,
            challenges: &self.challenges,
            policies: &self.principal_outcome.policies,
            on_behalf_of: self.on_behalf_of_outcome.as_ref(),
            mode: self.mode,
        }
    }

    /// The decision-log record view ([`DecisionRecord`]) written by decision point `pdp`, with
    /// no `call` nor `transport` (set them on the view where they are known).
    pub fn record<'a>(&'a self, pdp: &'a str) -> DecisionRecord<'a> {
        DecisionRecord {
            qid: &self.qid,
            at: rfc3339_ms(self.at_ms),
            principal: Uid(&self.principal),
            on_behalf_of: self.on_behalf_of.as_ref().map(Uid),
            action: self.action.id().unescaped(),
            resource: Uid(&self.resource),
            verdict: self.verdict,
            challenges: &self.challenges,
            policies: &self.principal_outcome.policies,
            on_behalf_of_outcome: self.on_behalf_of_outcome.as_ref(),
            mode: self.mode,
            challenge_qid: None,
            work_item: self.work_item.as_deref(),
            assigned: self.assigned,
            risk_score: self.risk_score,
            policy_version: self.policy_version,
            principals_version: self.principals_version,
            latency_us: self.latency_us,
            not_in_directory: Uids(&self.not_in_directory),
            inline_ignored: Uids(&self.inline_ignored),
            pdp,
            call: None,
            transport: None,
        }
    }

    /// The HTTP response of `POST /v1/access/evaluation` as JSON ([`Decision::response`]).
    pub fn to_response(&self) -> Value {
        to_value(&self.response())
    }

    /// The decision-log record as JSON ([`Decision::record`], without `call` and `transport`).
    pub fn to_record(&self, pdp: &str) -> Value {
        to_value(&self.record(pdp))
    }
}

/// A view as a JSON value. The views of this module cannot fail to serialise (every map key is
/// a string, no value refuses), so the `null` fallback is never taken; callers that write
/// records serialise the views themselves and count failures.
fn to_value(view: &impl Serialize) -> Value {
    serde_json::to_value(view).unwrap_or(Value::Null)
}

/// The outcome of a plan (docs/plans.md#building-a-plan-engineplan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanOutcome {
    /// Every row; no filter.
    AlwaysAllowed,
    /// No row; skip the query.
    AlwaysDenied,
    /// Every row needs the challenges passed first; then the filter applies.
    Challenge,
    /// The rows the filter matches.
    Conditional,
}

impl PlanOutcome {
    /// Wire name (`always_allowed`, `always_denied`, `challenge`, `conditional`), as it is
    /// serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlwaysAllowed => "always_allowed",
            Self::AlwaysDenied => "always_denied",
            Self::Challenge => "challenge",
            Self::Conditional => "conditional",
        }
    }
}

/// A query plan: the response of `POST /v1/access/plan` (docs/plans.md) plus what the decision log
/// records about it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryPlan {
    /// Plan id; a later request with `plan_qid` set to it pages with the same plan.
    pub qid: String,
    /// Outcome.
    pub outcome: PlanOutcome,
    /// The filter tree; present for `conditional` and `challenge`. Shared (`Arc`) with the
    /// plan cache and the side memo, so a cached or memoised plan is not copied.
    pub filter: Option<Arc<Filter>>,
    /// Challenge kinds: the ones to pass first (`challenge`), or the ones that could show more
    /// rows (`conditional` with `challenge_could_widen`). Sorted, unique.
    pub challenges: Vec<String>,
    /// A challenge hides some rows that passing it would show.
    pub challenge_could_widen: bool,
    /// Names of the policies (or built-in reasons) the plan was built from, sorted.
    pub policies: Vec<String>,
    /// Mode in force (reported, never applied: monitor mode still gets the real filter).
    pub mode: Mode,
    /// Version of the policies the plan was built with.
    pub policy_version: u64,
    /// Version of the principals when the plan was built.
    pub principals_version: u64,
    /// Seconds the plan is good for.
    pub max_age_secs: u64,
    /// True when an earlier plan was returned again for paging.
    pub pinned: bool,
    /// The principal (for the decision log).
    pub principal: EntityUid,
    /// The person the principal acted for.
    pub on_behalf_of: Option<EntityUid>,
    /// The resolved action.
    pub action: EntityUid,
    /// The resolved resource type.
    pub resource_type: EntityTypeName,
    /// Microseconds spent building (or finding) the plan.
    pub latency_us: u64,
}

/// The response of a plan, `POST /v1/access/plan` (docs/plans.md): the plan's fields with
/// `filter` left out when there is none, and the filter's summary (`needs_row_checks`,
/// `attributes`). Made by [`QueryPlan::response`].
#[derive(Debug, Clone, Serialize)]
pub struct PlanResponse<'a> {
    /// The plan id.
    pub qid: &'a str,
    /// The outcome.
    pub outcome: PlanOutcome,
    /// The filter tree (docs/plans.md#the-filter-tree); left out when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<&'a Filter>,
    /// Challenge kinds.
    pub challenges: &'a [String],
    /// Whether passing a challenge would show more rows.
    pub challenge_could_widen: bool,
    /// Whether some rows need a check of their own.
    pub needs_row_checks: bool,
    /// Attributes the filter reads, sorted.
    pub attributes: Vec<String>,
    /// The policies the plan was built from.
    pub policies: &'a [String],
    /// The mode in force.
    pub mode: Mode,
    /// The bundle version.
    pub policy_version: u64,
    /// The principals snapshot version.
    pub principals_version: u64,
    /// Seconds the plan is good for.
    pub max_age_secs: u64,
    /// Whether an earlier plan was returned again.
    pub pinned: bool,
}

/// A plan's decision-log record (docs/history.md#schema): `call` `plan`, the plan's `outcome`
/// and filter summary (`needs_row_checks`, `attributes`, no filter), `verdict` `null`, and
/// `resource` naming only the type. Made by [`QueryPlan::record`].
#[derive(Debug, Clone, Serialize)]
pub struct PlanRecord<'a> {
    /// The plan id.
    pub qid: &'a str,
    /// RFC 3339 time the record was made ([`rfc3339_ms`]).
    pub at: String,
    /// `plan`.
    pub call: Call,
    /// The transport the plan came by (`http`, `grpc`).
    pub transport: &'a str,
    /// The principal.
    pub principal: Uid<'a>,
    /// The person the principal acted for, or `null`.
    pub on_behalf_of: Option<Uid<'a>>,
    /// The resolved action's id.
    pub action: &'a str,
    /// The resource type, as `{"type": T, "id": null}`.
    pub resource: TypeOnly<'a>,
    /// Always `null` for a plan.
    pub verdict: Option<Verdict>,
    /// The outcome.
    pub outcome: PlanOutcome,
    /// Challenge kinds.
    pub challenges: &'a [String],
    /// The policies the plan was built from.
    pub policies: &'a [String],
    /// The mode in force.
    pub mode: Mode,
    /// The challenge this plan answers: `null`.
    pub challenge_qid: Option<&'a str>,
    /// Whether an earlier plan was returned again.
    pub pinned: bool,
    /// Whether some rows need a check of their own.
    pub needs_row_checks: bool,
    /// Attributes the filter reads, sorted.
    pub attributes: Vec<String>,
    /// The bundle version.
    pub policy_version: u64,
    /// The principals snapshot version.
    pub principals_version: u64,
    /// Microseconds spent building (or finding) the plan.
    pub latency_us: u64,
    /// The decision point's name.
    pub pdp: &'a str,
}

impl QueryPlan {
    /// `needs_row_checks` and `attributes` of the filter (`false` and none without one).
    fn summary(&self) -> (bool, Vec<String>) {
        self.filter.as_ref().map_or((false, Vec::new()), |f| {
            (f.needs_row_checks(), f.attributes())
        })
    }

    /// The plan response view ([`PlanResponse`]).
    pub fn response(&self) -> PlanResponse<'_> {
        let (needs_row_checks, attributes) = self.summary();
        PlanResponse {
            qid: &self.qid,
            outcome: self.outcome,
            filter: self.filter.as_deref(),
            challenges: &self.challenges,
            challenge_could_widen: self.challenge_could_widen,
            needs_row_checks,
            attributes,
            policies: &self.policies,
            mode: self.mode,
            policy_version: self.policy_version,
            principals_version: self.principals_version,
            max_age_secs: self.max_age_secs,
            pinned: self.pinned,
        }
    }

    /// The decision-log record view ([`PlanRecord`]) of this plan, made at `at_ms` (epoch
    /// milliseconds) by decision point `pdp`, which received it by `transport`.
    pub fn record<'a>(&'a self, pdp: &'a str, transport: &'a str, at_ms: u64) -> PlanRecord<'a> {
        let (needs_row_checks, attributes) = self.summary();
        PlanRecord {
            qid: &self.qid,
            at: rfc3339_ms(at_ms),
            call: Call::Plan,
            transport,
            principal: Uid(&self.principal),
            on_behalf_of: self.on_behalf_of.as_ref().map(Uid),
            action: self.action.id().unescaped(),
            resource: TypeOnly(&self.resource_type),
            verdict: None,
            outcome: self.outcome,
            challenges: &self.challenges,
            policies: &self.policies,
            mode: self.mode,
            challenge_qid: None,
            pinned: self.pinned,
            needs_row_checks,
            attributes,
            policy_version: self.policy_version,
            principals_version: self.principals_version,
            latency_us: self.latency_us,
            pdp,
        }
    }

    /// The HTTP response body of `POST /v1/access/plan` as JSON ([`QueryPlan::response`]).
    pub fn to_response(&self) -> Value {
        to_value(&self.response())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rfc3339_ms_writes_milliseconds_and_z() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_795_332_300_123), "2026-11-22T07:25:00.123Z");
        // A leap day, and a whole second (three zero digits kept).
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(u64::MAX), "9999-12-30T22:00:00.999Z");
    }

    /// The civil-from-days conversion `rfc3339_ms` used before it used `jiff` (Howard
    /// Hinnant's algorithm, proleptic Gregorian calendar), as the reference it must match.
    fn civil(ms: u64) -> String {
        let secs = ms / 1000;
        let days = i64::try_from(secs / 86_400).unwrap();
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60,
            ms % 1000
        )
    }

    #[test]
    fn rfc3339_ms_matches_the_former_conversion() {
        // Every 7,919,999,993 ms (about 92 days, prime) from 1970 to past 2400.
        let mut ms = 0u64;
        while ms < 14_000_000_000_000 {
            assert_eq!(rfc3339_ms(ms), civil(ms), "{ms}");
            ms += 7_919_999_993;
        }
    }

    #[test]
    fn check_views_write_what_the_json_builders_wrote() {
        use serde_json::json;
        let uid = |t: &str, i: &str| -> EntityUid { format!("{t}::\"{i}\"").parse().unwrap() };
        let obo = Outcome {
            verdict: Verdict::Challenge,
            challenges: vec!["mfa".into()],
            policies: vec!["q".into()],
        };
        let d = Decision {
            qid: "q1".into(),
            at_ms: 1_795_332_300_123,
            principal: uid("ServiceAccount", "bot"),
            on_behalf_of: Some(uid("Human", "ann")),
            action: uid("Action", "read"),
            resource: uid("Doc", "d1"),
            verdict: Verdict::Challenge,
            challenges: vec!["mfa".into()],
            principal_outcome: Outcome {
                verdict: Verdict::Allow,
                challenges: vec![],
                policies: vec!["p".into()],
            },
            on_behalf_of_outcome: Some(obo),
            mode: Mode::Enforce,
            work_item: Some("w1".into()),
            assigned: true,
            risk_score: Some(40),
            policy_version: 1,
            principals_version: 2,
            latency_us: 3,
            not_in_directory: vec![uid("Human", "ann")],
            inline_ignored: vec![uid("Doc", "d2")],
        };
        let outcome = json!({"verdict": "challenge", "challenges": ["mfa"], "policies": ["q"]});
        // The response and record as the hand-written builders made them (the network front
        // appended `call` and `transport` to the record).
        let response = json!({
            "qid": "q1", "verdict": "challenge", "challenges": ["mfa"], "policies": ["p"],
            "on_behalf_of": outcome, "mode": "enforce",
        });
        let record = json!({
            "qid": "q1", "at": "2026-11-22T07:25:00.123Z",
            "principal": {"type": "ServiceAccount", "id": "bot"},
            "on_behalf_of": {"type": "Human", "id": "ann"}, "action": "read",
            "resource": {"type": "Doc", "id": "d1"}, "verdict": "challenge",
            "challenges": ["mfa"], "policies": ["p"], "on_behalf_of_outcome": outcome,
            "mode": "enforce", "challenge_qid": null, "work_item": "w1", "assigned": true,
            "risk_score": 40, "policy_version": 1, "principals_version": 2, "latency_us": 3,
            "not_in_directory": [{"type": "Human", "id": "ann"}],
            "inline_ignored": [{"type": "Doc", "id": "d2"}], "pdp": "pdp-1",
            "call": "check", "transport": "http",
        });
        let s = |v: &dyn erased::Ser| v.json();
        assert_eq!(s(&d.response()), s(&response));
        let mut rec = d.record("pdp-1");
        rec.call = Some(Call::Check);
        rec.transport = Some("http");
        assert_eq!(s(&rec), s(&record));
        // Without a person, `on_behalf_of` is left out of the response and null in the record.
        let lone = Decision {
            on_behalf_of: None,
            on_behalf_of_outcome: None,
            ..d
        };
        assert!(!s(&lone.response()).contains("on_behalf_of"));
        assert!(s(&lone.record("p")).contains(r#""on_behalf_of":null,"#));
        assert!(!s(&lone.record("p")).contains("transport"));
    }

    #[test]
    fn plan_views_write_what_the_json_builders_wrote() {
        use serde_json::json;
        let uid = |t: &str, i: &str| -> EntityUid { format!("{t}::\"{i}\"").parse().unwrap() };
        let filter = Filter::Compare {
            attr: vec!["owner".into()],
            cmp: crate::residual_filter::Cmp::Eq,
            value: json!({"__entity": {"type": "Human", "id": "ann"}}),
        };
        let p = QueryPlan {
            qid: "q".into(),
            outcome: PlanOutcome::Conditional,
            filter: Some(Arc::new(filter)),
            challenges: vec!["mfa".into()],
            challenge_could_widen: true,
            policies: vec!["p1".into(), "p2".into()],
            mode: Mode::Monitor,
            policy_version: 3,
            principals_version: 4,
            max_age_secs: 300,
            pinned: false,
            principal: uid("ServiceAccount", "bot"),
            on_behalf_of: Some(uid("Human", "ann")),
            action: uid("Action", "read"),
            resource_type: "Doc".parse().unwrap(),
            latency_us: 7,
        };
        let f = p.filter.as_deref().unwrap();
        // The response and record as the hand-written builders made them.
        let response = json!({
            "qid": "q", "outcome": "conditional", "filter": f.to_json(), "challenges": ["mfa"],
            "challenge_could_widen": true, "needs_row_checks": f.needs_row_checks(),
            "attributes": f.attributes(), "policies": ["p1", "p2"], "mode": "monitor",
            "policy_version": 3, "principals_version": 4, "max_age_secs": 300, "pinned": false,
        });
        let record = json!({
            "qid": "q", "at": rfc3339_ms(5), "call": "plan", "transport": "grpc",
            "principal": {"type": "ServiceAccount", "id": "bot"},
            "on_behalf_of": {"type": "Human", "id": "ann"}, "action": "read",
            "resource": {"type": "Doc", "id": null}, "verdict": null, "outcome": "conditional",
            "challenges": ["mfa"], "policies": ["p1", "p2"], "mode": "monitor",
            "challenge_qid": null, "pinned": false, "needs_row_checks": f.needs_row_checks(),
            "attributes": f.attributes(), "policy_version": 3, "principals_version": 4,
            "latency_us": 7, "pdp": "pdp-1",
        });
        let s = |v: &dyn erased::Ser| v.json();
        assert_eq!(s(&p.response()), s(&response));
        assert_eq!(s(&p.record("pdp-1", "grpc", 5)), s(&record));
    }

    /// Serialising either a view or a JSON value, to compare their bytes.
    mod erased {
        pub(super) trait Ser {
            fn json(&self) -> String;
        }
        impl<T: serde::Serialize> Ser for T {
            fn json(&self) -> String {
                serde_json::to_string(self).unwrap()
            }
        }
    }
}
