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
//! authorizer rebuilds on every call) built once, and that condition compiled for checks
//! ([`crate::condition`]), so a check evaluates it over borrowed values and hands Cedar's
//! interpreter only what the compiled form leaves to it ([`Scoped::satisfied`]).
//!
//! And it records which entity-valued attributes those conditions dereference ([`Derefs`]), so a
//! check's entity slice holds only the referenced entities the evaluation can look up. Cedar
//! looks an entity up only to read its attributes or tags (`.`, `has`, `getTag`, `hasTag`) or
//! its ancestors (the left side of `in`); an entity that is merely compared (`==`, `contains`,
//! the right side of `in`) need not be present, and its absence changes nothing.

use crate::condition::{Condition, Env, Outcome};
use crate::maps::FastHasher;
use cedar_policy::{
    ActionConstraint, EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, PrincipalConstraint,
    ResourceConstraint,
};
use cedar_policy_core::ast::{BinaryOp, Expr, ExprKind, SlotEnv, Var};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Most environments kept per bundle; beyond it, subsets are computed but not kept. Schemas
/// bound the number of environments; this only guards bundles without one.
const MAX_ENVS: usize = 4096;

/// One policy ready for checks: its id and the condition Cedar's authorizer would evaluate for it
/// (`ast::Policy::condition`, with the link's slot values for a template-linked policy), and
/// that condition compiled ([`Condition`]; `None` when it holds what only Cedar evaluates).
#[derive(Debug)]
pub(crate) struct Compiled {
    id: PolicyId,
    condition: Expr,
    slots: SlotEnv,
    fast: Option<Condition>,
}

/// Which attributes of an entity in a check's slice hold entities the policies may look up:
/// the slice adds the entities those attributes reference (at any depth of sets and records),
/// each with its ancestors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Follow {
    /// Every attribute (the conservative answer).
    all: bool,
    /// These attributes (when not `all`).
    attrs: Vec<Box<str>>,
}

/// Every attribute: the slice of the one-hop contract in full.
pub(crate) static FOLLOW_ALL: Follow = Follow::ALL;
/// No attribute.
pub(crate) static FOLLOW_NONE: Follow = Follow {
    all: false,
    attrs: Vec::new(),
};

impl Follow {
    const ALL: Self = Self {
        all: true,
        attrs: Vec::new(),
    };

    /// Whether the entities referenced by attribute `attr` belong in the slice.
    pub(crate) fn takes(&self, attr: &str) -> bool {
        self.all || self.attrs.iter().any(|a| &**a == attr)
    }

    /// Whether any attribute is followed.
    pub(crate) fn any(&self) -> bool {
        self.all || !self.attrs.is_empty()
    }

    fn add(&mut self, attr: &str) {
        if !self.takes(attr) {
            self.attrs.push(attr.into());
        }
    }
}

/// The attributes followed from each root of a check's slice (see [`Follow`]): the principal
/// (`principal.a...`), the resource, and the entities the decision point puts in the context,
/// `context.agent` and `context.work_item`; and whether the slice must hold the ancestors of
/// the entities it holds.
///
/// Ancestors are read only as values: `in` looks at the left entity's own (pre-closed) ancestor
/// set, never at the ancestor entities. A condition can look an ancestor up only through a uid
/// it did not get from a root or a followed attribute: an entity literal or slot
/// (`Group::"admins".level`), a context value other than the agent and work item, the action's
/// attributes, or a read the analysis cannot place. Any of those sets `ancestors`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Derefs {
    pub(crate) principal: Follow,
    pub(crate) resource: Follow,
    pub(crate) agent: Follow,
    pub(crate) work_item: Follow,
    /// Whether the ancestors of every entity in the slice go in with it.
    pub(crate) ancestors: bool,
    /// Whether a condition looks the action entity up (`action in ...`, `action.a`), or may
    /// (every read that sets `ancestors` sets this too); else the slice leaves it out (scope
    /// constraints the index settled are not in the conditions).
    pub(crate) action: bool,
}

