//! The decision engine: one bundle plus one entity store, swapped atomically, and `decide`.
//!
//! Check semantics (docs/decisions.md, docs/architecture.md#verdicts-challenges-and-mode):
//!
//! 1. A contained principal, or a `ServiceAccount` that is not registered, is denied before any
//!    policy runs (`svc:contained`, `svc:unregistered`).
//! 2. Verdict of one principal from the satisfied policies: a plain `forbid` -> `deny`; else a
//!    `@challenge` forbid (with some permit satisfied) or only `@challenge` permits -> `challenge`
//!    with the union of their kinds; else a plain `permit` -> `allow`; else `deny`.
//! 3. `human_present = false` turns a challenge that needs `verification` into `deny`.
//! 4. An agent acting for a person: both are checked, deny > challenge > allow, every challenge
//!    that fires is required.
//! 5. The mode is reported, never applied.

use crate::bundle::{Bundle, Declared, TemplateLink};
pub use crate::decision::{
    rfc3339_ms, uid_key, Decision, Mode, Outcome, PlanOutcome, QueryPlan, Verdict,
};
use crate::error::{chain, BundleError, RequestError, SourceError};
use crate::limits::{self, DepthCheck, TooDeep};
use crate::maps::FastSet;
use crate::memo::{Injected, MemoContext};
use crate::plan_outcome::{
    finish, PlanCache, PlanKey, PrincipalState, Side, DEFAULT_PLAN_CACHE_CAPACITY,
    DEFAULT_PLAN_MAX_AGE_SECS,
};
pub use crate::request::INJECTED_CONTEXT;
use crate::request::{check_identifier, kind, parse_uid, CheckRequest, PlanRequest};
use crate::residual_filter::{partial_entities, residuals_with, PlanError};
use crate::scope::{Derefs, Follow, DEREFS_ALL, FOLLOW_ALL, FOLLOW_NONE};
use crate::store::{
    parse_uid_list, ClosedEntity, Hierarchy, Prefetch, Store, StoredEntity, Unclosable, WorkItem,
};
use arc_swap::ArcSwap;
use cedar_policy::{
    Context, Effect, Entities, Entity, EntityUid, EvalResult, Request, RequestValidationError,
};
use cedar_policy_core::ast::EntityUIDEntry;
use cedar_policy_core::evaluator::Evaluator;
use cedar_policy_core::extensions::Extensions;
use serde_json::{json, Map, Value};
use std::cell::OnceCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Built-in reason: the principal is contained (docs/architecture.md#built-in-denials).
pub const REASON_CONTAINED: &str = "svc:contained";
/// Built-in reason: the service account is not registered (docs/architecture.md#built-in-denials).
pub const REASON_UNREGISTERED: &str = "svc:unregistered";
/// Built-in reason: a `verification` challenge fired but nobody is present to answer it.
pub const REASON_HUMAN_NOT_PRESENT: &str = "svc:human_not_present";

#[derive(Clone)]
struct State {
    bundle: Arc<Bundle>,
    store: Store,
    mode: Mode,
    policy_version: u64,
    principals_version: u64,
    resources_version: u64,
    /// Every bundle, store and action entity with its ancestors closed.
    hierarchy: Hierarchy,
}

impl State {
    /// The entity in force for `uid`: the store's, else the bundle's, else the action entity.
    fn entity(&self, uid: &EntityUid) -> Option<&StoredEntity> {
        self.store
            .entities
            .get(uid)
            .or_else(|| self.bundle.entities.get(uid))
            .or_else(|| self.bundle.action_entities.get(uid))
            .map(|e| &**e)
    }

    /// Re-closes every entity (after a bundle or whole-store swap). Returns the uids of
    /// entities that are their own ancestors (the closure is still rebuilt, with those cycles
    /// left out).
    ///
    /// # Errors
    /// [`TooDeep`] when a parent chain is longer than [`limits::max_entity_depth`]: nothing is
    /// closed and the hierarchy is left as it was.
    fn rebuild_hierarchy(&mut self) -> Result<Vec<EntityUid>, TooDeep> {
        let b = &self.bundle;
        let uids = self
            .store
            .entities
            .keys()
            .chain(
                b.entities
                    .keys()
                    .filter(|u| !self.store.entities.contains_key(*u)),
            )
            .chain(b.action_entities.keys())
            .collect::<Vec<_>>();
        let (h, cycles) = Hierarchy::rebuild(uids.iter().copied(), &|u| self.entity(u))?;
        self.hierarchy = h;
        Ok(cycles)
    }

    /// Re-closes what changing `changed` can reach.
    ///
    /// # Errors
    /// [`RequestError`] on `field` when the change makes an entity its own ancestor or a parent
    /// chain longer than [`limits::max_entity_depth`] (the state is then half updated; the
    /// writer's copy must not be published).
    fn refresh_hierarchy(
        &mut self,
        changed: &[EntityUid],
        field: &str,
    ) -> Result<(), RequestError> {
        let mut h = std::mem::take(&mut self.hierarchy);
        let r = h.refresh(changed, &|u| self.entity(u));
        self.hierarchy = h;
        r.map_err(|e| match e {
            Unclosable::Cycles(c) => cycle(field, &c),
            Unclosable::TooDeep(d) => RequestError::new(field, d.to_string()),
        })
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
    st: arc_swap::Guard<Arc<State>>,
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
fn cycle(field: &str, uids: &[EntityUid]) -> RequestError {
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
    state: ArcSwap<State>,
    writer: Mutex<()>,
    plans: PlanCache,
    plan_max_age_secs: AtomicU64,
    /// Whether plan sides are memoised ([`Engine::set_plan_memo`]).
    plan_memo: AtomicBool,
    /// Whether check slices leave out references no policy looks into
    /// ([`Engine::set_slice_pruning`]).
    slice_pruning: AtomicBool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.versions();
        f.debug_struct("Engine").field("versions", &v).finish()
    }
}

/// What an engine-wide store update changed, used to move the right version counter.
#[derive(Default)]
struct Touched {
    principals: bool,
    resources: bool,
}

impl Engine {
    /// An engine deciding with `bundle`, an empty store and mode `enforce`.
    pub fn new(bundle: Bundle) -> Self {
        let mut st = State {
            bundle: Arc::new(bundle),
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
    fn update<T, E>(&self, f: impl FnOnce(&mut State) -> Result<T, E>) -> Result<T, E> {
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

    /// Replaces the bundle atomically; `policy_version` moves.
    ///
    /// # Errors
    /// [`BundleError`] on `entities.json` when the bundle's entities and the stored ones
    /// together form a parent chain longer than [`limits::max_entity_depth`]; the bundle in
    /// force is unchanged.
    pub fn replace_bundle(&self, bundle: Bundle) -> Result<(), BundleError> {
        self.update(|s| {
            s.bundle = Arc::new(bundle);
            s.policy_version += 1;
            // Keeps serving: a new bundle that closes a cycle with stored entities leaves that
            // cycle out of the closure rather than refusing the bundle.
            s.rebuild_hierarchy()
                .map(drop)
                .map_err(|e| BundleError::one(SourceError::file("entities.json", e.to_string())))
        })
    }

    /// Links templates into the bundle in force (all or nothing); `policy_version` moves.
    ///
    /// # Errors
    /// [`BundleError`] naming each bad link; the bundle in force is unchanged.
    pub fn link_templates(&self, links: &[TemplateLink]) -> Result<(), BundleError> {
        self.update(|s| {
            let next = s.bundle.with_links(links)?;
            s.bundle = Arc::new(next);
            s.policy_version += 1;
            Ok(())
        })
    }

    /// Sets the mode reported with decisions.
    pub fn set_mode(&self, mode: Mode) {
        let _ = self.update::<(), ()>(|s| {
            s.mode = mode;
            Ok(())
        });
    }

    fn parse_entities(
        bundle: &Bundle,
        values: Vec<Value>,
        field: &str,
    ) -> Result<Vec<StoredEntity>, RequestError> {
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            let f = format!("{field}[{i}]");
            let se = StoredEntity::from_json(v, bundle.schema(), &bundle.entity_types, &f)?;
            let uid = se.entity.uid();
            bundle.check_type(uid.type_name(), &format!("{f}.uid.type"))?;
            check_entity_ids(&se, &f)?;
            if !seen.insert(uid.clone()) {
                return Err(RequestError::new(f, format!("duplicate entity `{uid}`")));
            }
            out.push(se);
        }
        Ok(out)
    }

    fn touch(s: &mut State, t: &Touched) {
        if t.principals {
            s.principals_version += 1;
        }
        if t.resources {
            s.resources_version += 1;
        }
    }

    /// Inserts or replaces entities (Cedar JSON entity shape), all or nothing.
    ///
    /// # Errors
    /// [`RequestError`] on `entities[i]` for the first entity that is malformed, of a type the
    /// schema does not declare, does not match the schema, or repeats a uid; nothing is stored.
    pub fn upsert_entities(&self, values: Vec<Value>) -> Result<usize, RequestError> {
        self.update(|s| {
            let parsed = Self::parse_entities(&s.bundle, values, "entities")?;
            let n = parsed.len();
            let mut t = Touched::default();
            let mut changed = Vec::with_capacity(n);
            for se in parsed {
                let uid = se.entity.uid();
                if s.bundle.is_principal_type(uid.type_name()) {
                    t.principals = true;
                } else {
                    t.resources = true;
                }
                s.store.entities.insert(uid.clone(), Arc::new(se));
                changed.push(uid);
            }
            s.refresh_hierarchy(&changed, "entities")?;
            Self::touch(s, &t);
            Ok(n)
        })
    }

    /// Replaces every stored entity with `values` in one atomic swap (a principals/resources
    /// snapshot). Work items, containments and risk scores are kept.
    ///
    /// # Errors
    /// As [`Engine::upsert_entities`]; the previous snapshot stays in force.
    pub fn replace_entities(&self, values: Vec<Value>) -> Result<usize, RequestError> {
        self.update(|s| {
            let parsed = Self::parse_entities(&s.bundle, values, "entities")?;
            let n = parsed.len();
            s.store.entities = parsed
                .into_iter()
                .map(|se| (se.entity.uid(), Arc::new(se)))
                .collect();
            let cycles = s
                .rebuild_hierarchy()
                .map_err(|e| RequestError::new("entities", e.to_string()))?;
            if !cycles.is_empty() {
                return Err(cycle("entities", &cycles));
            }
            Self::touch(
                s,
                &Touched {
                    principals: true,
                    resources: true,
                },
            );
            Ok(n)
        })
    }

    /// Removes entities by uid; returns how many were present.
    ///
    /// # Errors
    /// [`RequestError`] on `uids[i]` for a malformed reference; nothing is removed.
    pub fn remove_entities(&self, uids: &Value) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "uids")?;
        self.update(|s| {
            let mut t = Touched::default();
            let mut n = 0;
            let mut changed = Vec::new();
            for u in &uids {
                if s.store.entities.remove(u).is_some() {
                    changed.push(u.clone());
                    n += 1;
                    if s.bundle.is_principal_type(u.type_name()) {
                        t.principals = true;
                    } else {
                        t.resources = true;
                    }
                }
            }
            s.refresh_hierarchy(&changed, "uids")?;
            Self::touch(s, &t);
            Ok(n)
        })
    }

    /// Registers (or re-registers) service accounts from their records
    /// (docs/architecture.md#entities-and-the-base-schema):
    /// `{id, owner, ai, groups, description, app?}`. Each becomes a `ServiceAccount` entity with
    /// attributes `owner` (a `Human`), `ai`, `registered = true`, `app` (default: the id up to its
    /// first dot), `description`, and the named `Group`s as parents.
    ///
    /// # Errors
    /// [`RequestError`] on `service_accounts[i].<field>`; nothing is registered.
    pub fn register_service_accounts(&self, records: &Value) -> Result<usize, RequestError> {
        let arr = records.as_array().ok_or_else(|| {
            RequestError::new(
                "service_accounts",
                "expected an array of service-account records",
            )
        })?;
        self.update(|s| {
            let b = &s.bundle;
            let sa_ty = b.type_named("ServiceAccount");
            let human_ty = b.type_named("Human");
            let group_ty = b.type_named("Group");
            let (Some(sa_ty), Some(human_ty), Some(group_ty)) = (sa_ty, human_ty, group_ty) else {
                return Err(RequestError::new("service_accounts", "invalid built-in type names"));
            };
            let mut out = Vec::with_capacity(arr.len());
            for (i, r) in arr.iter().enumerate() {
                let f = |k: &str| format!("service_accounts[{i}].{k}");
                let obj = r.as_object().ok_or_else(|| {
                    RequestError::new(format!("service_accounts[{i}]"), "expected an object")
                })?;
                for k in obj.keys() {
                    if !["id", "owner", "ai", "groups", "description", "app"].contains(&k.as_str())
                    {
                        return Err(RequestError::new(f(k), format!("unknown field `{k}`")));
                    }
                }
                let id = obj
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("id"), "expected a non-empty string"))?;
                let owner = obj
                    .get("owner")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("owner"), "expected a user name"))?;
                let ai = match obj.get("ai") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(o) => {
                        return Err(RequestError::new(f("ai"), format!("expected a boolean, got {}", kind(o))))
                    }
                };
                let groups: Vec<&str> = match obj.get("groups") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(gs)) => gs
                        .iter()
                        .map(|g| {
                            g.as_str().ok_or_else(|| {
                                RequestError::new(f("groups"), "expected an array of group names")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(RequestError::new(f("groups"), "expected an array of group names"))
                    }
                };
                let description = match obj.get("description") {
                    None | Some(Value::Null) => "",
                    Some(Value::String(d)) => d.as_str(),
                    Some(o) => {
                        return Err(RequestError::new(f("description"), format!("expected a string, got {}", kind(o))))
                    }
                };
                let app = match obj.get("app") {
                    Some(Value::String(a)) => a.clone(),
                    None | Some(Value::Null) => id.split('.').next().unwrap_or(id).to_owned(),
                    Some(o) => {
                        return Err(RequestError::new(f("app"), format!("expected a string, got {}", kind(o))))
                    }
                };
                let entity = json!({
                    "uid": {"type": sa_ty.to_string(), "id": id},
                    "attrs": {
                        "owner": {"__entity": {"type": human_ty.to_string(), "id": owner}},
                        "ai": ai,
                        "registered": true,
                        "app": app,
                        "description": description,
                    },
                    "parents": groups.iter().map(|g| json!({"type": group_ty.to_string(), "id": g})).collect::<Vec<_>>(),
                });
                let e = Entity::from_json_value(entity, None)
                    .map_err(|e| RequestError::new(format!("service_accounts[{i}]"), chain(&e)))?;
                out.push(StoredEntity::from_entity(e));
            }
            let n = out.len();
            let mut changed = Vec::with_capacity(n);
            for se in out {
                changed.push(se.entity.uid());
                s.store.entities.insert(se.entity.uid(), Arc::new(se));
            }
            s.refresh_hierarchy(&changed, "service_accounts")?;
            s.principals_version += 1;
            Ok(n)
        })
    }

    /// Retires service accounts by id: they are removed from the store, so every later check
    /// they make is denied with `svc:unregistered` (docs/architecture.md#built-in-denials).
    /// Returns how many were present.
    pub fn unregister_service_accounts(&self, ids: &[String]) -> usize {
        self.update::<usize, ()>(|s| {
            let Some(sa_ty) = s.bundle.type_named("ServiceAccount") else {
                return Ok(0);
            };
            let mut n = 0;
            let mut changed = Vec::new();
            for id in ids {
                let uid = EntityUid::from_type_name_and_id(
                    sa_ty.clone(),
                    cedar_policy::EntityId::new(id),
                );
                if s.store.entities.remove(&uid).is_some() {
                    changed.push(uid);
                    n += 1;
                }
            }
            // Removing an entity cannot close a cycle.
            let _ = s.refresh_hierarchy(&changed, "ids");
            s.principals_version += 1;
            Ok(n)
        })
        .unwrap_or(0)
    }

    /// Inserts or replaces work items: `{id, status: "open"|"closed", links: [uid], attrs?}`.
    ///
    /// # Errors
    /// [`RequestError`] on `work_items[i].<field>`; nothing is stored.
    pub fn upsert_work_items(&self, items: &Value) -> Result<usize, RequestError> {
        let arr = items
            .as_array()
            .ok_or_else(|| RequestError::new("work_items", "expected an array of work items"))?;
        self.update(|s| {
            let Some(wi_ty) = s.bundle.type_named("WorkItem") else {
                return Err(RequestError::new("work_items", "invalid built-in type name"));
            };
            let mut out = Vec::with_capacity(arr.len());
            for (i, r) in arr.iter().enumerate() {
                let f = |k: &str| format!("work_items[{i}].{k}");
                let obj = r.as_object().ok_or_else(|| {
                    RequestError::new(format!("work_items[{i}]"), "expected an object")
                })?;
                for k in obj.keys() {
                    if !["id", "status", "links", "attrs"].contains(&k.as_str()) {
                        return Err(RequestError::new(f(k), format!("unknown field `{k}`")));
                    }
                }
                let id = obj
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("id"), "expected a non-empty string"))?;
                let open = match obj.get("status").and_then(Value::as_str) {
                    Some("open") | None => true,
                    Some("closed") => false,
                    Some(o) => {
                        return Err(RequestError::new(
                            f("status"),
                            format!("unknown status `{o}`: expected `open` or `closed`"),
                        ))
                    }
                };
                let links: HashSet<EntityUid> = match obj.get("links") {
                    None => HashSet::new(),
                    Some(l) => parse_uid_list(l, &f("links"))?.into_iter().collect(),
                };
                let attrs = obj.get("attrs").cloned().unwrap_or_else(|| json!({}));
                if !attrs.is_object() {
                    return Err(RequestError::new(f("attrs"), "expected an object"));
                }
                let entity = Entity::from_json_value(
                    json!({"uid": {"type": wi_ty.to_string(), "id": id}, "attrs": attrs, "parents": []}),
                    None,
                )
                .map_err(|e| RequestError::new(f("attrs"), chain(&e)))?;
                // A work item has no parents, so it is its own closure.
                let se = StoredEntity::from_entity(entity);
                let closed = Arc::new(ClosedEntity::of(se.entity.as_ref().clone()));
                out.push(WorkItem {
                    id: id.to_owned(),
                    open,
                    links,
                    entity: Arc::new(se),
                    closed,
                });
            }
            let n = out.len();
            for w in out {
                s.store.work_items.insert(w.id.clone(), Arc::new(w));
            }
            s.resources_version += 1;
            Ok(n)
        })
    }

    /// Removes work items by id; returns how many were present.
    pub fn remove_work_items(&self, ids: &[String]) -> usize {
        self.update::<usize, ()>(|s| {
            let n = ids
                .iter()
                .filter(|id| s.store.work_items.remove(id.as_str()).is_some())
                .count();
            s.resources_version += 1;
            Ok(n)
        })
        .unwrap_or(0)
    }

    /// Replaces the containment list (the containment feed's snapshot).
    ///
    /// # Errors
    /// [`RequestError`] on `contained[i]` for a malformed reference; the list is unchanged.
    pub fn set_containments(&self, uids: &Value) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "contained")?;
        self.update(|s| {
            s.store.contained = uids.into_iter().collect();
            s.principals_version += 1;
            Ok(s.store.contained.len())
        })
    }

    /// Contains (`contained = true`) or lifts (`false`) principals (the feed's deltas).
    ///
    /// # Errors
    /// [`RequestError`] on `principals[i]` for a malformed reference; nothing changes.
    pub fn set_contained(&self, uids: &Value, contained: bool) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "principals")?;
        self.update(|s| {
            for u in uids {
                if contained {
                    s.store.contained.insert(u);
                } else {
                    s.store.contained.remove(&u);
                }
            }
            s.principals_version += 1;
            Ok(s.store.contained.len())
        })
    }

    /// Sets reasoner risk scores: `[{principal: uid, score: 0..=100}]`. With `replace`, scores
    /// not listed are dropped.
    ///
    /// # Errors
    /// [`RequestError`] on `scores[i].<field>` for a malformed entry or a score outside 0..=100.
    pub fn set_risk_scores(&self, scores: &Value, replace: bool) -> Result<usize, RequestError> {
        let arr = scores.as_array().ok_or_else(|| {
            RequestError::new("scores", "expected an array of {principal, score}")
        })?;
        let mut parsed = Vec::with_capacity(arr.len());
        for (i, e) in arr.iter().enumerate() {
            let p = parse_uid(
                e.get("principal").unwrap_or(&Value::Null),
                &format!("scores[{i}].principal"),
            )?;
            let score = e
                .get("score")
                .and_then(Value::as_i64)
                .filter(|s| (0..=100).contains(s))
                .ok_or_else(|| {
                    RequestError::new(format!("scores[{i}].score"), "expected an integer 0..=100")
                })?;
            parsed.push((p, score));
        }
        self.update(|s| {
            if replace {
                s.store.risk = crate::store::Layered::default();
            }
            for (p, score) in parsed {
                s.store.risk.insert(p, score);
            }
            s.principals_version += 1;
            Ok(s.store.risk.len())
        })
    }

    /// Decides a request given as the JSON of `POST /v1/access/evaluation`.
    ///
    /// # Errors
    /// [`RequestError`] naming the field at fault (see [`Engine::decide`]).
    pub fn decide_json(&self, value: &Value) -> Result<Decision, RequestError> {
        self.decide(&CheckRequest::from_json(value)?)
    }

    /// [`Engine::decide_json`] on an owned request value (nothing of it is copied).
    ///
    /// # Errors
    /// As [`Engine::decide_json`].
    pub fn decide_value(&self, value: Value) -> Result<Decision, RequestError> {
        self.decide(&CheckRequest::from_value(value)?)
    }

    /// A [`Prefetcher`] over the current snapshot.
    pub fn prefetcher(&self) -> Prefetcher {
        Prefetcher {
            st: self.state.load(),
        }
    }

    /// The key [`Prefetcher::prefetch`] takes for `uid`: a 64-bit hash of it, the same for the
    /// life of the process.
    #[must_use]
    pub fn prefetch_key(uid: &EntityUid) -> u64 {
        crate::store::uid_hash(uid.as_ref())
    }

    /// The [`Engine::prefetch_key`]s of what a check of `req` looks up first: its principal,
    /// its resource and, when set, its `on_behalf_of` person.
    pub fn prefetch_keys(req: &CheckRequest) -> impl Iterator<Item = u64> + '_ {
        [&req.principal, &req.resource]
            .into_iter()
            .chain(req.on_behalf_of.as_ref())
            .map(Self::prefetch_key)
    }

    /// Decides one check (docs/decisions.md).
    ///
    /// ```
    /// use pdp_core::{Bundle, BundleSources};
    ///
    /// let bundle = Bundle::from_sources(&BundleSources {
    ///     policies: vec![(
    ///         "docs.cedar".into(),
    ///         r#"@id("owners-read") permit (principal, action == Action::"read", resource is Doc)
    ///            when { resource.owner == principal };"#
    ///             .into(),
    ///     )],
    ///     schema: Some((
    ///         "docs.cedarschema".into(),
    ///         "entity Human; entity Doc = { owner: Human };
    ///          action read appliesTo { principal: [Human], resource: [Doc] };"
    ///             .into(),
    ///     )),
    ///     entities: Some((
    ///         "entities.json".into(),
    ///         r#"[{"uid": {"type": "Human", "id": "ann"}, "attrs": {}, "parents": []},
    ///             {"uid": {"type": "Doc", "id": "d1"},
    ///              "attrs": {"owner": {"__entity": {"type": "Human", "id": "ann"}}}, "parents": []}]"#
    ///             .into(),
    ///     )),
    ///     links: None,
    /// })?;
    /// use pdp_core::{CheckRequest, Engine, Verdict};
    ///
    /// let engine = Engine::new(bundle);
    /// let req = CheckRequest::from_value(serde_json::json!({
    ///     "principal": {"type": "Human", "id": "ann"},
    ///     "action": "read",
    ///     "resource": {"type": "Doc", "id": "d1"},
    /// }))?;
    /// let d = engine.decide(&req)?;
    /// assert_eq!(d.verdict, Verdict::Allow);
    /// assert_eq!(d.principal_outcome.policies, ["owners-read"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`RequestError`] when the action is unknown or ambiguous, an entity type is not declared,
    /// `on_behalf_of` is used by a non-`ServiceAccount` or names a non-`Human`, an inline entity
    /// is malformed, or the context or principal/resource types do not match the schema for the
    /// action.
    pub fn decide(&self, req: &CheckRequest) -> Result<Decision, RequestError> {
        let t0 = Instant::now();
        let st = self.state.load();
        let b = &*st.bundle;
        let action = b.resolve_action(&req.action)?;
        // Types the action is known to take are declared ones; only others need looking up.
        // Once the principal's policies for these types are built, they carry the answer.
        let (p_type, r_type) = (req.principal.type_name(), req.resource.type_name());
        let scoped = b.scopes.cached(&action, p_type, r_type);
        let types_valid = scoped.as_ref().map_or_else(
            || b.lookups.types_valid(&action, p_type, r_type),
            |s| s.types_valid,
        );
        if !types_valid {
            b.check_type(p_type, "principal.type")?;
            b.check_type(r_type, "resource.type")?;
        }
        check_on_behalf_of(b, &req.principal, req.on_behalf_of.as_ref())?;

        let (inline, inline_ignored) = inline_entities(&st, req)?;
        let work_item = req
            .work_item_id
            .as_ref()
            .and_then(|id| st.store.work_items.get(id.as_str()))
            .filter(|w| w.open)
            .cloned();
        let assigned = work_item
            .as_ref()
            .is_some_and(|w| w.links.contains(&req.resource));

        let cx = CheckCtx {
            st: &st,
            req,
            action: &action,
            inline: &inline,
            work_item: work_item.as_deref(),
            assigned,
            scoped,
        };
        let mut p_out = self.check_one(&cx, &req.principal, None, "principal")?;
        let mut obo_out = match &req.on_behalf_of {
            Some(o) => Some(self.check_one(&cx, o, Some(&req.principal), "on_behalf_of")?),
            None => None,
        };
        if !req.human_present {
            absent_human(&mut p_out);
            if let Some(o) = obo_out.as_mut() {
                absent_human(o);
            }
        }
        let verdict = obo_out
            .as_ref()
            .map_or(p_out.verdict, |o| o.verdict.max(p_out.verdict));
        let challenges = if verdict == Verdict::Challenge {
            let mut all: Vec<String> = p_out.challenges.clone();
            if let Some(o) = &obo_out {
                all.extend(o.challenges.iter().cloned());
            }
            all.sort();
            all.dedup();
            all
        } else {
            Vec::new()
        };
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Ok(Decision {
            qid: uuid::Uuid::now_v7().to_string(),
            at_ms,
            principal: req.principal.clone(),
            on_behalf_of: req.on_behalf_of.clone(),
            action,
            resource: req.resource.clone(),
            verdict,
            challenges,
            principal_outcome: p_out,
            on_behalf_of_outcome: obo_out,
            mode: st.mode,
            work_item: req.work_item_id.clone(),
            assigned,
            risk_score: st.store.risk(&req.principal),
            policy_version: st.policy_version,
            principals_version: st.principals_version,
            latency_us: elapsed_us(t0),
            not_in_directory: std::iter::once(&req.principal)
                .chain(req.on_behalf_of.as_ref())
                // The closed table holds every store and bundle entity, and its slots for
                // these two were just read by the check: no extra cold lookup.
                .filter(|u| st.hierarchy.get(u).is_none())
                .cloned()
                .collect(),
            inline_ignored,
        })
    }

    /// Sets how long a plan may be paged with (`max_age_secs`, docs/plans.md; default 300) and how
    /// many plans are kept for paging (default 10,000; least recently used go first).
    pub fn configure_plans(&self, max_age_secs: u64, capacity: usize) {
        self.plan_max_age_secs
            .store(max_age_secs, Ordering::Relaxed);
        self.plans.resize(capacity);
    }

    /// Number of plans held for paging.
    pub fn plans_cached(&self) -> usize {
        self.plans.len()
    }

    /// Plans a request given as the JSON of `POST /v1/access/plan`.
    ///
    /// # Errors
    /// [`RequestError`] naming the field at fault (see [`Engine::plan`]).
    pub fn plan_json(&self, value: &Value) -> Result<QueryPlan, RequestError> {
        self.plan(&PlanRequest::from_json(value)?)
    }

    /// [`Engine::plan_json`] on an owned request value (nothing of it is copied).
    ///
    /// # Errors
    /// As [`Engine::plan_json`].
    pub fn plan_value(&self, value: Value) -> Result<QueryPlan, RequestError> {
        self.plan(&PlanRequest::from_value(value)?)
    }

    /// Builds the query plan (docs/plans.md): which rows of `resource_type` the
    /// principal (and the person it acts for) may see, as a filter over the rows' attributes,
    /// from Cedar's type-aware partial evaluation with the resource unknown. A request whose
    /// `plan_qid` names a recent plan for the same question gets that plan back with `pinned`
    /// when it is younger than `max_age_secs`, no principal is contained, and neither the
    /// policies nor the principals changed.
    ///
    /// ```
    /// use pdp_core::{Bundle, BundleSources};
    ///
    /// let bundle = Bundle::from_sources(&BundleSources {
    ///     policies: vec![(
    ///         "docs.cedar".into(),
    ///         r#"@id("owners-read") permit (principal, action == Action::"read", resource is Doc)
    ///            when { resource.owner == principal };"#
    ///             .into(),
    ///     )],
    ///     schema: Some((
    ///         "docs.cedarschema".into(),
    ///         "entity Human; entity Doc = { owner: Human };
    ///          action read appliesTo { principal: [Human], resource: [Doc] };"
    ///             .into(),
    ///     )),
    ///     entities: Some((
    ///         "entities.json".into(),
    ///         r#"[{"uid": {"type": "Human", "id": "ann"}, "attrs": {}, "parents": []},
    ///             {"uid": {"type": "Doc", "id": "d1"},
    ///              "attrs": {"owner": {"__entity": {"type": "Human", "id": "ann"}}}, "parents": []}]"#
    ///             .into(),
    ///     )),
    ///     links: None,
    /// })?;
    /// use pdp_core::{Engine, PlanOutcome, PlanRequest};
    ///
    /// let engine = Engine::new(bundle);
    /// let req = PlanRequest::from_value(serde_json::json!({
    ///     "principal": {"type": "Human", "id": "ann"},
    ///     "action": "read",
    ///     "resource_type": "Doc",
    /// }))?;
    /// let plan = engine.plan(&req)?;
    /// // Ann may read the rows whose `owner` is Ann: a filter the app turns into SQL.
    /// assert_eq!(plan.outcome, PlanOutcome::Conditional);
    /// assert_eq!(plan.filter.map(|f| f.attributes()), Some(vec!["owner".to_owned()]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`RequestError`] when the bundle has no schema (partial evaluation is type-aware), the
    /// action or resource type is unknown or ambiguous, the action does not apply to the type,
    /// `on_behalf_of` is misused (as in [`Engine::decide`]), or the context does not match the
    /// schema.
    pub fn plan(&self, req: &PlanRequest) -> Result<QueryPlan, RequestError> {
        let t0 = Instant::now();
        let st = self.state.load();
        let b = &*st.bundle;
        // A bundle has attribute kinds exactly when it has a schema.
        let (Some(schema), Some(kinds)) = (b.schema.as_ref(), b.attr_kinds.as_deref()) else {
            return Err(RequestError::new(
                "resource_type",
                "query plans need a bundle with a schema (Cedar's partial evaluation is type-aware)",
            ));
        };
        let action = b.resolve_action(&req.action)?;
        let resource_type = b.resolve_type(&req.resource_type, "resource_type")?;
        b.check_type(req.principal.type_name(), "principal.type")?;
        check_on_behalf_of(b, &req.principal, req.on_behalf_of.as_ref())?;

        let mut subjects: Vec<(&EntityUid, Option<&EntityUid>, &str)> =
            vec![(&req.principal, None, "principal")];
        if let Some(o) = &req.on_behalf_of {
            subjects.push((o, Some(&req.principal), "on_behalf_of"));
        }
        let states: Vec<PrincipalState> = subjects
            .iter()
            .map(|(u, _, _)| PrincipalState {
                entity: st.hierarchy.get(u).map(|c| Arc::clone(c.entity())),
                risk: st.store.risk(u),
            })
            .collect();
        let key = PlanKey {
            principal: req.principal.clone(),
            on_behalf_of: req.on_behalf_of.clone(),
            action: action.clone(),
            resource_type: resource_type.clone(),
            context: req.context.clone(),
        };
        let max_age = self.plan_max_age_secs.load(Ordering::Relaxed);
        let contained = subjects.iter().any(|(u, _, _)| st.store.is_contained(u));
        if let (Some(qid), false) = (&req.plan_qid, contained) {
            if let Some(mut p) = self.plans.pinned(
                qid,
                &key,
                st.policy_version,
                &states,
                std::time::Duration::from_secs(max_age),
            ) {
                p.mode = st.mode;
                p.latency_us = elapsed_us(t0);
                return Ok(p);
            }
        }

        let mut sides = Vec::with_capacity(subjects.len());
        for (subject, agent, field) in &subjects {
            sides.push(self.plan_side(
                &st,
                req,
                subject,
                *agent,
                field,
                &action,
                &resource_type,
                (schema, kinds),
            )?);
        }
        let done = finish(sides);
        let id = uuid::Uuid::now_v7();
        let plan = QueryPlan {
            qid: id.to_string(),
            outcome: done.outcome,
            filter: done.filter,
            challenges: done.challenges,
            challenge_could_widen: done.challenge_could_widen,
            policies: done.policies,
            mode: st.mode,
            policy_version: st.policy_version,
            principals_version: st.principals_version,
            max_age_secs: max_age,
            pinned: false,
            principal: req.principal.clone(),
            on_behalf_of: req.on_behalf_of.clone(),
            action,
            resource_type,
            latency_us: elapsed_us(t0),
        };
        self.plans.insert(id.as_u128(), &plan, key, states);
        Ok(plan)
    }

    /// The filters of one principal of a plan (see [`crate::plan_outcome`]).
    #[allow(clippy::too_many_arguments)]
    fn plan_side(
        &self,
        st: &State,
        req: &PlanRequest,
        subject: &EntityUid,
        agent: Option<&EntityUid>,
        field: &str,
        action: &EntityUid,
        resource_type: &cedar_policy::EntityTypeName,
        (schema, kinds): (&cedar_policy::Schema, &crate::residual_filter::AttrKinds),
    ) -> Result<Side, RequestError> {
        let b = &*st.bundle;
        if st.store.is_contained(subject) {
            return Ok(Side::denied(REASON_CONTAINED));
        }
        if subject.type_name().basename() == "ServiceAccount" && !is_registered(st, subject) {
            return Ok(Side::denied(REASON_UNREGISTERED));
        }
        // No resource, so no work-item assignment: `assigned` is false for every row (a plan
        // never shows rows only an assignment would).
        let context = context_for(st, action, subject, agent, &req.context, true, false, None)?;
        let mut roots: Vec<(&EntityUid, &Follow)> =
            vec![(subject, &FOLLOW_ALL), (action, &FOLLOW_NONE)];
        if let Some(a) = agent {
            roots.push((a, &FOLLOW_ALL));
        }
        // The slice, converted for partial evaluation once per distinct slice (crate::memo).
        let slice = || {
            b.plan_entities.get_or_build(
                entities_of(&closed_list(st, &roots, None, &FOLLOW_ALL, true)),
                |list| {
                    let entities = Hierarchy::slice(list)?;
                    let partial = partial_entities(&entities, schema);
                    Ok::<_, RequestError>((entities, partial))
                },
            )
        };
        let compute = |known: &crate::memo::PlanEntities| {
            // Only the policies whose scope can match; the others leave no residual.
            let scoped = b.scoped(action, subject.type_name(), resource_type);
            let res = residuals_with(
                scoped.policies.as_ref().unwrap_or(&b.policies),
                schema,
                kinds,
                subject,
                action,
                context.context.clone(),
                resource_type,
                &known.entities,
                &known.partial,
            )
            .map_err(|e| plan_error(&e, field))?;
            Ok(Side::from_residuals(res, &b.meta))
        };
        if self.plan_memo.load(Ordering::Relaxed) {
            // The side is a pure function of its inputs; it is memoised by them (crate::memo).
            let question = crate::memo::SideQuestion {
                versions: (st.principals_version, st.resources_version),
                context: &context,
                principal: subject,
                agent,
                action,
                resource_type,
            };
            b.plan_sides.get_or_compute(&question, slice, compute)
        } else {
            compute(&*slice()?)
        }
    }

    /// Turns the memo of plan sides on (the default) or off. With it on, a plan whose
    /// principal, action, resource type, context, principal's entities and bundle are those of
    /// an earlier plan reuses that plan's filters (never its qid); off, every plan runs partial
    /// evaluation (for measuring that path).
    pub fn set_plan_memo(&self, on: bool) {
        self.plan_memo.store(on, Ordering::Relaxed);
    }

    /// Turns slice pruning on (the default) or off. On, a check's entity slice holds, of the
    /// entities the roots' attributes reference, only those in attributes some policy that can
    /// apply looks into ([`crate::scope::Derefs`]); off, all of them (the one-hop slice in
    /// full). Decisions are the same either way; off exists to test and measure that.
    pub fn set_slice_pruning(&self, on: bool) {
        self.slice_pruning.store(on, Ordering::Relaxed);
    }

    /// Checks one principal (`subject`); `agent` is the acting service account on a person's
    /// check.
    fn check_one(
        &self,
        cx: &CheckCtx<'_>,
        subject: &EntityUid,
        agent: Option<&EntityUid>,
        field: &str,
    ) -> Result<Outcome, RequestError> {
        let st = cx.st;
        let b = &*st.bundle;
        if st.store.is_contained(subject) {
            return Ok(Outcome::builtin(REASON_CONTAINED));
        }
        if subject.type_name().basename() == "ServiceAccount" && !is_registered(st, subject) {
            return Ok(Outcome::builtin(REASON_UNREGISTERED));
        }

        let context = context_for(
            st,
            cx.action,
            subject,
            agent,
            &cx.req.context,
            cx.req.human_present,
            cx.assigned,
            cx.work_item,
        )?;
        // Cedar validates a request against the schema: the principal and resource types for
        // the action, and the context. The context part depends on the context and action
        // only, so once a request with this very context passed, a request whose types the
        // action is known to take cannot fail validation and is not validated again. Anything
        // else is validated in full, so every error stays Cedar's. A request that needs no
        // validation is built for Cedar only if a condition is left to Cedar's interpreter.
        // Only the policies whose scope can match: the same satisfied set (crate::scope),
        // evaluated from their compiled conditions, over the slice they can look into.
        let scoped = match (&cx.scoped, agent) {
            (Some(s), None) => Arc::clone(s),
            _ => b.scoped(cx.action, subject.type_name(), cx.req.resource.type_name()),
        };
        let known_valid = b.schema.is_some() && context.validated() && scoped.types_valid;
        let mut request: Option<cedar_policy_core::ast::Request> = if known_valid {
            None
        } else {
            let schema = b.schema.as_ref();
            let r = Request::new(
                subject.clone(),
                cx.action.clone(),
                cx.req.resource.clone(),
                context.context.clone(),
                schema,
            )
            .map_err(|e| request_error(&e, field))?;
            if schema.is_some() {
                context.set_validated();
            }
            Some(r.as_ref().clone())
        };

        let derefs = if self.slice_pruning.load(Ordering::Relaxed) {
            &scoped.derefs
        } else {
            &DEREFS_ALL
        };
        let slice = gather(cx, subject, agent, derefs)?;
        let env = crate::condition::Env::new(
            subject.as_ref(),
            cx.action.as_ref(),
            cx.req.resource.as_ref(),
            context.context.as_ref(),
            slice.view(),
        );
        // Cedar's side of the check, built on first use: the slice as Cedar `Entities` and an
        // evaluator over the request.
        let built: OnceCell<Entities> = OnceCell::new();
        let eval: OnceCell<Evaluator<'_>> = OnceCell::new();
        let cedar = |cond: &cedar_policy_core::ast::Expr,
                     slots: &cedar_policy_core::ast::SlotEnv|
         -> Result<bool, RequestError> {
            let ev = match eval.get() {
                Some(ev) => ev,
                None => {
                    // `eval` is set below, so this runs until it first succeeds, and `built`
                    // only holds what `eval` borrows.
                    let entities = match &slice {
                        Slice::Built(e) => e,
                        Slice::Closed(list) => {
                            let e = Hierarchy::slice(entities_of(list))?;
                            built.get_or_init(|| e)
                        }
                    };
                    let request = request.take().unwrap_or_else(|| {
                        // What Cedar's `Request::new` builds after validating, built directly.
                        let known = |u: &EntityUid| EntityUIDEntry::known(u.as_ref().clone(), None);
                        cedar_policy_core::ast::Request::new_unchecked(
                            known(subject),
                            known(cx.action),
                            known(&cx.req.resource),
                            Some(context.context.as_ref().clone()),
                        )
                    });
                    eval.get_or_init(|| {
                        Evaluator::new(request, entities.as_ref(), Extensions::all_available())
                    })
                }
            };
            Ok(ev
                .interpret(cond, slots)
                .is_ok_and(|v| crate::condition::is_true(&v)))
        };
        let satisfied = scoped.satisfied(&env, cedar)?;
        Ok(classify(b, satisfied.into_iter()))
    }
}

