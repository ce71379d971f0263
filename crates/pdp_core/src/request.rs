//! Check requests: the JSON of `POST /v1/access/evaluation` (docs/decisions.md#request), parsed and
//! checked.

use crate::error::RequestError;
use cedar_policy::{EntityId, EntityTypeName, EntityUid};
use serde::de::{self, Deserializer, Error as _, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use serde_path_to_error::Segment;
use std::str::FromStr;

/// Fields a check request may carry (docs/decisions.md#request; `work_item_id` comes from the
/// `svc_work_item_id` claim, docs/architecture.md#agent-tokens).
pub const CHECK_FIELDS: [&str; 8] = [
    "principal",
    "action",
    "resource",
    "context",
    "on_behalf_of",
    "human_present",
    "work_item_id",
    "entities",
];

/// Context attributes the decision point fills in; callers cannot forge them
/// (docs/decisions.md#context-the-decision-point-fills-in).
pub const INJECTED_CONTEXT: [&str; 4] = ["human_present", "agent", "work_item", "assigned"];

/// Parses an entity reference: `{"type": T, "id": I}`, `{"__entity": {"type": T, "id": I}}`
/// or Cedar's literal form `T::"I"`.
///
/// # Errors
/// [`RequestError`] on `field` when the value is none of these or the type name is not a valid
/// Cedar name.
pub fn parse_uid(value: &Value, field: &str) -> Result<EntityUid, RequestError> {
    match value {
        Value::String(s) => {
            let uid = EntityUid::from_str(s).map_err(|e| {
                RequestError::new(
                    field,
                    format!(
                        "`{}` is not an entity reference (`Type::\"id\"` or {{type, id}}): {e}",
                        s.escape_debug()
                    ),
                )
            })?;
            check_identifier(uid.id().unescaped(), &format!("{field}.id"))?;
            Ok(uid)
        }
        Value::Object(obj) => {
            if let Some(inner) = obj.get("__entity") {
                return parse_uid(inner, field);
            }
            for k in obj.keys() {
                if k != "type" && k != "id" {
                    return Err(RequestError::new(
                        field,
                        format!(
                            "unexpected key `{k}` in entity reference: expected `type` and `id`"
                        ),
                    ));
                }
            }
            let ty = obj.get("type").and_then(Value::as_str).ok_or_else(|| {
                RequestError::new(format!("{field}.type"), "expected a string entity type")
            })?;
            let id = obj.get("id").and_then(Value::as_str).ok_or_else(|| {
                RequestError::new(format!("{field}.id"), "expected a string entity id")
            })?;
            uid_from_parts(ty, id, field)
        }
        Value::Null => Err(RequestError::new(field, "is required")),
        other => Err(RequestError::new(
            field,
            format!(
                "expected an entity reference {{type, id}}, got {}",
                kind(other)
            ),
        )),
    }
}

/// The entity reference `{"type": ty, "id": id}` (see [`parse_uid`]).
///
/// # Errors
/// [`RequestError`] on `<field>.type` when `ty` is not a valid Cedar entity type name.
pub fn uid_from_parts(ty: &str, id: &str, field: &str) -> Result<EntityUid, RequestError> {
    check_identifier(id, &format!("{field}.id"))?;
    let tn = type_name(ty).map_err(|e| {
        RequestError::new(
            format!("{field}.type"),
            format!("`{ty}` is not a valid entity type name: {e}"),
        )
    })?;
    Ok(EntityUid::from_type_name_and_id(tn, EntityId::new(id)))
}

/// Refuses an identifier (an entity id, an action, a work item id) that holds a control
/// character: C0 (NUL included), DEL or C1 (Unicode `Cc`). Such ids cannot be typed, print
/// as something else than they are in logs and records, and no directory issues them.
///
/// # Errors
/// [`RequestError`] on `field` naming the first control character and its position.
pub fn check_identifier(id: &str, field: &str) -> Result<(), RequestError> {
    match id.char_indices().find(|(_, c)| c.is_control()) {
        None => Ok(()),
        Some((at, c)) => Err(RequestError::new(
            field,
            format!(
                "control character U+{:04X} at byte {at}: identifiers may not hold control characters",
                u32::from(c)
            ),
        )),
    }
}

/// Most type names [`type_name`] keeps per thread before it starts over.
const TYPE_NAME_MEMO: usize = 256;

thread_local! {
    static TYPE_NAMES: std::cell::RefCell<crate::maps::FastMap<String, EntityTypeName>> =
        std::cell::RefCell::new(crate::maps::FastMap::default());
}

/// Parses an entity type name, remembering valid ones per thread: Cedar's parser is the
/// dearest part of reading a request, and requests name few distinct types. Invalid names are
/// parsed (and reported) every time. Valid names are canonical (`crate::intern`).
///
/// # Errors
/// Cedar's parse errors for `ty`, as text.
fn type_name(ty: &str) -> Result<EntityTypeName, String> {
    if let Some(t) = TYPE_NAMES.with(|m| m.borrow().get(ty).cloned()) {
        return Ok(t);
    }
    let t = EntityTypeName::from_str(ty).map_err(|e| e.to_string())?;
    let t = EntityTypeName::from(crate::intern::entity_type(t.as_ref()));
    TYPE_NAMES.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= TYPE_NAME_MEMO {
            m.clear();
        }
        m.insert(ty.to_owned(), t.clone());
    });
    Ok(t)
}

