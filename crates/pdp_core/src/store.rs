//! The in-memory entity store: principals, groups, resources, work items, containments,
//! service-account registrations and risk scores (SPEC 1 "what the decision point keeps").
//!
//! The store is a persistent (structurally shared) map, so a writer clones it in O(1), changes
//! its copy and publishes it with one atomic pointer swap: checks that already started keep the
//! snapshot they began with, and no check ever sees half an update.

use crate::error::{chain, RequestError};
use crate::request::parse_uid;
use cedar_policy::{Entity, EntityUid, EvalResult, Schema};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// An entity with its direct parents and the entities its attributes reference, kept beside
/// the Cedar entity so a check can gather the slice it needs without scanning the store.
#[derive(Debug, Clone)]
pub struct StoredEntity {
    /// The Cedar entity.
    pub entity: Entity,
    /// Its parents (as written; Cedar computes the transitive closure per check).
    pub parents: Vec<EntityUid>,
    /// Entities referenced by its attributes, at any depth of sets and records.
    pub refs: Vec<EntityUid>,
}

fn collect_refs(v: &EvalResult, out: &mut Vec<EntityUid>) {
    match v {
        EvalResult::EntityUid(u) => out.push(u.clone()),
        EvalResult::Set(s) => s.iter().for_each(|x| collect_refs(x, out)),
        EvalResult::Record(r) => r.iter().for_each(|(_, x)| collect_refs(x, out)),
        _ => {}
    }
}

impl StoredEntity {
    /// Wraps a Cedar entity, recording its parents and attribute references.
    pub fn from_entity(entity: Entity) -> Self {
        let mut refs = Vec::new();
        for (_, v) in entity.attrs() {
            if let Ok(v) = v {
                collect_refs(&v, &mut refs);
            }
        }
        let (_, _, parents) = entity.clone().into_inner();
        Self {
            entity,
            parents: parents.into_iter().collect(),
            refs,
        }
    }

    /// Parses one entity in Cedar's JSON entity format (the HTTP inline-entity shape of SPEC 2.4:
    /// `uid`, `attrs` with `__entity` / `__extn` escapes, `parents`), typed by `schema` when the
    /// schema declares its type.
    ///
    /// # Errors
    /// [`RequestError`] on `field` when the JSON is not an entity or does not match the schema.
    pub fn from_json(
        value: Value,
        schema: Option<&Schema>,
        declared: &HashSet<String>,
        field: &str,
    ) -> Result<Self, RequestError> {
        let ty = value
            .get("uid")
            .and_then(|u| {
                u.get("type")
                    .or_else(|| u.get("__entity").and_then(|e| e.get("type")))
            })
            .and_then(Value::as_str)
            .map(str::to_owned);
        let schema = match (&ty, schema) {
            (Some(t), Some(s)) if declared.contains(t) => Some(s),
            _ => None,
        };
        let entity = Entity::from_json_value(value, schema)
            .map_err(|e| RequestError::new(field, chain(&e)))?;
        Ok(Self::from_entity(entity))
    }
}

/// A work item from the issue-tracker connector (SPEC 5 claim `svc_work_item_id`).
#[derive(Debug, Clone)]
pub struct WorkItem {
    /// Id in the connector's form, `<tracker>:<key>`.
    pub id: String,
    /// Whether the item is open; a closed item assigns nothing.
    pub open: bool,
    /// Resources the item links: an agent on this item counts as assigned to exactly these.
    pub links: HashSet<EntityUid>,
    /// The item as a Cedar entity (type `WorkItem` of the bundle's schema).
    pub entity: Arc<StoredEntity>,
}

/// One immutable snapshot of everything the decision point knows besides the bundle.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub(crate) entities: imbl::HashMap<EntityUid, Arc<StoredEntity>>,
    pub(crate) work_items: imbl::HashMap<String, Arc<WorkItem>>,
    pub(crate) contained: imbl::HashSet<EntityUid>,
    pub(crate) risk: imbl::HashMap<EntityUid, i64>,
}

impl Store {
    /// Number of entities held (bundle entities not included).
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// Whether the store holds no entity.
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    /// Whether `uid` is contained.
    pub fn is_contained(&self, uid: &EntityUid) -> bool {
        self.contained.contains(uid)
    }

    /// The reasoner's risk score of `uid`, if it has one.
    pub fn risk(&self, uid: &EntityUid) -> Option<i64> {
        self.risk.get(uid).copied()
    }
}

/// Parses a list of entity references (`{type, id}`, `Type::"id"` or `{"__entity": ...}`).
///
/// # Errors
/// [`RequestError`] on `field[i]` for the first bad reference.
pub fn parse_uid_list(value: &Value, field: &str) -> Result<Vec<EntityUid>, RequestError> {
    let arr = value
        .as_array()
        .ok_or_else(|| RequestError::new(field, "expected an array of entity references"))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| parse_uid(v, &format!("{field}[{i}]")))
        .collect()
}