/// The context of one principal's check or plan: the caller's, with the decision point's own
/// fields on top (the reasoner's `risk_score`, `human_present`, `assigned`, `work_item`, `agent`;
/// docs/decisions.md#context-the-decision-point-fills-in), each only where the schema declares it
/// for `action`, typed against the schema.
///
/// The typed context is memoised per bundle ([`crate::memo::ContextMemo`]).
///
/// # Errors
/// [`RequestError`] on `context` when the result does not match the action's context type.
#[allow(clippy::too_many_arguments)]
fn context_for(
    st: &State,
    action: &EntityUid,
    subject: &EntityUid,
    agent: Option<&EntityUid>,
    caller: &Map<String, Value>,
    human_present: bool,
    assigned: bool,
    work_item: Option<&WorkItem>,
) -> Result<Arc<MemoContext>, RequestError> {
    let b = &*st.bundle;
    let takes = match (b.schema.is_some(), b.injected.get(action)) {
        (false, _) => Declared::ALL,
        (true, Some(d)) => *d,
        (true, None) => Declared::NONE,
    };
    let work_item = work_item
        .filter(|_| takes.work_item)
        .map(|w| w.entity.entity.uid());
    let inj = Injected {
        risk_score: st.store.risk(subject).filter(|_| takes.risk_score),
        human_present: takes.human_present.then_some(human_present),
        assigned: takes.assigned.then_some(assigned),
        work_item: work_item.as_ref(),
        agent: agent.filter(|_| takes.agent),
    };
    b.contexts.get_or_parse(action, caller, &inj, |v| {
        Context::from_json_value(v, b.schema.as_ref().map(|s| (s, action)))
            .map_err(|e| RequestError::new("context", chain(&e)))
    })
}