/// Every attribute of every root: the one-hop slice in full (plans use it).
pub(crate) static DEREFS_ALL: Derefs = Derefs::ALL;

impl Derefs {
    const ALL: Self = Self {
        principal: Follow::ALL,
        resource: Follow::ALL,
        agent: Follow::ALL,
        work_item: Follow::ALL,
        ancestors: true,
        action: true,
    };

    /// What `conditions` dereference. A condition that dereferences something other than a
    /// root or one of its attributes (`(if c then a else b).x`, `principal.a.b.c`, ...) makes
    /// the answer [`Derefs::ALL`], so the slice is never smaller than the one-hop contract
    /// needs.
    pub(crate) fn of<'e>(conditions: impl IntoIterator<Item = &'e Expr>) -> Self {
        let mut d = Self::default();
        let mut all = false;
        for c in conditions {
            walk(c, &mut d, &mut all);
            if all {
                return Self::ALL;
            }
        }
        d
    }
}

/// Records in `d` every dereference in `e` (see [`Derefs::of`]); sets `all` when one cannot be
/// placed.
fn walk(e: &Expr, d: &mut Derefs, all: &mut bool) {
    match e.expr_kind() {
        ExprKind::GetAttr { expr, .. } | ExprKind::HasAttr { expr, .. } => {
            target(expr, &[], d, all);
            walk(expr, d, all);
        }
        ExprKind::ExtHasAttr { expr, attrs } => {
            // `e has a.b.c` reads `e`, `e.a` and `e.a.b`.
            let attrs: Vec<&str> = attrs.iter().map(|a| a.as_str()).collect();
            for n in 0..attrs.len() {
                target(expr, attrs.get(..n).unwrap_or_default(), d, all);
            }
            walk(expr, d, all);
        }
        ExprKind::BinaryApp { op, arg1, arg2 } => {
            if matches!(op, BinaryOp::In | BinaryOp::GetTag | BinaryOp::HasTag) {
                target(arg1, &[], d, all);
            }
            walk(arg1, d, all);
            walk(arg2, d, all);
        }
        ExprKind::Lit(_) | ExprKind::Var(_) | ExprKind::Slot(_) | ExprKind::Unknown(_) => {}
        ExprKind::If {
            test_expr,
            then_expr,
            else_expr,
        } => {
            walk(test_expr, d, all);
            walk(then_expr, d, all);
            walk(else_expr, d, all);
        }
        ExprKind::And { left, right } | ExprKind::Or { left, right } => {
            walk(left, d, all);
            walk(right, d, all);
        }
        ExprKind::UnaryApp { arg, .. } => walk(arg, d, all),
        ExprKind::Like { expr, .. } | ExprKind::Is { expr, .. } => walk(expr, d, all),
        ExprKind::ExtensionFunctionApp { args, .. } | ExprKind::Set(args) => {
            args.iter().for_each(|a| walk(a, d, all));
        }
        ExprKind::Record(fields) => fields.values().for_each(|a| walk(a, d, all)),
        #[allow(unreachable_patterns)]
        _ => *all = true,
    }
}

/// Records that the value of `e.extra[0].extra[1]...` may be looked up as an entity.
fn target(e: &Expr, extra: &[&str], d: &mut Derefs, all: &mut bool) {
    let mut path: Vec<&str> = Vec::new();
    let mut cur = e;
    while let ExprKind::GetAttr { expr, attr } = cur.expr_kind() {
        path.push(attr.as_str());
        cur = expr;
    }
    path.reverse();
    path.extend_from_slice(extra);
    match (cur.expr_kind(), path.as_slice()) {
        // The action itself: its entity goes in the slice.
        (ExprKind::Var(Var::Action), []) => d.action = true,
        // A root itself.
        (ExprKind::Var(_), []) => {}
        (ExprKind::Var(Var::Principal), [a]) => d.principal.add(a),
        (ExprKind::Var(Var::Resource), [a]) => d.resource.add(a),
        (ExprKind::Var(Var::Context), [root, rest @ ..]) => match (*root, rest) {
            ("agent" | "work_item", []) => {}
            ("agent", [a]) => d.agent.add(a),
            ("work_item", [a]) => d.work_item.add(a),
            ("agent" | "work_item", _) => *all = true,
            // Any other context value is in the slice only if it is a root or an ancestor of
            // one; keep the ancestors (and the action, which a context value may name).
            _ => {
                d.ancestors = true;
                d.action = true;
            }
        },
        // An entity literal or slot, or what the action's attributes hold: in the slice only if
        // it is a root or an ancestor of one.
        (ExprKind::Lit(_) | ExprKind::Slot(_) | ExprKind::Var(Var::Action), _) => {
            d.ancestors = true;
            d.action = true;
        }
        _ => *all = true,
    }
}