/// A JSON type's name for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A check request, syntactically valid; the engine resolves names against the bundle.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    /// The actor.
    pub principal: EntityUid,
    /// Action as sent: bare id or full uid.
    pub action: String,
    /// The resource.
    pub resource: EntityUid,
    /// Caller's context (decision-point fields are overwritten,
    /// docs/decisions.md#context-the-decision-point-fills-in).
    pub context: Map<String, Value>,
    /// The person a service account acts for.
    pub on_behalf_of: Option<EntityUid>,
    /// Whether a person can answer a challenge now; absent means yes.
    pub human_present: bool,
    /// The work item the token named (`svc_work_item_id`), if any.
    pub work_item_id: Option<String>,
    /// Inline entities (Cedar JSON entity shape), parsed against the bundle by the engine.
    pub entities: Vec<Value>,
}

impl CheckRequest {
    /// Parses the request JSON of `POST /v1/access/evaluation`.
    ///
    /// # Errors
    /// [`RequestError`] naming the field: unknown field, missing `principal`/`action`/`resource`,
    /// wrong JSON types.
    pub fn from_json(value: &Value) -> Result<Self, RequestError> {
        Self::from_value(value.clone())
    }

    /// [`CheckRequest::from_json`] on an owned value: the context and inline entities are moved,
    /// not copied.
    ///
    /// # Errors
    /// As [`CheckRequest::from_json`].
    pub fn from_value(value: Value) -> Result<Self, RequestError> {
        let Value::Object(obj) = value else {
            return Err(RequestError::new(
                "request",
                format!("expected a JSON object, got {}", kind(&value)),
            ));
        };
        Self::from_object(obj, None, None)
    }

    /// [`CheckRequest::from_value`] on the request object, with the principal and resource
    /// already parsed where the caller could (`None`: read from `obj`, which then must not
    /// also hold them). Bindings use it to skip building JSON for the two entity references
    /// (see [`uid_from_parts`]).
    ///
    /// # Errors
    /// As [`CheckRequest::from_json`].
    pub fn from_object(
        obj: impl IntoIterator<Item = (String, Value)>,
        principal: Option<EntityUid>,
        resource: Option<EntityUid>,
    ) -> Result<Self, RequestError> {
        let mut f = Fields::take(obj, &CHECK_FIELDS);
        if let Some(k) = f.unknown.take() {
            return Err(unknown_field(&k, &CHECK_FIELDS, ""));
        }
        let principal = given_or_read(principal, f.principal.as_ref(), "principal")?;
        let resource = given_or_read(resource, f.resource.as_ref(), "resource")?;
        let action = take_action(f.action, "action")?;
        let context = take_context(f.context, "context")?;
        let on_behalf_of = optional_uid(f.on_behalf_of.as_ref(), "on_behalf_of")?;
        let human_present = take_human_present(f.human_present, "human_present")?;
        let work_item_id = take_work_item_id(f.work_item_id, "work_item_id")?;
        let entities = take_entities(f.entities, "entities")?;
        Ok(Self {
            principal,
            action,
            resource,
            context,
            on_behalf_of,
            human_present,
            work_item_id,
            entities,
        })
    }
}