struct CheckCtx<'a> {
    st: &'a State,
    req: &'a CheckRequest,
    action: &'a EntityUid,
    inline: &'a Inline,
    work_item: Option<&'a WorkItem>,
    assigned: bool,
    /// The principal's policies for the request's action and types ([`crate::scope::Scoped`]),
    /// when they were already built.
    scoped: Option<Arc<crate::scope::Scoped>>,
}

fn elapsed_us(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// `on_behalf_of` rules (docs/decisions.md#an-agent-acting-for-a-person): only a `ServiceAccount`
/// acts for someone, and only for a `Human` the schema declares.
fn check_on_behalf_of(
    b: &Bundle,
    principal: &EntityUid,
    obo: Option<&EntityUid>,
) -> Result<(), RequestError> {
    let Some(obo) = obo else { return Ok(()) };
    if principal.type_name().basename() != "ServiceAccount" {
        return Err(RequestError::new(
            "on_behalf_of",
            format!(
                "only a `ServiceAccount` acts on behalf of a person; the principal is a `{}`",
                principal.type_name()
            ),
        ));
    }
    if obo.type_name().basename() != "Human" {
        return Err(RequestError::new(
            "on_behalf_of.type",
            format!("expected a `Human`, got `{}`", obo.type_name()),
        ));
    }
    b.check_type(obo.type_name(), "on_behalf_of.type")
}

/// Maps a planning error to the request field at fault (`field` is the principal's).
fn plan_error(e: &PlanError, field: &str) -> RequestError {
    let f = match e {
        PlanError::UnknownResourceType(_) | PlanError::ActionNotForResourceType { .. } => {
            "resource_type".to_owned()
        }
        PlanError::UnknownAction(_) => "action".to_owned(),
        PlanError::ActionNotForPrincipalType { .. } => format!("{field}.type"),
        PlanError::InvalidRequest(_) => "context".to_owned(),
        PlanError::Evaluation(_) => "request".to_owned(),
    };
    RequestError::new(f, e.to_string())
}

fn request_error(e: &RequestValidationError, field: &str) -> RequestError {
    let f =
        match e {
            RequestValidationError::UndeclaredPrincipalType(_)
            | RequestValidationError::InvalidPrincipalType(_) => format!("{field}.type"),
            RequestValidationError::UndeclaredResourceType(_)
            | RequestValidationError::InvalidResourceType(_) => "resource.type".to_owned(),
            RequestValidationError::InvalidContext(_)
            | RequestValidationError::TypeOfContext(_) => "context".to_owned(),
            RequestValidationError::UndeclaredAction(_)
            | RequestValidationError::ExternalAction(_) => "action".to_owned(),
            _ => "request".to_owned(),
        };
    RequestError::new(f, chain(e))
}

/// A check's inline entities that are taken, by uid.
type Inline = crate::maps::Inline<StoredEntity>;

/// The inline entities of a check that are taken, keyed by uid, and the uids of those that
/// are ignored (docs/decisions.md, "Inline entities").
///
/// Inline entities describe, for one check, entities the directory and the store do not hold
/// (an app's own rows). They never outrank the directory: an inline entity of a directory type
/// (`Human`, `ServiceAccount`, `Group`) is ignored, so a principal's attributes and groups come
/// only from the directory; and an inline entity the store or bundle holds is ignored, so its
/// stored attributes and parents stand. Ignored entities are named in the decision record.
///
/// # Errors
/// [`RequestError`] on `entities` when there are more than [`limits::max_inline_entities`], and
/// on `entities[i]` when an entity is malformed, of an undeclared type, a duplicate, or the
/// start of a parent chain deeper than [`limits::max_entity_depth`].
fn inline_entities(
    st: &State,
    req: &CheckRequest,
) -> Result<(Inline, Vec<EntityUid>), RequestError> {
    let mut inline = Inline::new();
    let mut ignored = Vec::new();
    if req.entities.is_empty() {
        return Ok((inline, ignored));
    }
    let max = limits::max_inline_entities();
    if req.entities.len() > max {
        return Err(RequestError::new(
            "entities",
            format!(
                "{} inline entities: at most {max} are taken (limit `max_inline_entities` = {max})",
                req.entities.len()
            ),
        ));
    }
    let b = &*st.bundle;
    let mut order = Vec::with_capacity(req.entities.len());
    let ignore = |uid: &EntityUid| b.is_directory_type(uid.type_name()) || st.entity(uid).is_some();
    for (i, v) in req.entities.iter().enumerate() {
        let f = format!("entities[{i}]");
        // An entity that is ignored is not parsed further: what it says does not matter.
        if let Some(uid) = v.get("uid").and_then(|u| parse_uid(u, "uid").ok()) {
            if ignore(&uid) {
                ignored.push(uid);
                continue;
            }
        }
        let se = StoredEntity::from_json(v.clone(), b.schema(), &b.entity_types, &f)?;
        let uid = se.entity.uid();
        b.check_type(uid.type_name(), &format!("{f}.uid.type"))?;
        check_entity_ids(&se, &f)?;
        if ignore(&uid) {
            ignored.push(uid);
            continue;
        }
        if inline.insert(uid.clone(), Arc::new(se)).is_some() {
            return Err(RequestError::new(f, format!("duplicate entity `{uid}`")));
        }
        order.push((i, uid));
    }
    // Cedar closes this check's hierarchy itself, recursing once per level: bound the chains
    // that start at an inline entity (stored ones were bounded when they were stored).
    let mut depth = DepthCheck::new(limits::max_entity_depth(), |u: &EntityUid| {
        inline
            .get(u)
            .map(|e| e.parents.as_slice())
            .or_else(|| st.entity(u).map(|e| e.parents.as_slice()))
    });
    for (i, uid) in &order {
        if let Some(se) = inline.get(uid) {
            depth
                .depth(uid, &se.parents)
                .map_err(|e| RequestError::new(format!("entities[{i}].parents"), e.to_string()))?;
        }
    }
    Ok((inline, ignored))
}

/// Refuses an entity whose id, or a parent's id, holds a control character
/// ([`check_identifier`]).
///
/// # Errors
/// [`RequestError`] on `<field>.uid.id` or `<field>.parents[j].id`.
fn check_entity_ids(se: &StoredEntity, field: &str) -> Result<(), RequestError> {
    check_identifier(se.entity.uid().id().unescaped(), &format!("{field}.uid.id"))?;
    for (j, p) in se.parents.iter().enumerate() {
        check_identifier(p.id().unescaped(), &format!("{field}.parents[{j}].id"))?;
    }
    Ok(())
}

fn lookup<'a>(cx: &'a CheckCtx<'_>, uid: &EntityUid) -> Option<&'a StoredEntity> {
    if let Some(e) = cx.inline.get(uid) {
        return Some(e);
    }
    if let Some(e) = cx.st.store.entities.get(uid) {
        return Some(e);
    }
    let b = &*cx.st.bundle;
    if let Some(e) = b.entities.get(uid) {
        return Some(e);
    }
    if let Some(w) = cx.work_item {
        if &w.entity.entity.uid() == uid {
            return Some(&w.entity);
        }
    }
    b.action_entities.get(uid).map(|e| &**e)
}

fn is_registered(st: &State, uid: &EntityUid) -> bool {
    let e = st
        .store
        .entities
        .get(uid)
        .or_else(|| st.bundle.entities.get(uid));
    match e {
        None => false,
        Some(e) => !matches!(
            e.entity.attr("registered"),
            Some(Ok(EvalResult::Bool(false)))
        ),
    }
}

/// Builds the entity slice a check can reach: the principal, resource, agent, action and work
/// item, the entities referenced by those of their attributes the policies may look into
/// (`derefs`, see [`crate::scope::Derefs`]; one hop), all with their ancestors unless no policy
/// can look an ancestor up ([`Derefs::ancestors`]; their uids stay in each entity's ancestor
/// set, which is all `in` reads), and every inline entity (with inline entities the slice keeps
/// every ancestor, because Cedar closes the hierarchy of that slice itself). Its size depends
/// on the request, not on the store.
///
/// # Errors
/// [`RequestError`] on `entities` when Cedar refuses the inline entities with the stored ones.
fn gather<'s>(
    cx: &CheckCtx<'s>,
    subject: &EntityUid,
    agent: Option<&EntityUid>,
    derefs: &Derefs,
) -> Result<Slice<'s>, RequestError> {
    if cx.inline.is_empty() {
        return Ok(gather_closed(cx, subject, agent, derefs));
    }
    let mut seen: HashSet<EntityUid> = HashSet::new();
    let mut out: Vec<Entity> = Vec::new();
    // (uid, the attribute references to follow)
    let mut stack: Vec<(EntityUid, &Follow)> = Vec::with_capacity(16);
    // Inline entities go to the bottom of the stack: a root that is also inline (the app's
    // fresher copy of the resource) must be reached as a root first, so that the entities its
    // attributes reference are followed.
    for uid in cx.inline.keys() {
        stack.push((uid.clone(), &FOLLOW_NONE));
    }
    stack.push((subject.clone(), &derefs.principal));
    stack.push((cx.req.resource.clone(), &derefs.resource));
    stack.push((cx.action.clone(), &FOLLOW_NONE));
    if let Some(a) = agent {
        stack.push((a.clone(), &derefs.agent));
    }
    if let Some(w) = cx.work_item {
        stack.push((w.entity.entity.uid(), &derefs.work_item));
    }
    while let Some((uid, follow)) = stack.pop() {
        if !seen.insert(uid.clone()) {
            continue;
        }
        let Some(se) = lookup(cx, &uid) else {
            continue;
        };
        out.push(se.entity.clone());
        for p in &se.parents {
            if !seen.contains(p) {
                stack.push((p.clone(), &FOLLOW_NONE));
            }
        }
        if follow.any() {
            for (attr, r) in &se.refs {
                if follow.takes(attr) && !seen.contains(r) {
                    stack.push((r.clone(), &FOLLOW_NONE));
                }
            }
        }
    }
    Entities::from_entities(out, None)
        .map(Slice::Built)
        .map_err(|e| RequestError::new("entities", chain(&e)))
}

