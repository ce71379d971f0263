//! Query plans (docs/plans.md): which rows of a resource type a principal (and the person it
//! acts for) may see, as a filter, from Cedar's type-aware partial evaluation over the
//! principal's slice; memoised per side and cached per plan for paging (crate::plan_outcome).

use super::check::{check_on_behalf_of, context_for, context_with_risk, elapsed_us};
use super::check::{REASON_CONTAINED, REASON_UNREGISTERED};
use super::slice::{closed_list, entities_of};
use super::snapshot::State;
use super::state::Engine;
use crate::decision::QueryPlan;
use crate::error::RequestError;
use crate::plan_outcome::{finish, Finished, PlanKey, PrincipalState, Side};
use crate::request::PlanRequest;
use crate::residual_filter::{
    partial_entities, principal_residuals_with, residuals_with, PlanError,
};
use crate::scope::{Follow, FOLLOW_ALL, FOLLOW_NONE};
use crate::store::Hierarchy;
use cedar_policy::{Entities, EntityTypeName, EntityUid, PartialEntities};
use serde_json::{Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
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
        let (Some(schema), Some(kinds)) = (b.schema.as_ref(), st.caches.attr_kinds.as_deref())
        else {
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
        if subject.type_name().basename() == "ServiceAccount" && !st.is_registered(subject) {
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
            st.caches.plan_entities.get_or_build(
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
            let scoped = st
                .caches
                .scoped(b, action, subject.type_name(), resource_type);
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
            st.caches
                .plan_sides
                .get_or_compute(&question, slice, compute)
        } else {
            compute(&*slice()?)
        }
    }

    /// The plan of a subject search (docs/search.md#subject-search): which principals of
    /// `principal_type` may do `action` on `resource` with the caller's `context`, as a filter
    /// over the principals' rows, from Cedar's type-aware partial evaluation with the
    /// principal unknown, for principals whose risk score is `risk` (the one thing of a
    /// principal's own the context holds in a search: no agent, no work item, a human present).
    ///
    /// The outcome follows the verdict rules of a plan ([`crate::plan_outcome`]); containment
    /// and registration, which are a principal's own too, are left to the caller.
    ///
    /// `slice` holds the resource's entities once made (by the first call of a page; they do
    /// not depend on `risk`).
    ///
    /// # Errors
    /// [`RequestError`] when the bundle has no schema, the action does not apply to the types,
    /// or the context does not match the schema.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn subject_plan(
        &self,
        st: &State,
        principal_type: &EntityTypeName,
        action: &EntityUid,
        resource: &EntityUid,
        caller: &Map<String, Value>,
        risk: Option<i64>,
        slice: &mut Option<(Entities, PartialEntities)>,
    ) -> Result<Finished, RequestError> {
        let b = &*st.bundle;
        let (Some(schema), Some(kinds)) = (b.schema.as_ref(), st.caches.attr_kinds.as_deref())
        else {
            return Err(RequestError::new(
                "subject.type",
                "a subject search's plan needs a bundle with a schema",
            ));
        };
        let context = context_with_risk(st, action, risk, None, caller, true, false, None)?;
        // The resource's slice, the same for every risk score: made once per page.
        let (entities, known) = match slice {
            Some(s) => &*s,
            None => {
                let roots: Vec<(&EntityUid, &Follow)> =
                    vec![(resource, &FOLLOW_ALL), (action, &FOLLOW_NONE)];
                let entities = Hierarchy::slice(entities_of(&closed_list(
                    st,
                    &roots,
                    None,
                    &FOLLOW_ALL,
                    true,
                )))?;
                let known = partial_entities(&entities, schema);
                &*slice.insert((entities, known))
            }
        };
        let scoped = st
            .caches
            .scoped(b, action, principal_type, resource.type_name());
        let res = principal_residuals_with(
            scoped.policies.as_ref().unwrap_or(&b.policies),
            schema,
            kinds,
            principal_type,
            action,
            context.context.clone(),
            resource,
            entities,
            known,
        )
        .map_err(|e| plan_error(&e, "subject"))?;
        Ok(finish(vec![Side::from_residuals(res, &b.meta)]))
    }

    /// Turns the memo of plan sides on (the default) or off. With it on, a plan whose
    /// principal, action, resource type, context, principal's entities and bundle are those of
    /// an earlier plan reuses that plan's filters (never its qid); off, every plan runs partial
    /// evaluation (for measuring that path).
    pub fn set_plan_memo(&self, on: bool) {
        self.plan_memo.store(on, Ordering::Relaxed);
    }
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
