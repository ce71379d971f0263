//! Query plans: Cedar residuals turned into row filters (docs/plans.md#building-a-plan-engineplan).
//!
//! [`residuals`] runs Cedar's type-aware partial evaluation (TPE) with the resource unknown and of
//! the requested type, and turns each policy's residual into a [`Filter`]: a tree of the filter
//! JSON contract (docs/plans.md, "The filter tree") that a database layer compiles to SQL. [`combine`]
//! folds the per-policy filters into the plan's filter, `OR(permits) AND NOT OR(forbids)`.
//!
//! Filters use SQL three-valued logic: a missing attribute is NULL, and a row matches when the
//! filter is TRUE. Cedar skips a policy whose evaluation errors; the bundles are validated
//! strictly, so every optional attribute is guarded by `has`, and on schema-conforming rows a
//! filter leaf is NULL exactly where Cedar would error. The translation never guesses: a
//! construct with no faithful operator becomes [`Filter::Unmappable`], one that needs data outside
//! the row (another entity's attributes or ancestors) becomes [`Filter::Unknown`].

use crate::error::chain;
use cedar_policy::pst::{
    self, ActionConstraint, BinaryOp, Clause, Expr, Literal, PatternElem, PrincipalConstraint,
    ResourceConstraint, UnaryOp, Var,
};
use cedar_policy::{
    Context, Effect, Entities, EntityId, EntityTypeName, EntityUid, PartialEntities,
    PartialEntityUid, PartialRequest, Policy, PolicyId, PolicySet, Schema, ValidationMode,
    Validator,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// A comparison operator of a `compare` node (docs/plans.md#the-filter-tree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `eq`: equal (any value; entity references compare by type and id).
    Eq,
    /// `ne`: not equal.
    Ne,
    /// `lt`: less than (integers only).
    Lt,
    /// `le`: less than or equal (integers only).
    Le,
    /// `gt`: greater than (integers only).
    Gt,
    /// `ge`: greater than or equal (integers only).
    Ge,
}

impl Cmp {
    /// Returns the contract's name of the operator: `eq`, `ne`, `lt`, `le`, `gt` or `ge`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "eq",
            Self::Ne => "ne",
            Self::Lt => "lt",
            Self::Le => "le",
            Self::Gt => "gt",
            Self::Ge => "ge",
        }
    }

    /// The operator with its operands swapped (`5 < x` is `x > 5`).
    fn swapped(self) -> Self {
        match self {
            Self::Eq | Self::Ne => self,
            Self::Lt => Self::Gt,
            Self::Le => Self::Ge,
            Self::Gt => Self::Lt,
            Self::Ge => Self::Le,
        }
    }

    /// The negated operator. Exact under SQL NULL semantics too: both sides are NULL on a
    /// missing attribute.
    fn negated(self) -> Self {
        match self {
            Self::Eq => Self::Ne,
            Self::Ne => Self::Eq,
            Self::Lt => Self::Ge,
            Self::Le => Self::Gt,
            Self::Gt => Self::Le,
            Self::Ge => Self::Lt,
        }
    }
}

/// A filter tree over the rows of one resource type (docs/plans.md#the-filter-tree).
///
/// `attr` fields are paths into the resource's attributes (`["meta", "level"]`); values are Cedar
/// JSON values (entity references as `{"__entity": {"type", "id"}}`).
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// Every row.
    True,
    /// No row.
    False,
    /// All arguments hold.
    And(Vec<Filter>),
    /// Some argument holds.
    Or(Vec<Filter>),
    /// The argument does not hold.
    Not(Box<Filter>),
    /// The attribute compared with a value.
    Compare {
        /// Attribute path.
        attr: Vec<String>,
        /// Operator.
        cmp: Cmp,
        /// Cedar JSON value (a string, integer, boolean or entity reference).
        value: Value,
    },
    /// The row has the attribute path (never NULL).
    Has {
        /// Attribute path.
        attr: Vec<String>,
    },
    /// The set at `attr` holds `value`.
    Contains {
        /// Attribute path.
        attr: Vec<String>,
        /// Cedar JSON value.
        value: Value,
    },
    /// The set at `attr` holds one of `values`.
    ContainsAny {
        /// Attribute path.
        attr: Vec<String>,
        /// Cedar JSON values.
        values: Vec<Value>,
    },
    /// The set at `attr` holds all of `values`.
    ContainsAll {
        /// Attribute path.
        attr: Vec<String>,
        /// Cedar JSON values.
        values: Vec<Value>,
    },
    /// The string at `attr` matches a Cedar pattern: `*` matches anything, `\*` is a star.
    Like {
        /// Attribute path.
        attr: Vec<String>,
        /// The pattern.
        pattern: String,
    },
    /// The row is `entity` or a descendant of it.
    In {
        /// The ancestor.
        entity: EntityUid,
    },
    /// The row is exactly `entity`.
    Is {
        /// The entity.
        entity: EntityUid,
    },
    /// Cannot be decided from the row: needs data of other entities.
    Unknown {
        /// What was needed, for humans.
        detail: String,
    },
    /// Cannot be decided from the row: no filter operator expresses it.
    Unmappable {
        /// The construct, for humans.
        detail: String,
    },
}

/// Length of an `and`/`or` argument list from which [`Filter::simplify`] looks for repeated
/// arguments by fingerprint instead of comparing each new argument with all the others.
const HASHED_DEDUP_FROM: usize = 8;

/// Hashes a JSON value consistently with its `==`: an object's entries are hashed one by one
/// and summed, since objects compare equal whatever the order of their keys.
fn hash_value(v: &Value, h: &mut impl Hasher) {
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            items.iter().for_each(|i| hash_value(i, h));
        }
        Value::Object(m) => {
            let entries = m.iter().fold(0u64, |acc, (k, v)| {
                let mut e = foldhash::fast::FixedState::default().build_hasher();
                k.hash(&mut e);
                hash_value(v, &mut e);
                acc.wrapping_add(e.finish())
            });
            (5u8, m.len(), entries).hash(h);
        }
    }
}

fn uid_json(uid: &EntityUid) -> Value {
    json!({"type": uid.type_name().to_string(), "id": uid.id().unescaped()})
}

fn entity_value(uid: &EntityUid) -> Value {
    json!({"__entity": uid_json(uid)})
}