/// A check's entity slice ([`gather`]), borrowing from the snapshot `'s`.
enum Slice<'s> {
    /// The snapshot's pre-closed entities, each once, borrowed: taking an `Arc` of each would
    /// write its reference count, an atomic read-modify-write on the record's first cache line,
    /// which for a principal not in the cache waits for the line and holds back the loads after
    /// it. Cedar `Entities` over them are built only if a condition is left to Cedar's
    /// interpreter ([`Hierarchy::slice`]).
    Closed(Vec<&'s ClosedEntity>),
    /// Entities Cedar built (a check with inline entities, whose hierarchy Cedar closes).
    Built(Entities),
}

impl Slice<'_> {
    /// The slice as compiled conditions read it ([`crate::condition`]).
    fn view(&self) -> crate::condition::Entities<'_> {
        match self {
            Self::Closed(list) => crate::condition::Entities::List(list),
            Self::Built(e) => crate::condition::Entities::Cedar(e.as_ref()),
        }
    }
}

/// [`gather`] without inline entities: the same slice, taken from the snapshot's pre-closed
/// entities ([`Hierarchy`]), borrowed, so nothing is copied and Cedar computes no closure.
fn gather_closed<'s>(
    cx: &CheckCtx<'s>,
    subject: &EntityUid,
    agent: Option<&EntityUid>,
    derefs: &Derefs,
) -> Slice<'s> {
    let mut roots: Vec<(&EntityUid, &Follow)> = Vec::with_capacity(4);
    roots.push((subject, &derefs.principal));
    roots.push((&cx.req.resource, &derefs.resource));
    if derefs.action {
        roots.push((cx.action, &FOLLOW_NONE));
    }
    if let Some(a) = agent {
        roots.push((a, &derefs.agent));
    }
    Slice::Closed(closed_list(
        cx.st,
        &roots,
        cx.work_item,
        &derefs.work_item,
        derefs.ancestors,
    ))
}

