//! Lookups a bundle computes once from its schema, so that resolving the names of a request
//! costs a hash lookup instead of a Cedar parse: declared entity types as parsed names, actions
//! by their written uid, and per action the principal and resource types a request may have
//! (enumerated types left out). Part of the bundle's content (never changed after loading),
//! unlike the memos of `crate::memo`, which fill as checks run.

use crate::maps::{FastMap, FastSet};
use cedar_policy::{EntityTypeName, EntityUid, Schema};
use serde_json::Value;
use std::collections::HashSet;

/// Lookups computed once per bundle.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lookups {
    /// Declared entity types (empty without a schema).
    pub(crate) type_names: FastSet<EntityTypeName>,
    /// Declared entity types by their `Display` form (`NS::Document`).
    pub(crate) types_by_text: FastMap<String, EntityTypeName>,
    /// Schema actions by their `Display` form (`Action::"read"`), as clients often write them.
    pub(crate) actions_by_text: FastMap<String, EntityUid>,
    /// Per action: principal and resource types valid for it, without enumerated types (whose
    /// ids Cedar checks too). Empty when the schema's enumerated types could not be read.
    request_types: FastMap<EntityUid, (FastSet<EntityTypeName>, FastSet<EntityTypeName>)>,
}

impl Lookups {
    /// Lookups of `schema` (`schema_json`: its JSON form, to find enumerated entity types).
    pub(crate) fn new(schema: Option<&Schema>, schema_json: Option<&Value>) -> Self {
        let Some(s) = schema else {
            return Self::default();
        };
        let type_names: FastSet<EntityTypeName> = s.entity_types().cloned().collect();
        let types_by_text = type_names
            .iter()
            .map(|t| (t.to_string(), t.clone()))
            .collect();
        let mut actions_by_text = FastMap::default();
        for a in s.actions() {
            actions_by_text.insert(a.to_string(), a.clone());
        }
        let mut request_types = FastMap::default();
        if let Some(enums) = schema_json.and_then(enum_types) {
            for a in s.actions() {
                let (Some(ps), Some(rs)) = (s.principals_for_action(a), s.resources_for_action(a))
                else {
                    continue;
                };
                let keep = |t: &EntityTypeName| !enums.contains(&t.to_string());
                request_types.insert(
                    a.clone(),
                    (
                        ps.filter(|t| keep(t)).cloned().collect(),
                        rs.filter(|t| keep(t)).cloned().collect(),
                    ),
                );
            }
        }
        Self {
            type_names,
            types_by_text,
            actions_by_text,
            request_types,
        }
    }

    /// Whether the schema lets `action` take principals of type `principal` and resources of
    /// type `resource`, neither enumerated: then Cedar's scope checks of request validation
    /// cannot fail. `false` means "not known", never "invalid".
    pub(crate) fn types_valid(
        &self,
        action: &EntityUid,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> bool {
        self.request_types
            .get(action)
            .is_some_and(|(ps, rs)| ps.contains(principal) && rs.contains(resource))
    }
}

/// Qualified names of the enumerated entity types of a JSON schema; `None` when the JSON is
/// not a schema as expected.
fn enum_types(schema_json: &Value) -> Option<HashSet<String>> {
    let mut out = HashSet::new();
    for (ns, body) in schema_json.as_object()? {
        let Some(types) = body.get("entityTypes") else {
            continue;
        };
        for (name, def) in types.as_object()? {
            if def.get("enum").is_some() {
                out.insert(if ns.is_empty() {
                    name.clone()
                } else {
                    format!("{ns}::{name}")
                });
            }
        }
    }
    Some(out)
}
