//! The AuthZEN 1.0 Search APIs (OpenID AuthZEN Authorization API 1.0, "Search APIs";
//! docs/search.md): which subjects, resources or actions a question allows, one page at a time.
//!
//! This module holds what does not need the engine's state: the request ([`SearchRequest`],
//! parsed from AuthZEN's JSON shape), the answer ([`SearchPage`]), the opaque page token
//! ([`PageToken`]) and the evaluation of a query plan's filter on one stored row
//! ([`RowFilter`]). The searches themselves are methods of [`crate::Engine`]
//! (`engine/search.rs`).

use crate::decision::{Mode, Verdict};
use crate::error::RequestError;
use crate::request::uid_from_parts;
use crate::residual_filter::{Cmp, Filter};
use crate::store::Written;
use base64::Engine as _;
use cedar_policy::EntityUid;
use cedar_policy_core::ast::{Literal, Value as CedarValue, ValueKind};
use serde_json::{json, Map, Value};
use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// Page size when a request gives no `page.limit`.
pub const DEFAULT_SEARCH_LIMIT: usize = 100;
/// Default of the largest `page.limit` taken ([`crate::Engine::configure_search`]).
pub const DEFAULT_MAX_SEARCH_LIMIT: usize = 1000;

/// Which of the three searches (AuthZEN 1.0 "Subject Search", "Resource Search", "Action
/// Search").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SearchKind {
    /// Which subjects of a type may do the action on the resource.
    Subject,
    /// Which resources of a type the subject may do the action on.
    Resource,
    /// Which actions the subject may do on the resource.
    Action,
}

impl SearchKind {
    /// `subject`, `resource` or `action`: the last segment of the route
    /// (`/access/v1/search/<kind>`) and the `search` field of the decision record.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Resource => "resource",
            Self::Action => "action",
        }
    }

    /// The kind named `s` (`subject`, `resource`, `action`), `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "subject" => Some(Self::Subject),
            "resource" => Some(Self::Resource),
            "action" => Some(Self::Action),
            _ => None,
        }
    }
}

/// Why a search was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchError {
    /// The request is malformed or does not match the schema; names the AuthZEN field
    /// (`subject.id`, `page.limit`, `page.token`, ...). HTTP 400.
    Request(RequestError),
    /// `page.token` was issued on policies or entities that have changed since: the search
    /// must start again without a token (docs/search.md#paging). HTTP 410.
    Stale,
}

impl fmt::Display for SearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => write!(f, "{e}"),
            Self::Stale => f.write_str(STALE_MESSAGE),
        }
    }
}

impl std::error::Error for SearchError {}

impl From<RequestError> for SearchError {
    fn from(e: RequestError) -> Self {
        Self::Request(e)
    }
}

/// The text of [`SearchError::Stale`].
pub const STALE_MESSAGE: &str =
    "page.token: the policies or entities changed since the first page; start the search again without a token";

/// One search request in AuthZEN's shape: `subject`, `action`, `resource`, `context`, `page`.
/// The searched entity comes without its `id` (the action without its `name`, and action
/// search has no `action` at all).
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    /// Which search.
    pub kind: SearchKind,
    /// The subject (for subject search, only its type: the id is empty).
    pub subject_type: String,
    /// The subject's id; `None` for subject search.
    pub subject: Option<EntityUid>,
    /// The action's name (as in evaluation: an id or the full form); `None` for action search.
    pub action: Option<String>,
    /// The resource's type.
    pub resource_type: String,
    /// The resource; `None` for resource search.
    pub resource: Option<EntityUid>,
    /// The caller's context, as in evaluation.
    pub context: Map<String, Value>,
    /// `page.token`, when continuing a search.
    pub token: Option<String>,
    /// `page.limit` (at least 1), when given.
    pub limit: Option<usize>,
}