/// The pre-closed entities reachable from `roots` (each with the entities referenced by the
/// attributes its [`Follow`] takes) and from the work item (its references by
/// `work_item_follow`), each with its ancestors when `ancestors` (see [`Derefs::ancestors`]),
/// in a stable order (roots first, each followed by its ancestors and then by what its
/// attributes reference).
fn closed_list<'s>(
    st: &'s State,
    roots: &[(&EntityUid, &Follow)],
    work_item: Option<&'s WorkItem>,
    work_item_follow: &Follow,
    ancestors: bool,
) -> Vec<&'s ClosedEntity> {
    let h = &st.hierarchy;
    let mut out = SliceList::default();
    // Adds a closed entity and all its ancestors (already listed in its closure).
    let add = |out: &mut SliceList<'s>, e: &'s ClosedEntity| {
        if !out.push(e) || !ancestors {
            return;
        }
        for a in e.ancestors() {
            if let Some(ae) = h.get_core(a) {
                out.push(ae);
            }
        }
    };
    for &(uid, follow) in roots {
        if let Some(e) = h.get(uid) {
            add(&mut out, e);
        }
        if follow.any() {
            if let Some(se) = st.entity(uid) {
                for (attr, r) in &se.refs {
                    if follow.takes(attr) {
                        if let Some(e) = h.get(r) {
                            add(&mut out, e);
                        }
                    }
                }
            }
        }
    }
    if let Some(w) = work_item {
        // A work item's closed entity is its own copy, not the hierarchy's: matched by uid.
        if !out.has_uid(w.closed.uid()) {
            add(&mut out, &w.closed);
        }
        for (attr, r) in &w.entity.refs {
            if work_item_follow.takes(attr) {
                if let Some(e) = h.get(r) {
                    add(&mut out, e);
                }
            }
        }
    }
    out.list
}

