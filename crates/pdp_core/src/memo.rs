//! Per-bundle memos that keep a check or a plan cheap without changing any answer. They live
//! in the engine's state beside the bundle they were filled for (crate::engine), never in the
//! bundle itself, and start empty with every new bundle.
//!
//! * [`ContextMemo`]: the schema-typed `Context` of an action's context JSON. Parsing and typing
//!   a context is a pure function of (schema, action, JSON), and a bundle never changes its
//!   schema, so the memo lives as long as the bundle (beside it, in the engine state). An
//!   entry also records whether Cedar's full request validation already accepted that context
//!   for that action (context validation depends on nothing else), so a later request with the
//!   same context and types that the action is known to take skips the second validation
//!   (see `crate::lookups::Lookups::types_valid`). Failures are never memoised: they are
//!   recomputed, so every error message stays Cedar's.

use crate::maps::{FastHasher, FastMap};
use cedar_policy::{Context, EntityTypeName, EntityUid};
use hashbrown::HashTable;
use serde_json::{Map, Value};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

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

/// The decision point's own context fields of one check
/// (docs/decisions.md#context-the-decision-point-fills-in), as [`ContextMemo`] keys them: each is
/// `None` when the action's context does not take it (`risk_score` also when the
/// reasoner holds no score for the principal). The typed context is the caller's context
/// without [`crate::request::INJECTED_CONTEXT`] (nor its `risk_score` when one is injected), with
/// these fields laid on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Injected<'a> {
    /// The reasoner's risk score, 0 to 100.
    pub(crate) risk_score: Option<i64>,
    /// Whether a person is at the keyboard (the request's `human_present`).
    pub(crate) human_present: Option<bool>,
    /// Whether the request's work item is assigned to the resource.
    pub(crate) assigned: Option<bool>,
    /// The open work item of the request.
    pub(crate) work_item: Option<&'a EntityUid>,
    /// The agent, in the check of the person it acts for.
    pub(crate) agent: Option<&'a EntityUid>,
}

impl<'a> Injected<'a> {
    /// Whether the caller's context entry `key` gives way to (or is never taken from) the
    /// decision point.
    fn overrides(&self, key: &str) -> bool {
        crate::request::INJECTED_CONTEXT.contains(&key)
            || (key == "risk_score" && self.risk_score.is_some())
    }

    /// The entries of the caller's `context` that are kept: those these fields do not replace.
    fn kept<'c>(
        &self,
        caller: &'c Map<String, Value>,
    ) -> impl Iterator<Item = (&'c String, &'c Value)> + use<'c, '_, 'a> {
        caller.iter().filter(|(k, _)| !self.overrides(k))
    }

    /// `kept` (the caller's kept entries) with these fields laid on top: the JSON that is typed.
    fn merge(&self, mut ctx: Map<String, Value>) -> Map<String, Value> {
        if let Some(r) = self.risk_score {
            ctx.insert("risk_score".into(), Value::from(r));
        }
        if let Some(h) = self.human_present {
            ctx.insert("human_present".into(), Value::Bool(h));
        }
        if let Some(a) = self.assigned {
            ctx.insert("assigned".into(), Value::Bool(a));
        }
        if let Some(w) = self.work_item {
            ctx.insert("work_item".into(), entity_ref(w));
        }
        if let Some(a) = self.agent {
            ctx.insert("agent".into(), entity_ref(a));
        }
        ctx
    }
}

/// `{"__entity": {"type": .., "id": ..}}`, Cedar's JSON form of an entity reference.
fn entity_ref(u: &EntityUid) -> Value {
    serde_json::json!({ "__entity": {"type": u.type_name().to_string(), "id": u.id().unescaped()} })
}

/// One memoised context: what it was typed from, and the result.
struct ContextEntry {
    hash: u64,
    action: EntityUid,
    /// The caller's context without the entries [`Injected::overrides`] drops.
    caller: Map<String, Value>,
    risk_score: Option<i64>,
    human_present: Option<bool>,
    assigned: Option<bool>,
    work_item: Option<EntityUid>,
    agent: Option<EntityUid>,
    typed: Arc<MemoContext>,
}

