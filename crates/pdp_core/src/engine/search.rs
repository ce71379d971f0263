//! The AuthZEN 1.0 searches on the engine (docs/search.md): resource search on the query plan,
//! subject and action search by checks, paged over a per-snapshot index of the entities by
//! type in ascending id order ([`crate::search`] holds the request, page and token types).

use super::check::elapsed_us;
use super::state::{Engine, State};
use crate::decision::{Decision, PlanOutcome};
use crate::error::RequestError;
use crate::request::{CheckRequest, PlanRequest};
use crate::search::{
    row_matches, verdict_kind, PageToken, SearchError, SearchKind, SearchMethod, SearchPage,
    SearchRequest, SearchResult, DEFAULT_SEARCH_LIMIT,
};
use crate::store::{ClosedEntity, Written};
use cedar_policy::{EntityTypeName, EntityUid};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// One entity of a [`TypeIndex`]: its id (unescaped), uid and closed record (the one the
/// snapshot's hierarchy holds, so a row is read without looking it up).
type Indexed = (String, EntityUid, Option<Arc<ClosedEntity>>);

/// The entities of one snapshot by type, each list in ascending order of id (bytes of the
/// unescaped id), for paging with a cursor.
#[derive(Debug, Default)]
pub(crate) struct TypeIndex {
    by_type: HashMap<EntityTypeName, Vec<Indexed>>,
}

impl TypeIndex {
    /// Indexes every stored and bundle entity of `st` (not the actions).
    fn build(st: &State) -> Self {
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
        Self { by_type }
    }

    /// The entities of type `ty` whose id comes after `cursor` (all of them without one).
    fn after<'a>(&'a self, ty: &EntityTypeName, cursor: Option<&str>) -> &'a [Indexed] {
        let list = self.by_type.get(ty).map_or(&[][..], Vec::as_slice);
        match cursor {
            None => list,
            Some(c) => {
                let from = list.partition_point(|(id, _, _)| id.as_str() <= c);
                list.get(from..).unwrap_or(&[])
            }
        }
    }
}

/// Maps an engine field to the AuthZEN field of a search request.
fn authzen_error(e: RequestError) -> SearchError {
    let field = if let Some(rest) = e.field.strip_prefix("principal") {
        format!("subject{rest}")
    } else if e.field == "action" {
        "action.name".to_owned()
    } else if e.field == "resource_type" {
        "resource.type".to_owned()
    } else {
        e.field.clone()
    };
    SearchError::Request(RequestError::new(field, e.message))
}

/// What a candidate's check found.
enum Seen {
    /// `allow`: a result.
    Allowed,
    /// `challenge`, with the kinds to pass.
    Challenge(Vec<String>),
    /// The check could not be made with the request's context (action search: an action
    /// whose context type the context does not match); the reason.
    Undecided(String),
    /// `deny`.
    Denied,
}

/// One page being filled.
#[derive(Default)]
struct Filled {
    results: Vec<SearchResult>,
    challenges: Vec<(SearchResult, Vec<String>)>,
    undecided: Vec<(SearchResult, String)>,
    more: bool,
}

/// Fills one page from `next`, which yields the candidates in order: stops when the page
/// holds `limit` results and one more allowed candidate shows there is a next page (`more`).
/// Challenges and undecided candidates after the page's last result belong to the next page
/// when there is one.
fn fill<T>(
    limit: usize,
    mut next: impl FnMut() -> Option<Result<(T, Seen), SearchError>>,
    make: impl Fn(T) -> SearchResult,
) -> Result<Filled, SearchError> {
    let mut f = Filled::default();
    let mut after = Filled::default();
    while let Some(item) = next() {
        let (r, seen) = item?;
        let full = f.results.len() == limit;
        let into = if full { &mut after } else { &mut f };
        match seen {
            Seen::Allowed if full => {
                f.more = true;
                break;
            }
            Seen::Allowed => f.results.push(make(r)),
            Seen::Challenge(kinds) => into.challenges.push((make(r), kinds)),
            Seen::Undecided(why) => into.undecided.push((make(r), why)),
            Seen::Denied => {}
        }
    }
    if !f.more {
        f.challenges.extend(after.challenges);
        f.undecided.extend(after.undecided);
    }
    Ok(f)
}