/// Reads an AuthZEN entity (`{type, id?, properties?}`) of a search; `with_id` says whether
/// the id is required (the known entity) or must be absent (the searched one).
fn search_entity(
    o: &Map<String, Value>,
    field: &str,
    with_id: bool,
) -> Result<(String, Option<EntityUid>), RequestError> {
    let e = o
        .get(field)
        .and_then(Value::as_object)
        .ok_or_else(|| RequestError::new(field, "is required: an object with `type`"))?;
    if let Some(k) = e
        .keys()
        .find(|k| !["type", "id", "properties"].contains(&k.as_str()))
    {
        return Err(RequestError::new(
            format!("{field}.{k}"),
            "unknown field; an entity has type, id, properties",
        ));
    }
    let ty = e
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| RequestError::new(format!("{field}.type"), "expected a string"))?;
    match e.get("properties") {
        None | Some(Value::Null) => {}
        Some(Value::Object(p)) if p.is_empty() => {}
        Some(_) => return Err(RequestError::new(
            format!("{field}.properties"),
            "searches take no properties: they decide with the entities the decision point holds",
        )),
    }
    match (e.get("id"), with_id) {
        (Some(Value::String(id)), true) => {
            let uid = uid_from_parts(ty, id, field)?;
            Ok((ty.to_owned(), Some(uid)))
        }
        (Some(_), true) => Err(RequestError::new(
            format!("{field}.id"),
            "expected a string",
        )),
        (None, true) => Err(RequestError::new(format!("{field}.id"), "is required")),
        (None | Some(Value::Null), false) => Ok((ty.to_owned(), None)),
        (Some(_), false) => Err(RequestError::new(
            format!("{field}.id"),
            "is the searched entity: leave `id` out",
        )),
    }
}

impl SearchRequest {
    /// Parses the body of `POST /access/v1/search/<kind>` (AuthZEN 1.0 "Search APIs").
    ///
    /// Takes `subject`, `action` (`{name}`), `resource`, `context` (an object) and `page`
    /// (`{token?, limit?}`, `limit` an integer from 1). Returns the request; every field is
    /// checked for shape only, the types and the action are resolved by the search.
    ///
    /// # Errors
    /// [`RequestError`] naming the AuthZEN field: an unknown member, a missing `subject`,
    /// `resource` or `action.name`, an `id` on the searched entity or none on a known one,
    /// non-empty `properties`, a `context` that is not an object, a `page.limit` that is not an
    /// integer of at least 1, a `page.token` that is not a string.
    pub fn from_json(kind: SearchKind, v: &Value) -> Result<Self, RequestError> {
        let o = v
            .as_object()
            .ok_or_else(|| RequestError::new("request", "expected a JSON object"))?;
        let allowed: &[&str] = match kind {
            SearchKind::Action => &["subject", "resource", "context", "page"],
            _ => &["subject", "action", "resource", "context", "page"],
        };
        if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(RequestError::new(
                k.clone(),
                format!(
                    "unknown field; an AuthZEN {} search has {}",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            ));
        }
        let (subject_type, subject) = search_entity(o, "subject", kind != SearchKind::Subject)?;
        let (resource_type, resource) = search_entity(o, "resource", kind != SearchKind::Resource)?;
        let action = if kind == SearchKind::Action {
            None
        } else {
            let a = o
                .get("action")
                .and_then(Value::as_object)
                .ok_or_else(|| RequestError::new("action", "is required: an object with `name`"))?;
            if let Some(k) = a
                .keys()
                .find(|k| !["name", "properties"].contains(&k.as_str()))
            {
                return Err(RequestError::new(
                    format!("action.{k}"),
                    "unknown field; an action has name, properties",
                ));
            }
            match a.get("properties") {
                None | Some(Value::Null) => {}
                Some(Value::Object(p)) if p.is_empty() => {}
                Some(_) => {
                    return Err(RequestError::new(
                        "action.properties",
                        "searches take no properties",
                    ))
                }
            }
            Some(
                a.get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        RequestError::new("action.name", "is required: the action's name")
                    })?
                    .to_owned(),
            )
        };
        let context = match o.get("context") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(c)) => c.clone(),
            Some(_) => return Err(RequestError::new("context", "expected an object")),
        };
        let (token, limit) = match o.get("page") {
            None | Some(Value::Null) => (None, None),
            Some(Value::Object(p)) => {
                if let Some(k) = p.keys().find(|k| !["token", "limit"].contains(&k.as_str())) {
                    return Err(RequestError::new(
                        format!("page.{k}"),
                        "unknown field; a page has token, limit",
                    ));
                }
                let token = match p.get("token") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(t)) if t.is_empty() => None,
                    Some(Value::String(t)) => Some(t.clone()),
                    Some(_) => return Err(RequestError::new("page.token", "expected a string")),
                };
                let limit = match p.get("limit") {
                    None | Some(Value::Null) => None,
                    Some(l) => Some(
                        l.as_u64()
                            .filter(|n| *n >= 1)
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| {
                                RequestError::new("page.limit", "expected an integer of at least 1")
                            })?,
                    ),
                };
                (token, limit)
            }
            Some(_) => return Err(RequestError::new("page", "expected an object")),
        };
        Ok(Self {
            kind,
            subject_type,
            subject,
            action,
            resource_type,
            resource,
            context,
            token,
            limit,
        })
    }

    /// A 64-bit digest of everything in the request but its page (the kind, the entities, the
    /// action and the context with its keys in order): what a page token is bound to.
    pub fn digest(&self) -> u64 {
        let mut h = foldhash::quality::FixedState::with_seed(0x5EA4_C4AB_1E5E_A4C4).build_hasher();
        let canon = json!([
            self.kind.as_str(),
            self.subject_type,
            self.subject.as_ref().map(|u| u.id().unescaped().to_owned()),
            self.action,
            self.resource_type,
            self.resource
                .as_ref()
                .map(|u| u.id().unescaped().to_owned()),
            canonical(&Value::Object(self.context.clone())),
        ]);
        h.write(canon.to_string().as_bytes());
        h.finish()
    }
}