/// The fields of a check or plan request object, taken in one pass over its entries (each
/// matched by name once, none looked up), so that a request read from Python or JSON needs no
/// map of its own.
#[derive(Default)]
struct Fields {
    principal: Option<Value>,
    action: Option<Value>,
    resource: Option<Value>,
    context: Option<Value>,
    on_behalf_of: Option<Value>,
    human_present: Option<Value>,
    work_item_id: Option<Value>,
    entities: Option<Value>,
    resource_type: Option<Value>,
    plan_qid: Option<Value>,
    /// The first entry whose name is not in `allowed`.
    unknown: Option<String>,
}

impl Fields {
    /// Sorts the entries of `obj` into their fields; names outside `allowed` (a subset of the
    /// fields above) leave the first of them in `unknown`. A repeated name keeps its last value.
    fn take(obj: impl IntoIterator<Item = (String, Value)>, allowed: &[&str]) -> Self {
        let mut f = Self::default();
        for (k, v) in obj {
            let slot = if allowed.contains(&k.as_str()) {
                match k.as_str() {
                    "principal" => Some(&mut f.principal),
                    "action" => Some(&mut f.action),
                    "resource" => Some(&mut f.resource),
                    "context" => Some(&mut f.context),
                    "on_behalf_of" => Some(&mut f.on_behalf_of),
                    "human_present" => Some(&mut f.human_present),
                    "work_item_id" => Some(&mut f.work_item_id),
                    "entities" => Some(&mut f.entities),
                    "resource_type" => Some(&mut f.resource_type),
                    "plan_qid" => Some(&mut f.plan_qid),
                    _ => None,
                }
            } else {
                None
            };
            match slot {
                Some(slot) => *slot = Some(v),
                None => {
                    if f.unknown.is_none() {
                        f.unknown = Some(k);
                    }
                }
            }
        }
        f
    }
}

/// The error for a request entry `k` outside `fields`, naming the fields a request takes.
fn unknown_field(k: &str, fields: &[&str], hint: &str) -> RequestError {
    let expected: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
    RequestError::new(
        k,
        format!(
            "unknown field `{k}`{hint}: expected one of {}",
            expected.join(", ")
        ),
    )
}

/// The `action` field shared by check and plan requests: a non-empty string, or an entity
/// reference written back as `Type::"id"`.
fn take_action(v: Option<Value>, field: &str) -> Result<String, RequestError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => {
            check_identifier(&s, field)?;
            Ok(s)
        }
        Some(o @ Value::Object(_)) if o.get("type").is_some() || o.get("__entity").is_some() => {
            Ok(parse_uid(&o, field)?.to_string())
        }
        None | Some(Value::Null) => Err(RequestError::new(field, "is required")),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected a non-empty string, got {}", kind(&other)),
        )),
    }
}

/// The `action` of a request given as text (gRPC's `action` field), checked as the same text
/// in a JSON request is: a non-empty string without control characters.
///
/// # Errors
/// [`RequestError`] on `action` when `s` is empty or holds a control character.
pub fn action_text(s: String) -> Result<String, RequestError> {
    take_action(Some(Value::String(s)), "action")
}

/// The `resource_type` of a plan request given as text (gRPC's `resource_type` field), checked
/// as the same text in a JSON request is: a non-empty string.
///
/// # Errors
/// [`RequestError`] on `resource_type` when `s` is empty.
pub fn resource_type_text(s: String) -> Result<String, RequestError> {
    take_resource_type(Some(Value::String(s)), "resource_type")
}

/// The `resource_type` field of a plan request: a non-empty string (absent or null: "is
/// required").
fn take_resource_type(v: Option<Value>, field: &str) -> Result<String, RequestError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        None | Some(Value::Null) => Err(RequestError::new(field, "is required")),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected a non-empty string, got {}", kind(&other)),
        )),
    }
}

/// A required entity reference: `given` when the caller already parsed it, else read from
/// the field's value `v` (absent: "is required").
fn given_or_read(
    given: Option<EntityUid>,
    v: Option<&Value>,
    field: &str,
) -> Result<EntityUid, RequestError> {
    match given {
        Some(u) => Ok(u),
        None => parse_uid(v.unwrap_or(&Value::Null), field),
    }
}

/// An optional entity reference field (absent or null: `None`), as [`parse_uid`] reads it.
fn optional_uid(v: Option<&Value>, field: &str) -> Result<Option<EntityUid>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parse_uid(v, field).map(Some),
    }
}

