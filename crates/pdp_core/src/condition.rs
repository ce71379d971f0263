//! Policy conditions compiled for checks: a policy's condition (scope and `when`/`unless`
//! clauses as one expression, [`crate::scope`]) turned once into a tree that a check walks over
//! borrowed values, instead of handing it to Cedar's interpreter.
//!
//! Cedar's `Evaluator` is written for partial evaluation too: every step builds a
//! `PartialValue`, clones the values it reads out of entities and the context, looks each
//! entity up again by hashing its uid, and stamps source locations on results. A check needs
//! none of that: it only asks whether a condition is `true`. Here an attribute read borrows the
//! value inside the entity, `principal`, `resource`, `action` and `context` are built once per
//! check, and entities are found in the check's slice (a handful of entities) by a scan. On
//! document_cloud a decision went from 40.8k to 24.5k instructions, request parsing and
//! response included (callgrind; docs/benchmarks.md, "Decision core", has where they go).
//!
//! The semantics are Cedar's, operator by operator, as `cedar_policy_core::evaluator` 4.14
//! defines them (and the Cedar language reference): the same short-circuits, the same type
//! errors, `in` and `has` on a missing entity the same, overflow an error. A check needs only
//! the outcome, and a policy is satisfied exactly when its condition evaluates to `true`; any
//! error means "not satisfied" whatever the error, so errors carry no detail here.
//!
//! What the tree does not model, it hands back to Cedar, so coverage never costs correctness:
//!
//! * at compile time, a condition holding an extension function call (`ip(...)`,
//!   `decimal(...)`, `.lessThan(...)`, ...) or an unknown is not compiled
//!   ([`Condition::compile`] returns `None`), and checks interpret it with Cedar;
//! * at run time, a comparison of extension values (`<` on `datetime`, ...) or a residual
//!   attribute value answers [`Outcome::Cedar`], and the check interprets that policy with Cedar.
//!
//! Debug builds check every compiled answer against Cedar's interpreter
//! ([`crate::scope::Scoped::satisfied`]), and a property test compares the two over generated
//! conditions and entities (tests at the end of this file).

use crate::store::{uid_hash, ClosedEntity, Filed};
use cedar_policy_core::ast::{
    BinaryOp, Entity, EntityType, EntityUID, Expr, ExprKind, Literal, PartialValue, Pattern, Set,
    SlotEnv, UnaryOp, Value, ValueKind, Var,
};
use smol_str::SmolStr;
use std::borrow::Cow;
use std::sync::Arc;

/// A compiled condition (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Condition(Node);

#[derive(Debug, Clone)]
enum Node {
    /// A literal, a template slot's entity, or a set of literals: a value known at compile time.
    Const(Value),
    Var(Var),
    If(Box<(Node, Node, Node)>),
    And(Box<(Node, Node)>),
    Or(Box<(Node, Node)>),
    Unary(UnaryOp, Box<Node>),
    Binary(BinaryOp, Box<(Node, Node)>),
    GetAttr(Box<Node>, SmolStr),
    /// `e.attr.contains(x)`: [`BinaryOp::Contains`] on an attribute, which can rule a uid out
    /// by the hashes a [`ClosedEntity`] files a small set of entities under.
    AttrContains(Box<(Node, Node)>, SmolStr),
    HasAttr(Box<Node>, SmolStr),
    /// `e has a.b.c`.
    HasPath(Box<Node>, Vec<SmolStr>),
    Like(Box<Node>, Pattern),
    Is(Box<Node>, EntityType),
    Set(Vec<Node>),
    Record(Vec<(SmolStr, Node)>),
}

/// What evaluating a compiled condition says about its policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The condition is `true`: the policy is satisfied.
    True,
    /// The condition is `false`, or not a boolean, or its evaluation errors: the policy is not
    /// satisfied (Cedar's `ErrorHandling::Skip`).
    NotTrue,
    /// The condition reached something this module does not model; ask Cedar.
    Cedar,
}

/// Why an evaluation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Cedar would raise an evaluation error (of whatever kind).
    Error,
    /// Not modelled here; Cedar must decide.
    Cedar,
}

type Res<T> = Result<T, Stop>;

/// Where a check's entities are found: the slice Cedar would be given for the same check.
#[derive(Clone, Copy)]
pub(crate) enum Entities<'a> {
    /// The pre-closed entities of the slice (a check's usual few), scanned.
    List(&'a [&'a ClosedEntity]),
    /// Cedar's own entities (a check with inline entities builds them anyway).
    Cedar(&'a cedar_policy_core::entities::Entities),
}

impl<'a> Entities<'a> {
    /// The entity `uid`, as Cedar's `Entities::entity` would find it (`None` for
    /// `Dereference::NoSuchEntity`; checks use concrete entities, so never a residual).
    fn get(self, uid: &EntityUID) -> Option<EntityRef<'a>> {
        match self {
            // The eid tells most entities of a slice apart before the types are compared.
            Self::List(list) => list
                .iter()
                .find(|e| e.uid().eid() == uid.eid() && e.uid() == uid)
                .map(|e| EntityRef::Closed(e)),
            Self::Cedar(es) => match es.entity(uid) {
                cedar_policy_core::entities::Dereference::Data(e) => Some(EntityRef::Cedar(e)),
                _ => None,
            },
        }
    }
}

