//! The check and plan memos change no answer: every plan and check is compared with the same
//! engine's answer with the plan memo off, before and after changes to the principal, its
//! groups, the group hierarchy, the context, risk scores and the policies.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::{Bundle, BundleSources, Engine};
use serde_json::{json, Value};

const SCHEMA: &str = r#"
entity Group in [Group];
entity User in [Group] { level: Long };
entity Doc { readers: Set<Group>, level: Long, owner: User };
action view, edit appliesTo {
  principal: [User], resource: [Doc],
  context: { mfa: Bool, risk_score?: Long }
};
action share appliesTo { principal: [User], resource: [Doc], context: {} };
"#;

const POLICIES: &str = r#"
@id("readers") permit(principal, action == Action::"view", resource)
  when { principal in resource.readers };
@id("owner") permit(principal, action in [Action::"view", Action::"edit"], resource is Doc)
  when { resource.owner == principal && context.mfa };
@id("low") forbid(principal, action, resource)
  when { resource.level > principal.level };
@id("risky") forbid(principal, action == Action::"view", resource)
  when { context has risk_score && context.risk_score > 50 };
@id("sharers") permit(principal in Group::"sharers", action == Action::"share", resource);
"#;

fn engine(policies: &str) -> Engine {
    let src = BundleSources {
        policies: vec![("p.cedar".into(), policies.into())],
        schema: Some(("s.cedarschema".into(), SCHEMA.into())),
        entities: None,
        links: None,
    };
    Engine::new(Bundle::from_sources(&src).unwrap_or_else(|e| panic!("{e}")))
}

fn user(id: &str, level: i64, groups: &[&str]) -> Value {
    json!({"uid": {"type": "User", "id": id}, "attrs": {"level": level},
           "parents": groups.iter().map(|g| json!({"type": "Group", "id": g})).collect::<Vec<_>>()})
}

fn group(id: &str, parents: &[&str]) -> Value {
    json!({"uid": {"type": "Group", "id": id}, "attrs": {},
           "parents": parents.iter().map(|g| json!({"type": "Group", "id": g})).collect::<Vec<_>>()})
}

fn doc(id: &str, readers: &[&str], level: i64, owner: &str) -> Value {
    json!({"uid": {"type": "Doc", "id": id},
           "attrs": {"readers": readers.iter().map(|g| json!({"__entity": {"type": "Group", "id": g}})).collect::<Vec<_>>(),
                     "level": level, "owner": {"__entity": {"type": "User", "id": owner}}},
           "parents": []})
}

/// A plan's answer without its id and versions.
fn plan_answer(e: &Engine, req: &Value) -> Value {
    let mut v = e.plan_json(req).unwrap().to_response();
    let m = v.as_object_mut().unwrap();
    m.remove("qid");
    m.remove("principals_version");
    v
}

/// Plans `req` with the memo on (twice: a miss, then a hit) and off; all three must agree.
fn plan_agrees(e: &Engine, req: &Value) -> Value {
    let first = plan_answer(e, req);
    let again = plan_answer(e, req);
    e.set_plan_memo(false);
    let cold = plan_answer(e, req);
    e.set_plan_memo(true);
    assert_eq!(first, cold, "memo miss differs from memo off for {req}");
    assert_eq!(again, cold, "memo hit differs from memo off for {req}");
    cold
}

fn verdicts(e: &Engine, reqs: &[Value]) -> Vec<(String, Vec<String>)> {
    reqs.iter()
        .map(|r| {
            let d = e.decide_json(r).unwrap();
            (d.verdict.as_str().to_owned(), d.principal_outcome.policies)
        })
        .collect()
}