/// `v` with every object's keys sorted (serde_json's `Map` keeps insertion order when its
/// `preserve_order` feature is on anywhere in the build).
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Array(
                keys.into_iter()
                    .map(|k| json!([k, canonical(&m[k.as_str()])]))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// What a page token carries (docs/search.md#paging): the search it belongs to (the request's
/// [`SearchRequest::digest`]), where the next page starts (the last id returned; ids are
/// served in ascending order), and the versions the search started on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PageToken {
    /// [`SearchRequest::digest`] of the request that started the search.
    pub r: u64,
    /// The last id (or action name) returned; the next page starts after it.
    pub c: String,
    /// Policy, principals and resources versions the search started on.
    pub v: [u64; 3],
}

impl PageToken {
    /// The token as sent: base64url (RFC 4648 section 5, no padding) of its JSON.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a token made by [`PageToken::encode`] and checks it belongs to `req`.
    ///
    /// # Errors
    /// [`RequestError`] on `page.token` when it is not a token of this decision point or was
    /// issued for another request (another kind, entity, action or context).
    pub fn decode(token: &str, req: &SearchRequest) -> Result<Self, RequestError> {
        let bad = || RequestError::new("page.token", "not a page token of this decision point");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| bad())?;
        let t: Self = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if t.r != req.digest() {
            return Err(RequestError::new(
                "page.token",
                "the token belongs to another search: send the request that returned it, changing only `page`",
            ));
        }
        Ok(t)
    }
}

/// One search result: an entity (`{type, id}`) or, for action search, an action (`{name}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchResult {
    /// A subject or resource.
    Entity(EntityUid),
    /// An action, by the name evaluation takes for it.
    Action(String),
}

impl SearchResult {
    /// The result in AuthZEN's shape: `{"type": T, "id": I}` or `{"name": N}`.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Entity(u) => json!({"type": u.type_name().to_string(), "id": u.id().unescaped()}),
            Self::Action(n) => json!({"name": n}),
        }
    }
}

