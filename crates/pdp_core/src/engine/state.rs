//! The engine's state: one bundle with what the engine memoises about it ([`Caches`]), one
//! entity store, their closed hierarchy and versions, published together with one atomic
//! pointer swap ([`Engine`]); and the engine's construction and accessors.

use crate::bundle::Bundle;
use crate::decision::Mode;
use crate::error::RequestError;
use crate::limits::TooDeep;
use crate::memo::{ContextMemo, SideMemo, SliceMemo};
use crate::plan_outcome::{PlanCache, DEFAULT_PLAN_CACHE_CAPACITY, DEFAULT_PLAN_MAX_AGE_SECS};
use crate::residual_filter::AttrKinds;
use crate::scope::{ScopeIndex, Scoped};
use crate::store::{Hierarchy, Prefetch, Store, Written};
use arc_swap::ArcSwap;
use cedar_policy::{EntityTypeName, EntityUid};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

/// What the engine memoises about one bundle, built alongside it and replaced with it: the
/// bundle itself is only content (policies, schema, entities, lookups computed once), while
/// these fill as checks and plans run (crate::memo). None of them changes an answer.
pub(crate) struct Caches {
    /// Attribute kinds learned by query plans (with a schema only); shared by every plan.
    pub(crate) attr_kinds: Option<Arc<AttrKinds>>,
    /// The policies that can apply per (action, principal type, resource type).
    pub(crate) scopes: OwnLines<ScopeIndex>,
    /// Typed contexts by (action, context JSON).
    pub(crate) contexts: OwnLines<ContextMemo>,
    /// Plan entity slices, converted for partial evaluation.
    pub(crate) plan_entities: SliceMemo,
    /// Plan sides (one principal's filters) by everything they are computed from.
    pub(crate) plan_sides: SideMemo,
}

/// A value on cache lines of its own (128 bytes: two 64-byte lines, as adjacent-line prefetch
/// pairs them). Every check takes the read locks of the scope index and of the context memo;
/// a read lock writes its lock word, so with the two locks on one line, threads deciding at
/// once (`evaluate_many`) kept taking that line from each other: tinytodo's `evaluate_many` took
/// about twice as long per decision (`benches/bench_evaluate.py`).
#[repr(align(128))]
pub(crate) struct OwnLines<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLines<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl Caches {
    /// Empty caches for `bundle`.
    pub(super) fn new(bundle: &Bundle) -> Self {
        Self {
            attr_kinds: bundle.schema.as_ref().map(|s| Arc::new(AttrKinds::new(s))),
            scopes: OwnLines(ScopeIndex::new(bundle.action_ancestors.clone())),
            contexts: OwnLines(ContextMemo::default()),
            plan_entities: SliceMemo::default(),
            plan_sides: SideMemo::default(),
        }
    }

    /// The caches of `linked`, the bundle that linking templates into this one's bundle made
    /// (`Bundle::with_links`): the schema is the same, so the attribute kinds learned so far
    /// are kept; everything else depends on the policies and starts empty.
    pub(super) fn relinked(&self, linked: &Bundle) -> Self {
        Self {
            attr_kinds: self.attr_kinds.clone(),
            ..Self::new(linked)
        }
    }

    /// The policies of `bundle` that can apply when a principal of type `principal` performs
    /// `action` on a resource of type `resource`, compiled for checks, with whether the schema
    /// lets the action take those types ([`Scoped`]); built on first use and cached for checks
    /// and plans alike ([`ScopeIndex::get`]). `bundle` must be the one these caches were made
    /// for.
    #[inline]
    pub(super) fn scoped(
        &self,
        bundle: &Bundle,
        action: &EntityUid,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> Arc<Scoped> {
        self.scopes.get(
            &bundle.policies,
            |id| bundle.is_plain_forbid(id),
            || bundle.lookups.types_valid(action, principal, resource),
            action,
            principal,
            resource,
        )
    }
}

#[derive(Clone)]
pub(super) struct State {
    pub(super) bundle: Arc<Bundle>,
    /// What the engine memoises about `bundle` ([`Caches`]); replaced with it.
    pub(super) caches: Arc<Caches>,
    pub(super) store: Store,
    pub(super) mode: Mode,
    pub(super) policy_version: u64,
    pub(super) principals_version: u64,
    pub(super) resources_version: u64,
    /// Every bundle, store and action entity with its ancestors closed.
    pub(super) hierarchy: Hierarchy,
}

impl State {
    /// The entity in force for `uid`, as written: the store's, else the bundle's, else the
    /// action entity.
    #[inline]
    pub(super) fn entity(&self, uid: &EntityUid) -> Option<Written<'_>> {
        if let Some(r) = self.store.entities.get(uid.as_ref()) {
            return Some(Written::Record(r));
        }
        self.bundle
            .entities
            .get(uid)
            .or_else(|| self.bundle.action_entities.get(uid))
            .map(|e| Written::Stored(e))
    }