impl ContextEntry {
    /// The injected fields this entry was typed with.
    fn injected(&self) -> Injected<'_> {
        Injected {
            risk_score: self.risk_score,
            human_present: self.human_present,
            assigned: self.assigned,
            work_item: self.work_item.as_ref(),
            agent: self.agent.as_ref(),
        }
    }

    /// Whether this entry was typed from `caller` with `inj` laid on top, for `action`.
    fn matches(&self, action: &EntityUid, caller: &Map<String, Value>, inj: &Injected<'_>) -> bool {
        if self.injected() != *inj || &self.action != action {
            return false;
        }
        // The same entries in the same order (the usual case): one pass, no lookups.
        let mut kept = inj.kept(caller);
        let mut mine = self.caller.iter();
        loop {
            match (kept.next(), mine.next()) {
                (None, None) => return true,
                (Some((k, v)), Some((mk, mv))) if k == mk => {
                    if v != mv {
                        return false;
                    }
                }
                _ => break,
            }
        }
        // Another order: compare as maps.
        let mut n = 0;
        for (k, v) in inj.kept(caller) {
            n += 1;
            if self.caller.get(k) != Some(v) {
                return false;
            }
        }
        n == self.caller.len()
    }
}

/// Typed contexts by (action, caller's context JSON, [`Injected`] fields); see the module docs.
///
/// A lookup builds nothing: it hashes the caller's context where it lies, skipping the entries
/// the decision point replaces, and compares an entry with it the same way. Objects hash
/// independently of key order (as Cedar reads them); the hasher's seed is random per memo, since
/// contexts come from callers. Only a miss merges the fields into a JSON map and types it.
pub(crate) struct ContextMemo {
    hasher: FastHasher,
    map: RwLock<HashTable<ContextEntry>>,
}

impl Default for ContextMemo {
    fn default() -> Self {
        Self {
            hasher: FastHasher::default(),
            map: RwLock::new(HashTable::new()),
        }
    }
}

impl std::fmt::Debug for ContextMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextMemo")
            .field("cap", &MAX_CONTEXTS)
            .finish_non_exhaustive()
    }
}

impl ContextMemo {
    /// A hash of `v` that does not depend on the order of object keys.
    fn value_hash(&self, v: &Value) -> u64 {
        match v {
            Value::Object(m) => self.entries_hash(m.iter()),
            Value::Array(a) => {
                let mut h = self.hasher.build_hasher();
                h.write_u8(5);
                for x in a {
                    h.write_u64(self.value_hash(x));
                }
                h.finish()
            }
            scalar => self.hasher.hash_one(scalar),
        }
    }

    /// Order-independent hash of object entries: the wrapping sum of each entry's hash.
    fn entries_hash<'v>(&self, entries: impl Iterator<Item = (&'v String, &'v Value)>) -> u64 {
        entries.fold(0x6f62_6a65_6374_u64, |acc, (k, x)| {
            acc.wrapping_add(self.hasher.hash_one((k.as_str(), self.value_hash(x))))
        })
    }

    fn key_hash(&self, action: &EntityUid, caller: &Map<String, Value>, inj: &Injected<'_>) -> u64 {
        let body = self.entries_hash(inj.kept(caller));
        self.hasher.hash_one((action, body, inj))
    }

    /// The typed context of `caller` with `inj` laid on top, for `action`; on a miss `parse`
    /// types the merged JSON (`parse` must be the same pure function of the JSON every time).
    /// Errors are returned, not kept.
    pub(crate) fn get_or_parse<E>(
        &self,
        action: &EntityUid,
        caller: &Map<String, Value>,
        inj: &Injected<'_>,
        parse: impl FnOnce(Value) -> Result<Context, E>,
    ) -> Result<Arc<MemoContext>, E> {
        let hash = self.key_hash(action, caller, inj);
        {
            let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = map.find(hash, |e| e.hash == hash && e.matches(action, caller, inj)) {
                return Ok(Arc::clone(&e.typed));
            }
        }
        let kept: Map<String, Value> = inj
            .kept(caller)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let typed = Arc::new(MemoContext {
            context: parse(Value::Object(inj.merge(kept.clone())))?,
            validated: AtomicBool::new(false),
        });
        let entry = ContextEntry {
            hash,
            action: action.clone(),
            caller: kept,
            risk_score: inj.risk_score,
            human_present: inj.human_present,
            assigned: inj.assigned,
            work_item: inj.work_item.cloned(),
            agent: inj.agent.cloned(),
            typed: Arc::clone(&typed),
        };
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_CONTEXTS {
            map.clear();
        }
        // Another thread may have typed the same context meanwhile; keep one entry.
        if map
            .find(hash, |e| e.hash == hash && e.matches(action, caller, inj))
            .is_none()
        {
            map.insert_unique(hash, entry, |e| e.hash);
        }
        Ok(typed)
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
    /// The slice as TPE's partial entities (the conforming part; see `residual_filter::partial_entities`).
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

/// Most plan sides [`SideMemo`] keeps per bundle, in each of its two levels; when a level is
/// full it starts over.
const MAX_SIDES: usize = 1024;

/// Key of a memoised side: the addresses of its plan entities and typed context (pinned by the
/// entry), the principal, the action and the resource type.
type SideKey = (usize, usize, EntityUid, EntityUid, EntityTypeName);

/// Key of a side in the recent level: the address of its typed context (pinned by the entry),
/// the principal, the agent acting for it, the action and the resource type. The store's
/// versions are the level's, not the key's.
type RecentKey = (
    usize,
    EntityUid,
    Option<EntityUid>,
    EntityUid,
    EntityTypeName,
);

/// The store versions a side of the recent level was computed under: principals, then
/// resources (`Engine::versions`; both only grow).
pub(crate) type StoreVersions = (u64, u64);

struct SideEntry {
    _entities: Arc<PlanEntities>,
    _context: Arc<MemoContext>,
    side: crate::plan_outcome::Side,
}

/// The recent level: sides computed under one pair of store versions.
#[derive(Default)]
struct Recent {
    versions: StoreVersions,
    map: FastMap<RecentKey, Arc<SideEntry>>,
}

/// The filters of one principal of a plan, by everything they are computed from. A side is a
/// pure function of the bundle (policies, schema: the memo lives with it), the principal, the
/// action, the resource type, the typed context and the principal's entity slice; the last two
/// are identified by the memo entries they come from ([`SliceMemo`], [`ContextMemo`]), which a
/// change to the principal, its groups or anything they reference replaces. Contained and
/// unregistered principals are decided before a side is looked up.
///
/// Finding the slice is itself a walk over the principal's ancestors and references (a sixth
/// of a memoised github_example plan, whose users sit in many groups), so a second, recent
/// level keys sides by the store versions instead: within one pair of versions no entity
/// changed, so the same principal, agent, action, resource type and context have the same
/// slice. The recent level starts over whenever the versions move; the slice-keyed level
/// still answers then, after the walk.
#[derive(Default)]
pub(crate) struct SideMemo {
    map: Bounded<SideKey, Arc<SideEntry>, MAX_SIDES>,
    recent: RwLock<Recent>,
}

impl std::fmt::Debug for SideMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideMemo").finish_non_exhaustive()
    }
}