/// How a search found its results (reported in the response's `context.method`;
/// docs/search.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMethod {
    /// The query plan for the resource type, evaluated on each stored row; rows it cannot
    /// decide from their attributes are checked one by one.
    Plan,
    /// One check per candidate.
    Checks,
}

impl SearchMethod {
    /// `plan` or `checks`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Checks => "checks",
        }
    }
}

/// One page of a search: the allowed entities or actions in ascending order of id (or name),
/// the candidates that would need a challenge, and the token of the next page.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchPage {
    /// Id of this search call (a UUIDv7, the decision record's `qid`).
    pub qid: String,
    /// Which search.
    pub kind: SearchKind,
    /// What is allowed (verdict `allow`), at most the page's limit.
    pub results: Vec<SearchResult>,
    /// Candidates of this page's range whose verdict is `challenge`, with the challenge kinds
    /// to pass; never among `results`.
    pub challenges: Vec<(SearchResult, Vec<String>)>,
    /// Candidates of this page's range that could not be checked with the request's context
    /// (action search: the action's context type does not fit it), with the reason; never
    /// among `results`.
    pub undecided: Vec<(SearchResult, String)>,
    /// The next page's token; empty on the last page (AuthZEN 1.0).
    pub next_token: String,
    /// How the results were found.
    pub method: SearchMethod,
    /// The mode in force (monitor mode does not widen a search: results are allowed ones).
    pub mode: Mode,
    /// The subject (`None` for subject search).
    pub subject: Option<EntityUid>,
    /// The resolved action (`None` for action search).
    pub action: Option<EntityUid>,
    /// The resource (`None` for resource search).
    pub resource: Option<EntityUid>,
    /// The searched (or known) subject and resource types.
    pub types: (String, String),
    /// Versions the search (its first page) started on: policy, principals, resources.
    pub versions: [u64; 3],
    /// Microseconds spent.
    pub latency_us: u64,
}

impl SearchPage {
    /// The AuthZEN response: `results`, `page` (`next_token`, `count`; `total` is left out, it
    /// would need the whole result) and `context` (`qid`, `method`, `mode`, `challenges` as
    /// `[{type, id, challenges}]` or `[{name, challenges}]`, and `undecided`,
    /// `[{name, error}]`, only when some candidate could not be checked).
    pub fn to_response(&self) -> Value {
        let mut out = Map::new();
        out.insert(
            "results".into(),
            Value::Array(self.results.iter().map(SearchResult::to_json).collect()),
        );
        out.extend(self.response_rest());
        Value::Object(out)
    }