    /// Points the store's table at the hierarchy's record of each of `uids` that is a stored
    /// entity, so both share one record per entity.
    fn repoint<'u>(&mut self, uids: impl Iterator<Item = &'u EntityUid>) {
        for u in uids {
            if self.store.entities.contains_key(u.as_ref()) {
                if let Some(r) = self.hierarchy.get(u) {
                    self.store
                        .entities
                        .insert(u.as_ref().clone(), Arc::clone(r));
                }
            }
        }
    }

    /// Re-closes every entity (after a bundle or whole-store swap). Returns the uids of
    /// entities that are their own ancestors (the closure is still rebuilt, with those cycles
    /// left out).
    ///
    /// # Errors
    /// [`TooDeep`] when a parent chain is longer than [`crate::limits::max_entity_depth`]: nothing is
    /// closed and the hierarchy is left as it was.
    pub(super) fn rebuild_hierarchy(&mut self) -> Result<Vec<EntityUid>, TooDeep> {
        let b = &self.bundle;
        let stored: Vec<EntityUid> = self
            .store
            .entities
            .keys()
            .map(|u| EntityUid::from(u.clone()))
            .collect();
        let uids = stored
            .iter()
            .chain(
                b.entities
                    .keys()
                    .filter(|u| !self.store.entities.contains_key(u.as_ref())),
            )
            .chain(b.action_entities.keys())
            .collect::<Vec<_>>();
        let (h, cycles) = Hierarchy::rebuild(uids.iter().copied(), &|u| self.entity(u))?;
        self.hierarchy = h;
        // The store's table is rebuilt over the new records, so the records it held as written
        // (or closed under the previous bundle) are freed.
        self.store.entities = stored
            .iter()
            .filter_map(|u| {
                let r = self.hierarchy.get(u)?;
                Some((u.as_ref().clone(), Arc::clone(r)))
            })
            .collect();
        Ok(cycles)
    }

    /// Re-closes what changing `changed` can reach.
    ///
    /// # Errors
    /// [`RequestError`] on `field` when the change makes an entity its own ancestor or a parent
    /// chain longer than [`crate::limits::max_entity_depth`] (the state is then half updated; the
    /// writer's copy must not be published).
    pub(super) fn refresh_hierarchy(
        &mut self,
        changed: &[EntityUid],
        field: &str,
    ) -> Result<(), RequestError> {
        let mut h = std::mem::take(&mut self.hierarchy);
        let r = h.refresh(changed, &|u| self.entity(u));
        self.hierarchy = h;
        let (done, cycles) = r.map_err(|d| RequestError::new(field, d.to_string()))?;
        self.repoint(done.iter());
        if cycles.is_empty() {
            Ok(())
        } else {
            Err(cycle(field, &cycles))
        }
    }
}

/// Starts loading into the CPU's caches what the lookups of a check will read, so that on a
/// large store their memory waits overlap with other work instead of stalling the check
/// ([`Prefetch`]; docs/benchmarks.md, "Decision core"). Made by [`Engine::prefetcher`];
/// holds that moment's snapshot (cheaply, as a check does), so one serves a whole request or
/// a batch of them without reloading it.
///
/// Callers ask for [`Prefetch::Slot`] as soon as a request's uids are known and for
/// [`Prefetch::Record`] a little later: the Python binding while it reads the rest of the
/// request, `evaluate_many` one and two requests ahead of the one it decides. Only a hint:
/// decisions are the same with or without it, and prefetching from a snapshot that has since
/// been replaced only loads memory for nothing.
pub struct Prefetcher {
    pub(super) st: arc_swap::Guard<Arc<State>>,
}

impl Prefetcher {
    /// Starts loading what looking up the entities of `keys` ([`Engine::prefetch_key`]) reads
    /// at `step`, and returns at once.
    pub fn prefetch(&self, keys: &[u64], step: Prefetch) {
        for &key in keys {
            self.st.hierarchy.prefetch(key, step);
        }
    }
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher").finish_non_exhaustive()
    }
}