/// Cedar's entities of a slice of closed entities, in the same order.
fn entities_of(list: &[&ClosedEntity]) -> Vec<Arc<cedar_policy_core::ast::Entity>> {
    list.iter().map(|c| Arc::clone(c.entity())).collect()
}

/// The entities of one slice, each once. Within a snapshot every uid has one closed entity
/// (one address), so entities are told apart by address: a scan while the list is short (a
/// check's usual slice is a handful), a set of addresses once it is not.
#[derive(Default)]
struct SliceList<'s> {
    list: Vec<&'s ClosedEntity>,
    index: Option<FastSet<usize>>,
}

impl<'s> SliceList<'s> {
    /// Longest list kept without an index.
    const SCAN: usize = 16;

    /// Whether an entity with this uid is listed (a scan: for the rare entity that is not the
    /// hierarchy's own).
    fn has_uid(&self, uid: &cedar_policy_core::ast::EntityUID) -> bool {
        self.list.iter().any(|x| x.uid() == uid)
    }

    /// Adds `e` unless it is already listed; whether it was added.
    fn push(&mut self, e: &'s ClosedEntity) -> bool {
        let addr = std::ptr::from_ref(e) as usize;
        let fresh = match &mut self.index {
            Some(ix) => ix.insert(addr),
            None => !self.list.iter().any(|x| std::ptr::eq(*x, e)),
        };
        if !fresh {
            return false;
        }
        self.list.push(e);
        if self.index.is_none() && self.list.len() > Self::SCAN {
            self.index = Some(
                self.list
                    .iter()
                    .map(|x| std::ptr::from_ref(*x) as usize)
                    .collect(),
            );
        }
        true
    }
}