/// Serialised as [`Filter::to_json`] writes it (docs/plans.md#the-filter-tree), so a plan's
/// response can carry the filter as one of its fields (`crate::decision::PlanResponse`).
impl serde::Serialize for Filter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl Filter {
    /// Returns the node in the exact JSON shape of the filter contract
    /// (docs/plans.md#the-filter-tree): an object
    /// with `op` and that operator's fields.
    pub fn to_json(&self) -> Value {
        let list = |args: &[Filter]| Value::Array(args.iter().map(Self::to_json).collect());
        match self {
            Self::True => json!({"op": "true"}),
            Self::False => json!({"op": "false"}),
            Self::And(args) => json!({"op": "and", "args": list(args)}),
            Self::Or(args) => json!({"op": "or", "args": list(args)}),
            Self::Not(arg) => json!({"op": "not", "arg": arg.to_json()}),
            Self::Compare { attr, cmp, value } => {
                json!({"op": "compare", "attr": attr, "cmp": cmp.as_str(), "value": value})
            }
            Self::Has { attr } => json!({"op": "has", "attr": attr}),
            Self::Contains { attr, value } => {
                json!({"op": "contains", "attr": attr, "value": value})
            }
            Self::ContainsAny { attr, values } => {
                json!({"op": "contains_any", "attr": attr, "values": values})
            }
            Self::ContainsAll { attr, values } => {
                json!({"op": "contains_all", "attr": attr, "values": values})
            }
            Self::Like { attr, pattern } => json!({"op": "like", "attr": attr, "pattern": pattern}),
            Self::In { entity } => json!({"op": "in", "entity": uid_json(entity)}),
            Self::Is { entity } => json!({"op": "is", "entity": uid_json(entity)}),
            Self::Unknown { detail } => json!({"op": "unknown", "detail": detail}),
            Self::Unmappable { detail } => json!({"op": "unmappable", "detail": detail}),
        }
    }

    /// Returns an equivalent, smaller filter (docs/plans.md): folds `true`/`false` through
    /// `and`/`or`/`not`, flattens nested `and`s and `or`s, drops repeated arguments (keeping the
    /// first), removes double negations and collapses one-argument `and`/`or`. The result has
    /// no `and`/`or` with fewer than two arguments.
    pub fn simplify(self) -> Filter {
        match self {
            Self::And(args) => Self::junction(args, true),
            Self::Or(args) => Self::junction(args, false),
            Self::Not(arg) => match arg.simplify() {
                Self::True => Self::False,
                Self::False => Self::True,
                Self::Not(inner) => *inner,
                other => Self::Not(Box::new(other)),
            },
            other => other,
        }
    }

    /// Simplifies an `and` (`is_and`) or an `or`.
    fn junction(args: Vec<Filter>, is_and: bool) -> Filter {
        Self::junction_with(args, is_and, Self::simplify)
    }

    /// [`Filter::junction`] of arguments that are already simplified: the same result (simplifying
    /// is idempotent) without simplifying them again.
    fn junction_of_simplified(args: Vec<Filter>, is_and: bool) -> Filter {
        Self::junction_with(args, is_and, |f| f)
    }

    /// Simplifies an `and` (`is_and`) or an `or`, with `simplify` applied to each argument.
    fn junction_with(
        args: Vec<Filter>,
        is_and: bool,
        simplify: impl Fn(Filter) -> Filter,
    ) -> Filter {
        let (unit, zero) = if is_and {
            (Self::True, Self::False)
        } else {
            (Self::False, Self::True)
        };
        let mut out: Vec<Filter> = Vec::new();
        // Fingerprints of `out`, once it is long enough for pairwise comparisons to cost more
        // than hashing (equal filters have equal fingerprints; see `Filter::fingerprint`).
        let mut prints: Vec<u64> = Vec::new();
        for arg in args {
            // A simplified child of the same kind is already flat and free of constants.
            let parts = match (simplify(arg), is_and) {
                (Self::And(inner), true) | (Self::Or(inner), false) => inner,
                (other, _) => vec![other],
            };
            for part in parts {
                if part == zero {
                    return zero;
                }
                if part == unit {
                    continue;
                }
                if out.len() < HASHED_DEDUP_FROM {
                    if !out.contains(&part) {
                        out.push(part);
                    }
                    continue;
                }
                let known = prints.len();
                prints.extend(out.iter().skip(known).map(Self::fingerprint));
                let print = part.fingerprint();
                let seen = prints
                    .iter()
                    .zip(&out)
                    .any(|(p, o)| *p == print && *o == part);
                if !seen {
                    prints.push(print);
                    out.push(part);
                }
            }
        }
        let mut rest = out.into_iter();
        match (rest.next(), rest.next()) {
            (None, _) => unit,
            (Some(one), None) => one,
            (Some(a), Some(b)) => {
                let all = [a, b].into_iter().chain(rest).collect();
                if is_and {
                    Self::And(all)
                } else {
                    Self::Or(all)
                }
            }
        }
    }

    /// A hash of the filter consistent with `==` (equal filters, including JSON values whose
    /// objects list their keys in another order, hash alike).
    fn fingerprint(&self) -> u64 {
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        self.hash_into(&mut h);
        h.finish()
    }

    fn hash_into(&self, h: &mut impl Hasher) {
        std::mem::discriminant(self).hash(h);
        match self {
            Self::True | Self::False => {}
            Self::And(args) | Self::Or(args) => {
                args.len().hash(h);
                args.iter().for_each(|a| a.hash_into(h));
            }
            Self::Not(arg) => arg.hash_into(h),
            Self::Compare { attr, cmp, value } => {
                attr.hash(h);
                cmp.hash(h);
                hash_value(value, h);
            }
            Self::Has { attr } => attr.hash(h),
            Self::Contains { attr, value } => {
                attr.hash(h);
                hash_value(value, h);
            }
            Self::ContainsAny { attr, values } | Self::ContainsAll { attr, values } => {
                attr.hash(h);
                values.len().hash(h);
                values.iter().for_each(|v| hash_value(v, h));
            }
            Self::Like { attr, pattern } => {
                attr.hash(h);
                pattern.hash(h);
            }
            Self::In { entity } | Self::Is { entity } => entity.hash(h),
            Self::Unknown { detail } | Self::Unmappable { detail } => detail.hash(h),
        }
    }