    /// [`SearchPage::to_response`] without `results`: `page` and `context`, in that order
    /// (for a caller that writes the results its own way).
    pub fn response_rest(&self) -> Map<String, Value> {
        let challenges: Vec<Value> = self
            .challenges
            .iter()
            .map(|(r, kinds)| {
                let mut v = r.to_json();
                if let Value::Object(m) = &mut v {
                    m.insert("challenges".into(), json!(kinds));
                }
                v
            })
            .collect();
        let mut out = json!({
            "page": {"next_token": self.next_token, "count": self.results.len()},
            "context": {
                "qid": self.qid,
                "method": self.method.as_str(),
                "mode": self.mode.as_str(),
                "challenges": challenges,
            },
        });
        if !self.undecided.is_empty() {
            let undecided: Vec<Value> = self
                .undecided
                .iter()
                .map(|(r, why)| {
                    let mut v = r.to_json();
                    if let Value::Object(m) = &mut v {
                        m.insert("error".into(), json!(why));
                    }
                    v
                })
                .collect();
            if let Some(Value::Object(c)) = out.get_mut("context") {
                c.insert("undecided".into(), Value::Array(undecided));
            }
        }
        match out {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// The decision-log record of this search (docs/history.md#schema): `call` `search`,
    /// `search` the kind, the subject as `principal` (`{type, id: null}` for subject search),
    /// the action, the resource (`{type, id: null}` for resource search), `verdict` `null` and
    /// `count`, the number of results on the page.
    pub fn to_record(&self, pdp: &str, transport: &str, at: &str) -> Value {
        let ent = |u: &Option<EntityUid>, ty: &str| match u {
            Some(u) => json!({"type": u.type_name().to_string(), "id": u.id().unescaped()}),
            None => json!({"type": ty, "id": null}),
        };
        json!({
            "qid": self.qid,
            "at": at,
            "call": "search",
            "search": self.kind.as_str(),
            "transport": transport,
            "principal": ent(&self.subject, &self.types.0),
            "on_behalf_of": null,
            "action": self.action.as_ref().map(|a| a.id().unescaped().to_owned()),
            "resource": ent(&self.resource, &self.types.1),
            "verdict": null,
            "count": self.results.len(),
            "challenges": [],
            "policies": [],
            "mode": self.mode.as_str(),
            "challenge_qid": null,
            "method": self.method.as_str(),
            "policy_version": self.versions[0],
            "principals_version": self.versions[1],
            "latency_us": self.latency_us,
            "pdp": pdp,
        })
    }
}

/// What a candidate's check found, for a page being filled: `Some(true)` allowed,
/// `Some(false)` a challenge, `None` denied.
pub(crate) fn verdict_kind(v: Verdict) -> Option<bool> {
    match v {
        Verdict::Allow => Some(true),
        Verdict::Challenge => Some(false),
        Verdict::Deny => None,
    }
}

// ---------------------------------------------------------------- filters on stored rows

/// A query plan's filter prepared for evaluation on many stored rows (docs/plans.md#the-
/// filter-tree): each attribute path numbered (a row is read by that number, see
/// [`RowAttrs`]) and each entity reference read out of its JSON once, rather than on every row.
#[derive(Debug)]
pub(crate) struct RowFilter {
    root: Node,
    paths: Vec<Vec<String>>,
}

/// A node of a [`RowFilter`]: a [`Filter`] node with `col` in place of `attr`.
#[derive(Debug)]
enum Node {
    True,
    False,
    And(Vec<Node>),
    Or(Vec<Node>),
    Not(Box<Node>),
    Compare { col: usize, cmp: Cmp, value: Want },
    Has { col: usize },
    Contains { col: usize, value: Want },
    ContainsAny { col: usize, values: Vec<Want> },
    ContainsAll { col: usize, values: Vec<Want> },
    Like { col: usize, pattern: String },
    In { entity: EntityUid },
    Is { entity: EntityUid },
    Undecided,
}

/// A filter's value, as compared with a row's: an entity reference read out of its JSON, or
/// any other JSON value as the filter holds it.
#[derive(Debug)]
enum Want {
    Entity { ty: String, id: String },
    Json(Value),
}

impl Want {
    fn new(v: &Value) -> Self {
        // Only `{"__entity": {type, id}}`, the form plans write entities in: a bare
        // `{type, id}` object is an entity or a record depending on the row's value.
        if let Some(Value::Object(e)) = v
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.get("__entity"))
        {
            if let (Some(Value::String(ty)), Some(Value::String(id)), 2) =
                (e.get("type"), e.get("id"), e.len())
            {
                return Self::Entity {
                    ty: ty.clone(),
                    id: id.clone(),
                };
            }
        }
        Self::Json(v.clone())
    }

    /// Cedar's `==` between a row's value and this one ([`value_eq`]).
    fn eq(&self, v: &CedarValue) -> Option<bool> {
        match self {
            Self::Json(j) => value_eq(v, j),
            Self::Entity { ty, id } => match &v.value {
                ValueKind::ExtensionValue(_) => None,
                // The id first: it tells most rows apart without writing out the type's name.
                ValueKind::Lit(Literal::EntityUID(u)) => {
                    Some(u.eid().as_ref() == id.as_str() && u.entity_type().to_string() == *ty)
                }
                _ => Some(false),
            },
        }
    }

    /// Whether the set `v` holds this value ([`set_has`]).
    fn in_set(&self, v: &CedarValue) -> Option<bool> {
        let ValueKind::Set(s) = &v.value else {
            return None;
        };
        let mut found = Some(false);
        for e in s.authoritative.iter() {
            match self.eq(e) {
                Some(true) => return Some(true),
                Some(false) => {}
                None => found = None,
            }
        }
        found
    }
}

/// `a == b`, the ids compared first: they tell most rows apart without comparing the types'
/// names (paths of names).
fn same_entity(a: &EntityUid, b: &EntityUid) -> bool {
    a.id() == b.id() && a.type_name() == b.type_name()
}

/// What [`RowFilter::matches`] reads of a row: the value at the filter's `col`-th attribute
/// path ([`RowFilter::paths`]).
pub(crate) trait RowAttrs {
    /// The row's value at the path numbered `col`; `None` when the row has no value there.
    fn get(&self, col: usize) -> Option<&CedarValue>;
}

impl RowFilter {
    /// Prepares `f`.
    pub(crate) fn new(f: &Filter) -> Self {
        let mut paths = Vec::new();
        let root = Self::node(f, &mut paths);
        Self { root, paths }
    }