/// A check's verdict as [`fill`] takes it.
fn found(d: &Decision) -> Seen {
    match verdict_kind(d.verdict) {
        Some(true) => Seen::Allowed,
        Some(false) => Seen::Challenge(d.challenges.clone()),
        None => Seen::Denied,
    }
}

impl Engine {
    /// Sets the largest `page.limit` a search takes (docs/search.md#paging; default
    /// [`crate::search::DEFAULT_MAX_SEARCH_LIMIT`], at least 1): a larger limit is lowered to it.
    pub fn configure_search(&self, max_limit: usize) {
        self.search_max_limit
            .store(max_limit.max(1), Ordering::Relaxed);
    }

    /// The index of the snapshot `st` by type, built once per set of versions.
    fn type_index(&self, st: &State) -> Arc<TypeIndex> {
        let v = [
            st.policy_version,
            st.principals_version,
            st.resources_version,
        ];
        let mut slot = self
            .search_index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, idx)) = slot.as_ref() {
            if *at == v {
                return Arc::clone(idx);
            }
        }
        let idx = Arc::new(TypeIndex::build(st));
        *slot = Some((v, Arc::clone(&idx)));
        idx
    }

    /// Runs a search given as AuthZEN JSON (see [`SearchRequest::from_json`] and
    /// [`Engine::search`]).
    ///
    /// # Errors
    /// As [`SearchRequest::from_json`] and [`Engine::search`].
    pub fn search_json(
        &self,
        kind: SearchKind,
        v: &serde_json::Value,
    ) -> Result<SearchPage, SearchError> {
        self.search(&SearchRequest::from_json(kind, v)?)
    }

    /// Answers one page of an AuthZEN search (docs/search.md):
    ///
    /// * resource search: the resources of `resource.type` the decision point holds that the
    ///   subject may do the action on, from the query plan (docs/plans.md) evaluated on each
    ///   stored row; rows it cannot decide from their attributes (`unknown`, `unmappable`, a
    ///   missing attribute) are checked one by one, as are all rows without a schema;
    /// * subject search: the entities of `subject.type` the decision point holds that may do
    ///   the action on the resource, one check each;
    /// * action search: the schema's actions for the subject's and resource's types that the
    ///   subject may do on the resource, one check each.
    ///
    /// Results are those whose check is `allow`, in ascending order of id (action name); the
    /// candidates of the page whose check is `challenge` are listed apart. A page holds at most
    /// `page.limit` results (default 100, at most the [`Engine::configure_search`] maximum);
    /// its `next_token` continues after its last result and is empty on the last page.
    ///
    /// # Errors
    /// [`SearchError::Request`] naming the AuthZEN field when a type or the action is unknown,
    /// the action does not apply to the types, the context does not match the schema, action
    /// search is asked of a bundle without a schema, or `page.token` is not a token of this
    /// request; [`SearchError::Stale`] when the token was issued on other policy, principals or
    /// resources versions.
    pub fn search(&self, req: &SearchRequest) -> Result<SearchPage, SearchError> {
        let t0 = Instant::now();
        let st = self.state.load_full();
        let versions = [
            st.policy_version,
            st.principals_version,
            st.resources_version,
        ];
        let max = self.search_max_limit.load(Ordering::Relaxed);
        let limit = req.limit.unwrap_or(DEFAULT_SEARCH_LIMIT).min(max);
        let cursor = match &req.token {
            None => None,
            Some(t) => {
                let tok = PageToken::decode(t, req)?;
                if tok.v != versions {
                    return Err(SearchError::Stale);
                }
                Some(tok.c)
            }
        };
        let b = &*st.bundle;
        let action = match &req.action {
            Some(a) => Some(b.resolve_action(a).map_err(authzen_error)?),
            None => None,
        };
        let (filled, method) = match req.kind {
            SearchKind::Resource => self.resource_page(&st, req, limit, cursor.as_deref())?,
            SearchKind::Subject => self.subject_page(&st, req, limit, cursor.as_deref())?,
            SearchKind::Action => self.action_page(&st, req, limit, cursor.as_deref())?,
        };
        let next_token = match (filled.more, filled.results.last()) {
            (true, Some(last)) => PageToken {
                r: req.digest(),
                c: match last {
                    SearchResult::Entity(u) => u.id().unescaped().to_owned(),
                    SearchResult::Action(n) => n.clone(),
                },
                v: versions,
            }
            .encode(),
            _ => String::new(),
        };
        Ok(SearchPage {
            qid: uuid::Uuid::now_v7().to_string(),
            kind: req.kind,
            results: filled.results,
            challenges: filled.challenges,
            undecided: filled.undecided,
            next_token,
            method,
            mode: st.mode,
            subject: req.subject.clone(),
            action,
            resource: req.resource.clone(),
            types: (req.subject_type.clone(), req.resource_type.clone()),
            versions,
            latency_us: elapsed_us(t0),
        })
    }

    /// One check of the search's question with `principal` and `resource`.
    fn search_check(
        &self,
        req: &SearchRequest,
        principal: &EntityUid,
        action: &str,
        resource: &EntityUid,
    ) -> Result<Decision, SearchError> {
        self.decide(&CheckRequest {
            principal: principal.clone(),
            action: action.to_owned(),
            resource: resource.clone(),
            context: req.context.clone(),
            on_behalf_of: None,
            human_present: true,
            work_item_id: None,
            entities: Vec::new(),
        })
        .map_err(authzen_error)
    }

    fn resource_page(
        &self,
        st: &State,
        req: &SearchRequest,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Filled, SearchMethod), SearchError> {
        let (Some(subject), Some(action)) = (&req.subject, &req.action) else {
            return Err(SearchError::Request(RequestError::new(
                "subject.id",
                "is required",
            )));
        };
        let b = &*st.bundle;
        let rtype = b
            .resolve_type(&req.resource_type, "resource.type")
            .map_err(authzen_error)?;
        b.check_type(subject.type_name(), "subject.type")
            .map_err(authzen_error)?;
        let plan = if b.schema.is_some() {
            Some(
                self.plan(&PlanRequest {
                    principal: subject.clone(),
                    on_behalf_of: None,
                    action: action.clone(),
                    context: req.context.clone(),
                    resource_type: req.resource_type.clone(),
                    plan_qid: None,
                })
                .map_err(authzen_error)?,
            )
        } else {
            None
        };
        let index = self.type_index(st);
        let mut rows = index.after(&rtype, cursor).iter();
        let method = if plan.is_some() {
            SearchMethod::Plan
        } else {
            SearchMethod::Checks
        };
        if plan
            .as_ref()
            .is_some_and(|p| p.outcome == PlanOutcome::AlwaysDenied)
        {
            return Ok((Filled::default(), method));
        }
        let filled = fill(
            limit,
            || {
                let (_, uid, rec) = rows.next()?;
                let r = uid;
                // What the plan says of the row: Some(true) allowed, Some(false) denied, None: ask.
                let said = plan.as_ref().and_then(|p| match (p.outcome, &p.filter) {
                    (PlanOutcome::AlwaysAllowed, _) => Some(true),
                    (PlanOutcome::Conditional, Some(f)) => {
                        let rec = rec.as_ref()?;
                        let m = row_matches(f, uid, Written::Record(rec), &|e| {
                            rec.is_descendant_of(e.as_ref())
                        });
                        // A row the filter leaves out may still be a challenge when one could
                        // widen the plan: that row is checked.
                        match m {
                            Some(false) if p.challenge_could_widen => None,
                            m => m,
                        }
                    }
                    (PlanOutcome::Challenge, Some(f)) => {
                        let rec = rec.as_ref()?;
                        match row_matches(f, uid, Written::Record(rec), &|e| {
                            rec.is_descendant_of(e.as_ref())
                        }) {
                            Some(false) => Some(false),
                            _ => None,
                        }
                    }
                    _ => None,
                });
                Some(match said {
                    Some(true) => Ok((r, Seen::Allowed)),
                    Some(false) => Ok((r, Seen::Denied)),
                    None => self
                        .search_check(req, subject, action, uid)
                        .map(|d| (r, found(&d))),
                })
            },
            |u: &EntityUid| SearchResult::Entity(u.clone()),
        )?;
        Ok((filled, method))
    }

    fn subject_page(
        &self,
        st: &State,
        req: &SearchRequest,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Filled, SearchMethod), SearchError> {
        let (Some(resource), Some(action)) = (&req.resource, &req.action) else {
            return Err(SearchError::Request(RequestError::new(
                "resource.id",
                "is required",
            )));
        };
        let b = &*st.bundle;
        let stype = b
            .resolve_type(&req.subject_type, "subject.type")
            .map_err(authzen_error)?;
        b.check_type(resource.type_name(), "resource.type")
            .map_err(authzen_error)?;
        let index = self.type_index(st);
        let mut rows = index.after(&stype, cursor).iter();
        let filled = fill(
            limit,
            || {
                let (_, uid, _) = rows.next()?;
                Some(
                    self.search_check(req, uid, action, resource)
                        .map(|d| (uid, found(&d))),
                )
            },
            |u: &EntityUid| SearchResult::Entity(u.clone()),
        )?;
        Ok((filled, SearchMethod::Checks))
    }

    fn action_page(
        &self,
        st: &State,
        req: &SearchRequest,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Filled, SearchMethod), SearchError> {
        let (Some(subject), Some(resource)) = (&req.subject, &req.resource) else {
            return Err(SearchError::Request(RequestError::new(
                "subject.id",
                "is required",
            )));
        };
        let b = &*st.bundle;
        let Some(schema) = b.schema.as_ref() else {
            return Err(SearchError::Request(RequestError::new(
                "request",
                "action search needs a bundle with a schema (the schema says which actions apply to which types)",
            )));
        };
        b.check_type(subject.type_name(), "subject.type")
            .map_err(authzen_error)?;
        b.check_type(resource.type_name(), "resource.type")
            .map_err(authzen_error)?;
        // Each action by the name evaluation takes for it: its id when that names it alone.
        let mut actions: Vec<(String, EntityUid)> = schema
            .actions_for_principal_and_resource(subject.type_name(), resource.type_name())
            .map(|a| {
                let id = a.id().unescaped();
                let name = match b.resolve_action(id) {
                    Ok(u) if &u == a => id.to_owned(),
                    _ => a.to_string(),
                };
                (name, a.clone())
            })
            .collect();
        actions.sort_unstable_by(|x, y| x.0.cmp(&y.0));
        actions.dedup_by(|x, y| x.0 == y.0);
        let from = cursor.map_or(0, |c| actions.partition_point(|(n, _)| n.as_str() <= c));
        let mut rows = actions.get(from..).unwrap_or(&[]).iter();
        let filled = fill(
            limit,
            || {
                let (name, _) = rows.next()?;
                Some(match self.search_check(req, subject, name, resource) {
                    Ok(d) => Ok((name, found(&d))),
                    // The context is typed per action: one it does not fit is not allowed,
                    // and is listed with the reason.
                    Err(SearchError::Request(e)) if e.field.starts_with("context") => {
                        Ok((name, Seen::Undecided(e.to_string())))
                    }
                    Err(e) => Err(e),
                })
            },
            |n: &String| SearchResult::Action(n.clone()),
        )?;
        Ok((filled, SearchMethod::Checks))
    }
}