    /// `simplify(and(filters))` for filters that are already simplified, without simplifying
    /// them again (simplifying is idempotent).
    pub(crate) fn and_of_simplified(mut filters: Vec<Filter>) -> Filter {
        match (filters.pop(), filters.is_empty()) {
            (Some(one), true) => one,
            (last, _) => {
                Self::junction_of_simplified(filters.into_iter().chain(last).collect(), true)
            }
        }
    }

    /// Returns the attribute paths the filter reads, dotted (`meta.level`), sorted and unique:
    /// the plan's `attributes` field (docs/plans.md).
    pub fn attributes(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        self.visit(&mut |f| match f {
            Self::Compare { attr, .. }
            | Self::Has { attr }
            | Self::Contains { attr, .. }
            | Self::ContainsAny { attr, .. }
            | Self::ContainsAll { attr, .. }
            | Self::Like { attr, .. } => {
                out.insert(attr.join("."));
            }
            _ => {}
        });
        out.into_iter().collect()
    }

    /// Returns whether the filter has an `unknown` or `unmappable` node, so matched rows must be
    /// checked one by one: the plan's `needs_row_checks` field (docs/plans.md).
    pub fn needs_row_checks(&self) -> bool {
        let mut found = false;
        self.visit(&mut |f| {
            found |= matches!(f, Self::Unknown { .. } | Self::Unmappable { .. });
        });
        found
    }

    fn visit(&self, f: &mut dyn FnMut(&Filter)) {
        f(self);
        match self {
            Self::And(args) | Self::Or(args) => args.iter().for_each(|a| a.visit(f)),
            Self::Not(arg) => arg.visit(f),
            _ => {}
        }
    }
}

/// One policy that may apply to some rows of the planned resource type (docs/plans.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Residual {
    /// The policy's name in the bundle.
    pub id: PolicyId,
    /// `permit` or `forbid`.
    pub effect: Effect,
    /// The rows the policy is satisfied for, simplified. [`Filter::True`] means every row;
    /// never [`Filter::False`] (such policies are left out).
    pub filter: Filter,
}

/// Why a plan could not be computed (docs/plans.md).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The resource type is not declared in the schema.
    #[error("resource type `{0}` is not declared in the schema")]
    UnknownResourceType(String),
    /// The action is not declared in the schema.
    #[error("action `{0}` is not declared in the schema")]
    UnknownAction(String),
    /// The schema does not let the action apply to resources of this type.
    #[error("action `{action}` does not apply to resource type `{resource_type}`")]
    ActionNotForResourceType {
        /// The action.
        action: String,
        /// The resource type.
        resource_type: String,
    },
    /// The schema does not let the action apply to principals of this type.
    #[error("action `{action}` does not apply to principal type `{principal_type}`")]
    ActionNotForPrincipalType {
        /// The action.
        action: String,
        /// The principal's type.
        principal_type: String,
    },
    /// Cedar rejected the partial request (for example the context does not match the
    /// action's context type).
    #[error("invalid plan request: {0}")]
    InvalidRequest(String),
    /// Partial evaluation itself failed.
    #[error("partial evaluation failed: {0}")]
    Evaluation(String),
}

/// Computes the residual of every policy that may apply when `principal` performs `action` with
/// `context` on an unknown resource of type `resource_type`
/// (docs/plans.md#building-a-plan-engineplan).
///
/// `entities` are the concrete entities the caller has: at least the principal and its
/// ancestors; entities that break the schema are left out of the evaluation (what depends on
/// them becomes [`Filter::Unknown`]). Returns one [`Residual`] per policy, sorted by policy id,
/// leaving out policies that hold for no row (including those that error for every row).
///
/// # Errors
/// [`PlanError`] when the resource type or action is not in the schema, the action does not
/// apply to the resource or principal type, Cedar rejects the request (context), or partial
/// evaluation fails.
#[allow(clippy::too_many_arguments)]
pub fn residuals(
    policies: &PolicySet,
    schema: &Schema,
    kinds: &AttrKinds,
    principal: &EntityUid,
    action: &EntityUid,
    context: Context,
    resource_type: &EntityTypeName,
    entities: &Entities,
) -> Result<Vec<Residual>, PlanError> {
    let known = partial_entities(entities, schema);
    residuals_with(
        policies,
        schema,
        kinds,
        principal,
        action,
        context,
        resource_type,
        entities,
        &known,
    )
}

/// [`residuals`] with `known`, the entities already converted by [`partial_entities`].
///
/// # Errors
/// As [`residuals`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn residuals_with(
    policies: &PolicySet,
    schema: &Schema,
    kinds: &AttrKinds,
    principal: &EntityUid,
    action: &EntityUid,
    context: Context,
    resource_type: &EntityTypeName,
    entities: &Entities,
    known: &PartialEntities,
) -> Result<Vec<Residual>, PlanError> {
    check_request(schema, principal.type_name(), action, resource_type)?;
    let request = PartialRequest::new(
        PartialEntityUid::from_concrete(principal.clone()),
        action.clone(),
        PartialEntityUid::new(resource_type.clone(), None),
        Some(context),
        schema,
    )
    .map_err(|e| PlanError::InvalidRequest(chain(&e)))?;
    let planner = Planner {
        action,
        row: Var::Resource,
        row_type: resource_type,
        entities,
        kinds,
    };
    translate(policies, schema, &request, known, planner)
}

/// The residuals of a subject search's plan (docs/search.md#subject-search): every policy that
/// may apply when an unknown principal of type `principal_type` performs `action` with
/// `context` on `resource`, each turned into a [`Filter`] over the principals' rows (the
/// filter tree of docs/plans.md, with `attr` paths into the principal's attributes and
/// `in`/`is` naming the principal's ancestors and itself).
///
/// `entities` are the concrete entities known: at least the resource and its ancestors.
/// Returns one [`Residual`] per policy, sorted by policy id, leaving out those that hold for
/// no principal.
///
/// # Errors
/// As [`residuals`], with the principal type's errors for `principal_type`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn principal_residuals_with(
    policies: &PolicySet,
    schema: &Schema,
    kinds: &AttrKinds,
    principal_type: &EntityTypeName,
    action: &EntityUid,
    context: Context,
    resource: &EntityUid,
    entities: &Entities,
    known: &PartialEntities,
) -> Result<Vec<Residual>, PlanError> {
    check_request(schema, principal_type, action, resource.type_name())?;
    let request = PartialRequest::new(
        PartialEntityUid::new(principal_type.clone(), None),
        action.clone(),
        PartialEntityUid::from_concrete(resource.clone()),
        Some(context),
        schema,
    )
    .map_err(|e| PlanError::InvalidRequest(chain(&e)))?;
    let planner = Planner {
        action,
        row: Var::Principal,
        row_type: principal_type,
        entities,
        kinds,
    };
    translate(policies, schema, &request, known, planner)
}

