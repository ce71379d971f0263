//! Checks (docs/decisions.md, docs/architecture.md#verdicts-challenges-and-mode): resolving a
//! request against the snapshot, one principal's verdict from its satisfied policies, and the
//! combination with the person an agent acts for into a [`Decision`]. Also the rules checks and
//! plans share: built-in denials, `on_behalf_of`, and the context each principal is checked
//! with.

use super::slice::{entities_of, gather, CheckCtx, Inline, Slice};
use super::snapshot::State;
use super::state::{Engine, Prefetcher};
use crate::bundle::{Bundle, Declared};
use crate::decision::{Decision, Outcome, Verdict};
use crate::error::{chain, RequestError};
use crate::limits::{self, DepthCheck};
use crate::memo::{Injected, MemoContext};
use crate::request::{parse_uid, CheckRequest};
use crate::scope::DEREFS_ALL;
use crate::store::{Hierarchy, StoredEntity, WorkItem, Written};
use cedar_policy::{Context, Effect, Entities, EntityUid, Request, RequestValidationError};
use cedar_policy_core::ast::EntityUIDEntry;
use cedar_policy_core::evaluator::Evaluator;
use cedar_policy_core::extensions::Extensions;
use serde_json::{Map, Value};
use std::cell::OnceCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Built-in reason: the principal is contained (docs/architecture.md#built-in-denials).
pub const REASON_CONTAINED: &str = "svc:contained";
/// Built-in reason: the service account is not registered (docs/architecture.md#built-in-denials).
pub const REASON_UNREGISTERED: &str = "svc:unregistered";
/// Built-in reason: a `verification` challenge fired but nobody is present to answer it.
pub const REASON_HUMAN_NOT_PRESENT: &str = "svc:human_not_present";

impl Engine {
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
        let scoped = st.caches.scopes.cached(&action, p_type, r_type);
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
        if subject.type_name().basename() == "ServiceAccount" && !st.is_registered(subject) {
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
            _ => st.caches.scoped(
                b,
                cx.action,
                subject.type_name(),
                cx.req.resource.type_name(),
            ),
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
#[inline]
pub(super) fn context_for(
    st: &State,
    action: &EntityUid,
    subject: &EntityUid,
    agent: Option<&EntityUid>,
    caller: &Map<String, Value>,
    human_present: bool,
    assigned: bool,
    work_item: Option<&WorkItem>,
) -> Result<Arc<MemoContext>, RequestError> {
    context_with_risk(
        st,
        action,
        st.store.risk(subject),
        agent,
        caller,
        human_present,
        assigned,
        work_item,
    )
}

/// Whether the context of `action` takes the principal's `risk_score`: when it does not, every
/// principal's context is the same for the same request.
pub(super) fn takes_risk(st: &State, action: &EntityUid) -> bool {
    declared(st, action).risk_score
}

/// The fields svc fills into `action`'s context: all of them without a schema, else those
/// the action's context type declares.
fn declared(st: &State, action: &EntityUid) -> Declared {
    let b = &*st.bundle;
    match (b.schema.is_some(), b.injected.get(action)) {
        (false, _) => Declared::ALL,
        (true, Some(d)) => *d,
        (true, None) => Declared::NONE,
    }
}

/// [`context_for`] for a principal whose risk score is `risk` (0 to 100, `None` when it has
/// none): what a subject search plans with, where the principal is unknown
/// (docs/search.md#subject-search).
///
/// # Errors
/// As [`context_for`].
#[allow(clippy::too_many_arguments)]
pub(super) fn context_with_risk(
    st: &State,
    action: &EntityUid,
    risk: Option<i64>,
    agent: Option<&EntityUid>,
    caller: &Map<String, Value>,
    human_present: bool,
    assigned: bool,
    work_item: Option<&WorkItem>,
) -> Result<Arc<MemoContext>, RequestError> {
    let b = &*st.bundle;
    let takes = declared(st, action);
    let work_item = work_item
        .filter(|_| takes.work_item)
        .map(|w| w.entity.entity.uid());
    let inj = Injected {
        risk_score: risk.filter(|_| takes.risk_score),
        human_present: takes.human_present.then_some(human_present),
        assigned: takes.assigned.then_some(assigned),
        work_item: work_item.as_ref(),
        agent: agent.filter(|_| takes.agent),
    };
    st.caches.contexts.get_or_parse(action, caller, &inj, |v| {
        Context::from_json_value(v, b.schema.as_ref().map(|s| (s, action)))
            .map_err(|e| RequestError::new("context", chain(&e)))
    })
}

#[inline]
pub(super) fn elapsed_us(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// `on_behalf_of` rules (docs/decisions.md#an-agent-acting-for-a-person): only a `ServiceAccount`
/// acts for someone, and only for a `Human` the schema declares.
#[inline]
pub(super) fn check_on_behalf_of(
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
pub(super) fn inline_entities(
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
        se.check_ids(&f)?;
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
            .map(|e| Written::Stored(e).parents())
            .or_else(|| st.entity(u).map(Written::parents))
    });
    for (i, uid) in &order {
        if let Some(se) = inline.get(uid) {
            depth
                .depth(uid, Written::Stored(se).parents())
                .map_err(|e| RequestError::new(format!("entities[{i}].parents"), e.to_string()))?;
        }
    }
    Ok((inline, ignored))
}

/// Applies the verdict rules (docs/decisions.md#one-principals-verdict) to the satisfied policies
/// of one principal.
#[inline]
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
#[inline]
fn absent_human(o: &mut Outcome) {
    if o.verdict == Verdict::Challenge && o.challenges.iter().any(|c| c == "verification") {
        o.verdict = Verdict::Deny;
        o.challenges.clear();
        o.policies.push(REASON_HUMAN_NOT_PRESENT.to_owned());
    }
}