/// The policies of a bundle that can apply to one request environment.
#[derive(Debug)]
pub(crate) struct Scoped {
    /// Those policies compiled for checks: the plain forbids first, then the others, each part
    /// in the policy set's order.
    compiled: Vec<Compiled>,
    /// How many of `compiled` are plain forbids (forbids without `@challenge`).
    plain_forbids: usize,
    /// What their conditions dereference: the slice a check needs.
    pub(crate) derefs: Derefs,
    /// The subset of the bundle's policies (for plans); `None` when it could not be built, and
    /// then plans use the whole set, which is always correct.
    pub(crate) policies: Option<PolicySet>,
    /// Whether the schema lets the action take principals and resources of these types, so
    /// that Cedar's scope checks of request validation cannot fail
    /// (`crate::lookups::Lookups::types_valid`); kept here so a check finds it in the same
    /// lookup as its policies.
    pub(crate) types_valid: bool,
}

impl Scoped {
    /// The ids of the policies that decide the request `env` describes: the satisfied plain
    /// forbids (forbids without `@challenge`) when at least one is satisfied, else every
    /// satisfied policy, in the order of `compiled`. A policy is satisfied exactly when Cedar's
    /// authorizer reports it so (a policy whose condition errors or is not `true` is not, as
    /// with Cedar's `ErrorHandling::Skip`;
    /// `cedar_policy_core::authorizer::Authorizer::is_authorized_core`); the caller applies the
    /// verdict rules (docs/decisions.md#one-principals-verdict).
    ///
    /// Each condition is evaluated in its compiled form ([`crate::condition`]) over `env`;
    /// `cedar(condition, slots)` (Cedar's interpreter over the same request and slice: whether
    /// the condition is `true`) answers for a condition the compiled form leaves to Cedar, and,
    /// in debug builds, is asked too for every compiled answer, which must agree.
    ///
    /// Under those rules a satisfied plain forbid denies whatever else holds, and the policies
    /// a denial names are the satisfied plain forbids alone. So once one is satisfied, the
    /// other policies cannot change the verdict or the names, and they are not evaluated: on
    /// document_cloud's request mix, a third of the checks are such denials.
    ///
    /// # Errors
    /// What `cedar` returns (it builds Cedar's side of the check on first use, which can fail).
    pub(crate) fn satisfied<'s, E>(
        &'s self,
        env: &Env<'_>,
        mut cedar: impl FnMut(&Expr, &SlotEnv) -> Result<bool, E>,
    ) -> Result<Vec<&'s PolicyId>, E> {
        let mut holds = |c: &'s Compiled| -> Result<Option<&'s PolicyId>, E> {
            let fast = c.fast.as_ref().map_or(Outcome::Cedar, |f| f.eval(env));
            let yes = match fast {
                Outcome::True => true,
                Outcome::NotTrue => false,
                Outcome::Cedar => cedar(&c.condition, &c.slots)?,
            };
            #[cfg(debug_assertions)]
            if fast != Outcome::Cedar {
                let says = cedar(&c.condition, &c.slots)?;
                debug_assert_eq!(
                    yes, says,
                    "compiled condition of {} disagrees with Cedar",
                    c.id
                );
            }
            Ok(yes.then_some(&c.id))
        };
        let (forbids, others) = self.compiled.split_at(self.plain_forbids);
        let mut denied: Vec<&PolicyId> = Vec::new();
        for c in forbids {
            denied.extend(holds(c)?);
        }
        if !denied.is_empty() {
            return Ok(denied);
        }
        let mut out = Vec::new();
        for c in others {
            out.extend(holds(c)?);
        }
        Ok(out)
    }
}

