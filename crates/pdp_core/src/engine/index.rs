//! The search index of one snapshot ([`TypeIndex`]): its entities by type in ascending id
//! order, for paging with a cursor; the columns of the attribute values search filters read;
//! what each entity is as a principal; and subject search's plans prepared for rows
//! ([`PagePlan`]). Built once per snapshot and kept by the engine (`super::state`) for the
//! searches (`super::search`, docs/search.md).

use super::snapshot::State;
use crate::decision::PlanOutcome;
use crate::residual_filter::Filter;
use crate::search::{lookup, RowAttrs, RowFilter};
use crate::store::{ClosedEntity, Written};
use cedar_policy::{EntityTypeName, EntityUid};
use cedar_policy_core::ast::Value as CedarValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One entity of a [`TypeIndex`]: its id (unescaped), uid and closed record (the one the
/// snapshot's hierarchy holds, so a row is read without looking it up).
pub(super) type Indexed = (String, EntityUid, Option<Arc<ClosedEntity>>);

/// The values at one attribute path of every entity of a type, in the [`TypeIndex`]'s order
/// (`None` where an entity has no value there, or no record).
type Column = Arc<[Option<CedarValue>]>;

/// The entities of one snapshot by type, each list in ascending order of id (bytes of the
/// unescaped id), for paging with a cursor; and, built on first use, the columns of the
/// attribute paths plans have read.
///
/// A filter evaluated on 100,000 rows spent most of its time waiting for each row's record
/// to come from memory (the records are scattered); a column holds the one value the filter
/// reads of every row in one array, read in order. Columns are built once per snapshot and
/// attribute path (as many as the schema's paths at most), like the index itself.
#[derive(Debug, Default)]
pub(crate) struct TypeIndex {
    by_type: HashMap<EntityTypeName, Vec<Indexed>>,
    columns: Mutex<HashMap<(EntityTypeName, Vec<String>), Column>>,
    /// Subject search's plans on this snapshot, by question and risk score: a later page, or
    /// the same search again, reuses them (at most [`SUBJECT_PLANS_KEPT`]; emptied when full).
    pub(super) subject_plans: Mutex<HashMap<SubjectQuestion, Arc<PagePlan>>>,
    /// Per type, what each entity is as a principal on this snapshot ([`AsPrincipal`]),
    /// in the type's order; built on a type's first subject search.
    principals: Mutex<HashMap<EntityTypeName, Arc<[AsPrincipal]>>>,
}

/// What a subject search needs of a candidate principal besides its attributes: whether it is
/// denied before any policy runs (contained, or an unregistered service account), and its risk
/// score. Risk scores, containments and registrations all move the principals version, so
/// they hold for the snapshot of a [`TypeIndex`].
#[derive(Debug, Clone, Copy)]
pub(super) struct AsPrincipal {
    pub(super) denied: bool,
    pub(super) risk: Option<i64>,
}

/// Slots of a subject search page's plans by risk score: no score, then 0 to 100.
pub(super) const RISK_SLOTS: usize = 102;

/// The slot of `risk` among [`RISK_SLOTS`]; [`RISK_SLOTS`] itself (no slot) for a score
/// outside 0 to 100.
pub(super) fn risk_slot(risk: Option<i64>) -> usize {
    match risk {
        None => 0,
        Some(r) => usize::try_from(r)
            .ok()
            .filter(|r| *r <= 100)
            .map_or(RISK_SLOTS, |r| r + 1),
    }
}

/// How many subject-search plans a [`TypeIndex`] keeps.
pub(super) const SUBJECT_PLANS_KEPT: usize = 4096;

/// What a subject search's plan answers: the searched type, action, resource, the caller's
/// context (as JSON text) and the principals' risk score.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SubjectQuestion {
    pub(super) principal_type: EntityTypeName,
    pub(super) action: EntityUid,
    pub(super) resource: EntityUid,
    pub(super) context: String,
    pub(super) risk: Option<i64>,
}

impl TypeIndex {
    /// Indexes every stored and bundle entity of `st` (not the actions).
    pub(super) fn build(st: &State) -> Self {
        let mut by_type: HashMap<EntityTypeName, Vec<Indexed>> = HashMap::new();
        let mut add = |u: EntityUid| {
            let rec = st.hierarchy.get(&u).map(Arc::clone);
            by_type.entry(u.type_name().clone()).or_default().push((
                u.id().unescaped().to_owned(),
                u,
                rec,
            ));
        };
        for u in st.store.entities.keys() {
            add(EntityUid::from(u.clone()));
        }
        for u in st.bundle.entities.keys() {
            if !st.store.entities.contains_key(u.as_ref()) {
                add(u.clone());
            }
        }
        for list in by_type.values_mut() {
            list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
        Self {
            by_type,
            columns: Mutex::new(HashMap::new()),
            subject_plans: Mutex::new(HashMap::new()),
            principals: Mutex::new(HashMap::new()),
        }
    }

    /// The entities of type `ty` whose id comes after `cursor` (all of them without one), and
    /// the position of the first of them in the type's list (and columns).
    pub(super) fn after<'a>(
        &'a self,
        ty: &EntityTypeName,
        cursor: Option<&str>,
    ) -> (usize, &'a [Indexed]) {
        let list = self.by_type.get(ty).map_or(&[][..], Vec::as_slice);
        let from = cursor.map_or(0, |c| list.partition_point(|(id, _, _)| id.as_str() <= c));
        (from, list.get(from..).unwrap_or(&[]))
    }

