//! Query-plan filters (docs/plans.md): the exact contract JSON for each residual form, the
//! simplifier, and, over every example application in `tests/testdata/cedar-examples`, that the
//! combined filter matches a row exactly when Cedar allows the request on it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use cedar_policy::{
    Authorizer, Context, Decision, Effect, Entities, Entity, EntityTypeName, EntityUid, PolicySet,
    Request, Schema, ValidationMode, Validator,
};
use pdp_core::residual_filter::{combine, residuals, AttrKinds, Cmp, Filter, PlanError, Residual};
mod bundle_dir;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::str::FromStr;

// ------------------------------------------------------------------------------------------
// Fixture: a small schema with one attribute of each shape.

const SCHEMA: &str = r#"
entity Group in [Group];
entity User in [Group] { dept: String, level: Long };
entity Folder in [Folder];
entity Doc in [Folder] {
  owner: User,
  title: String,
  level: Long,
  public: Bool,
  tags: Set<String>,
  viewers: Set<Group>,
  editors: Group,
  meta: { level: Long, label?: String },
  score?: Long,
  created: datetime,
} tags String;
entity Other;
action view appliesTo {
  principal: [User],
  resource: [Doc, Other],
  context: { flag: Bool, n: Long }
};
action edit appliesTo { principal: [User], resource: [Doc] };
"#;

fn schema() -> Schema {
    Schema::from_cedarschema_str(SCHEMA).unwrap().0
}

fn uid(s: &str) -> EntityUid {
    EntityUid::from_str(s).unwrap()
}

fn ty(s: &str) -> EntityTypeName {
    EntityTypeName::from_str(s).unwrap()
}

fn entities(schema: &Schema) -> Entities {
    Entities::from_json_value(
        json!([
            {"uid": {"type": "User", "id": "alice"}, "attrs": {"dept": "eng", "level": 3},
             "parents": [{"type": "Group", "id": "eng"}]},
            {"uid": {"type": "Group", "id": "eng"}, "attrs": {},
             "parents": [{"type": "Group", "id": "all"}]},
            {"uid": {"type": "Group", "id": "all"}, "attrs": {}, "parents": []}
        ]),
        Some(schema),
    )
    .unwrap()
}

fn policy_set(text: &str, schema: &Schema) -> PolicySet {
    let set = PolicySet::from_str(text).unwrap();
    let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
    assert!(result.validation_passed(), "{text}: {result}");
    set
}

fn context(schema: &Schema, action: &EntityUid) -> Context {
    Context::from_json_value(json!({"flag": true, "n": 5}), Some((schema, action))).unwrap()
}

