//! The entity slice of a check or plan: the entities it can reach from its principal,
//! resource, action, agent and work item (and their ancestors and referenced entities, as far
//! as the policies that can apply look), borrowed from the snapshot's pre-closed hierarchy, or
//! built by Cedar when the check brings inline entities (docs/decisions.md).

use super::snapshot::State;
use crate::error::{chain, RequestError};
use crate::maps::FastSet;
use crate::request::CheckRequest;
use crate::scope::{Derefs, Follow, FOLLOW_NONE};
use crate::store::{ClosedEntity, StoredEntity, WorkItem, Written};
use cedar_policy::{Entities, Entity, EntityUid};
use std::collections::HashSet;
use std::sync::Arc;

/// A check's inline entities that are taken, by uid.
pub(super) type Inline = crate::maps::Inline<StoredEntity>;

/// What one check reads, resolved: the snapshot, the request, its action, inline entities
/// and work item.
pub(super) struct CheckCtx<'a> {
    pub(super) st: &'a State,
    pub(super) req: &'a CheckRequest,
    pub(super) action: &'a EntityUid,
    pub(super) inline: &'a Inline,
    pub(super) work_item: Option<&'a WorkItem>,
    pub(super) assigned: bool,
    /// The principal's policies for the request's action and types ([`crate::scope::Scoped`]),
    /// when they were already built.
    pub(super) scoped: Option<Arc<crate::scope::Scoped>>,
}

/// The entity `uid` as written, for a check with inline entities: the inline one, else the
/// store's, else the bundle's, else the work item, else the action entity.
#[inline]
fn lookup<'a>(cx: &'a CheckCtx<'_>, uid: &EntityUid) -> Option<Written<'a>> {
    if let Some(e) = cx.inline.get(uid) {
        return Some(Written::Stored(e));
    }
    if let Some(e) = cx.st.store.entities.get(uid.as_ref()) {
        return Some(Written::Record(e));
    }
    let b = &*cx.st.bundle;
    if let Some(e) = b.entities.get(uid) {
        return Some(Written::Stored(e));
    }
    if let Some(w) = cx.work_item {
        if &w.entity.entity.uid() == uid {
            return Some(Written::Stored(&w.entity));
        }
    }
    b.action_entities.get(uid).map(|e| Written::Stored(e))
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
#[inline]
pub(super) fn gather<'s>(
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
        let Some(w) = lookup(cx, &uid) else {
            continue;
        };
        out.push(w.to_entity());
        for p in w.parents() {
            if !seen.contains(p) {
                stack.push((p.clone(), &FOLLOW_NONE));
            }
        }
        if follow.any() {
            for (attr, r) in w.refs() {
                let r = EntityUid::from(r.clone());
                if follow.takes(attr) && !seen.contains(&r) {
                    stack.push((r, &FOLLOW_NONE));
                }
            }
        }
    }
    Entities::from_entities(out, None)
        .map(Slice::Built)
        .map_err(|e| RequestError::new("entities", chain(&e)))
}

/// A check's entity slice ([`gather`]), borrowing from the snapshot `'s`.
pub(super) enum Slice<'s> {
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
    #[inline]
    pub(super) fn view(&self) -> crate::condition::Entities<'_> {
        match self {
            Self::Closed(list) => crate::condition::Entities::List(list),
            Self::Built(e) => crate::condition::Entities::Cedar(e.as_ref()),
        }
    }
}

/// [`gather`] without inline entities: the same slice, taken from the snapshot's pre-closed
/// entities ([`Hierarchy`]), borrowed, so nothing is copied and Cedar computes no closure.
#[inline]
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
#[inline]
pub(super) fn closed_list<'s>(
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
        // The hierarchy's record is the entity in force (`State::entity`), closed.
        let Some(e) = h.get(uid) else {
            continue;
        };
        add(&mut out, e);
        if follow.any() {
            e.for_each_ref(
                |attr| follow.takes(attr),
                |r| {
                    if let Some(e) = h.get_core(r) {
                        add(&mut out, e);
                    }
                },
            );
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
#[inline]
pub(super) fn entities_of(list: &[&ClosedEntity]) -> Vec<Arc<cedar_policy_core::ast::Entity>> {
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
    #[inline]
    fn has_uid(&self, uid: &cedar_policy_core::ast::EntityUID) -> bool {
        self.list.iter().any(|x| x.uid() == uid)
    }

    /// Adds `e` unless it is already listed; whether it was added.
    #[inline]
    fn push(&mut self, e: &'s ClosedEntity) -> bool {
        let addr = std::ptr::from_ref(e).cast::<u8>() as usize;
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
                    .map(|x| std::ptr::from_ref(*x).cast::<u8>() as usize)
                    .collect(),
            );
        }
        true
    }
}
