//! One snapshot of what the engine decides with ([`State`]): a bundle with what the engine
//! memoises about it ([`Caches`]), the entity store, their closed hierarchy, the mode and the
//! versions; with the lookups every check, plan and search makes on it. The engine publishes a
//! new snapshot with one atomic pointer swap (`super::state`).
//!
//! The bottom of the engine's modules (docs/architecture.md#code-layout-and-conventions): it
//! uses only the crate's other modules, never another engine module.

use crate::bundle::Bundle;
use crate::decision::Mode;
use crate::error::RequestError;
use crate::limits::TooDeep;
use crate::memo::{ContextMemo, SideMemo, SliceMemo};
use crate::residual_filter::AttrKinds;
use crate::scope::{ScopeIndex, Scoped};
use crate::store::{Hierarchy, Store, Written};
use cedar_policy::{EntityTypeName, EntityUid};
use cedar_policy_core::ast::{Literal, ValueKind};
use std::sync::Arc;

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

    /// Whether `uid` is registered: a `ServiceAccount` the store or bundle holds whose
    /// `registered` attribute is not `false` (docs/decisions.md); checks, plans and subject
    /// searches deny an unregistered service account before any policy runs.
    #[inline]
    pub(super) fn is_registered(&self, uid: &EntityUid) -> bool {
        let e = match self.store.entities.get(uid.as_ref()) {
            Some(r) => Some(Written::Record(r)),
            None => self.bundle.entities.get(uid).map(|e| Written::Stored(e)),
        };
        match e {
            None => false,
            Some(e) => !matches!(
                e.attr("registered").map(|v| &v.value),
                Some(ValueKind::Lit(Literal::Bool(false)))
            ),
        }
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