/// Runs TPE on `request` and translates each residual policy with `planner`.
fn translate(
    policies: &PolicySet,
    schema: &Schema,
    request: &PartialRequest,
    known: &PartialEntities,
    mut planner: Planner<'_>,
) -> Result<Vec<Residual>, PlanError> {
    let response = policies
        .tpe(request, known, schema)
        .map_err(|e| PlanError::Evaluation(chain(&e)))?;
    let mut out: Vec<Residual> = Vec::new();
    for policy in response.policies() {
        let filter = planner.policy(&policy).simplify();
        if filter != Filter::False {
            out.push(Residual {
                id: policy.id().clone(),
                effect: policy.effect(),
                filter,
            });
        }
    }
    out.sort_by_cached_key(|r| r.id.to_string());
    Ok(out)
}

/// Combines per-policy filters into the plan's filter (docs/plans.md#building-a-plan-engineplan):
/// `simplify(and(or(permits), not(or(forbids))))`. No permits gives [`Filter::False`].
pub fn combine(permits: &[&Filter], forbids: &[&Filter]) -> Filter {
    let any = |fs: &[&Filter]| Filter::Or(fs.iter().map(|f| (*f).clone()).collect());
    Filter::And(vec![any(permits), Filter::Not(Box::new(any(forbids)))]).simplify()
}

/// [`combine`] for filters that are already simplified (as [`Residual::filter`] is), taken by
/// value. Simplifying is idempotent, so the result is [`combine`]'s: only the two `or`s, the
/// `not` and the `and` around them are simplified, not the filters again.
pub(crate) fn combine_simplified(permits: Vec<Filter>, forbids: Vec<Filter>) -> Filter {
    let any = Filter::junction_of_simplified(permits, false);
    let none = match Filter::junction_of_simplified(forbids, false) {
        Filter::True => Filter::False,
        Filter::False => Filter::True,
        Filter::Not(inner) => *inner,
        other => Filter::Not(Box::new(other)),
    };
    Filter::junction_of_simplified(vec![any, none], true)
}

fn check_request(
    schema: &Schema,
    principal_type: &EntityTypeName,
    action: &EntityUid,
    resource_type: &EntityTypeName,
) -> Result<(), PlanError> {
    if !schema.entity_types().any(|t| t == resource_type) {
        return Err(PlanError::UnknownResourceType(resource_type.to_string()));
    }
    if !schema.actions().any(|a| a == action) {
        return Err(PlanError::UnknownAction(action.to_string()));
    }
    let for_resource = schema
        .resources_for_action(action)
        .is_some_and(|mut types| types.any(|t| t == resource_type));
    if !for_resource {
        return Err(PlanError::ActionNotForResourceType {
            action: action.to_string(),
            resource_type: resource_type.to_string(),
        });
    }
    let for_principal = schema
        .principals_for_action(action)
        .is_some_and(|mut types| types.any(|t| t == principal_type));
    if !for_principal {
        return Err(PlanError::ActionNotForPrincipalType {
            action: action.to_string(),
            principal_type: principal_type.to_string(),
        });
    }
    Ok(())
}

/// The entities TPE may read. TPE insists on schema-conforming entities; when some do not
/// conform, the ones that do are kept and the others stay unknown.
pub(crate) fn partial_entities(entities: &Entities, schema: &Schema) -> PartialEntities {
    if let Ok(all) = PartialEntities::from_concrete(entities.clone(), schema) {
        return all;
    }
    let conforming = entities.iter().filter(|e| {
        Entities::from_entities([(*e).clone()], None)
            .is_ok_and(|one| PartialEntities::from_concrete(one, schema).is_ok())
    });
    Entities::from_entities(conforming.cloned(), None)
        .ok()
        .and_then(|kept| PartialEntities::from_concrete(kept, schema).ok())
        .or_else(|| PartialEntities::from_concrete(Entities::empty(), schema).ok())
        .unwrap_or_else(PartialEntities::empty)
}

/// What a resource attribute path holds, as far as the filter cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Entity,
    Set,
    Record,
    Other,
}

/// One operand of a comparison or membership test.
enum Side<'e> {
    /// The row's variable itself (`resource`, or `principal` in a subject search).
    Row,
    /// A path of the row's attributes (non-empty), through records only.
    Attr(Vec<String>),
    /// A resource attribute path through an entity: its data is not in the row.
    Deref(Filter),
    /// A literal value (scalar, entity, set or record of literals).
    Lit(&'e Expr),
    /// Anything else.
    Other,
}

/// Translates the residuals of one plan request.
struct Planner<'a> {
    action: &'a EntityUid,
    /// The unknown variable the rows stand for: `resource` for a query plan, `principal` for
    /// a subject search's plan (docs/search.md).
    row: Var,
    /// The type of the rows (of the unknown variable).
    row_type: &'a EntityTypeName,
    entities: &'a Entities,
    /// Kinds of attribute paths, shared by every plan of the bundle.
    kinds: &'a AttrKinds,
}

/// What the resource attribute paths of a schema hold (entity, set, record or other), learned
/// once per bundle by strictly validating tiny probe policies (the public API exposes no
/// attribute types) and shared by every plan. Safe to share between threads.
pub struct AttrKinds {
    validator: Validator,
    known: Mutex<HashMap<(String, Vec<String>), Kind>>,
}

impl fmt::Debug for AttrKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttrKinds").finish_non_exhaustive()
    }
}

impl AttrKinds {
    /// An empty cache over `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            validator: Validator::new(schema.clone()),
            known: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, ty: &EntityTypeName, path: &[String]) -> Option<Kind> {
        let g = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.get(&(ty.to_string(), path.to_vec())).copied()
    }

    fn put(&self, ty: &EntityTypeName, path: &[String], kind: Kind) {
        let mut g = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.insert((ty.to_string(), path.to_vec()), kind);
    }
}