/// One entity of a check's slice, from either kind of [`Entities`].
#[derive(Clone, Copy)]
enum EntityRef<'a> {
    /// The snapshot's record: `in` reads its own ancestor list ([`ClosedEntity`]).
    Closed(&'a ClosedEntity),
    /// Cedar's entity, with its ancestors closed.
    Cedar(&'a Entity),
}

impl<'a> EntityRef<'a> {
    /// The attribute `attr` (Cedar's `Entity::get`): `None` when there is none, an error
    /// ([`Stop::Cedar`]) when it is not a concrete value.
    fn get(self, attr: &str) -> Option<Res<&'a Value>> {
        self.get_filed(attr).map(|r| r.map(|(v, _)| v))
    }

    /// [`Self::get`], with the hashes of the entities in the value when the record files them
    /// ([`ClosedEntity::attr_filed`]).
    fn get_filed(self, attr: &str) -> Option<Res<Filed<'a>>> {
        match self {
            Self::Closed(c) => c.attr_filed(attr).map(|r| r.map_err(|_| Stop::Cedar)),
            Self::Cedar(e) => e.get(attr).map(|pv| concrete(pv).map(|v| (v, None))),
        }
    }

    /// The tag `tag` (Cedar's `Entity::get_tag`).
    fn get_tag(self, tag: &str) -> Option<&'a PartialValue> {
        match self {
            Self::Closed(c) => c.tag(tag),
            Self::Cedar(e) => e.get_tag(tag),
        }
    }

    /// Whether `target` is an ancestor (Cedar's `Entity::is_descendant_of`).
    fn is_descendant_of(self, target: &EntityUID) -> bool {
        match self {
            Self::Closed(c) => c.is_descendant_of(target),
            Self::Cedar(e) => e.is_descendant_of(target),
        }
    }
}

/// The request a compiled condition is evaluated for: the four variables as Cedar values, and
/// the entities of the check's slice. Built once per check and principal.
pub(crate) struct Env<'a> {
    principal: Value,
    action: Value,
    resource: Value,
    /// `None` for a context with unknowns (never a check's): reading it defers to Cedar.
    context: Option<Value>,
    entities: Entities<'a>,
    /// The principal's and the resource's entities, found once: most reads are of theirs.
    roots: [Option<EntityRef<'a>>; 2],
}

impl<'a> Env<'a> {
    /// The environment of a check of `principal` doing `action` on `resource` with `context`
    /// (the request's, as Cedar's `Request` holds it), over the check's slice `entities`.
    pub(crate) fn new(
        principal: &EntityUID,
        action: &EntityUID,
        resource: &EntityUID,
        context: &cedar_policy_core::ast::Context,
        entities: Entities<'a>,
    ) -> Self {
        let uid = |u: &EntityUID| Value::new(Literal::EntityUID(Arc::new(u.clone())), None);
        Self {
            principal: uid(principal),
            action: uid(action),
            resource: uid(resource),
            context: match context {
                cedar_policy_core::ast::Context::Value(m) => {
                    Some(Value::record_arc(Arc::clone(m), None))
                }
                cedar_policy_core::ast::Context::RestrictedResidual(_) => None,
            },
            roots: [entities.get(principal), entities.get(resource)],
            entities,
        }
    }

    /// The entity `uid` of the slice (see [`Entities::get`]); the principal's and resource's
    /// without a search when `uid` is the one this environment holds for them.
    fn entity(&self, uid: &EntityUID) -> Option<EntityRef<'a>> {
        for (root, found) in [&self.principal, &self.resource]
            .into_iter()
            .zip(self.roots)
        {
            if let ValueKind::Lit(Literal::EntityUID(r)) = &root.value {
                if std::ptr::eq(uid, &**r) {
                    return found;
                }
            }
        }
        self.entities.get(uid)
    }
}

static TRUE: Value = Value {
    value: ValueKind::Lit(Literal::Bool(true)),
    loc: None,
};
static FALSE: Value = Value {
    value: ValueKind::Lit(Literal::Bool(false)),
    loc: None,
};

fn boolean(b: bool) -> Cow<'static, Value> {
    Cow::Borrowed(if b { &TRUE } else { &FALSE })
}

fn owned<'a>(v: impl Into<ValueKind>) -> Cow<'a, Value> {
    Cow::Owned(Value::new(v, None))
}

/// Whether `v` is the boolean `true`: what makes a policy's condition satisfied (Cedar's
/// authorizer; anything else, another value or an error, is not).
pub(crate) fn is_true(v: &Value) -> bool {
    matches!(v.value, ValueKind::Lit(Literal::Bool(true)))
}

fn as_bool(v: &Value) -> Res<bool> {
    match &v.value {
        ValueKind::Lit(Literal::Bool(b)) => Ok(*b),
        _ => Err(Stop::Error),
    }
}

fn as_long(v: &Value) -> Res<i64> {
    match &v.value {
        ValueKind::Lit(Literal::Long(i)) => Ok(*i),
        _ => Err(Stop::Error),
    }
}

fn as_str(v: &Value) -> Res<&SmolStr> {
    match &v.value {
        ValueKind::Lit(Literal::String(s)) => Ok(s),
        _ => Err(Stop::Error),
    }
}

fn as_set(v: &Value) -> Res<&Set> {
    match &v.value {
        ValueKind::Set(s) => Ok(s),
        _ => Err(Stop::Error),
    }
}