type EnvKey = (EntityUid, EntityTypeName, EntityTypeName);

/// An [`EnvKey`] by reference, to look one up without cloning its uid and names. It hashes as
/// the tuple does (each part in order) and compares part by part.
#[derive(Hash)]
struct EnvRef<'a>(&'a EntityUid, &'a EntityTypeName, &'a EntityTypeName);

impl hashbrown::Equivalent<EnvKey> for EnvRef<'_> {
    fn equivalent(&self, key: &EnvKey) -> bool {
        self.0 == &key.0 && self.1 == &key.1 && self.2 == &key.2
    }
}

/// Lazily built [`Scoped`] subsets of one bundle, safe to share between threads.
#[derive(Debug, Default)]
pub(crate) struct ScopeIndex {
    /// Every action's transitive ancestors, when the schema fixes the action hierarchy
    /// (shared with the bundle, which computes them).
    action_ancestors: Option<Arc<HashMap<EntityUid, HashSet<EntityUid>>>>,
    cache: RwLock<hashbrown::HashMap<EnvKey, Arc<Scoped>, FastHasher>>,
}

impl ScopeIndex {
    /// An empty index. `action_ancestors` are the schema's actions with all their ancestors,
    /// or `None` when the action hierarchy is not fixed by a schema.
    pub(crate) fn new(
        action_ancestors: Option<Arc<HashMap<EntityUid, HashSet<EntityUid>>>>,
    ) -> Self {
        Self {
            action_ancestors,
            cache: RwLock::new(hashbrown::HashMap::default()),
        }
    }

    /// The [`Scoped`] subset of `action` on a principal of type `principal` and a resource of
    /// type `resource` if it was built already ([`ScopeIndex::get`]), else `None`.
    pub(crate) fn cached(
        &self,
        action: &EntityUid,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> Option<Arc<Scoped>> {
        self.cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&EnvRef(action, principal, resource))
            .cloned()
    }