    /// The columns of type `ty` for the attribute paths `filter` reads, in its numbering
    /// ([`RowFilter::paths`]), each built on first use.
    fn columns(&self, ty: &EntityTypeName, filter: &RowFilter) -> Columns {
        let mut built = self
            .columns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = self.by_type.get(ty).map_or(&[][..], Vec::as_slice);
        let cols = filter
            .paths()
            .iter()
            .map(|path| {
                let col = built.entry((ty.clone(), path.clone())).or_insert_with(|| {
                    list.iter()
                        .map(|(_, _, rec)| {
                            rec.as_ref()
                                .and_then(|r| lookup(Written::Record(r), path).cloned())
                        })
                        .collect()
                });
                Arc::clone(col)
            })
            .collect();
        Columns(cols)
    }
}

impl TypeIndex {
    /// What each entity of type `ty` is as a principal on `st` (this index's snapshot), in the
    /// type's order, built on first use.
    pub(super) fn as_principals(&self, st: &State, ty: &EntityTypeName) -> Arc<[AsPrincipal]> {
        let mut built = self
            .principals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let service_accounts = ty.basename() == "ServiceAccount";
        let list = self.by_type.get(ty).map_or(&[][..], Vec::as_slice);
        Arc::clone(built.entry(ty.clone()).or_insert_with(|| {
            list.iter()
                .map(|(_, uid, _)| AsPrincipal {
                    denied: st.store.is_contained(uid)
                        || (service_accounts && !st.is_registered(uid)),
                    risk: st.store.risk(uid),
                })
                .collect()
        }))
    }
}

/// The columns a [`RowFilter`] reads ([`TypeIndex::columns`]), in its numbering of paths.
#[derive(Debug)]
struct Columns(Vec<Column>);

/// Row `i` of a type's list, read from the [`Columns`] of the filter evaluated on it.
struct ColumnRow<'a> {
    cols: &'a Columns,
    i: usize,
}

impl RowAttrs for ColumnRow<'_> {
    fn get(&self, col: usize) -> Option<&CedarValue> {
        self.cols.0.get(col)?.get(self.i)?.as_ref()
    }
}

/// A plan prepared for a page: its outcome, its filter prepared for rows with the columns
/// that filter reads, and whether a challenge could widen it.
#[derive(Debug)]
pub(super) struct PagePlan {
    outcome: PlanOutcome,
    filter: Option<(RowFilter, Columns)>,
    challenge_could_widen: bool,
}

impl PagePlan {
    pub(super) fn new(
        index: &TypeIndex,
        ty: &EntityTypeName,
        outcome: PlanOutcome,
        filter: Option<&Filter>,
        challenge_could_widen: bool,
    ) -> Self {
        Self {
            outcome,
            filter: filter.map(|f| {
                let rf = RowFilter::new(f);
                let cols = index.columns(ty, &rf);
                (rf, cols)
            }),
            challenge_could_widen,
        }
    }

    /// What the plan says of row `i` of the type's list ([`plan_says`]).
    pub(super) fn says(&self, i: usize, uid: &EntityUid, rec: &ClosedEntity) -> Option<bool> {
        plan_says(
            self.outcome,
            self.filter.as_ref(),
            self.challenge_could_widen,
            |(f, cols)| {
                f.matches(uid, &ColumnRow { cols, i }, &|e| {
                    rec.is_descendant_of(e.as_ref())
                })
            },
        )
    }
}

/// What a plan's outcome and filter say of one row: `Some(true)` allowed, `Some(false)`
/// denied, `None` when the row must be checked (the filter cannot decide it, or the row may be
/// a challenge).
fn plan_says<F>(
    outcome: PlanOutcome,
    filter: Option<F>,
    challenge_could_widen: bool,
    matches: impl FnOnce(F) -> Option<bool>,
) -> Option<bool> {
    match (outcome, filter) {
        (PlanOutcome::AlwaysAllowed, _) => Some(true),
        (PlanOutcome::AlwaysDenied, _) => Some(false),
        // A row the filter leaves out may still be a challenge when one could widen the plan:
        // that row is checked.
        (PlanOutcome::Conditional, Some(f)) => match matches(f) {
            Some(false) if challenge_could_widen => None,
            m => m,
        },
        // Rows the challenge's filter leaves out are denied; the others are checked for the
        // challenge's kinds.
        (PlanOutcome::Challenge, Some(f)) => match matches(f) {
            Some(false) => Some(false),
            _ => None,
        },
        _ => None,
    }
}