/// The `human_present` field of a check request (absent or null: `true`).
fn take_human_present(v: Option<Value>, field: &str) -> Result<bool, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(b),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected a boolean, got {}", kind(&other)),
        )),
    }
}

/// The `work_item_id` field of a check request (absent or null: `None`).
fn take_work_item_id(v: Option<Value>, field: &str) -> Result<Option<String>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            check_identifier(&s, field)?;
            Ok(Some(s))
        }
        Some(other) => Err(RequestError::new(
            field,
            format!("expected a string, got {}", kind(&other)),
        )),
    }
}

/// The `entities` field of a check request (absent or null: none).
fn take_entities(v: Option<Value>, field: &str) -> Result<Vec<Value>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected an array of entities, got {}", kind(&other)),
        )),
    }
}

/// The `plan_qid` field of a plan request (absent, null or empty: `None`).
fn take_plan_qid(v: Option<Value>, field: &str) -> Result<Option<String>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected a string, got {}", kind(&other)),
        )),
    }
}

/// The `context` field shared by check and plan requests (absent or null: empty).
fn take_context(v: Option<Value>, field: &str) -> Result<Map<String, Value>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(other) => Err(RequestError::new(
            field,
            format!("expected an object, got {}", kind(&other)),
        )),
    }
}

/// Fields a plan request may carry (docs/plans.md#building-a-plan-engineplan).
pub const PLAN_FIELDS: [&str; 6] = [
    "principal",
    "on_behalf_of",
    "action",
    "context",
    "resource_type",
    "plan_qid",
];

/// A plan request (`POST /v1/access/plan`, gRPC `Plan`; docs/plans.md), syntactically valid.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// The actor.
    pub principal: EntityUid,
    /// The person a service account acts for.
    pub on_behalf_of: Option<EntityUid>,
    /// Action as sent: bare id or full uid.
    pub action: String,
    /// Caller's context (decision-point fields are overwritten,
    /// docs/decisions.md#context-the-decision-point-fills-in).
    pub context: Map<String, Value>,
    /// The type of the rows to list, as sent (`Document` or `NS::Document`).
    pub resource_type: String,
    /// The plan to page with, from an earlier response's `qid`.
    pub plan_qid: Option<String>,
}

impl PlanRequest {
    /// Parses the request JSON of `POST /v1/access/plan`.
    ///
    /// # Errors
    /// [`RequestError`] naming the field: unknown field, missing `principal`, `action` or
    /// `resource_type`, wrong JSON types.
    pub fn from_json(value: &Value) -> Result<Self, RequestError> {
        Self::from_value(value.clone())
    }

    /// [`PlanRequest::from_json`] on an owned value (the context is moved, not copied).
    ///
    /// # Errors
    /// As [`PlanRequest::from_json`].
    pub fn from_value(value: Value) -> Result<Self, RequestError> {
        let Value::Object(obj) = value else {
            return Err(RequestError::new(
                "request",
                format!("expected a JSON object, got {}", kind(&value)),
            ));
        };
        Self::from_object(obj, None)
    }

    /// [`PlanRequest::from_json`] on the request object, with the principal already parsed
    /// where the caller could (`None`: read from `obj`, which then must not also hold it).
    /// Bindings use it to skip building JSON for the principal (see [`uid_from_parts`]).
    ///
    /// # Errors
    /// As [`PlanRequest::from_json`].
    pub fn from_object(
        obj: impl IntoIterator<Item = (String, Value)>,
        principal: Option<EntityUid>,
    ) -> Result<Self, RequestError> {
        let mut f = Fields::take(obj, &PLAN_FIELDS);
        if let Some(k) = f.unknown.take() {
            let hint = if k == "resource" {
                " (a plan takes `resource_type`, the type of the rows to list)"
            } else {
                ""
            };
            return Err(unknown_field(&k, &PLAN_FIELDS, hint));
        }
        // The same fields, in the same order, as a check request reads them.
        let principal = given_or_read(principal, f.principal.as_ref(), "principal")?;
        let action = take_action(f.action, "action")?;
        let context = take_context(f.context, "context")?;
        let on_behalf_of = optional_uid(f.on_behalf_of.as_ref(), "on_behalf_of")?;
        let resource_type = take_resource_type(f.resource_type, "resource_type")?;
        let plan_qid = take_plan_qid(f.plan_qid, "plan_qid")?;
        Ok(Self {
            principal,
            on_behalf_of,
            action,
            context,
            resource_type,
            plan_qid,
        })
    }
}

