//! Query plans as the decision point answers them (docs/plans.md): the verdict rules
//! (docs/decisions.md#one-principals-verdict) lifted from one row to every row, the agent/person
//! intersection, and the bounded
//! cache that lets a client page with one plan.
//!
//! [`crate::residual_filter`] turns each policy's partial-evaluation residual into a filter; this module
//! decides what those filters mean together. For one principal, with `P`/`PC` the plain and
//! `@challenge` permits and `F`/`FC` the plain and `@challenge` forbids that may hold for some
//! row:
//!
//! * `allowed = (P) and not (F or FC)`: the rows a check would `allow` (a plain permit,
//!   no forbid of either kind);
//! * `after_challenge = (P or PC) and not F`: the rows a check would `allow` or `challenge`,
//!   which passing the challenges shows.
//!
//! An agent acting for a person gets the conjunction of both principals' filters. The outcome is
//! `always_allowed` when `allowed` holds for every row, `conditional` (filter `allowed`) when it
//! holds for some, and otherwise `challenge` (filter `after_challenge`) or `always_denied`.
//! `challenge_could_widen` is true on a conditional plan when passing a challenge would show
//! rows the filter hides.

use crate::bundle::PolicyMeta;
use crate::decision::{PlanOutcome, QueryPlan};
use crate::maps::FastHasher;
use crate::residual_filter::{combine_simplified, Filter, Residual};
use cedar_policy::{Effect, EntityTypeName, EntityUid, PolicyId};
use cedar_policy_core::ast;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default `max_age_secs` of a plan (issue "Query plans", item 2).
pub const DEFAULT_PLAN_MAX_AGE_SECS: u64 = 300;
/// Default number of plans kept for paging.
pub const DEFAULT_PLAN_CACHE_CAPACITY: usize = 10_000;

/// The filters of one principal (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Side {
    allowed: Arc<Filter>,
    after_challenge: Arc<Filter>,
    /// Whether `allowed == after_challenge` (compared once, when the side is built: sides are
    /// memoised, and comparing deep filters on every plan was a twentieth of a plan).
    same: bool,
    /// Sorted, each once; shared, as sides are memoised and cloned for every plan.
    challenges: Arc<[String]>,
    /// Sorted, each once; shared likewise.
    policies: Arc<[String]>,
}

impl Side {
    /// A principal denied before any policy runs (contained, unregistered).
    pub(crate) fn denied(reason: &str) -> Self {
        Self {
            allowed: Arc::new(Filter::False),
            after_challenge: Arc::new(Filter::False),
            same: true,
            challenges: Arc::new([]),
            policies: Arc::new([reason.to_owned()]),
        }
    }

    /// Applies the verdict rules (docs/decisions.md#one-principals-verdict) to the residuals of one
    /// principal.
    pub(crate) fn from_residuals(
        res: Vec<Residual>,
        meta: &crate::maps::FastMap<PolicyId, PolicyMeta>,
    ) -> Self {
        let mut p = Vec::new();
        let mut pc = Vec::new();
        let mut f = Vec::new();
        let mut fc = Vec::new();
        let mut challenges = BTreeSet::new();
        let mut policies = BTreeSet::new();
        for r in res {
            let kinds: &[String] = meta.get(&r.id).map_or(&[], |m| m.challenges.as_slice());
            policies.insert(
                meta.get(&r.id)
                    .map_or_else(|| r.id.to_string(), |m| m.name.clone()),
            );
            let bucket = match (r.effect, kinds.is_empty()) {
                (Effect::Permit, true) => &mut p,
                (Effect::Permit, false) => &mut pc,
                (Effect::Forbid, true) => &mut f,
                (Effect::Forbid, false) => &mut fc,
            };
            bucket.push(r.filter);
            challenges.extend(kinds.iter().cloned());
        }
        // allowed: P and not (F or FC); after_challenge: (P or PC) and not F. The residuals'
        // filters are simplified (crate::residual_filter::residuals).
        let all_forbids: Vec<Filter> = f.iter().cloned().chain(fc).collect();
        let allowed = combine_simplified(p.clone(), all_forbids);
        let all_permits: Vec<Filter> = p.into_iter().chain(pc).collect();
        let after_challenge = combine_simplified(all_permits, f);
        Self {
            same: allowed == after_challenge,
            allowed: Arc::new(allowed),
            after_challenge: Arc::new(after_challenge),
            challenges: challenges.into_iter().collect(),
            policies: policies.into_iter().collect(),
        }
    }
}

/// What [`finish`] decides from the sides of a plan.
pub(crate) struct Finished {
    pub(crate) outcome: PlanOutcome,
    pub(crate) filter: Option<Arc<Filter>>,
    pub(crate) challenges: Vec<String>,
    pub(crate) challenge_could_widen: bool,
    pub(crate) policies: Vec<String>,
}