/// Applies the verdict rules (docs/decisions.md#one-principals-verdict) to the satisfied policies
/// of one principal.
fn classify<'a>(
    b: &Bundle,
    satisfied: impl Iterator<Item = &'a cedar_policy::PolicyId>,
) -> Outcome {
    let mut plain_forbid = Vec::new();
    let mut ch_forbid = Vec::new();
    let mut plain_permit = Vec::new();
    let mut ch_permit = Vec::new();
    for id in satisfied {
        let Some(m) = b.meta.get(id) else { continue };
        match (m.effect, m.challenges.is_empty()) {
            (Effect::Forbid, true) => plain_forbid.push(m),
            (Effect::Forbid, false) => ch_forbid.push(m),
            (Effect::Permit, true) => plain_permit.push(m),
            (Effect::Permit, false) => ch_permit.push(m),
        }
    }
    let names = |v: &[&crate::bundle::PolicyMeta]| {
        let mut n: Vec<String> = v.iter().map(|m| m.name.clone()).collect();
        n.sort();
        n
    };
    let kinds = |v: &[&crate::bundle::PolicyMeta]| {
        let mut k: Vec<String> = v
            .iter()
            .flat_map(|m| m.challenges.iter().cloned())
            .collect();
        k.sort();
        k.dedup();
        k
    };
    if !plain_forbid.is_empty() {
        return Outcome {
            verdict: Verdict::Deny,
            challenges: Vec::new(),
            policies: names(&plain_forbid),
        };
    }
    let any_permit = !plain_permit.is_empty() || !ch_permit.is_empty();
    if !ch_forbid.is_empty() && any_permit {
        // The step-up forbid must be passed; so must the permits' own challenges when no plain
        // permit would allow by itself.
        let mut deciding = ch_forbid.clone();
        if plain_permit.is_empty() {
            deciding.extend(ch_permit.iter().copied());
        } else {
            deciding.extend(plain_permit.iter().copied());
        }
        let mut challengers = ch_forbid.clone();
        if plain_permit.is_empty() {
            challengers.extend(ch_permit.iter().copied());
        }
        return Outcome {
            verdict: Verdict::Challenge,
            challenges: kinds(&challengers),
            policies: names(&deciding),
        };
    }
    if !plain_permit.is_empty() {
        return Outcome {
            verdict: Verdict::Allow,
            challenges: Vec::new(),
            policies: names(&plain_permit),
        };
    }
    if !ch_permit.is_empty() {
        return Outcome {
            verdict: Verdict::Challenge,
            challenges: kinds(&ch_permit),
            policies: names(&ch_permit),
        };
    }
    Outcome {
        verdict: Verdict::Deny,
        challenges: Vec::new(),
        policies: Vec::new(),
    }
}

/// `human_present = false`: a challenge that needs `verification` cannot be answered
/// (docs/decisions.md#an-agent-acting-for-a-person).
fn absent_human(o: &mut Outcome) {
    if o.verdict == Verdict::Challenge && o.challenges.iter().any(|c| c == "verification") {
        o.verdict = Verdict::Deny;
        o.challenges.clear();
        o.policies.push(REASON_HUMAN_NOT_PRESENT.to_owned());
    }
}
