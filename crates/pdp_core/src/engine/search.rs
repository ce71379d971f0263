//! The AuthZEN 1.0 searches on the engine (docs/search.md): resource search on the query plan,
//! subject search on a plan with the principal unknown, action search by checks, paged over a
//! per-snapshot index of the entities by type in ascending id order, with columns of the
//! attribute values filters read ([`crate::search`] holds the request, page, token and
//! prepared-filter types).

use super::check::{elapsed_us, takes_risk};
use super::index::{
    risk_slot, PagePlan, SubjectQuestion, TypeIndex, RISK_SLOTS, SUBJECT_PLANS_KEPT,
};
use super::snapshot::State;
use super::state::Engine;
use crate::decision::{Decision, PlanOutcome};
use crate::error::RequestError;
use crate::plan_outcome::Finished;
use crate::request::{CheckRequest, PlanRequest};
use crate::search::{
    verdict_kind, PageToken, SearchError, SearchKind, SearchMethod, SearchPage, SearchRequest,
    SearchResult, DEFAULT_SEARCH_LIMIT,
};
use cedar_policy::EntityUid;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

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

    /// Turns subject search's plans (docs/search.md#how-each-search-is-answered-contextmethod)
    /// on (the default) or off. Off, subject search checks every candidate (`checks`), as it
    /// does without a schema; the results are the same either way, and off exists to test and
    /// measure that.
    pub fn set_subject_plans(&self, on: bool) {
        self.subject_plans.store(on, Ordering::Relaxed);
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
    ///   the action on the resource, from a plan made with the principal unknown (one per
    ///   risk score among the candidates) evaluated on each principal's row, with contained
    ///   and unregistered principals denied first; rows it cannot decide are checked one by
    ///   one, as are all rows without a schema;
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
        let (from, rows) = index.after(&rtype, cursor);
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
        let plan = plan.map(|p| {
            PagePlan::new(
                &index,
                &rtype,
                p.outcome,
                p.filter.as_deref(),
                p.challenge_could_widen,
            )
        });
        let mut rows = rows.iter().enumerate();
        let filled = fill(
            limit,
            || {
                let (k, (_, uid, rec)) = rows.next()?;
                let said = plan
                    .as_ref()
                    .and_then(|p| p.says(from + k, uid, rec.as_ref()?));
                Some(match said {
                    Some(true) => Ok((uid, Seen::Allowed)),
                    Some(false) => Ok((uid, Seen::Denied)),
                    None => self
                        .search_check(req, subject, action, uid)
                        .map(|d| (uid, found(&d))),
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
        let (from, rows) = index.after(&stype, cursor);
        let mut rows = rows.iter().enumerate();
        // One plan per risk score among the candidates (the context's only part that is a
        // principal's own), built when a candidate with that score first comes.
        // The page's plans by risk score (0 to 100, as `set_risk_scores` takes them; slot 0 is
        // no score), found per candidate without hashing.
        let mut plans: Vec<Option<Arc<PagePlan>>> = vec![None; RISK_SLOTS];
        let action_uid = b.resolve_action(action).map_err(authzen_error)?;
        let context = serde_json::to_string(&req.context).unwrap_or_default();
        let mut slice = None;
        let mut plan_for = |plans: &mut Vec<Option<Arc<PagePlan>>>,
                            risk: Option<i64>|
         -> Result<(), SearchError> {
            let Some(slot) = plans.get_mut(risk_slot(risk)) else {
                return Ok(());
            };
            if slot.is_none() {
                let question = SubjectQuestion {
                    principal_type: stype.clone(),
                    action: action_uid.clone(),
                    resource: resource.clone(),
                    context: context.clone(),
                    risk,
                };
                let kept = index
                    .subject_plans
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(&question)
                    .map(Arc::clone);
                let plan = match kept {
                    Some(p) => p,
                    None => {
                        let p: Finished = self
                            .subject_plan(
                                st,
                                &stype,
                                &action_uid,
                                resource,
                                &req.context,
                                risk,
                                &mut slice,
                            )
                            .map_err(authzen_error)?;
                        let plan = Arc::new(PagePlan::new(
                            &index,
                            &stype,
                            p.outcome,
                            p.filter.as_deref(),
                            p.challenge_could_widen,
                        ));
                        let mut kept = index
                            .subject_plans
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if kept.len() >= SUBJECT_PLANS_KEPT {
                            kept.clear();
                        }
                        kept.insert(question, Arc::clone(&plan));
                        plan
                    }
                };
                *slot = Some(plan);
            }
            Ok(())
        };
        // Without a schema (partial evaluation is type-aware), or when the request's plan
        // cannot be made, every candidate is checked; the checks report the request's errors.
        if b.schema.is_none()
            || !self.subject_plans.load(Ordering::Relaxed)
            || plan_for(&mut plans, None).is_err()
        {
            let filled = fill(
                limit,
                || {
                    let (_, (_, uid, _)) = rows.next()?;
                    Some(
                        self.search_check(req, uid, action, resource)
                            .map(|d| (uid, found(&d))),
                    )
                },
                |u: &EntityUid| SearchResult::Entity(u.clone()),
            )?;
            return Ok((filled, SearchMethod::Checks));
        }
        let by_risk = takes_risk(st, &action_uid);
        let principals = index.as_principals(st, &stype);
        let filled = fill(
            limit,
            || {
                let (k, (_, uid, rec)) = rows.next()?;
                let me = principals.get(from + k)?;
                // A contained or unregistered principal is denied before any policy runs.
                if me.denied {
                    return Some(Ok((uid, Seen::Denied)));
                }
                let risk = if by_risk { me.risk } else { None };
                if let Err(e) = plan_for(&mut plans, risk) {
                    return Some(Err(e));
                }
                // A score outside 0 to 100 (never stored) has no slot: its rows are checked.
                let said = plans
                    .get(risk_slot(risk))
                    .and_then(Option::as_ref)
                    .and_then(|p| p.says(from + k, uid, rec.as_ref()?));
                Some(match said {
                    Some(true) => Ok((uid, Seen::Allowed)),
                    Some(false) => Ok((uid, Seen::Denied)),
                    None => self
                        .search_check(req, uid, action, resource)
                        .map(|d| (uid, found(&d))),
                })
            },
            |u: &EntityUid| SearchResult::Entity(u.clone()),
        )?;
        Ok((filled, SearchMethod::Plan))
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