/// Residuals of `policies` for alice viewing resources of `resource_type`.
fn plan(policies: &str, resource_type: &str) -> Vec<Residual> {
    let schema = schema();
    let action = uid(r#"Action::"view""#);
    residuals(
        &policy_set(policies, &schema),
        &schema,
        &AttrKinds::new(&schema),
        &uid(r#"User::"alice""#),
        &action,
        context(&schema, &action),
        &ty(resource_type),
        &entities(&schema),
    )
    .unwrap()
}

/// The filter JSON of one permit's condition on `Doc` rows (`false` when it was left out).
fn when(condition: &str) -> Value {
    let text = format!(
        "permit(principal, action == Action::\"view\", resource is Doc) when {{ {condition} }};"
    );
    let out = plan(&text, "Doc");
    assert!(out.len() <= 1, "{out:?}");
    match out.first() {
        Some(r) => {
            assert_eq!(r.effect, Effect::Permit);
            r.filter.to_json()
        }
        None => json!({"op": "false"}),
    }
}

fn cmp(attr: &[&str], cmp: &str, value: Value) -> Value {
    json!({"op": "compare", "attr": attr, "cmp": cmp, "value": value})
}

fn ent(t: &str, id: &str) -> Value {
    json!({"__entity": {"type": t, "id": id}})
}

fn op(v: &Value) -> &str {
    v["op"].as_str().unwrap()
}

// ------------------------------------------------------------------------------------------
// One residual form per test.

#[test]
fn comparisons_with_a_literal_on_either_side() {
    assert_eq!(when("resource.level >= 3"), cmp(&["level"], "ge", json!(3)));
    assert_eq!(when("resource.level > 3"), cmp(&["level"], "gt", json!(3)));
    assert_eq!(when("resource.level < 3"), cmp(&["level"], "lt", json!(3)));
    assert_eq!(when("resource.level <= 3"), cmp(&["level"], "le", json!(3)));
    // Literal on the left: the comparison is flipped.
    assert_eq!(when("3 < resource.level"), cmp(&["level"], "gt", json!(3)));
    assert_eq!(when("3 >= resource.level"), cmp(&["level"], "le", json!(3)));
    assert_eq!(
        when(r#""q1" == resource.title"#),
        cmp(&["title"], "eq", json!("q1"))
    );
    assert_eq!(
        when(r#"resource.title != "q1""#),
        cmp(&["title"], "ne", json!("q1"))
    );
    // Known values (context, principal attributes) are folded in by partial evaluation.
    assert_eq!(
        when("resource.level <= context.n"),
        cmp(&["level"], "le", json!(5))
    );
    assert_eq!(
        when("resource.level == principal.level"),
        cmp(&["level"], "eq", json!(3))
    );
    assert_eq!(
        when("resource.owner == principal"),
        cmp(&["owner"], "eq", ent("User", "alice"))
    );
    assert_eq!(
        when("resource.meta.level == 2"),
        cmp(&["meta", "level"], "eq", json!(2))
    );
    // A boolean attribute on its own, and negated.
    assert_eq!(when("resource.public"), cmp(&["public"], "eq", json!(true)));
    assert_eq!(
        when("!resource.public"),
        cmp(&["public"], "ne", json!(true))
    );
}

#[test]
fn has_contains_and_like() {
    assert_eq!(
        when("resource has score"),
        json!({"op": "has", "attr": ["score"]})
    );
    assert_eq!(
        when("resource.meta has label"),
        json!({"op": "has", "attr": ["meta", "label"]})
    );
    assert_eq!(
        when(r#"resource.meta has label && resource.meta.label == "x""#),
        json!({"op": "and", "args": [
            {"op": "has", "attr": ["meta", "label"]},
            cmp(&["meta", "label"], "eq", json!("x"))
        ]})
    );
    assert_eq!(
        when(r#"resource.tags.contains("a")"#),
        json!({"op": "contains", "attr": ["tags"], "value": "a"})
    );
    assert_eq!(
        when(r#"resource.tags.containsAny(["a", "b"])"#),
        json!({"op": "contains_any", "attr": ["tags"], "values": ["a", "b"]})
    );
    // containsAny is symmetric.
    assert_eq!(
        when(r#"["a", "b"].containsAny(resource.tags)"#),
        json!({"op": "contains_any", "attr": ["tags"], "values": ["a", "b"]})
    );
    assert_eq!(
        when(r#"resource.tags.containsAll(["a", "b"])"#),
        json!({"op": "contains_all", "attr": ["tags"], "values": ["a", "b"]})
    );
    // A literal set holding the attribute is a disjunction of equalities.
    assert_eq!(
        when(r#"["a", "b"].contains(resource.title)"#),
        json!({"op": "or", "args": [
            cmp(&["title"], "eq", json!("a")),
            cmp(&["title"], "eq", json!("b"))
        ]})
    );
    assert_eq!(
        when(r#"resource.title like "re*port\*""#),
        json!({"op": "like", "attr": ["title"], "pattern": "re*port\\*"})
    );
}

#[test]
fn entity_tests_on_the_resource() {
    assert_eq!(
        when(r#"resource in Folder::"f1""#),
        json!({"op": "in", "entity": {"type": "Folder", "id": "f1"}})
    );
    assert_eq!(
        when(r#"resource in [Folder::"f1", Folder::"f2"]"#),
        json!({"op": "or", "args": [
            {"op": "in", "entity": {"type": "Folder", "id": "f1"}},
            {"op": "in", "entity": {"type": "Folder", "id": "f2"}}
        ]})
    );
    assert_eq!(
        when(r#"resource == Doc::"d1""#),
        json!({"op": "is", "entity": {"type": "Doc", "id": "d1"}})
    );
    assert_eq!(
        when(r#"resource != Doc::"d1""#),
        json!({"op": "not", "arg": {"op": "is", "entity": {"type": "Doc", "id": "d1"}}})
    );
    // In the scope too.
    let out = plan(
        r#"permit(principal, action, resource in Folder::"f1");"#,
        "Doc",
    );
    assert_eq!(
        out[0].filter.to_json(),
        json!({"op": "in", "entity": {"type": "Folder", "id": "f1"}})
    );
    // `is` is decided by the planned type.
    assert_eq!(when("resource is Doc"), json!({"op": "true"}));
    assert_eq!(
        when(r#"resource is Doc in Folder::"f1""#),
        json!({"op": "in", "entity": {"type": "Folder", "id": "f1"}})
    );
    let text = r#"permit(principal, action, resource is Doc);"#;
    assert_eq!(plan(text, "Doc")[0].filter, Filter::True);
    assert!(plan(text, "Other").is_empty());
}

#[test]
fn principal_in_a_resource_attribute_uses_the_principals_ancestors() {
    // A set of groups: any of alice, her group and its parent.
    assert_eq!(
        when("principal in resource.viewers"),
        json!({"op": "contains_any", "attr": ["viewers"], "values": [
            ent("User", "alice"), ent("Group", "all"), ent("Group", "eng")
        ]})
    );
    // A single group: equal to one of them.
    assert_eq!(
        when("principal in resource.editors"),
        json!({"op": "or", "args": [
            cmp(&["editors"], "eq", ent("User", "alice")),
            cmp(&["editors"], "eq", ent("Group", "all")),
            cmp(&["editors"], "eq", ent("Group", "eng"))
        ]})
    );
}

#[test]
fn boolean_structure() {
    assert_eq!(
        when(r#"resource.public || (resource.level > 1 && !(resource.title == "x"))"#),
        json!({"op": "or", "args": [
            cmp(&["public"], "eq", json!(true)),
            {"op": "and", "args": [
                cmp(&["level"], "gt", json!(1)),
                cmp(&["title"], "ne", json!("x"))
            ]}
        ]})
    );
    assert_eq!(
        when("!(resource has score && resource.score > 1)"),
        json!({"op": "not", "arg": {"op": "and", "args": [
            {"op": "has", "attr": ["score"]},
            cmp(&["score"], "gt", json!(1))
        ]}})
    );
    assert_eq!(
        when("if resource has score then resource.score > 1 else resource.public"),
        json!({"op": "or", "args": [
            {"op": "and", "args": [
                {"op": "has", "attr": ["score"]},
                cmp(&["score"], "gt", json!(1))
            ]},
            {"op": "and", "args": [
                {"op": "not", "arg": {"op": "has", "attr": ["score"]}},
                cmp(&["public"], "eq", json!(true))
            ]}
        ]})
    );
    // Known parts fold away.
    assert_eq!(
        when("context.flag && resource.public"),
        cmp(&["public"], "eq", json!(true))
    );
    assert_eq!(
        when("!context.flag && resource.public"),
        json!({"op": "false"})
    );
    // `unless` negates.
    let out = plan(
        r#"permit(principal, action, resource is Doc) unless { resource.level > 2 };"#,
        "Doc",
    );
    assert_eq!(out[0].filter.to_json(), cmp(&["level"], "le", json!(2)));
}

#[test]
fn data_of_other_entities_is_unknown() {
    for condition in [
        r#"resource.owner.dept == "eng""#,
        r#"resource.owner in Group::"eng""#,
        r#"resource.owner.level > 2"#,
    ] {
        // `>` is `!(<=)` in Cedar's AST, so the node may sit under a `not`.
        let f = when(condition);
        let node = if op(&f) == "not" { &f["arg"] } else { &f };
        assert_eq!(op(node), "unknown", "{condition}: {f}");
        assert!(
            node["detail"].as_str().unwrap().contains("resource.owner"),
            "{f}"
        );
    }
}

#[test]
fn constructs_without_an_operator_are_unmappable() {
    for condition in [
        "resource.level + 1 > 3",
        "resource.level > resource.meta.level",
        "resource.tags.isEmpty()",
        r#"resource.hasTag("x")"#,
        r#"resource.hasTag("x") && resource.getTag("x") == "y""#,
        r#"resource.created < datetime("2024-01-01")"#,
        r#"["a"].containsAll(resource.tags)"#,
        r#"resource.title like "a\\b*""#,
        r#"resource.tags == ["a"]"#,
    ] {
        let f = when(condition);
        let json = f.to_string();
        assert!(json.contains("\"unmappable\""), "{condition}: {json}");
        assert!(!json.contains("\"unknown\""), "{condition}: {json}");
    }
}

#[test]
fn always_erroring_parts_follow_cedar_error_semantics() {
    // `context.n + max` overflows: the conjunction errors when the attribute holds, so the
    // `unless` clause keeps the policy exactly for rows where `public` is false.
    let max = i64::MAX;
    let text = format!(
        "permit(principal, action == Action::\"view\", resource is Doc) \
         unless {{ resource.public && context.n + {max} > 0 }};"
    );
    let out = plan(&text, "Doc");
    assert_eq!(out[0].filter.to_json(), cmp(&["public"], "ne", json!(true)));
    // In a `when` it can never hold.
    assert_eq!(
        when(&format!("resource.public && context.n + {max} > 0")),
        json!({"op": "false"})
    );
}

#[test]
fn residuals_are_per_policy_and_combine() {
    let out = plan(
        r#"
        @id("open") permit(principal, action, resource is Doc) when { resource.public };
        @id("mine") permit(principal, action, resource is Doc) when { resource.owner == principal };
        @id("never") permit(principal, action == Action::"view", resource) when { !context.flag };
        @id("locked") forbid(principal, action, resource) when { resource has score && resource.score < 0 };
        "#,
        "Doc",
    );
    // Plain `PolicySet::from_str` names policies by position (`never` is `policy2`).
    let ids: Vec<String> = out.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(ids, ["policy0", "policy1", "policy3"]);
    let permits: Vec<&Filter> = out
        .iter()
        .filter(|r| r.effect == Effect::Permit)
        .map(|r| &r.filter)
        .collect();
    let forbids: Vec<&Filter> = out
        .iter()
        .filter(|r| r.effect == Effect::Forbid)
        .map(|r| &r.filter)
        .collect();
    let f = combine(&permits, &forbids);
    assert_eq!(
        f.to_json(),
        json!({"op": "and", "args": [
            {"op": "or", "args": [
                cmp(&["public"], "eq", json!(true)),
                cmp(&["owner"], "eq", ent("User", "alice"))
            ]},
            {"op": "not", "arg": {"op": "and", "args": [
                {"op": "has", "attr": ["score"]},
                cmp(&["score"], "lt", json!(0))
            ]}}
        ]})
    );
    assert_eq!(f.attributes(), ["owner", "public", "score"]);
    assert!(!f.needs_row_checks());
    assert_eq!(combine(&[], &forbids), Filter::False);
    assert_eq!(combine(&[&Filter::True], &[]), Filter::True);
    assert_eq!(combine(&[&Filter::True], &[&Filter::True]), Filter::False);
}

#[test]
fn plan_errors_name_what_is_wrong() {
    let schema = schema();
    let set = policy_set("permit(principal, action, resource);", &schema);
    let alice = uid(r#"User::"alice""#);
    let view = uid(r#"Action::"view""#);
    let edit = uid(r#"Action::"edit""#);
    let ents = entities(&schema);
    let run = |action: &EntityUid, ctx: Context, rt: &str| {
        residuals(
            &set,
            &schema,
            &AttrKinds::new(&schema),
            &alice,
            action,
            ctx,
            &ty(rt),
            &ents,
        )
        .unwrap_err()
    };
    let e = run(&view, context(&schema, &view), "Nope");
    assert_eq!(e, PlanError::UnknownResourceType("Nope".into()));
    assert_eq!(
        e.to_string(),
        "resource type `Nope` is not declared in the schema"
    );
    let e = run(&edit, Context::empty(), "Other");
    assert_eq!(
        e.to_string(),
        r#"action `Action::"edit"` does not apply to resource type `Other`"#
    );
    let e = run(&uid(r#"Action::"drop""#), Context::empty(), "Doc");
    assert_eq!(
        e.to_string(),
        r#"action `Action::"drop"` is not declared in the schema"#
    );
    let e = residuals(
        &set,
        &schema,
        &AttrKinds::new(&schema),
        &uid(r#"Group::"eng""#),
        &view,
        context(&schema, &view),
        &ty("Doc"),
        &ents,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"action `Action::"view"` does not apply to principal type `Group`"#
    );
    let e = run(&view, Context::empty(), "Doc");
    assert!(matches!(e, PlanError::InvalidRequest(_)), "{e}");
    assert!(e.to_string().starts_with("invalid plan request: "), "{e}");
}

#[test]
fn entities_that_break_the_schema_are_left_out_of_evaluation() {
    let schema = schema();
    let mut list: Vec<Entity> = entities(&schema).iter().cloned().collect();
    // `level` should be a Long: TPE refuses the whole set with this entity in it.
    list.push(
        Entity::from_json_value(
            json!({"uid": {"type": "User", "id": "mallory"}, "attrs": {"level": "high"},
                   "parents": []}),
            None,
        )
        .unwrap(),
    );
    let ents = Entities::from_entities(list, None).unwrap();
    let action = uid(r#"Action::"view""#);
    let text = r#"permit(principal, action == Action::"view", resource is Doc)
        when { principal.level == 3 && principal in resource.viewers };"#;
    let out = residuals(
        &policy_set(text, &schema),
        &schema,
        &AttrKinds::new(&schema),
        &uid(r#"User::"alice""#),
        &action,
        context(&schema, &action),
        &ty("Doc"),
        &ents,
    )
    .unwrap();
    // alice's own data still reached partial evaluation.
    assert_eq!(
        out[0].filter.to_json(),
        json!({"op": "contains_any", "attr": ["viewers"], "values": [
            ent("User", "alice"), ent("Group", "all"), ent("Group", "eng")
        ]})
    );
    // mallory's did not: what depends on it is unknown, never guessed.
    let out = residuals(
        &policy_set(text, &schema),
        &schema,
        &AttrKinds::new(&schema),
        &uid(r#"User::"mallory""#),
        &action,
        context(&schema, &action),
        &ty("Doc"),
        &ents,
    )
    .unwrap();
    assert!(out[0].filter.needs_row_checks(), "{:?}", out[0].filter);
}

// ------------------------------------------------------------------------------------------
// Filter methods on hand-built trees.

fn leaf(name: &str) -> Filter {
    Filter::Has {
        attr: vec![name.to_owned()],
    }
}

#[test]
fn simplify_folds_flattens_and_dedupes() {
    use Filter::{And, False, Not, Or, True};
    let a = || leaf("a");
    let b = || leaf("b");
    let c = || leaf("c");
    assert_eq!(And(vec![a(), True]).simplify(), a());
    assert_eq!(And(vec![a(), False, b()]).simplify(), False);
    assert_eq!(Or(vec![a(), True]).simplify(), True);
    assert_eq!(Or(vec![False, a(), False]).simplify(), a());
    assert_eq!(And(vec![]).simplify(), True);
    assert_eq!(Or(vec![]).simplify(), False);
    assert_eq!(Not(Box::new(True)).simplify(), False);
    assert_eq!(Not(Box::new(And(vec![a(), False]))).simplify(), True);
    assert_eq!(Not(Box::new(Not(Box::new(a())))).simplify(), a());
    // Flattening keeps the order of first appearance and drops repeats.
    assert_eq!(
        And(vec![a(), And(vec![b(), And(vec![c(), a()])]), b()]).simplify(),
        And(vec![a(), b(), c()])
    );
    assert_eq!(
        Or(vec![Or(vec![b(), a()]), a(), Or(vec![b()])]).simplify(),
        Or(vec![b(), a()])
    );
    // Different kinds do not flatten into each other.
    assert_eq!(
        And(vec![Or(vec![a(), b()]), Or(vec![a(), False])]).simplify(),
        And(vec![Or(vec![a(), b()]), a()])
    );
    // Unknown nodes are kept unless a constant decides.
    let u = || Filter::Unknown { detail: "u".into() };
    assert_eq!(And(vec![u(), False]).simplify(), False);
    assert_eq!(Or(vec![u(), a()]).simplify(), Or(vec![u(), a()]));
    assert_eq!(
        Or(vec![u(), a()]).simplify().to_json(),
        json!({"op": "or", "args": [{"op": "unknown", "detail": "u"}, {"op": "has", "attr": ["a"]}]})
    );
}

#[test]
fn attributes_and_row_checks() {
    let f = Filter::And(vec![
        Filter::Compare {
            attr: vec!["meta".into(), "level".into()],
            cmp: Cmp::Ge,
            value: json!(2),
        },
        Filter::Not(Box::new(Filter::Or(vec![
            leaf("b"),
            Filter::Like {
                attr: vec!["title".into()],
                pattern: "a*".into(),
            },
            Filter::In {
                entity: uid(r#"Folder::"f""#),
            },
            leaf("b"),
        ]))),
        Filter::ContainsAll {
            attr: vec!["tags".into()],
            values: vec![json!("x")],
        },
    ]);
    assert_eq!(f.attributes(), ["b", "meta.level", "tags", "title"]);
    assert!(!f.needs_row_checks());
    let g = Filter::Or(vec![
        f.clone(),
        Filter::Not(Box::new(Filter::Unmappable { detail: "x".into() })),
    ]);
    assert!(g.needs_row_checks());
    assert!(Filter::Unknown {
        detail: String::new()
    }
    .needs_row_checks());
    assert!(Filter::True.attributes().is_empty());
    assert_eq!(
        Filter::Is {
            entity: uid(r#"NS::Doc::"d1""#)
        }
        .to_json(),
        json!({"op": "is", "entity": {"type": "NS::Doc", "id": "d1"}})
    );
}

// ------------------------------------------------------------------------------------------
// The contract's semantics, as a test-only evaluator over one resource entity.

/// SQL three-valued result: `None` is NULL.
type Tri = Option<bool>;

struct Row<'a> {
    uid: EntityUid,
    attrs: Value,
    entities: &'a Entities,
}

impl Row<'_> {
    fn get(&self, path: &[String]) -> Option<&Value> {
        let mut cur = &self.attrs;
        for p in path {
            if cur.get("__entity").is_some() || cur.get("__extn").is_some() {
                return None;
            }
            cur = cur.get(p)?;
        }
        Some(cur)
    }

    /// Evaluates `f`; `unknown`/`unmappable` count as TRUE under an even number of NOTs and
    /// FALSE under an odd number (the contract's superset reading).
    fn eval(&self, f: &Filter, positive: bool) -> Tri {
        match f {
            Filter::True => Some(true),
            Filter::False => Some(false),
            Filter::And(args) => {
                let vals: Vec<Tri> = args.iter().map(|a| self.eval(a, positive)).collect();
                if vals.contains(&Some(false)) {
                    Some(false)
                } else if vals.contains(&None) {
                    None
                } else {
                    Some(true)
                }
            }
            Filter::Or(args) => {
                let vals: Vec<Tri> = args.iter().map(|a| self.eval(a, positive)).collect();
                if vals.contains(&Some(true)) {
                    Some(true)
                } else if vals.contains(&None) {
                    None
                } else {
                    Some(false)
                }
            }
            Filter::Not(arg) => self.eval(arg, !positive).map(|b| !b),
            Filter::Compare { attr, cmp, value } => {
                let v = self.get(attr)?;
                match cmp {
                    Cmp::Eq => Some(v == value),
                    Cmp::Ne => Some(v != value),
                    _ => {
                        let (x, y) = (v.as_i64()?, value.as_i64()?);
                        Some(match cmp {
                            Cmp::Lt => x < y,
                            Cmp::Le => x <= y,
                            Cmp::Gt => x > y,
                            _ => x >= y,
                        })
                    }
                }
            }
            Filter::Has { attr } => Some(self.get(attr).is_some()),
            Filter::Contains { attr, value } => Some(self.get(attr)?.as_array()?.contains(value)),
            Filter::ContainsAny { attr, values } => {
                let set = self.get(attr)?.as_array()?;
                Some(values.iter().any(|v| set.contains(v)))
            }
            Filter::ContainsAll { attr, values } => {
                let set = self.get(attr)?.as_array()?;
                Some(values.iter().all(|v| set.contains(v)))
            }
            Filter::Like { attr, pattern } => {
                Some(like(self.get(attr)?.as_str()?, &pattern_tokens(pattern)))
            }
            Filter::In { entity } => Some(
                self.uid == *entity
                    || self
                        .entities
                        .ancestors(&self.uid)
                        .is_some_and(|mut a| a.any(|x| x == entity)),
            ),
            Filter::Is { entity } => Some(self.uid == *entity),
            Filter::Unknown { .. } | Filter::Unmappable { .. } => Some(positive),
        }
    }
}

/// Contract pattern text to tokens: `None` is the wildcard.
fn pattern_tokens(p: &str) -> Vec<Option<char>> {
    let mut out = Vec::new();
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push(Some('*'));
            }
            '*' => out.push(None),
            c => out.push(Some(c)),
        }
    }
    out
}

fn like(text: &str, pat: &[Option<char>]) -> bool {
    let t: Vec<char> = text.chars().collect();
    // m[i][j]: t[..i] matches pat[..j].
    let mut m = vec![vec![false; pat.len() + 1]; t.len() + 1];
    m[0][0] = true;
    for j in 1..=pat.len() {
        m[0][j] = m[0][j - 1] && pat[j - 1].is_none();
    }
    for i in 1..=t.len() {
        for j in 1..=pat.len() {
            m[i][j] = match pat[j - 1] {
                None => m[i][j - 1] || m[i - 1][j],
                Some(c) => m[i - 1][j - 1] && t[i - 1] == c,
            };
        }
    }
    m[t.len()][pat.len()]
}

#[test]
fn test_evaluator_follows_the_contract() {
    let toks = pattern_tokens("a*b\\*");
    assert!(like("aXXb*", &toks));
    assert!(!like("aXXbY", &toks));
    assert!(like("ab*", &toks));
}

#[test]
fn fixture_filters_agree_with_cedar_on_sample_rows() {
    let schema = schema();
    let rows = Entities::from_json_value(
        json!([
            {"uid": {"type": "Doc", "id": "d1"}, "parents": [{"type": "Folder", "id": "f1"}],
             "attrs": {"owner": {"type": "User", "id": "alice"}, "title": "report*", "level": 2,
               "public": true, "tags": ["a"], "viewers": [{"type": "Group", "id": "eng"}],
               "editors": {"type": "Group", "id": "all"}, "meta": {"level": 2, "label": "x"},
               "score": 5, "created": {"__extn": {"fn": "datetime", "arg": "2023-05-01"}}}},
            {"uid": {"type": "Doc", "id": "d2"}, "parents": [{"type": "Folder", "id": "f2"}],
             "attrs": {"owner": {"type": "User", "id": "bob"}, "title": "q1", "level": 5,
               "public": false, "tags": [], "viewers": [],
               "editors": {"type": "Group", "id": "ops"}, "meta": {"level": 7},
               "created": {"__extn": {"fn": "datetime", "arg": "2025-05-01"}}}},
            {"uid": {"type": "Doc", "id": "d3"}, "parents": [],
             "attrs": {"owner": {"type": "User", "id": "alice"}, "title": "report", "level": 3,
               "public": false, "tags": ["a", "b"], "viewers": [{"type": "Group", "id": "ops"}],
               "editors": {"type": "Group", "id": "eng"}, "meta": {"level": 1},
               "score": -1, "created": {"__extn": {"fn": "datetime", "arg": "2024-05-01"}}}},
            {"uid": {"type": "Folder", "id": "f2"}, "attrs": {},
             "parents": [{"type": "Folder", "id": "f1"}]},
            {"uid": {"type": "Folder", "id": "f1"}, "attrs": {}, "parents": []}
        ]),
        Some(&schema),
    )
    .unwrap();
    let all = Entities::from_entities(
        entities(&schema)
            .iter()
            .chain(rows.iter())
            .cloned()
            .chain(schema.action_entities().unwrap().iter().cloned()),
        None,
    )
    .unwrap();
    let alice = uid(r#"User::"alice""#);
    let view = uid(r#"Action::"view""#);
    let mut counts = Counts::default();
    for condition in [
        "resource.level >= 3",
        "3 < resource.level",
        "2 >= resource.level",
        r#"resource.title != "q1""#,
        "resource.owner == principal",
        "resource.meta.level == principal.level",
        "!resource.public",
        "resource has score",
        r#"resource.meta has label && resource.meta.label == "x""#,
        r#"resource.tags.contains("a")"#,
        r#"["b", "c"].containsAny(resource.tags)"#,
        r#"resource.tags.containsAll(["a", "b"])"#,
        r#"["q1", "report"].contains(resource.title)"#,
        r#"resource.title like "report\*""#,
        r#"resource.title like "re*""#,
        r#"resource in Folder::"f1""#,
        r#"resource in [Folder::"f2", Folder::"f9"]"#,
        r#"resource == Doc::"d3" || resource in Folder::"f2""#,
        r#"resource != Doc::"d1""#,
        "principal in resource.viewers",
        "principal in resource.editors",
        "if resource has score then resource.score > 1 else resource.public",
        "!(resource has score && resource.score > 1)",
        r#"resource.owner.dept == "eng""#,
        "resource.level + 1 > 3",
        r#"resource.created < datetime("2024-01-01")"#,
        r#"["a"].containsAll(resource.tags)"#,
    ] {
        for effect in ["permit", "forbid"] {
            // A forbid needs a permit to override.
            let text = format!(
                "permit(principal, action == Action::\"view\", resource is Doc) when {{ resource.level < 100 }};\n\
                 {effect}(principal, action == Action::\"view\", resource is Doc) when {{ {condition} }};"
            );
            let set = policy_set(&text, &schema);
            let ctx = context(&schema, &view);
            let out = residuals(
                &set,
                &schema,
                &AttrKinds::new(&schema),
                &alice,
                &view,
                ctx.clone(),
                &ty("Doc"),
                &all,
            )
            .unwrap();
            let pick = |eff: Effect| -> Vec<&Filter> {
                out.iter()
                    .filter(|r| r.effect == eff)
                    .map(|r| &r.filter)
                    .collect()
            };
            let filter = combine(&pick(Effect::Permit), &pick(Effect::Forbid));
            for row in rows.iter().filter(|e| e.uid().type_name() == &ty("Doc")) {
                let req = Request::new(
                    alice.clone(),
                    view.clone(),
                    row.uid(),
                    ctx.clone(),
                    Some(&schema),
                )
                .unwrap();
                let allow =
                    Authorizer::new().is_authorized(&req, &set, &all).decision() == Decision::Allow;
                check_row(
                    &format!("{effect} when {condition}"),
                    &filter,
                    row,
                    &all,
                    allow,
                    &mut counts,
                );
            }
        }
    }
    eprintln!("{counts:?}");
    assert!(counts.rows_exact >= 120, "{counts:?}");
}

// ------------------------------------------------------------------------------------------
// Every example application: the filter agrees with Cedar on every resource it has.

/// The repository's `tests/testdata/cedar-examples` (see its README.md).
///
/// Panics, naming the path, when it is not a directory: the data is part of the repository, so
/// its absence is a broken checkout, never a reason to skip.
fn examples_dir() -> PathBuf {
    let root =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/cedar-examples");
    assert!(
        root.is_dir(),
        "{} is not a directory; the Cedar example apps are part of the repository (tests/testdata/cedar-examples)",
        root.display()
    );
    root
}

/// Distinct contexts of the application's example requests, plus the empty one.
fn example_contexts(app: &std::path::Path) -> Vec<Value> {
    let mut out = vec![json!({})];
    for folder in ["ALLOW", "DENY"] {
        let Ok(files) = std::fs::read_dir(app.join(folder)) else {
            continue;
        };
        for f in files.flatten() {
            let req: Value =
                serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
            if let Some(ctx) = req.get("context") {
                if !out.contains(ctx) {
                    out.push(ctx.clone());
                }
            }
        }
    }
    out
}

/// Asserts the filter's verdict on `row` against Cedar's `allow`: exactly, or, when the filter
/// needs row checks, that its superset reading keeps every allowed row.
fn check_row(
    label: &str,
    filter: &Filter,
    row: &Entity,
    all: &Entities,
    allow: bool,
    counts: &mut Counts,
) {
    let json = row.to_json_value().unwrap();
    let r = Row {
        uid: row.uid(),
        attrs: json["attrs"].clone(),
        entities: all,
    };
    let got = r.eval(filter, true);
    let what = format!(
        "{label} {}: cedar allow={allow}, filter gives {got:?}: {}",
        row.uid(),
        filter.to_json()
    );
    if filter.needs_row_checks() {
        if allow {
            assert_eq!(got, Some(true), "{what}");
        }
        counts.rows_checked_superset += 1;
    } else {
        assert_eq!(got == Some(true), allow, "{what}");
        counts.rows_exact += 1;
    }
}

#[derive(Default, Debug)]
struct Counts {
    plans: usize,
    rows_exact: usize,
    rows_checked_superset: usize,
}

fn check_app(app: &std::path::Path, counts: &mut Counts) {
    let bundle = bundle_dir::load(app).unwrap_or_else(|e| panic!("{}: {e}", app.display()));
    let schema = bundle.schema().expect("example has a schema");
    let policies = bundle.policy_set();
    let base: Vec<Entity> = bundle.entities().cloned().collect();
    let actions = schema.action_entities().unwrap();
    let all =
        Entities::from_entities(base.iter().cloned().chain(actions.iter().cloned()), None).unwrap();
    let contexts = example_contexts(app);
    let authorizer = Authorizer::new();
    for action in schema.actions() {
        let (Some(ptypes), Some(rtypes)) = (
            schema.principals_for_action(action),
            schema.resources_for_action(action),
        ) else {
            continue;
        };
        let ptypes: Vec<&EntityTypeName> = ptypes.collect();
        let rtypes: Vec<&EntityTypeName> = rtypes.collect();
        for ctx_json in &contexts {
            let Ok(ctx) = Context::from_json_value(ctx_json.clone(), Some((schema, action))) else {
                continue;
            };
            if ctx.validate(schema, action).is_err() {
                continue;
            }
            let kinds = AttrKinds::new(schema);
            for principal in base.iter().map(Entity::uid) {
                if !ptypes.contains(&principal.type_name()) {
                    continue;
                }
                for rtype in &rtypes {
                    let res = residuals(
                        policies,
                        schema,
                        &kinds,
                        &principal,
                        action,
                        ctx.clone(),
                        rtype,
                        &all,
                    )
                    .unwrap_or_else(|e| {
                        panic!("{}: {principal} {action} {rtype}: {e}", app.display())
                    });
                    counts.plans += 1;
                    let pick = |eff: Effect| -> Vec<&Filter> {
                        res.iter()
                            .filter(|r| r.effect == eff)
                            .map(|r| &r.filter)
                            .collect()
                    };
                    let filter = combine(&pick(Effect::Permit), &pick(Effect::Forbid));
                    for row in base.iter().filter(|e| e.uid().type_name() == *rtype) {
                        let Ok(req) = Request::new(
                            principal.clone(),
                            action.clone(),
                            row.uid(),
                            ctx.clone(),
                            Some(schema),
                        ) else {
                            continue;
                        };
                        let allow = authorizer.is_authorized(&req, policies, &all).decision()
                            == Decision::Allow;
                        let label = format!("{}: {principal} {action}", app.display());
                        check_row(&label, &filter, row, &all, allow, counts);
                    }
                }
            }
        }
    }
}

#[test]
fn example_apps_filters_agree_with_cedar_on_every_row() {
    let root = examples_dir();
    let mut counts = Counts::default();
    let mut apps = 0;
    for app in std::fs::read_dir(&root).unwrap().flatten() {
        if app.path().is_dir() {
            apps += 1;
            check_app(&app.path(), &mut counts);
        }
    }
    eprintln!("{counts:?}");
    assert_eq!(apps, 5);
    assert!(counts.plans >= 50, "{counts:?}");
    assert!(counts.rows_exact >= 50, "{counts:?}");
}