/// The error for a parent relation with a cycle (Cedar requires the hierarchy to be a DAG).
pub(super) fn cycle(field: &str, uids: &[EntityUid]) -> RequestError {
    let names: Vec<String> = uids.iter().map(|u| format!("`{u}`")).collect();
    RequestError::new(
        field,
        format!(
            "parents form a cycle: {} would be its own ancestor",
            names.join(", ")
        ),
    )
}

/// Versions of what an engine decides with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// Moves on every bundle change (load, link).
    pub policy_version: u64,
    /// Moves on every change to principals, groups, registrations, containments or risk scores.
    pub principals_version: u64,
    /// Moves on every change to other entities and to work items.
    pub resources_version: u64,
}

/// The in-process decision engine. Cheap to share (`Sync`); every method may be called while
/// checks run on other threads.
pub struct Engine {
    pub(super) state: ArcSwap<State>,
    pub(super) writer: Mutex<()>,
    pub(super) plans: PlanCache,
    pub(super) plan_max_age_secs: AtomicU64,
    /// Whether plan sides are memoised ([`Engine::set_plan_memo`]).
    pub(super) plan_memo: AtomicBool,
    /// Whether check slices leave out references no policy looks into
    /// ([`Engine::set_slice_pruning`]).
    pub(super) slice_pruning: AtomicBool,
    /// The largest `page.limit` a search takes ([`Engine::configure_search`]).
    pub(super) search_max_limit: AtomicUsize,
    /// Whether subject search plans with the principal unknown ([`Engine::set_subject_plans`]).
    pub(super) subject_plans: std::sync::atomic::AtomicBool,
    /// The entities by type of the latest snapshot a search ran on, with its versions
    /// (policy, principals, resources).
    pub(super) search_index: Mutex<Option<([u64; 3], Arc<super::search::TypeIndex>)>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.versions();
        f.debug_struct("Engine").field("versions", &v).finish()
    }
}

impl Engine {
    /// An engine deciding with `bundle`, an empty store and mode `enforce`.
    pub fn new(bundle: Bundle) -> Self {
        let caches = Arc::new(Caches::new(&bundle));
        let mut st = State {
            bundle: Arc::new(bundle),
            caches,
            store: Store::default(),
            mode: Mode::Enforce,
            policy_version: 1,
            principals_version: 1,
            resources_version: 1,
            hierarchy: Hierarchy::default(),
        };
        // A bundle loaded by `Bundle::from_sources` has no cycles (Cedar closes its entities)
        // and no chain over the depth limit (it refuses one); an engine is still built if it
        // had a cycle, with the cycle ignored.
        let _ = st.rebuild_hierarchy();
        Self {
            state: ArcSwap::from_pointee(st),
            writer: Mutex::new(()),
            plans: PlanCache::new(DEFAULT_PLAN_CACHE_CAPACITY),
            plan_max_age_secs: AtomicU64::new(DEFAULT_PLAN_MAX_AGE_SECS),
            plan_memo: AtomicBool::new(true),
            slice_pruning: AtomicBool::new(true),
            search_max_limit: AtomicUsize::new(crate::search::DEFAULT_MAX_SEARCH_LIMIT),
            subject_plans: std::sync::atomic::AtomicBool::new(true),
            search_index: Mutex::new(None),
        }
    }

    /// The bundle in force.
    pub fn bundle(&self) -> Arc<Bundle> {
        self.state.load().bundle.clone()
    }

    /// Current versions.
    pub fn versions(&self) -> Versions {
        let s = self.state.load();
        Versions {
            policy_version: s.policy_version,
            principals_version: s.principals_version,
            resources_version: s.resources_version,
        }
    }

    /// Current mode.
    pub fn mode(&self) -> Mode {
        self.state.load().mode
    }

    /// A snapshot of the store (O(1)).
    pub fn store(&self) -> Store {
        self.state.load().store.clone()
    }

    /// Applies `f` to a copy of the state and publishes it atomically. Writers are serialised;
    /// readers are never blocked.
    pub(super) fn update<T, E>(&self, f: impl FnOnce(&mut State) -> Result<T, E>) -> Result<T, E> {
        let _guard = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = State::clone(&self.state.load());
        let out = f(&mut next)?;
        next.store.settle();
        next.hierarchy.settle();
        self.state.store(Arc::new(next));
        Ok(out)
    }
}
