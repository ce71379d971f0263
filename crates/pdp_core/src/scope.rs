//! Policy pruning by scope: the policies of a bundle that can apply to one request environment
//! (action, principal type, resource type), so checks and plans hand Cedar only those.
//!
//! A policy's scope (`principal`, `action`, `resource` constraints) is the first thing Cedar
//! evaluates, and it never errors: a policy whose scope cannot match the request is neither
//! satisfied nor erroneous, so leaving it out changes no decision, no `policies` list and no
//! residual. A policy is left out only when its scope provably cannot match:
//!
//! * `action == A'` or `action in [...]` with neither the request's action nor one of its
//!   ancestors listed (the action hierarchy comes from the schema; without a schema, or when a
//!   declared entity type could shadow an action, only `action == A'` prunes);
//! * `principal == E` or `principal is T` (also `is T in E`) with another type than the
//!   principal's; the same for `resource`.
//!
//! `in E` constraints without `is` never prune: any type may be an ancestor. The subsets are built
//! lazily per environment and kept for the bundle's life (a new bundle starts empty).
//!
//! Each subset also keeps its policies compiled for checks ([`Compiled`]): the condition Cedar
//! evaluates for a policy (scope and `when`/`unless` clauses as one expression, which Cedar's
//! authorizer rebuilds on every call) built once, so a check only interprets it
//! ([`Scoped::satisfied`]).

use crate::store::FastMap;
use cedar_policy::{
    ActionConstraint, EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, PrincipalConstraint,
    ResourceConstraint,
};
use cedar_policy_core::ast::{Expr, Literal, SlotEnv, ValueKind};
use cedar_policy_core::evaluator::Evaluator;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Most environments kept per bundle; beyond it, subsets are computed but not kept. Schemas
/// bound the number of environments; this only guards bundles without one.
const MAX_ENVS: usize = 4096;

/// One policy ready for checks: its id and the condition Cedar's authorizer would evaluate for it
/// (`ast::Policy::condition`, with the link's slot values for a template-linked policy).
#[derive(Debug)]
pub(crate) struct Compiled {
    id: PolicyId,
    condition: Expr,
    slots: SlotEnv,
}

/// The policies of a bundle that can apply to one request environment.
#[derive(Debug)]
pub(crate) struct Scoped {
    /// Those policies compiled for checks, in the policy set's order.
    compiled: Vec<Compiled>,
    /// The subset of the bundle's policies (for plans); `None` when it could not be built, and
    /// then plans use the whole set, which is always correct.
    pub(crate) policies: Option<PolicySet>,
}

impl Scoped {
    /// The ids of the policies satisfied by the request `eval` was built for, in the policy
    /// set's order: exactly those Cedar's authorizer reports as satisfied (a policy whose
    /// condition errors or is not `true` is not satisfied, as with Cedar's `ErrorHandling::Skip`;
    /// `cedar_policy_core::authorizer::Authorizer::is_authorized_core`). Both effects are
    /// reported; the caller applies the verdict rules (DESIGN 4).
    pub(crate) fn satisfied<'s>(
        &'s self,
        eval: &'s Evaluator<'_>,
    ) -> impl Iterator<Item = &'s PolicyId> + 's {
        self.compiled
            .iter()
            .filter_map(move |c| match eval.interpret(&c.condition, &c.slots) {
                Ok(v) if matches!(v.value, ValueKind::Lit(Literal::Bool(true))) => Some(&c.id),
                _ => None,
            })
    }
}

type EnvKey = (EntityUid, EntityTypeName, EntityTypeName);

/// Lazily built [`Scoped`] subsets of one bundle, safe to share between threads.
#[derive(Debug, Default)]
pub(crate) struct ScopeIndex {
    /// Every action's transitive ancestors, when the schema fixes the action hierarchy.
    action_ancestors: Option<HashMap<EntityUid, HashSet<EntityUid>>>,
    cache: RwLock<FastMap<EnvKey, Arc<Scoped>>>,
}