impl Planner<'_> {
    /// The rows a residual policy is satisfied for (not yet simplified).
    fn policy(&mut self, policy: &Policy) -> Filter {
        let pst = match policy.to_pst() {
            Ok(p) => p,
            Err(e) => {
                return Filter::Unmappable {
                    detail: format!("residual cannot be inspected: {}", chain(&e)),
                }
            }
        };
        let body = pst.body();
        // TPE folds the scope into the condition; anything else left in the scope is not
        // something this translation understands.
        if !matches!(body.principal, PrincipalConstraint::Any)
            || !matches!(body.action, ActionConstraint::Any)
            || !matches!(body.resource, ResourceConstraint::Any)
        {
            return Filter::Unmappable {
                detail: format!("residual of `{}` keeps a scope constraint", policy.id()),
            };
        }
        let clauses = body
            .clauses()
            .iter()
            .map(|c| match c {
                Clause::When(e) => self.truth(e, true),
                Clause::Unless(e) => self.truth(e, false),
            })
            .collect();
        Filter::And(clauses)
    }

    /// The rows for which `e` evaluates to `want` without an error.
    ///
    /// Where `e` holds a node TPE knows always errors, Cedar's left-to-right evaluation is
    /// followed exactly: such a node is neither true nor false, and an error skips the policy.
    fn truth(&mut self, e: &Expr, want: bool) -> Filter {
        if !has_error(e) {
            let f = self.boolean(e);
            return if want { f } else { negate(f) };
        }
        match e {
            Expr::ResidualError => Filter::False,
            Expr::UnaryOp {
                op: UnaryOp::Not,
                expr,
            } => self.truth(expr, !want),
            Expr::BinaryOp {
                op: BinaryOp::And,
                left,
                right,
            } => {
                if want {
                    and2(self.truth(left, true), self.truth(right, true))
                } else {
                    let l_false = self.truth(left, false);
                    let l_true = self.truth(left, true);
                    or2(l_false, and2(l_true, self.truth(right, false)))
                }
            }
            Expr::BinaryOp {
                op: BinaryOp::Or,
                left,
                right,
            } => {
                if want {
                    let l_true = self.truth(left, true);
                    let l_false = self.truth(left, false);
                    or2(l_true, and2(l_false, self.truth(right, true)))
                } else {
                    and2(self.truth(left, false), self.truth(right, false))
                }
            }
            Expr::IfThenElse {
                cond,
                then_expr,
                else_expr,
            } => {
                let c_true = self.truth(cond, true);
                let c_false = self.truth(cond, false);
                or2(
                    and2(c_true, self.truth(then_expr, want)),
                    and2(c_false, self.truth(else_expr, want)),
                )
            }
            other => Filter::Unmappable {
                detail: format!("`{other}` holds an expression that always errors"),
            },
        }
    }

    /// The rows for which the boolean expression `e` (free of error nodes) is true.
    fn boolean(&mut self, e: &Expr) -> Filter {
        match e {
            Expr::Literal(Literal::Bool(b)) => {
                if *b {
                    Filter::True
                } else {
                    Filter::False
                }
            }
            Expr::UnaryOp {
                op: UnaryOp::Not,
                expr,
            } => negate(self.boolean(expr)),
            Expr::BinaryOp { op, left, right } => match op {
                BinaryOp::And => and2(self.boolean(left), self.boolean(right)),
                BinaryOp::Or => or2(self.boolean(left), self.boolean(right)),
                BinaryOp::Eq => self.equality(e, left, right),
                BinaryOp::NotEq => negate(self.equality(e, left, right)),
                BinaryOp::Less => self.ordering(e, left, right, Cmp::Lt),
                BinaryOp::LessEq => self.ordering(e, left, right, Cmp::Le),
                BinaryOp::Greater => self.ordering(e, left, right, Cmp::Gt),
                BinaryOp::GreaterEq => self.ordering(e, left, right, Cmp::Ge),
                BinaryOp::In => self.membership(e, left, right),
                BinaryOp::Contains => self.contains(e, left, right),
                BinaryOp::ContainsAny => self.contains_any(e, left, right),
                BinaryOp::ContainsAll => self.contains_all(e, left, right),
                _ => self.opaque(e),
            },
            Expr::IfThenElse {
                cond,
                then_expr,
                else_expr,
            } => {
                let c = self.boolean(cond);
                let not_c = negate(c.clone());
                or2(
                    and2(c, self.boolean(then_expr)),
                    and2(not_c, self.boolean(else_expr)),
                )
            }
            Expr::HasAttr { expr, attrs } => self.has(e, expr, attrs),
            Expr::Like { expr, pattern } => match self.side(expr) {
                Side::Attr(attr) => match like_pattern(pattern) {
                    Some(pattern) => Filter::Like { attr, pattern },
                    None => Filter::Unmappable {
                        detail: format!("`{e}`: the contract has no escape for a backslash"),
                    },
                },
                Side::Deref(f) => f,
                _ => self.opaque(e),
            },
            Expr::Is {
                expr,
                entity_type,
                in_expr,
            } => match self.side(expr) {
                Side::Row => {
                    if &type_name(entity_type) != self.row_type {
                        return Filter::False;
                    }
                    match in_expr {
                        None => Filter::True,
                        Some(target) => self.membership(e, expr, target),
                    }
                }
                Side::Deref(f) => f,
                _ => self.opaque(e),
            },
            Expr::GetAttr { .. } => match self.side(e) {
                Side::Attr(attr) => Filter::Compare {
                    attr,
                    cmp: Cmp::Eq,
                    value: Value::Bool(true),
                },
                Side::Deref(f) => f,
                _ => self.opaque(e),
            },
            _ => self.opaque(e),
        }
    }

    /// `left == right`.
    fn equality(&mut self, e: &Expr, left: &Expr, right: &Expr) -> Filter {
        match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => f,
            (Side::Row, Side::Lit(x)) | (Side::Lit(x), Side::Row) => match entity(x) {
                Some(entity) => Filter::Is { entity },
                None => self.opaque(e),
            },
            (Side::Attr(attr), Side::Lit(x)) | (Side::Lit(x), Side::Attr(attr)) => {
                match scalar(x) {
                    Some(value) => Filter::Compare {
                        attr,
                        cmp: Cmp::Eq,
                        value,
                    },
                    None => Filter::Unmappable {
                        detail: format!("`{e}` compares with a set or record"),
                    },
                }
            }
            _ => self.opaque(e),
        }
    }

    /// `left < right` and friends: only integers.
    fn ordering(&mut self, e: &Expr, left: &Expr, right: &Expr, cmp: Cmp) -> Filter {
        let (attr, lit, cmp) = match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => return f,
            (Side::Attr(attr), Side::Lit(x)) => (attr, x, cmp),
            (Side::Lit(x), Side::Attr(attr)) => (attr, x, cmp.swapped()),
            _ => return self.opaque(e),
        };
        match lit {
            Expr::Literal(Literal::Long(n)) => Filter::Compare {
                attr,
                cmp,
                value: json!(n),
            },
            _ => self.opaque(e),
        }
    }

    /// `left in right`.
    fn membership(&mut self, e: &Expr, left: &Expr, right: &Expr) -> Filter {
        match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => f,
            (Side::Row, Side::Lit(x)) => {
                if let Some(entity) = entity(x) {
                    Filter::In { entity }
                } else if let Some(set) = entity_set(x) {
                    Filter::Or(
                        set.into_iter()
                            .map(|entity| Filter::In { entity })
                            .collect(),
                    )
                } else {
                    self.opaque(e)
                }
            }
            (Side::Lit(x), Side::Row) => match entity(x) {
                Some(p) => match self.self_and_ancestors(&p) {
                    Some(all) => Filter::Or(
                        all.into_iter()
                            .map(|entity| Filter::Is { entity })
                            .collect(),
                    ),
                    None => no_ancestors(e, &p),
                },
                None => self.opaque(e),
            },
            (Side::Lit(x), Side::Attr(attr)) => {
                let Some(p) = entity(x) else {
                    return self.opaque(e);
                };
                let Some(all) = self.self_and_ancestors(&p) else {
                    return no_ancestors(e, &p);
                };
                let values: Vec<Value> = all.iter().map(entity_value).collect();
                match self.kind(&attr) {
                    Kind::Set => Filter::ContainsAny { attr, values },
                    Kind::Entity => Filter::Or(
                        values
                            .into_iter()
                            .map(|value| Filter::Compare {
                                attr: attr.clone(),
                                cmp: Cmp::Eq,
                                value,
                            })
                            .collect(),
                    ),
                    Kind::Record | Kind::Other => self.opaque(e),
                }
            }
            (Side::Attr(_), _) => Filter::Unknown {
                detail: format!("`{e}` needs the ancestors of an entity the row only names"),
            },
            _ => self.opaque(e),
        }
    }

    /// `left.contains(right)`.
    fn contains(&mut self, e: &Expr, left: &Expr, right: &Expr) -> Filter {
        match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => f,
            (Side::Attr(attr), Side::Lit(x)) => match scalar(x) {
                Some(value) => Filter::Contains { attr, value },
                None => self.opaque(e),
            },
            // `[a, b].contains(resource.x)` is `resource.x` equal to one of them.
            (Side::Lit(x), Side::Attr(attr)) => match scalar_set(x) {
                Some(values) => Filter::Or(
                    values
                        .into_iter()
                        .map(|value| Filter::Compare {
                            attr: attr.clone(),
                            cmp: Cmp::Eq,
                            value,
                        })
                        .collect(),
                ),
                None => self.opaque(e),
            },
            _ => self.opaque(e),
        }
    }

    /// `left.containsAny(right)`, which is symmetric.
    fn contains_any(&mut self, e: &Expr, left: &Expr, right: &Expr) -> Filter {
        match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => f,
            (Side::Attr(attr), Side::Lit(x)) | (Side::Lit(x), Side::Attr(attr)) => {
                match scalar_set(x) {
                    Some(values) => Filter::ContainsAny { attr, values },
                    None => self.opaque(e),
                }
            }
            _ => self.opaque(e),
        }
    }

    /// `left.containsAll(right)`: only with the attribute on the left.
    fn contains_all(&mut self, e: &Expr, left: &Expr, right: &Expr) -> Filter {
        match (self.side(left), self.side(right)) {
            (Side::Deref(f), _) | (_, Side::Deref(f)) => f,
            (Side::Attr(attr), Side::Lit(x)) => match scalar_set(x) {
                Some(values) => Filter::ContainsAll { attr, values },
                None => self.opaque(e),
            },
            _ => self.opaque(e),
        }
    }

    /// `expr has a.b.c`.
    fn has(&mut self, e: &Expr, expr: &Expr, attrs: &pst::NonEmpty<pst::SmolStr>) -> Filter {
        let mut path = match self.side(expr) {
            Side::Row => Vec::new(),
            Side::Attr(p) => p,
            Side::Deref(f) => return f,
            _ => return self.opaque(e),
        };
        let base = path.len().max(1);
        path.extend(attrs.iter().map(ToString::to_string));
        for end in base..path.len() {
            if self.kind(path.get(..end).unwrap_or_default()) != Kind::Record {
                return deref(e);
            }
        }
        Filter::Has { attr: path }
    }

    /// [`opaque`] for this plan's row variable.
    fn opaque(&self, e: &Expr) -> Filter {
        opaque(e, &self.row)
    }

    /// Classifies an operand.
    fn side<'e>(&mut self, e: &'e Expr) -> Side<'e> {
        match e {
            Expr::Var(v) if *v == self.row => Side::Row,
            Expr::GetAttr { .. } if rooted_at(e, &self.row) => match self.path(e) {
                Some(p) => Side::Attr(p),
                None => Side::Deref(deref(e)),
            },
            _ if is_literal(e) => Side::Lit(e),
            _ => Side::Other,
        }
    }

    /// The attribute path of `resource.a.b...`, or `None` when it passes through an entity.
    fn path(&mut self, e: &Expr) -> Option<Vec<String>> {
        match e {
            Expr::Var(v) if *v == self.row => Some(Vec::new()),
            Expr::GetAttr { expr, attr } => {
                let mut p = self.path(expr)?;
                if !p.is_empty() && self.kind(&p) != Kind::Record {
                    return None;
                }
                p.push(attr.to_string());
                Some(p)
            }
            _ => None,
        }
    }

    /// The principal-side entity and its ancestors (from the caller's entities), in a stable
    /// order; `None` when the caller did not give the entity.
    fn self_and_ancestors(&self, uid: &EntityUid) -> Option<Vec<EntityUid>> {
        let mut ancestors: Vec<EntityUid> = self.entities.ancestors(uid)?.cloned().collect();
        ancestors.sort_by_cached_key(ToString::to_string);
        ancestors.dedup();
        ancestors.retain(|a| a != uid);
        Some(std::iter::once(uid.clone()).chain(ancestors).collect())
    }

    /// What the resource attribute path holds, learned from the schema by validating tiny
    /// probe policies (the public API exposes no attribute types). Anything not positively
    /// shown to be a record is never read through.
    fn kind(&mut self, path: &[String]) -> Kind {
        if let Some(k) = self.kinds.get(self.row_type, path) {
            return k;
        }
        let is_entity = |v: Arc<Expr>, ty: &pst::EntityType| Expr::Is {
            expr: v,
            entity_type: ty.clone(),
            in_expr: None,
        };
        let kind = if self.probe(path, &is_entity) {
            Kind::Entity
        } else if self.probe(path, &|v, _| Expr::UnaryOp {
            op: UnaryOp::IsEmpty,
            expr: v,
        }) {
            Kind::Set
        } else if self.probe(path, &|v, _| Expr::HasAttr {
            expr: v,
            attrs: pst::NonEmpty {
                head: "plan_probe".into(),
                tail: Vec::new(),
            },
        }) {
            Kind::Record
        } else {
            Kind::Other
        };
        self.kinds.put(self.row_type, path, kind);
        kind
    }

    /// Whether `permit(principal, action == A, resource is T) when { resource has path &&
    /// check(resource.path) };` passes strict validation (with `principal` in the place of
    /// `resource` when the rows are principals).
    fn probe(
        &mut self,
        path: &[String],
        check: &dyn Fn(Arc<Expr>, &pst::EntityType) -> Expr,
    ) -> bool {
        let (Some(ty), Some(action), Some((head, tail))) = (
            pst_type(self.row_type),
            pst_uid(self.action),
            path.split_first(),
        ) else {
            return false;
        };
        let resource = Arc::new(Expr::Var(self.row.clone()));
        let guard = Expr::HasAttr {
            expr: Arc::clone(&resource),
            attrs: pst::NonEmpty {
                head: head.as_str().into(),
                tail: tail.iter().map(|a| a.as_str().into()).collect(),
            },
        };
        let value = path.iter().fold(resource, |acc, a| {
            Arc::new(Expr::GetAttr {
                expr: acc,
                attr: a.as_str().into(),
            })
        });
        let cond = Expr::BinaryOp {
            op: BinaryOp::And,
            left: Arc::new(guard),
            right: Arc::new(check(value, &ty)),
        };
        let template = pst::Template::new(
            pst::PolicyID("plan_probe".into()),
            pst::Effect::Permit,
            if self.row == Var::Principal {
                PrincipalConstraint::Is(ty.clone())
            } else {
                PrincipalConstraint::Any
            },
            ActionConstraint::Eq(action),
            if self.row == Var::Principal {
                ResourceConstraint::Any
            } else {
                ResourceConstraint::Is(ty)
            },
        )
        .try_with_clauses(vec![Clause::When(Arc::new(cond))]);
        let Some(set) = template
            .ok()
            .and_then(|t| pst::StaticPolicy::try_from(t).ok())
            .and_then(|p| Policy::from_pst(pst::Policy::Static(p)).ok())
            .and_then(|p| PolicySet::from_policies([p]).ok())
        else {
            return false;
        };
        self.kinds
            .validator
            .validate(&set, ValidationMode::Strict)
            .validation_passed()
    }
}