/// What a side is asked for: the store versions of the snapshot planned on, the typed
/// context, the principal, the agent acting for it (on a person's side), the action and the
/// resource type.
pub(crate) struct SideQuestion<'a> {
    pub(crate) versions: StoreVersions,
    pub(crate) context: &'a Arc<MemoContext>,
    pub(crate) principal: &'a EntityUid,
    pub(crate) agent: Option<&'a EntityUid>,
    pub(crate) action: &'a EntityUid,
    pub(crate) resource_type: &'a EntityTypeName,
}

impl SideMemo {
    /// The side for `q`: from the recent level when the store has not changed since it was
    /// computed, else from the slice-keyed level with the entities `slice` finds, else
    /// `compute`d from those entities.
    ///
    /// # Errors
    /// `slice`'s or `compute`'s error, which is not kept.
    pub(crate) fn get_or_compute<E>(
        &self,
        q: &SideQuestion<'_>,
        slice: impl FnOnce() -> Result<Arc<PlanEntities>, E>,
        compute: impl FnOnce(&PlanEntities) -> Result<crate::plan_outcome::Side, E>,
    ) -> Result<crate::plan_outcome::Side, E> {
        let recent_key: RecentKey = (
            Arc::as_ptr(q.context) as usize,
            q.principal.clone(),
            q.agent.cloned(),
            q.action.clone(),
            q.resource_type.clone(),
        );
        {
            let g = self.recent.read().unwrap_or_else(PoisonError::into_inner);
            if g.versions == q.versions {
                if let Some(hit) = g.map.get(&recent_key) {
                    return Ok(hit.side.clone());
                }
            }
        }
        let entities = slice()?;
        let key: SideKey = (
            Arc::as_ptr(&entities) as usize,
            Arc::as_ptr(q.context) as usize,
            q.principal.clone(),
            q.action.clone(),
            q.resource_type.clone(),
        );
        let entry = match self.map.get(&key) {
            Some(hit) => hit,
            None => {
                let side = compute(&entities)?;
                let entry = Arc::new(SideEntry {
                    _entities: entities,
                    _context: Arc::clone(q.context),
                    side,
                });
                self.map.insert(key, Arc::clone(&entry));
                entry
            }
        };
        self.remember(q.versions, recent_key, Arc::clone(&entry));
        Ok(entry.side.clone())
    }

