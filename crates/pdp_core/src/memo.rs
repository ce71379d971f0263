//! Per-bundle lookups and memos that keep a check cheap without changing any answer.
//!
//! * [`Lookups`]: declared entity types as parsed names, actions by their written uid, and per
//!   action the principal and resource types a request may have (enumerated types left out).
//! * [`ContextMemo`]: the schema-typed `Context` of an action's context JSON. Parsing and typing
//!   a context is a pure function of (schema, action, JSON), and a bundle never changes its
//!   schema, so the memo lives with the bundle. An entry also records whether Cedar's full
//!   request validation already accepted that context for that action (context validation
//!   depends on nothing else), so a later request with the same context and types that the
//!   action is known to take skips the second validation (see
//!   [`Lookups::types_valid`]). Failures are never memoised: they are recomputed, so every error
//!   message stays Cedar's.

use crate::store::FastMap;
use cedar_policy::{Context, EntityTypeName, EntityUid, Schema};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Most contexts kept per bundle; when full the memo starts over (contexts carry per-principal
/// risk scores, so their number is not bounded by the schema).
const MAX_CONTEXTS: usize = 8192;

/// The store under each memo: a map that starts over when it holds `CAP` entries. Values are
/// cheap to clone (`Arc`s); readers share the lock, a miss takes it for writing once.
pub(crate) struct Bounded<K, V, const CAP: usize> {
    map: RwLock<FastMap<K, V>>,
}

impl<K, V, const CAP: usize> Default for Bounded<K, V, CAP> {
    fn default() -> Self {
        Self {
            map: RwLock::new(FastMap::default()),
        }
    }
}

impl<K, V, const CAP: usize> std::fmt::Debug for Bounded<K, V, CAP> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounded")
            .field("cap", &CAP)
            .finish_non_exhaustive()
    }
}

impl<K: std::hash::Hash + Eq, V: Clone, const CAP: usize> Bounded<K, V, CAP> {
    /// The value kept for `key`, if any.
    fn get(&self, key: &K) -> Option<V> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Keeps `value` for `key`, first emptying the map when it is full.
    fn insert(&self, key: K, value: V) {
        let mut g = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.len() >= CAP {
            g.clear();
        }
        g.insert(key, value);
    }
}

/// Lookups computed once per bundle.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lookups {
    /// Declared entity types (empty without a schema).
    pub(crate) type_names: HashSet<EntityTypeName>,
    /// Declared entity types by their `Display` form (`NS::Document`).
    pub(crate) types_by_text: HashMap<String, EntityTypeName>,
    /// Schema actions by their `Display` form (`Action::"read"`), as clients often write them.
    pub(crate) actions_by_text: HashMap<String, EntityUid>,
    /// Per action: principal and resource types valid for it, without enumerated types (whose
    /// ids Cedar checks too). Empty when the schema's enumerated types could not be read.
    request_types: HashMap<EntityUid, (HashSet<EntityTypeName>, HashSet<EntityTypeName>)>,
}

