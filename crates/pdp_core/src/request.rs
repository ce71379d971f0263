//! Check requests: the JSON of `POST /v1/access/evaluation` (docs/decisions.md#request), parsed and
//! checked.

use crate::error::RequestError;
use cedar_policy::{EntityId, EntityTypeName, EntityUid};
use serde_json::{Map, Value};
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
        let action = take_action(f.action)?;
        let context = take_context(f.context)?;
        let on_behalf_of = optional_uid(f.on_behalf_of.as_ref(), "on_behalf_of")?;
        let human_present = match f.human_present {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(RequestError::new(
                    "human_present",
                    format!("expected a boolean, got {}", kind(&other)),
                ))
            }
        };
        let work_item_id = match f.work_item_id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
                check_identifier(&s, "work_item_id")?;
                Some(s)
            }
            Some(other) => {
                return Err(RequestError::new(
                    "work_item_id",
                    format!("expected a string, got {}", kind(&other)),
                ))
            }
        };
        let entities = match f.entities {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(RequestError::new(
                    "entities",
                    format!("expected an array of entities, got {}", kind(&other)),
                ))
            }
        };
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
fn take_action(v: Option<Value>) -> Result<String, RequestError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => {
            check_identifier(&s, "action")?;
            Ok(s)
        }
        Some(o @ Value::Object(_)) if o.get("type").is_some() || o.get("__entity").is_some() => {
            Ok(parse_uid(&o, "action")?.to_string())
        }
        None | Some(Value::Null) => Err(RequestError::new("action", "is required")),
        Some(other) => Err(RequestError::new(
            "action",
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
    take_action(Some(Value::String(s)))
}

/// The `resource_type` of a plan request given as text (gRPC's `resource_type` field), checked
/// as the same text in a JSON request is: a non-empty string.
///
/// # Errors
/// [`RequestError`] on `resource_type` when `s` is empty.
pub fn resource_type_text(s: String) -> Result<String, RequestError> {
    take_resource_type(Some(Value::String(s)))
}

/// The `resource_type` field of a plan request: a non-empty string (absent or null: "is
/// required").
fn take_resource_type(v: Option<Value>) -> Result<String, RequestError> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        None | Some(Value::Null) => Err(RequestError::new("resource_type", "is required")),
        Some(other) => Err(RequestError::new(
            "resource_type",
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

/// The `context` field shared by check and plan requests (absent or null: empty).
fn take_context(v: Option<Value>) -> Result<Map<String, Value>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(other) => Err(RequestError::new(
            "context",
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
        let action = take_action(f.action)?;
        let context = take_context(f.context)?;
        let on_behalf_of = optional_uid(f.on_behalf_of.as_ref(), "on_behalf_of")?;
        let resource_type = take_resource_type(f.resource_type)?;
        let plan_qid = match f.plan_qid {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                return Err(RequestError::new(
                    "plan_qid",
                    format!("expected a string, got {}", kind(&other)),
                ))
            }
        };
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