// ------------------------------------------------------------ request bodies read by serde

/// Why a request body (bytes) could not be read as a check or plan request.
#[derive(Debug)]
pub enum BodyError {
    /// The body is not JSON (RFC 8259): a syntax error, an early end, trailing characters or
    /// nesting past `serde_json`'s limit of 128. It is reported as such even when a field's
    /// type error comes before the syntax error in the body, as when the body was parsed into a
    /// [`Value`] first.
    Json(serde_json::Error),
    /// The body is JSON but not a valid request: the [`RequestError`] names the field.
    Request(RequestError),
}

impl From<RequestError> for BodyError {
    fn from(e: RequestError) -> Self {
        Self::Request(e)
    }
}

impl CheckRequest {
    /// Parses the body of `POST /v1/access/evaluation` (JSON bytes, docs/decisions.md#request)
    /// in one pass, without building a [`Value`] for the request object: its fields are read
    /// by serde derive, the context and inline entities straight into their [`Value`]s.
    ///
    /// Same requests, fields and messages as [`CheckRequest::from_value`], except which
    /// error comes first when a request has several: the first in body order (a missing
    /// `principal`, `action` or `resource` after all of them, in that order), and a field
    /// named twice, which is refused (docs/decisions.md#request).
    ///
    /// # Errors
    /// [`BodyError::Json`] when `bytes` is not JSON; [`BodyError::Request`] naming the field
    /// otherwise.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, BodyError> {
        let w: CheckWire = read_body(bytes, &CHECK_FIELDS, |_| "")?;
        Ok(Self {
            principal: required(w.principal, "principal")?,
            resource: required(w.resource, "resource")?,
            action: required(w.action, "action")?,
            context: w.context,
            on_behalf_of: w.on_behalf_of,
            human_present: w.human_present,
            work_item_id: w.work_item_id,
            entities: w.entities,
        })
    }
}

impl PlanRequest {
    /// Parses the body of `POST /v1/access/plan` (JSON bytes, docs/plans.md) in one pass, as
    /// [`CheckRequest::from_slice`] does a check request.
    ///
    /// Same requests, fields and messages as [`PlanRequest::from_value`], except which error
    /// comes first when a request has several (body order; a missing `principal`, `action` or
    /// `resource_type` after all of them, in that order) and a field named twice, which is
    /// refused (docs/decisions.md#request).
    ///
    /// # Errors
    /// [`BodyError::Json`] when `bytes` is not JSON; [`BodyError::Request`] naming the field
    /// otherwise.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, BodyError> {
        let w: PlanWire = read_body(bytes, &PLAN_FIELDS, |k| {
            if k == "resource" {
                " (a plan takes `resource_type`, the type of the rows to list)"
            } else {
                ""
            }
        })?;
        Ok(Self {
            principal: required(w.principal, "principal")?,
            action: required(w.action, "action")?,
            resource_type: required(w.resource_type, "resource_type")?,
            on_behalf_of: w.on_behalf_of,
            context: w.context,
            plan_qid: w.plan_qid,
        })
    }
}

/// A required field's value, or "is required" on `field`.
fn required<T>(v: Option<T>, field: &str) -> Result<T, RequestError> {
    v.ok_or_else(|| RequestError::new(field, "is required"))
}

/// A check request body as sent (docs/decisions.md#request). Every field is read as a JSON
/// value by its `take_*` reader, so the messages are those of [`CheckRequest::from_value`];
/// an absent field and `null` read alike.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckWire {
    #[serde(default, deserialize_with = "de_uid")]
    principal: Option<EntityUid>,
    #[serde(default, deserialize_with = "de_action")]
    action: Option<String>,
    #[serde(default, deserialize_with = "de_uid")]
    resource: Option<EntityUid>,
    #[serde(default, deserialize_with = "de_context")]
    context: Map<String, Value>,
    #[serde(default, deserialize_with = "de_uid")]
    on_behalf_of: Option<EntityUid>,
    #[serde(default = "yes", deserialize_with = "de_human_present")]
    human_present: bool,
    #[serde(default, deserialize_with = "de_work_item_id")]
    work_item_id: Option<String>,
    #[serde(default, deserialize_with = "de_entities")]
    entities: Vec<Value>,
}