fn and2(a: Filter, b: Filter) -> Filter {
    Filter::And(vec![a, b])
}

fn or2(a: Filter, b: Filter) -> Filter {
    Filter::Or(vec![a, b])
}

/// `not f`, with comparisons flipped instead of wrapped (`!(x == 1)` is `x != 1`).
fn negate(f: Filter) -> Filter {
    match f {
        Filter::True => Filter::False,
        Filter::False => Filter::True,
        Filter::Not(inner) => *inner,
        Filter::Compare { attr, cmp, value } => Filter::Compare {
            attr,
            cmp: cmp.negated(),
            value,
        },
        other => Filter::Not(Box::new(other)),
    }
}

/// A node for `e`, which has no faithful operator: `unknown` when it does not involve the
/// row's variable (it is left over only because an entity's data was not given), else
/// `unmappable`.
fn opaque(e: &Expr, row: &Var) -> Filter {
    if mentions(e, row) {
        Filter::Unmappable {
            detail: format!("no filter operator for `{e}`"),
        }
    } else {
        Filter::Unknown {
            detail: format!("`{e}` needs entity data the plan was not given"),
        }
    }
}

fn deref(e: &Expr) -> Filter {
    Filter::Unknown {
        detail: format!("`{e}` reads another entity's attributes, which are not in the row"),
    }
}