    /// The attribute paths the filter reads, in the order of their numbers.
    pub(crate) fn paths(&self) -> &[Vec<String>] {
        &self.paths
    }

    fn node(f: &Filter, paths: &mut Vec<Vec<String>>) -> Node {
        let mut col = |attr: &Vec<String>| match paths.iter().position(|p| p == attr) {
            Some(i) => i,
            None => {
                paths.push(attr.clone());
                paths.len() - 1
            }
        };
        match f {
            Filter::True => Node::True,
            Filter::False => Node::False,
            Filter::And(args) => Node::And(args.iter().map(|a| Self::node(a, paths)).collect()),
            Filter::Or(args) => Node::Or(args.iter().map(|a| Self::node(a, paths)).collect()),
            Filter::Not(a) => Node::Not(Box::new(Self::node(a, paths))),
            Filter::Compare { attr, cmp, value } => Node::Compare {
                col: col(attr),
                cmp: *cmp,
                value: Want::new(value),
            },
            Filter::Has { attr } => Node::Has { col: col(attr) },
            Filter::Contains { attr, value } => Node::Contains {
                col: col(attr),
                value: Want::new(value),
            },
            Filter::ContainsAny { attr, values } => Node::ContainsAny {
                col: col(attr),
                values: values.iter().map(Want::new).collect(),
            },
            Filter::ContainsAll { attr, values } => Node::ContainsAll {
                col: col(attr),
                values: values.iter().map(Want::new).collect(),
            },
            Filter::Like { attr, pattern } => Node::Like {
                col: col(attr),
                pattern: pattern.clone(),
            },
            Filter::In { entity } => Node::In {
                entity: entity.clone(),
            },
            Filter::Is { entity } => Node::Is {
                entity: entity.clone(),
            },
            Filter::Unknown { .. } | Filter::Unmappable { .. } => Node::Undecided,
        }
    }