/// A plan request body as sent (docs/plans.md), read as [`CheckWire`] is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanWire {
    #[serde(default, deserialize_with = "de_uid")]
    principal: Option<EntityUid>,
    #[serde(default, deserialize_with = "de_uid")]
    on_behalf_of: Option<EntityUid>,
    #[serde(default, deserialize_with = "de_action")]
    action: Option<String>,
    #[serde(default, deserialize_with = "de_context")]
    context: Map<String, Value>,
    #[serde(default, deserialize_with = "de_resource_type")]
    resource_type: Option<String>,
    #[serde(default, deserialize_with = "de_plan_qid")]
    plan_qid: Option<String>,
}

/// `human_present`'s default: a person is there.
const fn yes() -> bool {
    true
}

/// Marks a [`RequestError`] carried through serde's error as text: `MARK`, the field relative
/// to the serde path (`""`, `".type"`), `MARK`, the message.
const MARK: char = '\u{0}';

/// Reads one field's JSON value and checks it with `take`, whose [`RequestError`] names the
/// field relative to it (`""`, `".type"`); that error travels as a serde error (see [`MARK`]).
fn leaf<'de, D, T>(d: D, take: impl FnOnce(Value) -> Result<T, RequestError>) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    let v = Value::deserialize(d)?;
    take(v).map_err(|e| D::Error::custom(format_args!("{MARK}{}{MARK}{}", e.field, e.message)))
}

/// An entity reference in any of [`parse_uid`]'s forms; `null` is absent.
fn de_uid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EntityUid>, D::Error> {
    leaf(d, |v| match v {
        Value::Null => Ok(None),
        v => parse_uid(&v, "").map(Some),
    })
}

/// An action as `take_action` reads it; `null` is absent.
fn de_action<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    leaf(d, |v| match v {
        Value::Null => Ok(None),
        v => take_action(Some(v), "").map(Some),
    })
}

/// A plan's `resource_type` as `take_resource_type` reads it; `null` is absent.
fn de_resource_type<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    leaf(d, |v| match v {
        Value::Null => Ok(None),
        v => take_resource_type(Some(v), "").map(Some),
    })
}

/// The context object, moved out of its [`Value`].
fn de_context<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    leaf(d, |v| take_context(Some(v), ""))
}

/// `human_present` as `take_human_present` reads it.
fn de_human_present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    leaf(d, |v| take_human_present(Some(v), ""))
}

/// `work_item_id` as `take_work_item_id` reads it.
fn de_work_item_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    leaf(d, |v| take_work_item_id(Some(v), ""))
}

/// The inline entities, moved out of their [`Value`].
fn de_entities<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    leaf(d, |v| take_entities(Some(v), ""))
}

/// `plan_qid` as `take_plan_qid` reads it.
fn de_plan_qid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    leaf(d, |v| take_plan_qid(Some(v), ""))
}

/// A request object: `T` read from a JSON object, anything else refused as
/// [`CheckRequest::from_value`] refuses it ("expected a JSON object, got ..."). A derived
/// struct alone would also take an array of its fields in order.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectVisitor(std::marker::PhantomData))
    }
}

/// The visitor of [`Object`].
struct ObjectVisitor<T>(std::marker::PhantomData<T>);

