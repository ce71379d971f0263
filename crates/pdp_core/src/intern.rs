//! One shared copy of each entity type name, so that comparing two uids is a pointer comparison.
//!
//! Cedar's entity type name keeps its namespace path behind an `Arc`, one allocation per parsed
//! name. Every uid Cedar or the store compares (table keys, `==`, `in`, set membership) compares
//! those paths; `Arc`'s equality looks at the pointers first and reads the allocations only when
//! they differ. Parsed separately, two equal names never share an allocation, so each comparison
//! read two of them, and with 200,000 stored entities the stored one was cold memory (about a
//! twelfth of a check, docs/benchmarks.md). Entities are made canonical when they are stored
//! ([`entity`]) and request uids when their type name is parsed (`crate::request`), so the
//! common comparisons never leave the cache. A name that is not canonical still compares
//! correctly, only more slowly.

use cedar_policy_core::ast::{
    Entity, EntityType, EntityUID, Literal, PartialValue, Set, Value, ValueKind,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Most distinct type names kept; beyond it (only junk requests get there) names are returned
/// as they are.
const MAX_TYPES: usize = 4096;

static TYPES: OnceLock<Mutex<HashMap<EntityType, EntityType>>> = OnceLock::new();

/// The process's canonical copy of `ty` (equal to it, sharing one allocation with every other
/// canonical copy of the same name).
pub(crate) fn entity_type(ty: &EntityType) -> EntityType {
    let mut m = TYPES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = m.get(ty) {
        return c.clone();
    }
    if m.len() < MAX_TYPES {
        m.insert(ty.clone(), ty.clone());
    }
    ty.clone()
}

/// `uid` with its canonical type name (and no source location).
pub(crate) fn uid(uid: &EntityUID) -> EntityUID {
    EntityUID::from_components(entity_type(uid.entity_type()), uid.eid().clone(), None)
}

/// `v` with every entity uid in it canonical, at any depth of sets and records.
fn value(v: &Value) -> Value {
    match &v.value {
        ValueKind::Lit(Literal::EntityUID(u)) => {
            Value::new(Literal::EntityUID(Arc::new(uid(u))), v.loc.clone())
        }
        ValueKind::Set(s) if s.authoritative.iter().any(has_uid) => {
            Value::set(s.authoritative.iter().map(value), v.loc.clone())
        }
        ValueKind::Record(r) if r.values().any(has_uid) => {
            Value::record(r.iter().map(|(k, x)| (k.clone(), value(x))), v.loc.clone())
        }
        _ => v.clone(),
    }
}

/// Whether `v` holds an entity uid at any depth.
fn has_uid(v: &Value) -> bool {
    match &v.value {
        ValueKind::Lit(Literal::EntityUID(_)) => true,
        ValueKind::Set(Set { authoritative, .. }) => authoritative.iter().any(has_uid),
        ValueKind::Record(r) => r.values().any(has_uid),
        _ => false,
    }
}

fn partial(v: &PartialValue) -> PartialValue {
    match v {
        PartialValue::Value(v) => PartialValue::Value(value(v)),
        PartialValue::Residual(_) => v.clone(),
    }
}

/// `e` with its uid, its ancestors and every uid in its attributes and tags canonical.
pub(crate) fn entity(e: &Entity) -> Entity {
    let parents: HashSet<EntityUID> = e.parents().map(uid).collect();
    let indirect: HashSet<EntityUID> = e.indirect_ancestors().map(uid).collect();
    Entity::new_with_attr_partial_value(
        uid(e.uid()),
        e.attrs().map(|(k, v)| (k.clone(), partial(v))),
        indirect,
        parents,
        e.tags().map(|(k, v)| (k.clone(), partial(v))),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::str::FromStr;

    #[test]
    fn canonical_entities_are_equal_to_the_parsed_ones() {
        let parsed: Vec<Entity> = cedar_policy::Entities::from_json_str(
            r#"[{"uid": {"type": "NS::User", "id": "a"},
                 "attrs": {"boss": {"__entity": {"type": "NS::User", "id": "b"}},
                           "teams": [{"__entity": {"type": "Team", "id": "t"}}],
                           "meta": {"owner": {"__entity": {"type": "Team", "id": "t"}}, "n": 1}},
                 "parents": [{"type": "Team", "id": "t"}]}]"#,
            None,
        )
        .unwrap()
        .iter()
        .map(|e| AsRef::<Entity>::as_ref(e).clone())
        .collect();
        let e = parsed.first().unwrap();
        let c = entity(e);
        assert!(c.deep_eq(e));
        let u = EntityUID::from_str(r#"NS::User::"zz""#).unwrap();
        let (a, b) = (uid(&u), uid(c.uid()));
        assert_eq!(a.entity_type(), b.entity_type());
        assert_eq!(uid(&u), u);
    }
}