    /// The filter's value for one stored row, in SQL's three-valued logic (docs/plans.md#null-
    /// semantics): `Some(true)`/`Some(false)` when the row's attributes decide it, `None` when
    /// they do not (a missing attribute, an `unknown` or `unmappable` node, a value this
    /// evaluator does not read such as an extension value). A `None` row is checked on its own
    /// by the search.
    ///
    /// `uid` is the row's entity, `row` gives its attribute values and `descendant_of(e)` says
    /// whether it is a (transitive) descendant of `e`.
    pub(crate) fn matches<R: RowAttrs>(
        &self,
        uid: &EntityUid,
        row: &R,
        descendant_of: &dyn Fn(&EntityUid) -> bool,
    ) -> Option<bool> {
        node_matches(&self.root, uid, row, descendant_of)
    }
}

fn node_matches<R: RowAttrs>(
    f: &Node,
    uid: &EntityUid,
    row: &R,
    descendant_of: &dyn Fn(&EntityUid) -> bool,
) -> Option<bool> {
    match f {
        Node::True => Some(true),
        Node::False => Some(false),
        Node::And(args) => {
            let mut all = Some(true);
            for a in args {
                match node_matches(a, uid, row, descendant_of) {
                    Some(false) => return Some(false),
                    Some(true) => {}
                    None => all = None,
                }
            }
            all
        }
        Node::Or(args) => {
            let mut any = Some(false);
            for a in args {
                match node_matches(a, uid, row, descendant_of) {
                    Some(true) => return Some(true),
                    Some(false) => {}
                    None => any = None,
                }
            }
            any
        }
        Node::Not(a) => node_matches(a, uid, row, descendant_of).map(|b| !b),
        Node::Compare { col, cmp, value } => {
            let v = row.get(*col)?;
            match cmp {
                Cmp::Eq => value.eq(v),
                Cmp::Ne => value.eq(v).map(|b| !b),
                Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge => {
                    let (ValueKind::Lit(Literal::Long(a)), Want::Json(j)) = (&v.value, value)
                    else {
                        return None;
                    };
                    let b = j.as_i64()?;
                    Some(match cmp {
                        Cmp::Lt => *a < b,
                        Cmp::Le => *a <= b,
                        Cmp::Gt => *a > b,
                        _ => *a >= b,
                    })
                }
            }
        }
        Node::Has { col } => Some(row.get(*col).is_some()),
        Node::Contains { col, value } => value.in_set(row.get(*col)?),
        Node::ContainsAny { col, values } => {
            let set = row.get(*col)?;
            let mut any = Some(false);
            for v in values {
                match v.in_set(set) {
                    Some(true) => return Some(true),
                    Some(false) => {}
                    None => any = None,
                }
            }
            any
        }
        Node::ContainsAll { col, values } => {
            let set = row.get(*col)?;
            let mut all = Some(true);
            for v in values {
                match v.in_set(set) {
                    Some(false) => return Some(false),
                    Some(true) => {}
                    None => all = None,
                }
            }
            all
        }
        Node::Like { col, pattern } => {
            let ValueKind::Lit(Literal::String(s)) = &row.get(*col)?.value else {
                return None;
            };
            like(s, pattern)
        }
        Node::In { entity } => Some(same_entity(entity, uid) || descendant_of(entity)),
        Node::Is { entity } => Some(same_entity(entity, uid)),
        Node::Undecided => None,
    }
}

/// The value at `path` in the row's attributes, `None` when absent.
pub(crate) fn lookup<'a>(row: Written<'a>, path: &[String]) -> Option<&'a CedarValue> {
    let (first, rest) = path.split_first()?;
    let mut v = row.attr(first)?;
    for p in rest {
        let ValueKind::Record(r) = &v.value else {
            return None;
        };
        v = r.get(p.as_str())?;
    }
    Some(v)
}

/// `{"__entity": {type, id}}` or a bare `{type, id}`: the type and id.
fn json_uid(o: &Map<String, Value>) -> Option<(&str, &str)> {
    let e = match o.get("__entity") {
        Some(Value::Object(e)) => e,
        _ if o.len() == 2 => o,
        _ => return None,
    };
    Some((e.get("type")?.as_str()?, e.get("id")?.as_str()?))
}