impl<T> ObjectVisitor<T> {
    /// The error for a request that is a JSON `kind` other than an object.
    fn not<E: de::Error>(kind: &str) -> E {
        E::custom(format_args!(
            "{MARK}{MARK}expected a JSON object, got {kind}"
        ))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Object)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(Self::not("null"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(Self::not("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(Self::not("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(Self::not("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(Self::not("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(Self::not("a string"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(Self::not("an array"))
    }
}

/// Reads a request body into `T` in one pass and turns its first error into a
/// [`BodyError`]: a [`RequestError`] on the JSON path of the field (`principal.type`), an
/// unknown field as [`CheckRequest::from_value`] names it (with `hint(field)` after its
/// name), a field named twice as such.
///
/// The path comes from `serde_path_to_error`, on a second read of a body found wrong:
/// tracking it on every read costs an owned copy of every object key of the body (context
/// and inline entities included), which made a read slower than parsing a [`Value`] first.
fn read_body<'de, T: Deserialize<'de>>(
    bytes: &'de [u8],
    fields: &[&str],
    hint: impl Fn(&str) -> &'static str,
) -> Result<T, BodyError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let e = match Object::<T>::deserialize(&mut de) {
        // Only trailing characters can fail here: a syntax error.
        Ok(Object(t)) => return de.end().map(|()| t).map_err(BodyError::Json),
        Err(e) => e,
    };
    if !e.is_data() {
        return Err(BodyError::Json(e));
    }
    // A syntax error later in the body wins, as it did when the body was parsed whole first.
    if let Err(syntax) = serde_json::from_slice::<Value>(bytes) {
        return Err(BodyError::Json(syntax));
    }
    // The same read fails the same way, now naming where.
    let tracked = serde_path_to_error::deserialize::<_, Object<T>>(
        &mut serde_json::Deserializer::from_slice(bytes),
    );
    let path = tracked.err().map(|t| t.path().clone());
    let segments: Vec<&Segment> = path.iter().flat_map(|p| p.iter()).collect();
    let top = match segments.as_slice() {
        [Segment::Map { key }] => Some(key.as_str()),
        _ => None,
    };
    let at = match &path {
        Some(p) if !segments.is_empty() => p.to_string(),
        _ => "request".to_owned(),
    };
    let text = e.to_string();
    let text = text
        .strip_suffix(&format!(" at line {} column {}", e.line(), e.column()))
        .unwrap_or(&text);
    if let Some(carried) = text.strip_prefix(MARK) {
        let (rel, message) = carried.split_once(MARK).unwrap_or(("", carried));
        return Err(BodyError::Request(RequestError::new(
            format!("{at}{rel}"),
            message,
        )));
    }
    if let Some(k) = top.filter(|k| !fields.contains(k)) {
        return Err(BodyError::Request(unknown_field(k, fields, hint(k))));
    }
    if let Some(k) = text
        .strip_prefix("duplicate field `")
        .and_then(|t| t.strip_suffix('`'))
    {
        return Err(BodyError::Request(RequestError::new(
            k,
            format!(
                "duplicate field `{k}`: a request names each field once (RFC 7493, section 2.3)"
            ),
        )));
    }
    Err(BodyError::Request(RequestError::new(at, text)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// A well-formed check request.
    fn check() -> Value {
        json!({
            "principal": {"type": "Human", "id": "alice"},
            "action": "view",
            "resource": "Document::\"design\"",
            "context": {"risk_score": 3},
            "on_behalf_of": {"__entity": {"type": "Human", "id": "bob"}},
            "human_present": false,
            "work_item_id": "OPS-1",
            "entities": [{"uid": {"type": "Document", "id": "x"}, "attrs": {}, "parents": []}],
        })
    }

    /// A well-formed plan request.
    fn plan() -> Value {
        json!({
            "principal": {"type": "Human", "id": "alice"},
            "action": "Action::\"view\"",
            "context": {},
            "resource_type": "Document",
            "plan_qid": "",
        })
    }

    /// `from_slice` on `v`'s text reads as `from_value` on that text parsed (what the HTTP
    /// route did before): same request or same error.
    fn same_check(v: &Value) {
        let bytes = serde_json::to_vec(v).unwrap();
        let by_slice = CheckRequest::from_slice(&bytes).map(|r| format!("{r:?}"));
        let by_value = CheckRequest::from_value(serde_json::from_slice(&bytes).unwrap())
            .map(|r| format!("{r:?}"));
        match (by_slice, by_value) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(BodyError::Request(a)), Err(b)) => assert_eq!(a, b, "{v}"),
            (a, b) => panic!("{v}: from_slice {a:?}, from_value {b:?}"),
        }
    }

    /// As [`same_check`], for plan requests.
    fn same_plan(v: &Value) {
        let bytes = serde_json::to_vec(v).unwrap();
        let by_slice = PlanRequest::from_slice(&bytes);
        let by_value = PlanRequest::from_value(serde_json::from_slice(&bytes).unwrap());
        match (by_slice, by_value) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(BodyError::Request(a)), Err(b)) => assert_eq!(a, b, "{v}"),
            (a, b) => panic!("{v}: from_slice {a:?}, from_value {b:?}"),
        }
    }

    /// `from_slice`'s request error for `body`.
    fn check_error(body: &str) -> RequestError {
        match CheckRequest::from_slice(body.as_bytes()) {
            Err(BodyError::Request(e)) => e,
            other => panic!("{body}: {other:?}"),
        }
    }

    /// JSON values near what a request field holds: scalars, entity references in their
    /// three forms (valid or not), control characters, nested objects and arrays.
    fn field_value() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            Just(String::new()),
            Just("alice".to_owned()),
            Just("Human".to_owned()),
            Just("Human::\"alice\"".to_owned()),
            Just("Action::\"view\"".to_owned()),
            Just("not a type".to_owned()),
            Just("a\u{0}b".to_owned()),
            Just("x\u{85}".to_owned()),
            "[a-zA-Z:\" ]{0,12}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            let key = prop_oneof![
                Just("type".to_owned()),
                Just("id".to_owned()),
                Just("__entity".to_owned()),
                "[a-z]{1,4}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..3)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// A request with one field replaced by (or added as) an arbitrary value reads the
        /// same from bytes as from its [`Value`]: with one error there is no order to differ.
        #[test]
        fn one_field_reads_alike(
            field in prop::sample::select(vec![
                "principal", "action", "resource", "context", "on_behalf_of", "human_present",
                "work_item_id", "entities", "resource_type", "plan_qid", "other",
            ]),
            value in field_value(),
            drop in any::<bool>(),
        ) {
            for (mut req, same) in [
                (check(), same_check as fn(&Value)),
                (plan(), same_plan as fn(&Value)),
            ] {
                let obj = req.as_object_mut().unwrap();
                if drop {
                    obj.remove(field);
                } else {
                    obj.insert(field.to_owned(), value.clone());
                }
                same(&req);
            }
        }

        /// Any JSON value as a whole request reads as it does from its [`Value`] when it has
        /// at most one field.
        #[test]
        fn whole_values_read_alike(value in field_value()) {
            if value.as_object().is_none_or(|o| o.len() <= 1) {
                same_check(&value);
                same_plan(&value);
            }
        }
    }

    #[test]
    fn fields_and_messages_are_those_of_from_value() {
        let e = check_error(r#"{"principal": {"type": 5, "id": "a"}}"#);
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("principal.type", "expected a string entity type")
        );
        let e = check_error(r#"{"principal": {"__entity": {"type": "Human"}}}"#);
        assert_eq!(e.field, "principal.id");
        let e = check_error(r#"{"contxt": {}}"#);
        assert_eq!(e, unknown_field("contxt", &CHECK_FIELDS, ""));
        let e = check_error("[1, 2]");
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("request", "expected a JSON object, got an array")
        );
        let e = match PlanRequest::from_slice(br#"{"resource": "Document::\"x\""}"#) {
            Err(BodyError::Request(e)) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            e,
            unknown_field(
                "resource",
                &PLAN_FIELDS,
                " (a plan takes `resource_type`, the type of the rows to list)"
            )
        );
    }

    #[test]
    fn errors_come_in_body_order_then_missing_fields() {
        let e = check_error(r#"{"work_item_id": 7, "human_present": "yes"}"#);
        assert_eq!(e.field, "work_item_id");
        let e = check_error(r#"{"action": "view", "context": {}}"#);
        assert_eq!(e.field, "principal");
        assert_eq!(e.message, "is required");
    }

    #[test]
    fn a_field_named_twice_is_refused() {
        let e = check_error(r#"{"principal": "Human::\"a\"", "principal": "Human::\"b\""}"#);
        assert_eq!(e.field, "principal");
        assert!(e.message.starts_with("duplicate field `principal`"), "{e}");
    }

    #[test]
    fn malformed_json_wins_over_a_field_error_before_it() {
        for body in [
            r#"{"principal": 5, "action": }"#,
            r#"{"bogus": 1, "#,
            r#"{"principal": "Human::\"a\"", "action": "v", "resource": "D::\"d\""} x"#,
            "nul",
        ] {
            let e = CheckRequest::from_slice(body.as_bytes()).unwrap_err();
            let syntax = serde_json::from_slice::<Value>(body.as_bytes()).unwrap_err();
            match e {
                BodyError::Json(e) => assert_eq!(e.to_string(), syntax.to_string()),
                BodyError::Request(e) => panic!("{body}: {e}"),
            }
        }
    }
}
