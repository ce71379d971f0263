//! The in-memory entity store: principals, groups, resources, work items, containments,
//! service-account registrations and risk scores (SPEC 1 "what the decision point keeps").
//!
//! The store is a persistent (structurally shared) map, so a writer clones it in O(1), changes
//! its copy and publishes it with one atomic pointer swap: checks that already started keep the
//! snapshot they began with, and no check ever sees half an update.

use crate::error::{chain, RequestError};
use crate::request::parse_uid;
use cedar_policy::{Entities, Entity, EntityUid, EvalResult, Schema};
use cedar_policy_core::ast;
use cedar_policy_core::entities::{Entities as CoreEntities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// The hasher of svc's own maps: foldhash, seeded at random per process. Entity uids are hashed
/// several times per check, and SipHash (the standard hasher) was about a tenth of a check.
pub(crate) type FastHasher = foldhash::fast::RandomState;
/// A persistent hash map with [`FastHasher`].
pub(crate) type PMap<K, V> =
    imbl::GenericHashMap<K, V, FastHasher, imbl::shared_ptr::DefaultSharedPtr>;
/// A persistent hash set with [`FastHasher`].
pub(crate) type PSet<K> = imbl::GenericHashSet<K, FastHasher, imbl::shared_ptr::DefaultSharedPtr>;
/// A hash map with [`FastHasher`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastHasher>;
/// A hash set with [`FastHasher`].
pub(crate) type FastSet<K> = HashSet<K, FastHasher>;

/// An entity with its direct parents and the entities its attributes reference, kept beside
/// the Cedar entity so a check can gather the slice it needs without scanning the store.
#[derive(Debug, Clone)]
pub struct StoredEntity {
    /// The Cedar entity.
    pub entity: Entity,
    /// Its parents (as written; Cedar computes the transitive closure per check).
    pub parents: Vec<EntityUid>,
    /// Entities referenced by its attributes, at any depth of sets and records, each with the
    /// name of the attribute it was found in.
    pub refs: Vec<(Arc<str>, EntityUid)>,
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
        let mut found = Vec::new();
        for (name, v) in entity.attrs() {
            if let Ok(v) = v {
                collect_refs(&v, &mut found);
                if !found.is_empty() {
                    let name: Arc<str> = name.into();
                    refs.extend(found.drain(..).map(|u| (Arc::clone(&name), u)));
                }
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
    /// The same entity with its transitive ancestors, closed when the item was stored.
    pub(crate) closed: Arc<ast::Entity>,
}

/// One immutable snapshot of everything the decision point knows besides the bundle.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub(crate) entities: PMap<EntityUid, Arc<StoredEntity>>,
    pub(crate) work_items: PMap<String, Arc<WorkItem>>,
    pub(crate) contained: PSet<EntityUid>,
    pub(crate) risk: PMap<EntityUid, i64>,
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

/// Every entity the engine knows (the bundle's `entities.json` base layer, the store above it,
/// and the schema's action entities), each with its transitive ancestors precomputed.
///
/// Cedar needs the ancestor relation transitively closed before it evaluates. Computing the
/// closure of each check's slice was the largest cost of a check (see docs/benchmarks.md), so
/// the closure is kept here instead, per snapshot: a check hands Cedar `Arc`s of these entities
/// with [`TCComputation::AssumeAlreadyComputed`], copying nothing. Writers re-close only what a
/// change can reach: the changed entities, plus (when a changed entity is somebody's parent) every
/// entity whose ancestors include it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hierarchy {
    closed: PMap<ast::EntityUID, Arc<ast::Entity>>,
    /// Uids that are (or were, since the last rebuild) a parent of some entity. An entity
    /// outside this set has no descendants, so changing it re-closes only itself.
    parents: PSet<EntityUid>,
}

impl Hierarchy {
    /// Closes one entity: its Cedar entity with every ancestor reachable through `look`
    /// (depth-first, cycle-safe) added as an indirect ancestor. The flag is true when the entity
    /// is its own ancestor (a cycle, which Cedar refuses).
    pub(crate) fn close_entity<'a>(
        se: &StoredEntity,
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> (ast::Entity, bool) {
        let mut core: ast::Entity = se.entity.as_ref().clone();
        let direct: HashSet<&EntityUid> = se.parents.iter().collect();
        let mut seen: HashSet<EntityUid> = HashSet::new();
        let mut stack: Vec<&EntityUid> = se.parents.iter().collect();
        let own = se.entity.uid();
        let mut cyclic = false;
        while let Some(p) = stack.pop() {
            if !seen.insert(p.clone()) {
                continue;
            }
            if *p == own {
                cyclic = true;
                continue;
            }
            if !direct.contains(p) {
                core.add_indirect_ancestor(p.as_ref().clone());
            }
            if let Some(pe) = look(p) {
                stack.extend(pe.parents.iter().filter(|g| !seen.contains(*g)));
            }
        }
        (core, cyclic)
    }

    /// Closes every entity in `uids` from scratch. Returns the closure and the uids of entities
    /// that are their own ancestors (their cycle is left out of their closure).
    pub(crate) fn rebuild<'a, 'u>(
        uids: impl Iterator<Item = &'u EntityUid>,
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> (Self, Vec<EntityUid>) {
        let mut h = Self::default();
        let mut cycles = Vec::new();
        for uid in uids {
            if let Some(se) = look(uid) {
                for p in &se.parents {
                    h.parents.insert(p.clone());
                }
                let (e, cyclic) = Self::close_entity(se, look);
                if cyclic {
                    cycles.push(uid.clone());
                }
                h.closed.insert(uid.as_ref().clone(), Arc::new(e));
            }
        }
        cycles.sort();
        (h, cycles)
    }

    /// Re-closes after the entities `changed` were inserted, replaced or removed (`look` shows
    /// the state after the change).
    ///
    /// # Errors
    /// The uids of entities the change made their own ancestors; `self` is then half updated
    /// and must be dropped (writers work on a copy and do not publish it).
    pub(crate) fn refresh<'a>(
        &mut self,
        changed: &[EntityUid],
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> Result<(), Vec<EntityUid>> {
        let mut cycles = Vec::new();
        let mut affected: HashSet<EntityUid> = changed.iter().cloned().collect();
        if changed.iter().any(|u| self.parents.contains(u)) {
            let core: HashSet<&ast::EntityUID> = changed.iter().map(AsRef::as_ref).collect();
            for (uid, e) in &self.closed {
                if e.ancestors().any(|a| core.contains(a)) {
                    affected.insert(EntityUid::from(uid.clone()));
                }
            }
        }
        for uid in affected {
            match look(&uid) {
                Some(se) => {
                    for p in &se.parents {
                        self.parents.insert(p.clone());
                    }
                    let (e, cyclic) = Self::close_entity(se, look);
                    self.closed.insert(uid.as_ref().clone(), Arc::new(e));
                    if cyclic {
                        cycles.push(uid);
                    }
                }
                None => {
                    self.closed.remove(uid.as_ref());
                }
            }
        }
        if cycles.is_empty() {
            Ok(())
        } else {
            cycles.sort();
            Err(cycles)
        }
    }

    /// The closed entity `uid`, if known.
    pub(crate) fn get(&self, uid: &EntityUid) -> Option<&Arc<ast::Entity>> {
        self.closed.get(uid.as_ref())
    }

    /// The closed entity `uid` (Cedar's internal uid), if known.
    pub(crate) fn get_core(&self, uid: &ast::EntityUID) -> Option<&Arc<ast::Entity>> {
        self.closed.get(uid)
    }

    /// Cedar `Entities` over already-closed entities (no copy, no closure computation).
    ///
    /// # Errors
    /// [`RequestError`] on `entities` if Cedar refuses the set (two different entities with one
    /// uid; callers deduplicate, so this is not expected).
    pub(crate) fn slice(entities: Vec<Arc<ast::Entity>>) -> Result<Entities, RequestError> {
        CoreEntities::new()
            .add_entities(
                entities,
                None::<&NoEntitiesSchema>,
                TCComputation::AssumeAlreadyComputed,
                Extensions::all_available(),
            )
            .map(Entities::from)
            .map_err(|e| RequestError::new("entities", chain(&e)))
    }
}