/// Cedar's `==` between a row's value and a filter's JSON value; `None` when the JSON value
/// is one this evaluator does not read (an extension value, a non-integer number).
fn value_eq(v: &CedarValue, j: &Value) -> Option<bool> {
    if let Value::Object(o) = j {
        if o.contains_key("__extn") {
            return None;
        }
    }
    match (&v.value, j) {
        (ValueKind::ExtensionValue(_), _) => None,
        (ValueKind::Lit(Literal::Bool(b)), Value::Bool(x)) => Some(b == x),
        (ValueKind::Lit(Literal::Long(n)), Value::Number(x)) => x.as_i64().map(|x| x == *n),
        (ValueKind::Lit(Literal::String(s)), Value::String(x)) => Some(s.as_str() == x),
        (ValueKind::Lit(Literal::EntityUID(u)), Value::Object(o)) => match json_uid(o) {
            // The id first: it tells most rows apart without writing out the type's name.
            Some((t, id)) => Some(u.eid().as_ref() == id && u.entity_type().to_string() == t),
            None => Some(false),
        },
        (ValueKind::Set(s), Value::Array(a)) => {
            // Equal sets: every element of each is in the other.
            for x in a {
                if !set_has(v, x)? {
                    return Some(false);
                }
            }
            for e in s.authoritative.iter() {
                let mut found = Some(false);
                for x in a {
                    match value_eq(e, x) {
                        Some(true) => {
                            found = Some(true);
                            break;
                        }
                        Some(false) => {}
                        None => found = None,
                    }
                }
                if !found? {
                    return Some(false);
                }
            }
            Some(true)
        }
        (ValueKind::Record(r), Value::Object(o)) if !o.contains_key("__entity") => {
            if r.len() != o.len() {
                return Some(false);
            }
            let mut all = Some(true);
            for (k, x) in o {
                match r.get(k.as_str()).map(|e| value_eq(e, x)) {
                    None | Some(Some(false)) => return Some(false),
                    Some(Some(true)) => {}
                    Some(None) => all = None,
                }
            }
            all
        }
        (_, Value::Number(x)) if x.as_i64().is_none() => None,
        _ => Some(false),
    }
}

/// Whether the set `v` holds `x`; `None` when `v` is not a set or an element's equality is
/// not known.
fn set_has(v: &CedarValue, x: &Value) -> Option<bool> {
    let ValueKind::Set(s) = &v.value else {
        return None;
    };
    let mut found = Some(false);
    for e in s.authoritative.iter() {
        match value_eq(e, x) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => found = None,
        }
    }
    found
}

/// Cedar's `like`: `*` matches any text, `\*` a star; `None` for any other backslash.
fn like(s: &str, pattern: &str) -> Option<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum Tok {
        Char(char),
        Star,
    }
    let mut toks = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('*') => toks.push(Tok::Char('*')),
                _ => return None,
            },
            '*' => toks.push(Tok::Star),
            c => toks.push(Tok::Char(c)),
        }
    }
    let text: Vec<char> = s.chars().collect();
    // Greedy glob match with backtracking to the last star.
    let (mut t, mut p) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match toks.get(p) {
            Some(Tok::Star) => {
                star = Some((p, t));
                p += 1;
            }
            Some(Tok::Char(c)) if text.get(t) == Some(c) => {
                t += 1;
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return Some(false),
            },
        }
    }
    Some(
        toks.get(p..)
            .is_some_and(|r| r.iter().all(|k| *k == Tok::Star)),
    )
}

#[cfg(test)]
mod tests {
    use super::like;

    #[test]
    fn like_matches_cedar_patterns() {
        assert_eq!(like("Q3_report", "Q3*"), Some(true));
        assert_eq!(like("Q3_report", "*report"), Some(true));
        assert_eq!(like("Q3_report", "*_*t"), Some(true));
        assert_eq!(like("Q3_report", "Q4*"), Some(false));
        assert_eq!(like("a*b", "a\\*b"), Some(true));
        assert_eq!(like("axb", "a\\*b"), Some(false));
        assert_eq!(like("", "*"), Some(true));
        assert_eq!(like("", ""), Some(true));
        assert_eq!(like("x", ""), Some(false));
        assert_eq!(like("x", "a\\b"), None);
    }
}
