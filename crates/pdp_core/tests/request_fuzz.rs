//! Property tests of the request parser and the slice builder on arbitrary input: whatever a
//! client sends, [`CheckRequest::from_value`] and [`Engine::decide`] return an answer or an
//! error, never panic, never overflow the stack, and keep to the limits of
//! `pdp_core::limits` (docs/decisions.md, "Limits").
//!
//! Three generators: arbitrary JSON values as whole requests; well-formed requests whose
//! fields are arbitrary JSON; and well-formed requests with arbitrary inline entity graphs
//! (random parents among themselves and stored entities, cycles, deep chains, directory types,
//! copies of stored entities). `PROPTEST_CASES` sets the number of cases (default 256 each).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::{Bundle, BundleSources, CheckRequest, Engine};
mod bundle_dir;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::OnceLock;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/bundles/corp");
        Engine::new(bundle_dir::load(&dir).unwrap())
    })
}

/// Any JSON value, nested up to a few levels (serde_json's parser stops at 128 levels, so
/// the transports never hand the core anything deeper).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "Human",
            "Group",
            "Document",
            "ServiceAccount",
            "alice",
            "design",
            "view",
            "__entity",
            "__extn",
            "Human::\"alice\"",
            "Action::\"view\"",
            "type",
            "id",
            "",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "type",
                        "id",
                        "uid",
                        "attrs",
                        "parents",
                        "__entity",
                        "principal",
                        "x",
                    ]),
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn uid(ty: &str, id: &str) -> Value {
    json!({"type": ty, "id": id})
}

/// An inline entity graph: `n` entities of assorted types, each with parents drawn from the
/// graph itself (cycles allowed) and from stored groups.
fn entity_graph() -> impl Strategy<Value = Vec<Value>> {
    (1usize..40).prop_flat_map(|n| {
        prop::collection::vec(
            (
                prop::sample::select(vec![
                    "Group",
                    "Document",
                    "Human",
                    "ServiceAccount",
                    "Ticket",
                ]),
                prop::collection::vec(0..n + 3, 0..3),
                any::<bool>(),
            ),
            n,
        )
        .prop_map(move |nodes| {
            nodes
                .iter()
                .enumerate()
                .map(|(i, (ty, parents, stored_id))| {
                    let id = if *stored_id {
                        "design".to_owned()
                    } else {
                        format!("e{i}")
                    };
                    let parents: Vec<Value> = parents
                        .iter()
                        .map(|&p| match p.checked_sub(n) {
                            None => uid("Group", &format!("e{p}")),
                            Some(0) => uid("Group", "staff"),
                            Some(1) => uid("Group", "engineering"),
                            Some(_) => uid("Group", "admins"),
                        })
                        .collect();
                    json!({"uid": uid(ty, &id), "attrs": {}, "parents": parents})
                })
                .collect()
        })
    })
}

fn decide(req: Value) {
    // Either result is fine; a panic or a stack overflow fails the test.
    if let Ok(r) = CheckRequest::from_value(req) {
        let _ = engine().decide(&r);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn arbitrary_json_is_answered_or_refused(v in any_json()) {
        decide(v);
    }

    #[test]
    fn arbitrary_fields_are_answered_or_refused(
        principal in any_json(),
        action in any_json(),
        resource in any_json(),
        context in any_json(),
        entities in any_json(),
    ) {
        decide(json!({"principal": principal, "action": action, "resource": resource}));
        decide(json!({
            "principal": uid("Human", "alice"), "action": "view", "resource": uid("Document", "design"),
            "context": context, "entities": entities,
        }));
    }

    #[test]
    fn arbitrary_inline_graphs_are_answered_or_refused(
        entities in entity_graph(),
        principal in prop::sample::select(vec!["alice", "e0", "e1", "mallory"]),
        resource in prop::sample::select(vec!["design", "e0", "e1", "e2"]),
    ) {
        let req = json!({
            "principal": uid("Human", principal),
            "action": "view",
            "resource": uid("Document", resource),
            "entities": entities,
        });
        let parsed = CheckRequest::from_value(req).unwrap();
        match engine().decide(&parsed) {
            // Inline directory entities are never taken, so an inline principal never decides.
            Ok(d) => prop_assert!(principal == "alice" || d.principal_outcome.policies.is_empty()),
            Err(e) => prop_assert!(e.field.starts_with("entities"), "{e}"),
        }
    }
}

/// A parent chain far past the depth limit is refused, not walked: the case that overflowed
/// the stack in Cedar's recursive closure (50,000 levels; the count limit is raised for it).
#[test]
fn a_chain_far_past_the_depth_limit_is_refused() {
    let bundle = Bundle::from_sources(&BundleSources {
        policies: vec![(
            "p.cedar".into(),
            r#"permit (principal, action, resource in Folder::"top");"#.into(),
        )],
        schema: Some((
            "s.cedarschema".into(),
            "entity Human; entity Folder in [Folder]; entity Doc in [Folder]; action view appliesTo { principal: [Human], resource: [Doc] };".into(),
        )),
        entities: None,
        links: None,
    })
    .unwrap();
    let engine = Engine::new(bundle);
    pdp_core::limits::set_max_inline_entities(100_000);
    let chain = |n: usize| {
        let mut entities: Vec<Value> = (0..n)
            .map(|i| json!({"uid": uid("Folder", &format!("f{i}")), "attrs": {}, "parents": [uid("Folder", &format!("f{}", i + 1))]}))
            .collect();
        entities.push(json!({"uid": uid("Folder", &format!("f{n}")), "attrs": {}, "parents": [uid("Folder", "top")]}));
        entities.push(
            json!({"uid": uid("Doc", "deep"), "attrs": {}, "parents": [uid("Folder", "f0")]}),
        );
        CheckRequest::from_value(json!({
            "principal": uid("Human", "ann"), "action": "view", "resource": uid("Doc", "deep"),
            "entities": entities,
        }))
        .unwrap()
    };
    let err = engine.decide(&chain(50_000)).unwrap_err();
    assert!(err.to_string().contains("max_entity_depth"), "{err}");
    assert!(err.field.starts_with("entities["), "{}", err.field);
    // Doc -> f0 -> ... -> f62 -> top is 64 links: at the limit, and decided.
    let d = engine.decide(&chain(62)).unwrap();
    assert_eq!(d.verdict, pdp_core::Verdict::Allow);
    assert!(engine.decide(&chain(63)).is_err());
}