    /// Keeps `entry` in the recent level under `versions`: a level kept under other versions
    /// starts over when these are newer, and `entry` is dropped when they are older (a plan on
    /// a snapshot that was replaced while it ran).
    fn remember(&self, versions: StoreVersions, key: RecentKey, entry: Arc<SideEntry>) {
        let mut stale = Vec::new();
        {
            let mut g = self.recent.write().unwrap_or_else(PoisonError::into_inner);
            if g.versions != versions {
                if versions.0 < g.versions.0 || versions.1 < g.versions.1 {
                    return;
                }
                g.versions = versions;
                stale.extend(std::mem::take(&mut g.map).into_values());
            } else if g.map.len() >= MAX_SIDES {
                stale.extend(std::mem::take(&mut g.map).into_values());
            }
            stale.extend(g.map.insert(key, entry));
        }
        // Freed outside the lock.
        drop(stale);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::cell::Cell;
    use std::str::FromStr;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    fn none() -> Injected<'static> {
        Injected {
            risk_score: None,
            human_present: None,
            assigned: None,
            work_item: None,
            agent: None,
        }
    }

    /// Looks `caller` up with `inj`; returns the typed context and the JSON `parse` was given
    /// (`None` on a hit).
    fn lookup(
        memo: &ContextMemo,
        action: &EntityUid,
        caller: &Map<String, Value>,
        inj: &Injected<'_>,
    ) -> (Arc<MemoContext>, Option<Value>) {
        let seen: Cell<Option<Value>> = Cell::new(None);
        let typed = memo
            .get_or_parse(action, caller, inj, |v| {
                seen.set(Some(v.clone()));
                Context::from_json_value(v, None).map_err(|e| e.to_string())
            })
            .unwrap();
        (typed, seen.take())
    }

    #[test]
    fn key_order_and_replaced_fields_do_not_split_entries() {
        let memo = ContextMemo::default();
        let read = EntityUid::from_str(r#"Action::"read""#).unwrap();
        let inj = Injected {
            human_present: Some(true),
            ..none()
        };
        let a = obj(serde_json::json!({"ip": "10.0.0.1", "n": {"x": 1, "y": [1, 2]}}));
        let b = obj(
            serde_json::json!({"n": {"y": [1, 2], "x": 1}, "ip": "10.0.0.1",
                                       "human_present": false, "agent": "forged"}),
        );
        let (first, parsed) = lookup(&memo, &read, &a, &inj);
        assert_eq!(
            parsed.unwrap(),
            serde_json::json!({"ip": "10.0.0.1", "n": {"x": 1, "y": [1, 2]}, "human_present": true})
        );
        let (second, parsed) = lookup(&memo, &read, &b, &inj);
        assert!(parsed.is_none(), "same context in another order: a hit");
        assert!(Arc::ptr_eq(&first, &second));
    }

    #[test]
    fn values_actions_and_injected_fields_tell_entries_apart() {
        let memo = ContextMemo::default();
        let read = EntityUid::from_str(r#"Action::"read""#).unwrap();
        let write = EntityUid::from_str(r#"Action::"write""#).unwrap();
        let agent = EntityUid::from_str(r#"ServiceAccount::"bot""#).unwrap();
        let ctx = obj(serde_json::json!({"risk_score": 5, "ip": "a"}));
        let (base, _) = lookup(&memo, &read, &ctx, &none());
        for (action, caller, inj) in [
            (&write, ctx.clone(), none()),
            (
                &read,
                obj(serde_json::json!({"risk_score": 5, "ip": "b"})),
                none(),
            ),
            (&read, obj(serde_json::json!({"risk_score": 5})), none()),
            (
                &read,
                ctx.clone(),
                Injected {
                    agent: Some(&agent),
                    ..none()
                },
            ),
            (
                &read,
                ctx.clone(),
                Injected {
                    assigned: Some(false),
                    ..none()
                },
            ),
        ] {
            let (other, parsed) = lookup(&memo, action, &caller, &inj);
            assert!(parsed.is_some() && !Arc::ptr_eq(&base, &other));
        }
        // The reasoner's score replaces the caller's; without one the caller's stays.
        let (_, parsed) = lookup(
            &memo,
            &read,
            &ctx,
            &Injected {
                risk_score: Some(80),
                ..none()
            },
        );
        assert_eq!(
            parsed.unwrap(),
            serde_json::json!({"ip": "a", "risk_score": 80})
        );
        let (again, parsed) = lookup(&memo, &read, &ctx, &none());
        assert!(parsed.is_none() && Arc::ptr_eq(&base, &again));
    }
}