/// Combines the principal's side with the person's (when an agent acts for one): a row is
/// shown only when both may see it, and every challenge of either is required
/// (docs/decisions.md#an-agent-acting-for-a-person).
pub(crate) fn finish(sides: Vec<Side>) -> Finished {
    // A side's filters are already simplified, and simplifying is idempotent, so they are not
    // simplified again (the `and` of one simplified filter simplifies to that filter).
    // Sorted, each once: a lone side's lists already are.
    let union = |of: fn(&Side) -> &[String]| -> Vec<String> {
        match sides.as_slice() {
            [s] => of(s).to_vec(),
            _ => sides
                .iter()
                .flat_map(|s| of(s).iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        }
    };
    let policies = union(|s| &s.policies);
    let challenges = union(|s| &s.challenges);
    let (allowed, after, same) = match <[Side; 1]>::try_from(sides) {
        // One side (no agent acting for a person): its filters, shared as they are.
        Ok([s]) => (s.allowed, s.after_challenge, s.same),
        Err(sides) => {
            let (allowed, after): (Vec<Filter>, Vec<Filter>) = sides
                .into_iter()
                .map(|s| {
                    (
                        Arc::unwrap_or_clone(s.allowed),
                        Arc::unwrap_or_clone(s.after_challenge),
                    )
                })
                .unzip();
            let allowed = Filter::and_of_simplified(allowed);
            let after = Filter::and_of_simplified(after);
            let same = allowed == after;
            (Arc::new(allowed), Arc::new(after), same)
        }
    };
    match (&*allowed, &*after) {
        (Filter::True, _) => Finished {
            outcome: PlanOutcome::AlwaysAllowed,
            filter: None,
            challenges: Vec::new(),
            challenge_could_widen: false,
            policies,
        },
        (Filter::False, Filter::False) => Finished {
            outcome: PlanOutcome::AlwaysDenied,
            filter: None,
            challenges: Vec::new(),
            challenge_could_widen: false,
            policies,
        },
        (Filter::False, _) => Finished {
            outcome: PlanOutcome::Challenge,
            filter: Some(after),
            challenges,
            challenge_could_widen: false,
            policies,
        },
        _ => {
            let widen = !same && !challenges.is_empty();
            Finished {
                outcome: PlanOutcome::Conditional,
                filter: Some(allowed),
                challenges: if widen { challenges } else { Vec::new() },
                challenge_could_widen: widen,
                policies,
            }
        }
    }
}

/// Identifies what a plan was asked for: a `plan_qid` is honoured only for the same question.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlanKey {
    pub(crate) principal: EntityUid,
    pub(crate) on_behalf_of: Option<EntityUid>,
    pub(crate) action: EntityUid,
    pub(crate) resource_type: EntityTypeName,
    pub(crate) context: Map<String, Value>,
}

/// What a plan depended on about its principals, to tell whether "that principal changed".
#[derive(Debug, Clone)]
pub(crate) struct PrincipalState {
    /// The principal's closed entity (re-closed whenever it, its groups or their attributes
    /// change), compared by pointer.
    pub(crate) entity: Option<Arc<ast::Entity>>,
    /// The reasoner's risk score.
    pub(crate) risk: Option<i64>,
}

impl PrincipalState {
    fn same(&self, other: &Self) -> bool {
        let entity = match (&self.entity, &other.entity) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        entity && self.risk == other.risk
    }
}

struct Cached {
    plan: QueryPlan,
    key: PlanKey,
    principals: Vec<PrincipalState>,
    created: Instant,
}

/// The bounded (LRU) cache of recent plans, safe to share between threads.
pub(crate) struct PlanCache {
    /// By the plan id's 128 bits (a qid that is not a UUID names no plan), hashed with
    /// foldhash: hashing and copying the 36-character text was a tenth of a memoised plan.
    inner: Mutex<lru::LruCache<u128, Arc<Cached>, FastHasher>>,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache").finish_non_exhaustive()
    }
}

impl PlanCache {
    /// A cache holding at most `capacity` plans (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(lru::LruCache::with_hasher(
                bound(capacity),
                FastHasher::default(),
            )),
        }
    }

    /// The plan `qid` again, marked pinned, when it answered the same question, is younger than
    /// `max_age`, was built with `policy_version`, and its principals are unchanged. Contained
    /// principals never get here (the caller checks first).
    pub(crate) fn pinned(
        &self,
        qid: &str,
        key: &PlanKey,
        policy_version: u64,
        principals: &[PrincipalState],
        max_age: Duration,
    ) -> Option<QueryPlan> {
        let id = uuid::Uuid::parse_str(qid).ok()?.as_u128();
        let hit = {
            let mut g = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            g.get(&id).cloned()
        }?;
        let fresh = hit.created.elapsed() < max_age
            && hit.plan.policy_version == policy_version
            && hit.key == *key
            && hit.principals.len() == principals.len()
            && hit
                .principals
                .iter()
                .zip(principals)
                .all(|(a, b)| a.same(b));
        if !fresh {
            return None;
        }
        let mut plan = hit.plan.clone();
        plan.pinned = true;
        Some(plan)
    }

    /// Remembers a new plan under `id`, the 128 bits of the UUID its `qid` is written from.
    pub(crate) fn insert(
        &self,
        id: u128,
        plan: &QueryPlan,
        key: PlanKey,
        principals: Vec<PrincipalState>,
    ) {
        let c = Arc::new(Cached {
            plan: plan.clone(),
            key,
            principals,
            created: Instant::now(),
        });
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let evicted = g.push(id, c);
        drop(g);
        // The plan that made room is freed outside the lock.
        drop(evicted);
    }

    /// Number of plans held.
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Changes the bound, dropping the least recently used plans beyond it.
    pub(crate) fn resize(&self, capacity: usize) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .resize(bound(capacity));
    }
}

/// The cache bound for a requested capacity: at least one plan.
fn bound(capacity: usize) -> NonZeroUsize {
    NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)
}
