//! The engine itself ([`Engine`]): the snapshot in force ([`State`]), swapped atomically on
//! every write, with the writer lock, the plan cache, the engine's switches and the search
//! index of the latest snapshot; its construction and accessors, its [`Versions`] and the
//! [`Prefetcher`] made from a snapshot. The engine's methods live in the modules above this
//! one, one file per job (`writes`, `check`, `plan`, `search`).

use super::index::TypeIndex;
use super::snapshot::{Caches, State};
use crate::bundle::Bundle;
use crate::decision::Mode;
use crate::plan_outcome::{PlanCache, DEFAULT_PLAN_CACHE_CAPACITY, DEFAULT_PLAN_MAX_AGE_SECS};
use crate::store::{Hierarchy, Prefetch, Store};
use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

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
    pub(super) search_index: Mutex<Option<([u64; 3], Arc<TypeIndex>)>>,
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