fn no_ancestors(e: &Expr, uid: &EntityUid) -> Filter {
    Filter::Unknown {
        detail: format!("`{e}` needs the ancestors of `{uid}`, which the plan was not given"),
    }
}

fn mentions(e: &Expr, row: &Var) -> bool {
    e.reduce(
        &|x| matches!(x, Expr::Var(v) if v == row).then_some(true),
        &|a, b| a || b,
        false,
    )
}

fn has_error(e: &Expr) -> bool {
    e.reduce(
        &|x| matches!(x, Expr::ResidualError).then_some(true),
        &|a, b| a || b,
        false,
    )
}

fn rooted_at(e: &Expr, row: &Var) -> bool {
    match e {
        Expr::Var(v) => v == row,
        Expr::GetAttr { expr, .. } => rooted_at(expr, row),
        _ => false,
    }
}

/// A literal as a Cedar JSON value.
fn literal(e: &Expr) -> Option<Value> {
    match e {
        Expr::Literal(Literal::Bool(b)) => Some(Value::Bool(*b)),
        Expr::Literal(Literal::Long(n)) => Some(json!(n)),
        Expr::Literal(Literal::String(s)) => Some(Value::String(s.to_string())),
        Expr::Literal(Literal::EntityUID(_)) => entity(e).map(|u| entity_value(&u)),
        Expr::Set(items) => items
            .iter()
            .map(|i| literal(i))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        Expr::Record(fields) => fields
            .iter()
            .map(|(k, v)| Some((k.clone(), literal(v)?)))
            .collect::<Option<Map<String, Value>>>()
            .map(Value::Object),
        _ => None,
    }
}