impl Lookups {
    /// Lookups of `schema` (`schema_json`: its JSON form, to find enumerated entity types).
    pub(crate) fn new(schema: Option<&Schema>, schema_json: Option<&Value>) -> Self {
        let Some(s) = schema else {
            return Self::default();
        };
        let type_names: HashSet<EntityTypeName> = s.entity_types().cloned().collect();
        let types_by_text = type_names
            .iter()
            .map(|t| (t.to_string(), t.clone()))
            .collect();
        let mut actions_by_text = HashMap::new();
        for a in s.actions() {
            actions_by_text.insert(a.to_string(), a.clone());
        }
        let mut request_types = HashMap::new();
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

/// A typed context and whether Cedar's request validation accepted it for its action.
#[derive(Debug)]
pub(crate) struct MemoContext {
    /// The context, typed against the schema.
    pub(crate) context: Context,
    /// Set once a request with this context passed Cedar's full validation.
    validated: AtomicBool,
}

impl MemoContext {
    /// Whether a request with this context already passed Cedar's full validation.
    pub(crate) fn validated(&self) -> bool {
        self.validated.load(Ordering::Relaxed)
    }

    /// Records that a request with this context passed Cedar's full validation.
    pub(crate) fn set_validated(&self) {
        self.validated.store(true, Ordering::Relaxed);
    }
}

/// Typed contexts by (action, context JSON); see the module docs. The JSON value itself is the
/// key (hashed and compared structurally; key order does not matter, as it does not to Cedar):
/// serialising it to text for the key was a fortieth of a document_cloud check.
#[derive(Debug, Default)]
pub(crate) struct ContextMemo {
    map: Bounded<(EntityUid, Value), Arc<MemoContext>, MAX_CONTEXTS>,
}

impl ContextMemo {
    /// The typed context of `json` for `action`, parsed by `parse` on a miss (`parse` must be
    /// the same pure function of the JSON every time). Errors are returned, not kept.
    pub(crate) fn get_or_parse<E>(
        &self,
        action: &EntityUid,
        json: Map<String, Value>,
        parse: impl FnOnce(Value) -> Result<Context, E>,
    ) -> Result<Arc<MemoContext>, E> {
        let key = (action.clone(), Value::Object(json));
        if let Some(hit) = self.map.get(&key) {
            return Ok(hit);
        }
        let entry = Arc::new(MemoContext {
            context: parse(key.1.clone())?,
            validated: AtomicBool::new(false),
        });
        self.map.insert(key, Arc::clone(&entry));
        Ok(entry)
    }
}

/// Most entity slices [`SliceMemo`] keeps per bundle; when full it starts over.
const MAX_SLICES: usize = 1024;

/// A plan's concrete entities, as Cedar's `Entities` and as TPE's `PartialEntities`.
#[derive(Debug)]
pub(crate) struct PlanEntities {
    /// Keeps the slice's entities alive, so that no other entity can take their addresses
    /// (the memo's key) while this entry exists.
    _entities: Vec<Arc<cedar_policy_core::ast::Entity>>,
    /// The slice as Cedar entities.
    pub(crate) entities: cedar_policy::Entities,
    /// The slice as TPE's partial entities (the conforming part; see `plan::partial_entities`).
    pub(crate) partial: cedar_policy::PartialEntities,
}

/// The entities of a plan by the closed entities they are made of. A snapshot's closed
/// entities are immutable and re-created on any change to an entity, its ancestors or their
/// attributes, so the same list of entities (by address, kept alive by the entry) is the same
/// slice; converting it for TPE is a pure function of it and the schema (the bundle's).
#[derive(Debug, Default)]
pub(crate) struct SliceMemo {
    map: Bounded<Vec<usize>, Arc<PlanEntities>, MAX_SLICES>,
}

impl SliceMemo {
    /// The plan entities of `slice`, built by `build` (Cedar entities, then TPE's) on a miss.
    ///
    /// # Errors
    /// `build`'s error, which is not kept.
    pub(crate) fn get_or_build<E>(
        &self,
        slice: Vec<Arc<cedar_policy_core::ast::Entity>>,
        build: impl FnOnce(
            Vec<Arc<cedar_policy_core::ast::Entity>>,
        )
            -> Result<(cedar_policy::Entities, cedar_policy::PartialEntities), E>,
    ) -> Result<Arc<PlanEntities>, E> {
        let key: Vec<usize> = slice.iter().map(|e| Arc::as_ptr(e) as usize).collect();
        if let Some(hit) = self.map.get(&key) {
            return Ok(hit);
        }
        let (entities, partial) = build(slice.clone())?;
        let entry = Arc::new(PlanEntities {
            _entities: slice,
            entities,
            partial,
        });
        self.map.insert(key, Arc::clone(&entry));
        Ok(entry)
    }
}

/// Most plan sides [`SideMemo`] keeps per bundle; when full it starts over.
const MAX_SIDES: usize = 1024;

/// Key of a memoised side: the addresses of its plan entities and typed context (pinned by the
/// entry), the principal, the action and the resource type.
type SideKey = (usize, usize, EntityUid, EntityUid, EntityTypeName);

struct SideEntry {
    _entities: Arc<PlanEntities>,
    _context: Arc<MemoContext>,
    side: crate::query_plan::Side,
}

/// The filters of one principal of a plan, by everything they are computed from. A side is a
/// pure function of the bundle (policies, schema: the memo lives with it), the principal, the
/// action, the resource type, the typed context and the principal's entity slice; the last two
/// are identified by the memo entries they come from ([`SliceMemo`], [`ContextMemo`]), which a
/// change to the principal, its groups or anything they reference replaces. Contained and
/// unregistered principals are decided before a side is looked up.
#[derive(Default)]
pub(crate) struct SideMemo {
    map: Bounded<SideKey, Arc<SideEntry>, MAX_SIDES>,
}

impl std::fmt::Debug for SideMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideMemo").finish_non_exhaustive()
    }
}

impl SideMemo {
    /// The side for these inputs, computed by `compute` on a miss.
    ///
    /// # Errors
    /// `compute`'s error, which is not kept.
    pub(crate) fn get_or_compute<E>(
        &self,
        entities: &Arc<PlanEntities>,
        context: &Arc<MemoContext>,
        principal: &EntityUid,
        action: &EntityUid,
        resource_type: &EntityTypeName,
        compute: impl FnOnce() -> Result<crate::query_plan::Side, E>,
    ) -> Result<crate::query_plan::Side, E> {
        let key: SideKey = (
            Arc::as_ptr(entities) as usize,
            Arc::as_ptr(context) as usize,
            principal.clone(),
            action.clone(),
            resource_type.clone(),
        );
        if let Some(hit) = self.map.get(&key) {
            return Ok(hit.side.clone());
        }
        let side = compute()?;
        let entry = Arc::new(SideEntry {
            _entities: Arc::clone(entities),
            _context: Arc::clone(context),
            side: side.clone(),
        });
        self.map.insert(key, entry);
        Ok(side)
    }
}