impl ScopeIndex {
    /// An empty index. `action_ancestors` are the schema's actions with all their ancestors,
    /// or `None` when the action hierarchy is not fixed by a schema.
    pub(crate) fn new(action_ancestors: Option<HashMap<EntityUid, HashSet<EntityUid>>>) -> Self {
        Self {
            action_ancestors,
            cache: RwLock::new(FastMap::default()),
        }
    }

    /// The same index with nothing cached (for a bundle whose policies change).
    pub(crate) fn emptied(&self) -> Self {
        Self::new(self.action_ancestors.clone())
    }

    /// The policies of `policies` that can apply when a principal of type `principal` performs
    /// `action` on a resource of type `resource`.
    pub(crate) fn get(
        &self,
        policies: &PolicySet,
        action: &EntityUid,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> Arc<Scoped> {
        let key: EnvKey = (action.clone(), principal.clone(), resource.clone());
        if let Some(s) = self
            .cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
        {
            return Arc::clone(s);
        }
        // An action the hierarchy does not list keeps every `action in` policy.
        let ancestors = self.action_ancestors.as_ref().and_then(|m| m.get(action));
        let keep: Vec<&Policy> = policies
            .policies()
            .filter(|p| may_apply(p, action, ancestors, principal, resource))
            .collect();
        let compiled = keep
            .iter()
            .map(|p| {
                let ast: &cedar_policy_core::ast::Policy = (*p).as_ref();
                Compiled {
                    id: p.id().clone(),
                    condition: ast.condition(),
                    slots: ast.env().clone(),
                }
            })
            .collect();
        let ids: Vec<&PolicyId> = keep.iter().map(|p| p.id()).collect();
        let scoped = Arc::new(Scoped {
            compiled,
            policies: subset(policies, &ids),
        });
        let mut g = self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.len() < MAX_ENVS {
            g.insert(key, Arc::clone(&scoped));
        }
        scoped
    }
}

/// Whether `p`'s scope can match the environment (see the module docs). `ancestors`: the
/// action's ancestors when the action hierarchy is known, else `None` (then `action in` keeps).
fn may_apply(
    p: &Policy,
    action: &EntityUid,
    ancestors: Option<&HashSet<EntityUid>>,
    principal: &EntityTypeName,
    resource: &EntityTypeName,
) -> bool {
    let action_ok = match p.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => &a == action,
        ActionConstraint::In(list) => match ancestors {
            None => true,
            Some(anc) => list.iter().any(|a| a == action || anc.contains(a)),
        },
    };
    let principal_ok = match p.principal_constraint() {
        PrincipalConstraint::Any | PrincipalConstraint::In(_) => true,
        PrincipalConstraint::Eq(e) => e.type_name() == principal,
        PrincipalConstraint::Is(t) | PrincipalConstraint::IsIn(t, _) => &t == principal,
    };
    let resource_ok = match p.resource_constraint() {
        ResourceConstraint::Any | ResourceConstraint::In(_) => true,
        ResourceConstraint::Eq(e) => e.type_name() == resource,
        ResourceConstraint::Is(t) | ResourceConstraint::IsIn(t, _) => &t == resource,
    };
    action_ok && principal_ok && resource_ok
}

/// The policies `keep` of `src` (static or template-linked, with the same ids) as a new set.
fn subset(src: &PolicySet, keep: &[&PolicyId]) -> Option<PolicySet> {
    let mut out = PolicySet::new();
    for id in keep {
        let p = src.policy(id)?;
        if p.is_static() {
            out.add(p.clone()).ok()?;
        } else {
            let tid = p.template_id()?;
            if out.template(tid).is_none() {
                out.add_template(src.template(tid)?.clone()).ok()?;
            }
            out.link(tid.clone(), (*id).clone(), p.template_links()?)
                .ok()?;
        }
    }
    Some(out)
}