    /// The policies of `policies` that can apply when a principal of type `principal` performs
    /// `action` on a resource of type `resource`. `plain_forbid` tells the forbids without
    /// `@challenge` (from the bundle's policy metadata), which checks evaluate first
    /// ([`Scoped::satisfied`]); `types_valid` answers [`Scoped::types_valid`] when the subset is
    /// built (every caller must give the same answer for the same types, since the subset is
    /// cached for all).
    pub(crate) fn get(
        &self,
        policies: &PolicySet,
        plain_forbid: impl Fn(&PolicyId) -> bool,
        types_valid: impl FnOnce() -> bool,
        action: &EntityUid,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> Arc<Scoped> {
        if let Some(s) = self.cached(action, principal, resource) {
            return s;
        }
        // An action the hierarchy does not list keeps every `action in` policy.
        let ancestors = self.action_ancestors.as_ref().and_then(|m| m.get(action));
        let keep: Vec<(&Policy, ScopeTruth)> = policies
            .policies()
            .map(|p| (p, ScopeTruth::of(p, action, ancestors, principal, resource)))
            .filter(|(_, truth)| truth.may_apply())
            .collect();
        let (mut first, rest): (Vec<_>, Vec<_>) =
            keep.iter().partition(|(p, _)| plain_forbid(p.id()));
        let plain_forbids = first.len();
        first.extend(rest);
        let compiled = first
            .into_iter()
            .map(|&(p, truth)| {
                let ast: &cedar_policy_core::ast::Policy = p.as_ref();
                let condition = condition_for(ast, truth);
                Compiled {
                    id: p.id().clone(),
                    fast: Condition::compile(&condition, ast.env()),
                    condition,
                    slots: ast.env().clone(),
                }
            })
            .collect::<Vec<Compiled>>();
        let ids: Vec<&PolicyId> = keep.iter().map(|(p, _)| p.id()).collect();
        let scoped = Arc::new(Scoped {
            derefs: Derefs::of(compiled.iter().map(|c| &c.condition)),
            compiled,
            plain_forbids,
            policies: subset(policies, &ids),
            types_valid: types_valid(),
        });
        let mut g = self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if g.len() < MAX_ENVS {
            g.insert(
                (action.clone(), principal.clone(), resource.clone()),
                Arc::clone(&scoped),
            );
        }
        scoped
    }
}

/// What a policy's scope constraints are for every request of one environment: `Some(true)`
/// holds for all of them, `Some(false)` for none, `None` depends on the request.
#[derive(Debug, Clone, Copy)]
struct ScopeTruth {
    principal: Option<bool>,
    action: Option<bool>,
    resource: Option<bool>,
}

impl ScopeTruth {
    /// The truth of `p`'s scope for `action` on a principal of type `principal` and a resource
    /// of type `resource` (see the module docs). `ancestors`: the action's ancestors when the
    /// schema fixes the action hierarchy, else `None` (then `action in` depends on the request).
    /// `principal == E` and `in` constraints depend on the request unless `E`'s type differs;
    /// `principal is T` is decided by the type alone.
    fn of(
        p: &Policy,
        action: &EntityUid,
        ancestors: Option<&HashSet<EntityUid>>,
        principal: &EntityTypeName,
        resource: &EntityTypeName,
    ) -> Self {
        let unless_other_type = |same: bool| if same { None } else { Some(false) };
        Self {
            principal: match p.principal_constraint() {
                PrincipalConstraint::Any => Some(true),
                PrincipalConstraint::In(_) => None,
                PrincipalConstraint::Eq(e) => unless_other_type(e.type_name() == principal),
                PrincipalConstraint::Is(t) => Some(&t == principal),
                PrincipalConstraint::IsIn(t, _) => unless_other_type(&t == principal),
            },
            action: match p.action_constraint() {
                ActionConstraint::Any => Some(true),
                ActionConstraint::Eq(a) => Some(&a == action),
                ActionConstraint::In(list) => {
                    ancestors.map(|anc| list.iter().any(|a| a == action || anc.contains(a)))
                }
            },
            resource: match p.resource_constraint() {
                ResourceConstraint::Any => Some(true),
                ResourceConstraint::In(_) => None,
                ResourceConstraint::Eq(e) => unless_other_type(e.type_name() == resource),
                ResourceConstraint::Is(t) => Some(&t == resource),
                ResourceConstraint::IsIn(t, _) => unless_other_type(&t == resource),
            },
        }
    }