fn as_uid(v: &Value) -> Res<&EntityUID> {
    match &v.value {
        ValueKind::Lit(Literal::EntityUID(u)) => Ok(u),
        _ => Err(Stop::Error),
    }
}

/// An attribute or tag value of an entity: a residual (never in a check's concrete entities)
/// defers to Cedar.
fn concrete(pv: &PartialValue) -> Res<&Value> {
    match pv {
        PartialValue::Value(v) => Ok(v),
        PartialValue::Residual(_) => Err(Stop::Cedar),
    }
}

impl Condition {
    /// Compiles `expr` (a policy's condition; `slots` fill a template-linked policy's
    /// `?principal`/`?resource`). `None` when the condition holds a construct this module
    /// leaves to Cedar: an extension function call, an unknown, an unfilled slot, or nesting
    /// deeper than [`MAX_DEPTH`].
    pub(crate) fn compile(expr: &Expr, slots: &SlotEnv) -> Option<Self> {
        compile(expr, slots, 0).map(Self)
    }

    /// Evaluates the condition for `env`: whether the policy is satisfied, or that Cedar must
    /// say ([`Outcome::Cedar`]).
    pub(crate) fn eval(&self, env: &Env<'_>) -> Outcome {
        match eval(&self.0, env).and_then(|v| as_bool(&v)) {
            Ok(true) => Outcome::True,
            Ok(false) | Err(Stop::Error) => Outcome::NotTrue,
            Err(Stop::Cedar) => Outcome::Cedar,
        }
    }
}

/// Deepest nesting compiled. Cedar's evaluator fails a condition with a recursion-limit error
/// when less than 100 KiB of stack is left, which depends on the thread and so on the depth;
/// conditions this shallow never get near it, and deeper ones (no real policy) stay with Cedar,
/// which then answers as it would.
const MAX_DEPTH: usize = 128;

fn boxed(e: &Expr, slots: &SlotEnv, depth: usize) -> Option<Box<Node>> {
    compile(e, slots, depth).map(Box::new)
}

fn pair(a: &Expr, b: &Expr, slots: &SlotEnv, depth: usize) -> Option<Box<(Node, Node)>> {
    Some(Box::new((
        compile(a, slots, depth)?,
        compile(b, slots, depth)?,
    )))
}