/// Whether [`literal`] gives a value for `e` (without building it).
fn is_literal(e: &Expr) -> bool {
    match e {
        Expr::Literal(Literal::Bool(_) | Literal::Long(_) | Literal::String(_)) => true,
        Expr::Literal(Literal::EntityUID(_)) => entity(e).is_some(),
        Expr::Set(items) => items.iter().all(|i| is_literal(i)),
        Expr::Record(fields) => fields.values().all(|v| is_literal(v)),
        _ => false,
    }
}

/// A string, integer, boolean or entity literal.
fn scalar(e: &Expr) -> Option<Value> {
    match e {
        // A set literal is an array: never a scalar.
        Expr::Set(_) => None,
        _ => {
            literal(e).filter(|v| (!v.is_array() && !v.is_object()) || v.get("__entity").is_some())
        }
    }
}

/// A set literal of scalars.
fn scalar_set(e: &Expr) -> Option<Vec<Value>> {
    match e {
        Expr::Set(items) => items.iter().map(|i| scalar(i)).collect(),
        _ => None,
    }
}

fn entity(e: &Expr) -> Option<EntityUid> {
    match e {
        Expr::Literal(Literal::EntityUID(u)) => Some(EntityUid::from_type_name_and_id(
            type_name(&u.ty),
            EntityId::new(u.eid.as_str()),
        )),
        _ => None,
    }
}

/// The entity type of a residual as Cedar's public type, converted without printing and
/// parsing it again (the residual's names are already valid, and names compare without their
/// source locations).
fn type_name(ty: &pst::EntityType) -> EntityTypeName {
    EntityTypeName::from(cedar_policy_core::ast::EntityType::from(ty.clone()))
}

fn entity_set(e: &Expr) -> Option<Vec<EntityUid>> {
    match e {
        Expr::Set(items) => items.iter().map(|i| entity(i)).collect(),
        _ => None,
    }
}

/// The contract's pattern text: `*` is the wildcard and `\*` a literal star. A literal
/// backslash has no agreed escape, so such patterns are not translated.
fn like_pattern(pattern: &[PatternElem]) -> Option<String> {
    let mut out = String::new();
    for elem in pattern {
        match elem {
            PatternElem::Wildcard => out.push('*'),
            PatternElem::Char('*') => out.push_str("\\*"),
            PatternElem::Char('\\') => return None,
            PatternElem::Char(c) => out.push(*c),
        }
    }
    Some(out)
}

fn pst_type(ty: &EntityTypeName) -> Option<pst::EntityType> {
    pst::Name::qualified(ty.namespace_components(), ty.basename())
        .ok()
        .map(pst::EntityType::from_name)
}

fn pst_uid(uid: &EntityUid) -> Option<pst::EntityUID> {
    Some(pst::EntityUID {
        ty: pst_type(uid.type_name())?,
        eid: uid.id().unescaped().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::{combine, combine_simplified, Cmp, Filter};
    use serde_json::{json, Value};

    fn eq(attr: &str, value: Value) -> Filter {
        Filter::Compare {
            attr: vec![attr.to_owned()],
            cmp: Cmp::Eq,
            value,
        }
    }

    /// Many arguments, with repeats spelled differently (object keys in another order), so the
    /// fingerprint path of `junction` runs: the first of each repeat is kept, in order.
    #[test]
    fn long_junctions_drop_repeats_like_short_ones() {
        let entity = |id: usize, flip: bool| {
            let mut m = serde_json::Map::new();
            if flip {
                m.insert("id".into(), json!(format!("g{id}")));
                m.insert("type".into(), json!("Group"));
            } else {
                m.insert("type".into(), json!("Group"));
                m.insert("id".into(), json!(format!("g{id}")));
            }
            json!({ "__entity": Value::Object(m) })
        };
        let args: Vec<Filter> = (0..40)
            .map(|i| eq("readers", entity(i % 13, i % 2 == 1)))
            .chain([
                Filter::False,
                Filter::Has {
                    attr: vec!["x".into()],
                },
            ])
            .chain((0..5).map(|i| Filter::Not(Box::new(eq("n", json!(i % 3))))))
            .collect();
        let want: Vec<Filter> = (0..13)
            .map(|i| eq("readers", entity(i, i % 2 == 1)))
            .chain([Filter::Has {
                attr: vec!["x".into()],
            }])
            .chain((0..3).map(|i| Filter::Not(Box::new(eq("n", json!(i))))))
            .collect();
        // `not (n == i)` simplifies as is (no comparison flipping in `simplify`).
        assert_eq!(Filter::Or(args).simplify(), Filter::Or(want));
    }

    /// `combine_simplified` on simplified filters equals `combine`.
    #[test]
    fn combine_simplified_is_combine() {
        let leaf = |i: usize| eq("a", json!(i % 4));
        let filters: Vec<Filter> = vec![
            Filter::True,
            Filter::False,
            leaf(1),
            Filter::And(vec![leaf(1), leaf(2)]),
            Filter::Or(vec![leaf(3), leaf(1), Filter::And(vec![leaf(0), leaf(2)])]),
            Filter::Not(Box::new(Filter::Or(vec![leaf(2), leaf(3)]))),
            Filter::Or((0..20).map(leaf).collect()),
        ]
        .into_iter()
        .map(Filter::simplify)
        .collect();
        for n in 0..filters.len() {
            for m in 0..filters.len() {
                let permits: Vec<Filter> = filters.iter().skip(n).take(3).cloned().collect();
                let forbids: Vec<Filter> = filters.iter().skip(m).take(2).cloned().collect();
                let p: Vec<&Filter> = permits.iter().collect();
                let f: Vec<&Filter> = forbids.iter().collect();
                assert_eq!(
                    combine_simplified(permits.clone(), forbids.clone()),
                    combine(&p, &f)
                );
                assert_eq!(
                    Filter::and_of_simplified(permits.clone()),
                    Filter::And(permits.clone()).simplify()
                );
            }
        }
    }
}