    /// Whether the scope can match some request of the environment: no constraint is false
    /// for all of them.
    fn may_apply(self) -> bool {
        [self.principal, self.action, self.resource]
            .iter()
            .all(|t| *t != Some(false))
    }
}

/// The condition Cedar evaluates for `p` (`ast::Policy::condition`: principal, action and
/// resource constraints and the `when`/`unless` body, joined by `&&` in that order), less the
/// scope constraints `truth` says hold for every request of the environment. Scope constraints
/// never error, and `true && x` is `x` (errors included), so the policy is satisfied exactly
/// when Cedar's full condition is.
fn condition_for(ast: &cedar_policy_core::ast::Policy, truth: ScopeTruth) -> Expr {
    let mut parts: Vec<Expr> = Vec::with_capacity(4);
    if truth.principal != Some(true) {
        parts.push(ast.principal_constraint().as_expr());
    }
    if truth.action != Some(true) {
        parts.push(ast.action_constraint().as_expr());
    }
    if truth.resource != Some(true) {
        parts.push(ast.resource_constraint().as_expr());
    }
    if let Some(body) = ast.non_scope_constraints() {
        parts.push(body.clone());
    }
    // Right-nested like Cedar's own: a && (b && (c && d)).
    let mut it = parts.into_iter().rev();
    let last = it.next().unwrap_or_else(|| Expr::val(true));
    it.fold(last, |acc, e| Expr::and(e, acc))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::str::FromStr;

    fn derefs(src: &str) -> Derefs {
        let set = PolicySet::from_str(src).unwrap();
        let conds: Vec<Expr> = set
            .policies()
            .map(|p| AsRef::<cedar_policy_core::ast::Policy>::as_ref(p).condition())
            .collect();
        Derefs::of(conds.iter())
    }

    fn follows(f: &Follow) -> Vec<&str> {
        let mut v: Vec<&str> = f.attrs.iter().map(|a| &**a).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn compared_entities_are_not_followed() {
        let d = derefs(
            r#"permit (principal, action, resource) when {
                 resource.owner == principal && principal in resource.readers &&
                 resource.tags.contains(principal.team) && principal has blocked };"#,
        );
        assert_eq!(d, Derefs::default());
    }

    #[test]
    fn read_through_attributes_are_followed() {
        let d = derefs(
            r#"permit (principal, action, resource) when {
                 resource.owner.blocked.contains(principal) && resource.meta.rank > 2 };
               forbid (principal, action, resource) when {
                 principal.manager in Group::"g" && principal has boss.name &&
                 context.agent.owner.hasTag("x") && context.work_item.project.key == "k" };"#,
        );
        assert!(!d.principal.all && !d.resource.all);
        assert_eq!(follows(&d.resource), vec!["meta", "owner"]);
        assert_eq!(follows(&d.principal), vec!["boss", "manager"]);
        assert_eq!(follows(&d.agent), vec!["owner"]);
        assert_eq!(follows(&d.work_item), vec!["project"]);
        assert!(!d.ancestors);
    }

    #[test]
    fn literal_or_context_lookups_keep_ancestors() {
        for src in [
            r#"permit (principal, action, resource) when { Group::"admins".level > 1 };"#,
            r#"permit (principal, action, resource) when { context.team has name };"#,
            r#"permit (principal, action, resource) when { Group::"a" in Group::"b" };"#,
            r#"permit (principal, action, resource) when { action.meta.x == 1 };"#,
            // A record or an entity: without types, the analysis cannot tell.
            r#"permit (principal, action, resource) when { context.request.ip == "1" };"#,
        ] {
            let d = derefs(src);
            assert!(d.ancestors, "{src}");
            assert!(!d.principal.all && !d.resource.all, "{src}");
        }
    }

    #[test]
    fn the_action_entity_is_kept_only_when_looked_up() {
        for src in [
            r#"permit (principal, action == Action::"a", resource);"#,
            r#"permit (principal, action, resource) when { action == Action::"a" };"#,
            r#"permit (principal, action, resource) when { principal in action };"#,
        ] {
            assert!(!derefs(src).action, "{src}");
        }
        for src in [
            r#"permit (principal, action in [Action::"a", Action::"b"], resource);"#,
            r#"permit (principal, action, resource) when { action in Action::"g" };"#,
            r#"permit (principal, action, resource) when { action.meta.x == 1 };"#,
            r#"permit (principal, action, resource) when { Action::"a".x == 1 };"#,
            r#"permit (principal, action, resource) when { context.a has x };"#,
        ] {
            assert!(derefs(src).action, "{src}");
        }
    }

    #[test]
    fn deeper_or_computed_reads_follow_everything() {
        for src in [
            r#"permit (principal, action, resource) when { resource.owner.manager.level > 1 };"#,
            r#"permit (principal, action, resource) when { (if context.a then resource.owner else principal).level > 1 };"#,
            r#"permit (principal, action, resource) when { context.agent.owner.team.x == 1 };"#,
        ] {
            assert_eq!(derefs(src), Derefs::ALL, "{src}");
        }
    }
}