#[test]
fn memos_follow_every_change() {
    let e = engine(POLICIES);
    e.upsert_entities(vec![
        group("eng", &[]),
        group("ops", &[]),
        group("all", &[]),
        group("sharers", &[]),
        user("alice", 3, &["eng"]),
        user("bob", 1, &["ops"]),
        doc("d1", &["eng"], 2, "bob"),
        doc("d2", &["all"], 5, "alice"),
        doc("d3", &["ops"], 1, "alice"),
    ])
    .unwrap();
    let plan = |p: &str, a: &str, mfa: bool| {
        json!({"principal": {"type": "User", "id": p}, "action": a, "resource_type": "Doc",
               "context": {"mfa": mfa}})
    };
    let check = |p: &str, a: &str, d: &str, mfa: bool| {
        json!({"principal": {"type": "User", "id": p}, "action": a,
               "resource": {"type": "Doc", "id": d}, "context": {"mfa": mfa}})
    };
    let checks: Vec<Value> = ["alice", "bob"]
        .iter()
        .flat_map(|p| {
            ["d1", "d2", "d3"].iter().flat_map(move |d| {
                [("view", true), ("view", false), ("edit", true)]
                    .iter()
                    .map(move |(a, m)| check(p, a, d, *m))
            })
        })
        .collect();

    let before = plan_agrees(&e, &plan("alice", "view", true));
    let v0 = verdicts(&e, &checks);
    assert_eq!(
        verdicts(&e, &checks),
        v0,
        "a check repeated gives the same answer"
    );

    // The principal's groups change: the filter follows.
    e.upsert_entities(vec![user("alice", 3, &["ops"])]).unwrap();
    let moved = plan_agrees(&e, &plan("alice", "view", true));
    assert_ne!(before, moved);
    assert!(moved.to_string().contains("\"ops\""), "{moved}");

    // A group above the principal's group appears: the filter follows.
    e.upsert_entities(vec![group("ops", &["all"])]).unwrap();
    let nested = plan_agrees(&e, &plan("alice", "view", true));
    assert!(nested.to_string().contains("\"all\""), "{nested}");

    // The principal's own attributes change.
    e.upsert_entities(vec![user("alice", 9, &["ops"])]).unwrap();
    let promoted = plan_agrees(&e, &plan("alice", "view", true));
    assert_ne!(nested, promoted);

    // Another context, then a risk score that the context carries.
    plan_agrees(&e, &plan("alice", "view", false));
    plan_agrees(&e, &plan("alice", "edit", true));
    e.set_risk_scores(
        &json!([{"principal": {"type": "User", "id": "alice"}, "score": 80}]),
        false,
    )
    .unwrap();
    let risky = plan_agrees(&e, &plan("alice", "view", true));
    assert_eq!(risky["outcome"], "always_denied", "{risky}");

    // Group membership for an action scope (`principal in Group::"sharers"`).
    let share = json!({"principal": {"type": "User", "id": "bob"}, "action": "share",
                       "resource_type": "Doc"});
    assert_eq!(plan_agrees(&e, &share)["outcome"], "always_denied");
    e.upsert_entities(vec![user("bob", 1, &["ops", "sharers"])])
        .unwrap();
    // (the `low` forbid still hides the documents above bob's level)
    assert_eq!(plan_agrees(&e, &share)["outcome"], "conditional");

    // Checks after all these changes agree with a fresh engine holding the same state.
    let fresh = engine(POLICIES);
    fresh
        .upsert_entities(vec![
            group("eng", &[]),
            group("ops", &["all"]),
            group("all", &[]),
            group("sharers", &[]),
            user("alice", 9, &["ops"]),
            user("bob", 1, &["ops", "sharers"]),
            doc("d1", &["eng"], 2, "bob"),
            doc("d2", &["all"], 5, "alice"),
            doc("d3", &["ops"], 1, "alice"),
        ])
        .unwrap();
    fresh
        .set_risk_scores(
            &json!([{"principal": {"type": "User", "id": "alice"}, "score": 80}]),
            false,
        )
        .unwrap();
    assert_eq!(verdicts(&e, &checks), verdicts(&fresh, &checks));
    for (p, a, m) in [
        ("alice", "view", true),
        ("alice", "edit", true),
        ("bob", "view", false),
    ] {
        assert_eq!(
            plan_answer(&e, &plan(p, a, m)),
            plan_answer(&fresh, &plan(p, a, m))
        );
    }

    // New policies: nothing planned or typed with the old ones is reused.
    e.replace_bundle(
        Bundle::from_sources(&BundleSources {
            policies: vec![(
                "p.cedar".into(),
                r#"@id("all") permit(principal, action, resource);"#.into(),
            )],
            schema: Some(("s.cedarschema".into(), SCHEMA.into())),
            entities: None,
            links: None,
        })
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        plan_agrees(&e, &plan("alice", "view", true))["outcome"],
        "always_allowed"
    );
}

#[test]
fn validation_errors_are_cedars_after_a_valid_request() {
    let e = engine(POLICIES);
    e.upsert_entities(vec![user("alice", 3, &[]), doc("d1", &[], 1, "alice")])
        .unwrap();
    let ok = json!({"principal": {"type": "User", "id": "alice"}, "action": "view",
                    "resource": {"type": "Doc", "id": "d1"}, "context": {"mfa": true}});
    e.decide_json(&ok).unwrap();
    // Same context (already validated), a resource type the action does not take.
    let bad_resource = json!({"principal": {"type": "User", "id": "alice"}, "action": "view",
                              "resource": {"type": "User", "id": "alice"}, "context": {"mfa": true}});
    let err = e.decide_json(&bad_resource).unwrap_err();
    assert_eq!(err.field, "resource.type");
    // Same context, a principal type the action does not take.
    let bad_principal = json!({"principal": {"type": "Doc", "id": "d1"}, "action": "view",
                               "resource": {"type": "Doc", "id": "d1"}, "context": {"mfa": true}});
    assert_eq!(
        e.decide_json(&bad_principal).unwrap_err().field,
        "principal.type"
    );
    // A context with a wrong type is refused every time, not only the first.
    let bad_context = json!({"principal": {"type": "User", "id": "alice"}, "action": "view",
                             "resource": {"type": "Doc", "id": "d1"}, "context": {"mfa": "yes"}});
    for _ in 0..2 {
        assert_eq!(e.decide_json(&bad_context).unwrap_err().field, "context");
    }
}