fn compile(e: &Expr, slots: &SlotEnv, depth: usize) -> Option<Node> {
    if depth > MAX_DEPTH {
        return None;
    }
    let d = depth + 1;
    Some(match e.expr_kind() {
        ExprKind::Lit(l) => Node::Const(Value::new(l.clone(), None)),
        ExprKind::Slot(id) => Node::Const(Value::new(
            Literal::EntityUID(Arc::new(slots.get(id)?.clone())),
            None,
        )),
        ExprKind::Var(v) => Node::Var(*v),
        ExprKind::If {
            test_expr,
            then_expr,
            else_expr,
        } => Node::If(Box::new((
            compile(test_expr, slots, d)?,
            compile(then_expr, slots, d)?,
            compile(else_expr, slots, d)?,
        ))),
        ExprKind::And { left, right } => Node::And(pair(left, right, slots, d)?),
        ExprKind::Or { left, right } => Node::Or(pair(left, right, slots, d)?),
        ExprKind::UnaryApp { op, arg } => Node::Unary(*op, boxed(arg, slots, d)?),
        ExprKind::BinaryApp {
            op: BinaryOp::Contains,
            arg1,
            arg2,
        } => match arg1.expr_kind() {
            ExprKind::GetAttr { expr, attr } => {
                Node::AttrContains(pair(expr, arg2, slots, d)?, attr.clone())
            }
            _ => Node::Binary(BinaryOp::Contains, pair(arg1, arg2, slots, d)?),
        },
        ExprKind::BinaryApp { op, arg1, arg2 } => Node::Binary(*op, pair(arg1, arg2, slots, d)?),
        ExprKind::GetAttr { expr, attr } => Node::GetAttr(boxed(expr, slots, d)?, attr.clone()),
        ExprKind::HasAttr { expr, attr } => Node::HasAttr(boxed(expr, slots, d)?, attr.clone()),
        ExprKind::ExtHasAttr { expr, attrs } => {
            Node::HasPath(boxed(expr, slots, d)?, attrs.iter().cloned().collect())
        }
        ExprKind::Like { expr, pattern } => Node::Like(boxed(expr, slots, d)?, pattern.clone()),
        ExprKind::Is { expr, entity_type } => Node::Is(boxed(expr, slots, d)?, entity_type.clone()),
        ExprKind::Set(items) => {
            let nodes = items
                .iter()
                .map(|i| compile(i, slots, d))
                .collect::<Option<Vec<_>>>()?;
            // A set of constants (an action scope's list, `["a", "b"]`) is built once.
            if nodes.iter().all(|n| matches!(n, Node::Const(_))) {
                let vals = nodes.into_iter().filter_map(|n| match n {
                    Node::Const(v) => Some(v),
                    _ => None,
                });
                Node::Const(Value::set(vals, None))
            } else {
                Node::Set(nodes)
            }
        }
        ExprKind::Record(fields) => Node::Record(
            fields
                .iter()
                .map(|(k, v)| Some((k.clone(), compile(v, slots, d)?)))
                .collect::<Option<Vec<_>>>()?,
        ),
        // Extension calls and unknowns stay Cedar's.
        ExprKind::ExtensionFunctionApp { .. } | ExprKind::Unknown(_) => return None,
        // And so does any form a later Cedar adds.
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

/// Evaluates `n` as Cedar's `Evaluator::interpret` would, to a value borrowed from the
/// condition, the environment or an entity where it can be.
fn eval<'a>(n: &'a Node, env: &'a Env<'a>) -> Res<Cow<'a, Value>> {
    match n {
        Node::Const(v) => Ok(Cow::Borrowed(v)),
        Node::Var(v) => Ok(Cow::Borrowed(match v {
            Var::Principal => &env.principal,
            Var::Action => &env.action,
            Var::Resource => &env.resource,
            Var::Context => env.context.as_ref().ok_or(Stop::Cedar)?,
        })),
        Node::If(b) => {
            let (test, then, other) = &**b;
            if as_bool(&*eval(test, env)?)? {
                eval(then, env)
            } else {
                eval(other, env)
            }
        }
        Node::And(b) => {
            let (l, r) = &**b;
            if !as_bool(&*eval(l, env)?)? {
                return Ok(boolean(false));
            }
            Ok(boolean(as_bool(&*eval(r, env)?)?))
        }
        Node::Or(b) => {
            let (l, r) = &**b;
            if as_bool(&*eval(l, env)?)? {
                return Ok(boolean(true));
            }
            Ok(boolean(as_bool(&*eval(r, env)?)?))
        }
        Node::Unary(op, arg) => {
            let v = eval(arg, env)?;
            match op {
                UnaryOp::Not => Ok(boolean(!as_bool(&v)?)),
                UnaryOp::Neg => as_long(&v)?
                    .checked_neg()
                    .map(|i| owned(Literal::Long(i)))
                    .ok_or(Stop::Error),
                UnaryOp::IsEmpty => Ok(boolean(as_set(&v)?.is_empty())),
            }
        }
        Node::Binary(op, b) => {
            let (l, r) = &**b;
            // Cedar evaluates both operands before it looks at the operator.
            let a = eval(l, env)?;
            let c = eval(r, env)?;
            binary(*op, &a, &c, env)
        }
        Node::GetAttr(e, attr) => {
            let v = eval(e, env)?;
            match v {
                Cow::Borrowed(v) => get_attr(v, attr, env).map(Cow::Borrowed),
                Cow::Owned(v) => get_attr(&v, attr, env).map(|x| Cow::Owned(x.clone())),
            }
        }
        Node::AttrContains(b, attr) => {
            let (e, x) = &**b;
            let v = eval(e, env)?;
            let Cow::Borrowed(v) = v else {
                // A record built by the condition itself: no hashes to use.
                let set = get_attr(&v, attr, env)?;
                let x = eval(x, env)?;
                return binary(BinaryOp::Contains, set, &x, env);
            };
            let (set, uids) = get_attr_filed(v, attr, env)?;
            let x = eval(x, env)?;
            if let (Some(uids), ValueKind::Lit(Literal::EntityUID(u))) = (uids, &x.value) {
                // `set` is a set (only sets have hashes), and `u` is in it only if its hash is.
                if !uids.contains(&uid_hash(u)) {
                    return Ok(boolean(false));
                }
            }
            binary(BinaryOp::Contains, set, &x, env)
        }
        Node::HasAttr(e, attr) => {
            let v = eval(e, env)?;
            Ok(boolean(has_attr(&v, attr, env)?))
        }
        Node::HasPath(e, attrs) => {
            let v = eval(e, env)?;
            has_path(&v, attrs, env).map(boolean)
        }
        Node::Like(e, pattern) => {
            let v = eval(e, env)?;
            Ok(boolean(pattern.wildcard_match(as_str(&v)?)))
        }
        Node::Is(e, ty) => {
            let v = eval(e, env)?;
            Ok(boolean(as_uid(&v)?.entity_type() == ty))
        }
        Node::Set(items) => {
            let vals = items
                .iter()
                .map(|i| eval(i, env).map(Cow::into_owned))
                .collect::<Res<Vec<Value>>>()?;
            Ok(Cow::Owned(Value::set(vals, None)))
        }
        Node::Record(fields) => {
            let vals = fields
                .iter()
                .map(|(k, i)| eval(i, env).map(|v| (k.clone(), v.into_owned())))
                .collect::<Res<Vec<(SmolStr, Value)>>>()?;
            Ok(Cow::Owned(Value::record(vals, None)))
        }
    }
}

/// `v.attr` on an entity or a record (Cedar's `get_attr`): a missing entity or attribute is
/// an error, as is any other kind of value.
fn get_attr<'v>(v: &'v Value, attr: &str, env: &Env<'v>) -> Res<&'v Value> {
    get_attr_filed(v, attr, env).map(|(v, _)| v)
}

/// [`get_attr`], with the hashes of the entities in the value where the entity's record files
/// them ([`ClosedEntity::attr_filed`]).
fn get_attr_filed<'v>(v: &'v Value, attr: &str, env: &Env<'v>) -> Res<Filed<'v>> {
    match &v.value {
        ValueKind::Record(r) => r.get(attr).map(|x| (x, None)).ok_or(Stop::Error),
        ValueKind::Lit(Literal::EntityUID(uid)) => {
            let e = env.entity(uid).ok_or(Stop::Error)?;
            e.get_filed(attr).ok_or(Stop::Error)?
        }
        _ => Err(Stop::Error),
    }
}

/// `v has attr`: on a missing entity `false`, on a value that is neither entity nor record an
/// error.
fn has_attr(v: &Value, attr: &str, env: &Env<'_>) -> Res<bool> {
    match &v.value {
        ValueKind::Record(r) => Ok(r.contains_key(attr)),
        ValueKind::Lit(Literal::EntityUID(uid)) => {
            Ok(env.entity(uid).is_some_and(|e| e.get(attr).is_some()))
        }
        _ => Err(Stop::Error),
    }
}

/// `v has a.b.c` (Cedar's `eval_extended_has_attr_value`): `v has a && v.a has b && ...`,
/// stopping at the first attribute missing.
fn has_path(v: &Value, attrs: &[SmolStr], env: &Env<'_>) -> Res<bool> {
    let mut cur = v;
    for attr in attrs {
        let next = match &cur.value {
            ValueKind::Record(r) => r.get(attr.as_str()),
            ValueKind::Lit(Literal::EntityUID(uid)) => match env.entity(uid) {
                Some(e) => e.get(attr).transpose()?,
                None => None,
            },
            _ => return Err(Stop::Error),
        };
        match next {
            Some(n) => cur = n,
            None => return Ok(false),
        }
    }
    Ok(true)
}

fn binary<'a>(op: BinaryOp, a: &Value, b: &Value, env: &Env<'a>) -> Res<Cow<'a, Value>> {
    match op {
        BinaryOp::Eq => Ok(boolean(a == b)),
        BinaryOp::Less | BinaryOp::LessEq => match (&a.value, &b.value) {
            (ValueKind::Lit(Literal::Long(x)), ValueKind::Lit(Literal::Long(y))) => {
                Ok(boolean(if op == BinaryOp::Less { x < y } else { x <= y }))
            }
            // Extension values (`datetime`, `duration`, `decimal`) order by their own rules.
            (ValueKind::ExtensionValue(_), _) | (_, ValueKind::ExtensionValue(_)) => {
                Err(Stop::Cedar)
            }
            _ => Err(Stop::Error),
        },
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul => {
            let (x, y) = (as_long(a)?, as_long(b)?);
            let r = match op {
                BinaryOp::Add => x.checked_add(y),
                BinaryOp::Sub => x.checked_sub(y),
                _ => x.checked_mul(y),
            };
            r.map(|i| owned(Literal::Long(i))).ok_or(Stop::Error)
        }
        BinaryOp::In => {
            let uid = as_uid(a)?;
            let entity = env.entity(uid);
            let under = |target: &EntityUID| {
                uid == target || entity.is_some_and(|e| e.is_descendant_of(target))
            };
            match &b.value {
                ValueKind::Lit(Literal::EntityUID(t)) => Ok(boolean(under(t))),
                ValueKind::Set(s) => {
                    // Every element must be an entity, even after a match (Cedar collects the
                    // uids before it tests them).
                    let targets = s.iter().map(as_uid).collect::<Res<Vec<_>>>()?;
                    Ok(boolean(targets.into_iter().any(under)))
                }
                _ => Err(Stop::Error),
            }
        }
        BinaryOp::Contains => Ok(boolean(as_set(a)?.contains(b))),
        BinaryOp::ContainsAll => {
            let (x, y) = (as_set(a)?, as_set(b)?);
            Ok(boolean(y.is_subset(x)))
        }
        BinaryOp::ContainsAny => {
            let (x, y) = (as_set(a)?, as_set(b)?);
            Ok(boolean(!x.is_disjoint(y)))
        }
        BinaryOp::GetTag | BinaryOp::HasTag => {
            let uid = as_uid(a)?;
            let tag = as_str(b)?;
            let entity = env.entity(uid);
            if op == BinaryOp::HasTag {
                return Ok(boolean(entity.is_some_and(|e| e.get_tag(tag).is_some())));
            }
            let e = entity.ok_or(Stop::Error)?;
            let v = concrete(e.get_tag(tag).ok_or(Stop::Error)?)?;
            Ok(Cow::Borrowed(v))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
    use super::*;
    use cedar_policy_core::evaluator::Evaluator;
    use cedar_policy_core::extensions::Extensions;
    use proptest::prelude::*;
    use std::str::FromStr;

    const ENTITIES: &str = r#"[
      {"uid": {"type": "User", "id": "alice"},
       "attrs": {"name": "alice", "age": 30, "manager": {"__entity": {"type": "User", "id": "bob"}},
                 "blocked": [{"__entity": {"type": "User", "id": "bob"}}],
                 "profile": {"level": 2, "team": {"__entity": {"type": "Team", "id": "t1"}}},
                 "nums": [1, 2, 3], "big": 9223372036854775807},
       "parents": [{"type": "Team", "id": "t2"}],
       "tags": {"t": "x", "n": 1}},
      {"uid": {"type": "User", "id": "bob"},
       "attrs": {"name": "bob", "age": -4, "blocked": [], "nums": [2],
                 "manager": {"__entity": {"type": "User", "id": "ghost"}}},
       "parents": [{"type": "Team", "id": "t1"}]},
      {"uid": {"type": "Team", "id": "t1"}, "attrs": {"name": "one"}, "parents": [{"type": "Org", "id": "o"}]},
      {"uid": {"type": "Team", "id": "t2"}, "attrs": {}, "parents": [{"type": "Org", "id": "o"}]},
      {"uid": {"type": "Org", "id": "o"}, "attrs": {"name": "org"}, "parents": []},
      {"uid": {"type": "Doc", "id": "d1"},
       "attrs": {"owner": {"__entity": {"type": "User", "id": "alice"}}, "isPrivate": false,
                 "readers": {"__entity": {"type": "Team", "id": "t1"}}, "name": "hello doc",
                 "ip": {"__extn": {"fn": "ip", "arg": "10.0.0.1"}},
                 "when": {"__extn": {"fn": "datetime", "arg": "2024-01-01"}}},
       "parents": [], "tags": {"t": {"__entity": {"type": "User", "id": "bob"}}}},
      {"uid": {"type": "Action", "id": "view"}, "attrs": {}, "parents": [{"type": "Action", "id": "read"}]}
    ]"#;

    const CONTEXT: &str = r#"{"authenticated": true, "n": 5, "s": "hello", "who": {"__entity": {"type": "User", "id": "bob"}},
        "set": [1, 2], "rec": {"a": {"b": 1}}, "at": {"__extn": {"fn": "datetime", "arg": "2025-01-01"}}}"#;

    fn leaf() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "principal",
            "resource",
            "action",
            "context",
            "User::\"alice\"",
            "User::\"bob\"",
            "User::\"ghost\"",
            "Team::\"t1\"",
            "Org::\"o\"",
            "Action::\"read\"",
            "1",
            "-3",
            "9223372036854775807",
            "\"hello\"",
            "\"hello doc\"",
            "true",
            "false",
            "[User::\"bob\", Team::\"t1\"]",
            "[1, \"a\"]",
            "[]",
            "{a: 1}",
            "context.set",
            "context.at",
            "resource.when",
            "principal.nums",
        ])
        .prop_map(str::to_owned)
    }

    fn expr() -> impl Strategy<Value = String> {
        leaf().prop_recursive(4, 48, 3, |inner| {
            let attr = prop::sample::select(vec![
                "name",
                "age",
                "manager",
                "owner",
                "profile",
                "level",
                "team",
                "blocked",
                "isPrivate",
                "readers",
                "nums",
                "big",
                "n",
                "s",
                "who",
                "authenticated",
                "rec",
                "a",
                "b",
                "missing",
            ]);
            prop_oneof![
                inner.clone().prop_map(|a| format!("!({a})")),
                inner.clone().prop_map(|a| format!("-({a})")),
                inner.clone().prop_map(|a| format!("({a}).isEmpty()")),
                (inner.clone(), attr.clone()).prop_map(|(a, f)| format!("({a}).{f}")),
                (inner.clone(), attr.clone()).prop_map(|(a, f)| format!("({a}) has {f}")),
                (inner.clone(), attr.clone(), attr)
                    .prop_map(|(a, f, g)| format!("({a}) has {f}.{g}")),
                inner.clone().prop_map(|a| format!("({a}) like \"h*o*\"")),
                inner.clone().prop_map(|a| format!("({a}) is User")),
                inner.clone().prop_map(|a| format!("({a}).getTag(\"t\")")),
                inner.clone().prop_map(|a| format!("({a}).hasTag(\"t\")")),
                (
                    inner.clone(),
                    inner.clone(),
                    prop::sample::select(vec![
                        "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "in", "&&", "||",
                    ])
                )
                    .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
                (
                    inner.clone(),
                    inner.clone(),
                    prop::sample::select(vec!["contains", "containsAll", "containsAny",])
                )
                    .prop_map(|(a, b, m)| format!("({a}).{m}({b})")),
                (inner.clone(), inner.clone(), inner.clone())
                    .prop_map(|(a, b, c)| format!("if ({a}) then ({b}) else ({c})")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("[{a}, {b}]")),
                (inner.clone(), inner).prop_map(|(a, b)| format!("{{x: {a}, y: {b}}}")),
            ]
        })
    }

    #[derive(Clone, Copy)]
    enum Ty {
        Bool,
        Long,
        Str,
        Entity,
        Set,
    }

    fn leaves(ty: Ty) -> Vec<&'static str> {
        match ty {
            Ty::Bool => vec![
                "true",
                "false",
                "context.authenticated",
                "resource.isPrivate",
            ],
            Ty::Long => vec![
                "1",
                "-3",
                "principal.age",
                "context.n",
                "principal.big",
                "User::\"bob\".age",
            ],
            Ty::Str => vec![
                "\"hello\"",
                "principal.name",
                "context.s",
                "resource.name",
                "Team::\"t1\".name",
            ],
            Ty::Entity => vec![
                "principal",
                "resource",
                "action",
                "User::\"bob\"",
                "User::\"ghost\"",
                "Team::\"t1\"",
                "Org::\"o\"",
                "resource.owner",
                "principal.manager",
                "context.who",
                "resource.readers",
                "principal.profile.team",
                "Action::\"read\"",
            ],
            Ty::Set => vec![
                "principal.blocked",
                "principal.nums",
                "context.set",
                "[1, 2]",
                "[]",
                "[User::\"bob\", Team::\"t1\"]",
                "User::\"bob\".blocked",
                "[Org::\"o\"]",
            ],
        }
    }

    /// Mostly well-typed expressions of type `ty` (a few leaves of other types make errors).
    fn typed(ty: Ty, depth: u32) -> BoxedStrategy<String> {
        let own = prop::sample::select(leaves(ty)).prop_map(str::to_owned);
        let any = prop::sample::select(leaves(Ty::Entity)).prop_map(str::to_owned);
        let leaf = prop_oneof![9 => own, 1 => any].boxed();
        if depth == 0 {
            return leaf;
        }
        let d = depth - 1;
        let t = |ty| typed(ty, d);
        let compound = match ty {
            Ty::Bool => prop_oneof![
                (
                    t(Ty::Bool),
                    t(Ty::Bool),
                    prop::sample::select(vec!["&&", "||", "==", "!="])
                )
                    .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
                t(Ty::Bool).prop_map(|a| format!("!({a})")),
                (
                    t(Ty::Entity),
                    t(Ty::Entity),
                    prop::sample::select(vec!["==", "in", "!="])
                )
                    .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
                (t(Ty::Entity), t(Ty::Set)).prop_map(|(a, b)| format!("({a}) in ({b})")),
                (
                    t(Ty::Long),
                    t(Ty::Long),
                    prop::sample::select(vec!["<", "<=", ">", ">=", "=="])
                )
                    .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
                (t(Ty::Set), t(Ty::Entity)).prop_map(|(a, b)| format!("({a}).contains({b})")),
                (t(Ty::Set), t(Ty::Long)).prop_map(|(a, b)| format!("({a}).contains({b})")),
                (
                    t(Ty::Set),
                    t(Ty::Set),
                    prop::sample::select(vec!["containsAll", "containsAny"])
                )
                    .prop_map(|(a, b, m)| format!("({a}).{m}({b})")),
                t(Ty::Set).prop_map(|a| format!("({a}).isEmpty()")),
                t(Ty::Str).prop_map(|a| format!("({a}) like \"h*o*\"")),
                (
                    t(Ty::Entity),
                    prop::sample::select(vec!["name", "manager", "owner", "blocked", "profile"])
                )
                    .prop_map(|(a, f)| format!("({a}) has {f}")),
                t(Ty::Entity).prop_map(|a| format!("({a}) has profile.team")),
                t(Ty::Entity).prop_map(|a| format!("({a}) is User")),
                t(Ty::Entity).prop_map(|a| format!("({a}).hasTag(\"t\")")),
                (t(Ty::Bool), t(Ty::Bool), t(Ty::Bool))
                    .prop_map(|(a, b, c)| format!("if ({a}) then ({b}) else ({c})")),
            ]
            .boxed(),
            Ty::Long => prop_oneof![
                (
                    t(Ty::Long),
                    t(Ty::Long),
                    prop::sample::select(vec!["+", "-", "*"])
                )
                    .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
                t(Ty::Long).prop_map(|a| format!("-({a})")),
                t(Ty::Entity).prop_map(|a| format!("({a}).age")),
            ]
            .boxed(),
            Ty::Str => t(Ty::Entity).prop_map(|a| format!("({a}).name")).boxed(),
            Ty::Entity => prop_oneof![
                (
                    t(Ty::Entity),
                    prop::sample::select(vec!["owner", "manager"])
                )
                    .prop_map(|(a, f)| format!("({a}).{f}")),
                t(Ty::Entity).prop_map(|a| format!("({a}).getTag(\"t\")")),
                (t(Ty::Bool), t(Ty::Entity), t(Ty::Entity))
                    .prop_map(|(a, b, c)| format!("if ({a}) then ({b}) else ({c})")),
            ]
            .boxed(),
            Ty::Set => prop_oneof![
                (t(Ty::Entity), t(Ty::Entity)).prop_map(|(a, b)| format!("[{a}, {b}]")),
                (t(Ty::Long), t(Ty::Long)).prop_map(|(a, b)| format!("[{a}, {b}]")),
                t(Ty::Entity).prop_map(|a| format!("({a}).blocked")),
            ]
            .boxed(),
        };
        prop_oneof![1 => leaf, 3 => compound].boxed()
    }

    struct World {
        list: Vec<Arc<ClosedEntity>>,
        cedar: cedar_policy::Entities,
        context: cedar_policy::Context,
    }

    fn world() -> World {
        let cedar = cedar_policy::Entities::from_json_str(ENTITIES, None).unwrap();
        let core: &cedar_policy_core::entities::Entities = cedar.as_ref();
        let list = core.iter().map(|e| ClosedEntity::of(e.clone())).collect();
        let context = cedar_policy::Context::from_json_str(CONTEXT, None).unwrap();
        World {
            list,
            cedar,
            context,
        }
    }

    fn uid(s: &str) -> EntityUID {
        EntityUID::from_str(s).unwrap()
    }

    /// Compares the compiled evaluation of `src` (a condition) with Cedar's interpreter over
    /// both kinds of entity source: equal values, or both an error, or the compiled side defers.
    fn agree(w: &World, src: &str) -> Result<(), TestCaseError> {
        let policy = format!("permit (principal, action, resource) when {{ {src} }};");
        let Ok(set) = cedar_policy::PolicySet::from_str(&policy) else {
            return Ok(());
        };
        let p = set.policies().next().unwrap();
        let ast: &cedar_policy_core::ast::Policy = p.as_ref();
        let cond = ast.condition();
        let Some(compiled) = Condition::compile(&cond, ast.env()) else {
            return Ok(());
        };
        let (pr, ac, re) = (
            uid("User::\"alice\""),
            uid("Action::\"view\""),
            uid("Doc::\"d1\""),
        );
        let core_entities: &cedar_policy_core::entities::Entities = w.cedar.as_ref();
        let request = cedar_policy_core::ast::Request::new_unchecked(
            cedar_policy_core::ast::EntityUIDEntry::known(pr.clone(), None),
            cedar_policy_core::ast::EntityUIDEntry::known(ac.clone(), None),
            cedar_policy_core::ast::EntityUIDEntry::known(re.clone(), None),
            Some(w.context.as_ref().clone()),
        );
        let ev = Evaluator::new(request, core_entities, Extensions::all_available());
        let want = ev.interpret(&cond, ast.env());
        let records: Vec<&ClosedEntity> = w.list.iter().map(|e| &**e).collect();
        for source in [Entities::List(&records), Entities::Cedar(core_entities)] {
            let env = Env::new(&pr, &ac, &re, w.context.as_ref(), source);
            let got = eval(&compiled.0, &env);
            match (&got, &want) {
                (Err(Stop::Cedar), _) | (Err(Stop::Error), Err(_)) => {}
                (Ok(g), Ok(v)) => prop_assert_eq!(&**g, v, "{}", src),
                _ => prop_assert!(false, "{src}: compiled {got:?}, Cedar {want:?}"),
            }
            let outcome = compiled.eval(&env);
            let truth = want.as_ref().is_ok_and(is_true);
            if outcome != Outcome::Cedar {
                prop_assert_eq!(outcome == Outcome::True, truth, "{}", src);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2500))]
        #[test]
        fn compiled_conditions_evaluate_as_cedar_does(src in expr()) {
            agree(&world(), &src)?;
        }

        #[test]
        fn typed_conditions_evaluate_as_cedar_does(src in typed(Ty::Bool, 4)) {
            agree(&world(), &src)?;
        }
    }

    #[test]
    fn only_conditions_cedar_interprets_alone_stay_uncompiled() {
        let cond = |src: &str| {
            let set = cedar_policy::PolicySet::from_str(&format!(
                "permit (principal, action, resource) when {{ {src} }};"
            ))
            .unwrap();
            let p = set.policies().next().unwrap();
            let ast: &cedar_policy_core::ast::Policy = p.as_ref();
            Condition::compile(&ast.condition(), ast.env()).is_some()
        };
        assert!(cond("principal == resource.owner && context.n > 1"));
        assert!(!cond("context.at < datetime(\"2024-01-01\")"));
        assert!(!cond("resource.ip.isLoopback()"));
        // Nesting past MAX_DEPTH: left to Cedar, whose own recursion limit then applies.
        let nested = |n: usize| (0..n).fold(Expr::val(true), |e, _| Expr::not(e));
        let slots = SlotEnv::new();
        assert!(Condition::compile(&nested(MAX_DEPTH + 4), &slots).is_none());
        assert!(Condition::compile(&nested(MAX_DEPTH), &slots).is_some());
    }

    #[test]
    fn hand_picked_conditions_evaluate_as_cedar_does() {
        let w = world();
        for src in [
            "principal == resource.owner",
            "principal in resource.readers",
            "principal in Org::\"o\"",
            "User::\"bob\" in Org::\"o\"",
            "User::\"ghost\" in User::\"ghost\"",
            "User::\"ghost\" in [User::\"ghost\", 1]",
            "principal in [Team::\"t1\", Team::\"t2\"]",
            "resource.owner.blocked.contains(principal)",
            "principal.blocked.contains(resource.owner)",
            "principal has blocked && principal.blocked.contains(User::\"bob\")",
            // `contains` on an attribute, filed by hash or not, hit or miss.
            "principal.blocked.contains(User::\"alice\")",
            "User::\"bob\".blocked.contains(principal)",
            "principal.nums.contains(User::\"bob\")",
            "principal.nums.contains(2)",
            "principal.blocked.contains(1)",
            "principal.name.contains(User::\"bob\")",
            "User::\"ghost\".blocked.contains(principal)",
            "{a: [User::\"bob\"]}.a.contains(User::\"bob\")",
            "context.set.contains(1)",
            "User::\"ghost\" has name",
            "User::\"ghost\".name == \"x\"",
            "principal.manager.manager has name",
            "principal has profile.team",
            "principal has profile.level.x",
            "context has rec.a.b",
            "context.rec.a.b == 1",
            "principal.big + 1 > 0",
            "-principal.age < 0",
            "context.at < resource.when",
            "resource.when <= context.at",
            "resource.ip.isLoopback()",
            "resource.getTag(\"t\") == User::\"bob\"",
            "principal.getTag(\"missing\") == 1",
            "User::\"ghost\".hasTag(\"t\")",
            "[principal, 1].contains(User::\"alice\")",
            "[principal.nums].containsAny([[1, 2, 3]])",
            "principal.nums.containsAll([1, 3])",
            "resource.name like \"hello*\"",
            "action in Action::\"read\"",
            "principal is User && resource is Doc",
            "if context.authenticated then principal.age >= 30 else false",
            "{a: principal.name}.a == \"alice\"",
            "!context.authenticated || principal.missing",
            "context.authenticated && principal.missing",
        ] {
            agree(&w, src).unwrap();
        }
    }
}
