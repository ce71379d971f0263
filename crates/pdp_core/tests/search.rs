//! The AuthZEN searches (docs/search.md) against brute force: on random stores and random
//! policy sets, every subject, resource and action search, read page by page with every page
//! limit from 1 to past the whole result, returns exactly the candidates whose check is
//! `allow` (and lists exactly those whose check is `challenge` apart), in ascending order.
//! Also the page token's binding to its request and to the versions it started on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::search::{SearchError, SearchKind, SearchMethod};
use pdp_core::{Bundle, BundleSources, CheckRequest, Engine, Verdict};
use proptest::prelude::*;
use serde_json::{json, Value};

const SCHEMA: &str = r#"
entity Group in [Group];
entity User in [Group] { dept: String, level: Long };
entity Folder in [Folder];
entity Doc in [Folder] {
  owner: User,
  dept: String,
  level: Long,
  tags: Set<String>,
  title: String,
  readers: Set<Group>,
  note?: String,
};
action view, edit, remove, share appliesTo {
  principal: [User], resource: [Doc], context: { risk_score?: Long }
};
"#;

/// The policies a random policy set is drawn from: every filter node, a forbid, a challenge,
/// residuals the plan cannot map (read through an entity attribute), so rows are checked one
/// by one, and conditions on the principal's risk score (which differs between the
/// principals of a subject search).
const POLICIES: [&str; 14] = [
    r#"@id("own") permit (principal, action == Action::"view", resource) when { resource.owner == principal };"#,
    r#"@id("dept") permit (principal, action == Action::"view", resource) when { resource.dept == principal.dept };"#,
    r#"@id("level") permit (principal, action == Action::"edit", resource) when { resource.level <= principal.level };"#,
    r#"@id("readers") permit (principal, action in [Action::"view", Action::"share"], resource) when { principal in resource.readers };"#,
    r#"@id("folder") permit (principal, action in [Action::"view", Action::"edit"], resource in Folder::"f0");"#,
    r#"@id("locked") forbid (principal, action == Action::"edit", resource) when { resource.tags.contains("locked") };"#,
    r#"@id("drafts") permit (principal, action == Action::"remove", resource) when { resource.title like "draft*" };"#,
    r#"@id("step-up") @challenge("verification") permit (principal, action == Action::"remove", resource) when { resource.owner == principal };"#,
    r#"@id("owner-dept") permit (principal, action == Action::"share", resource) when { resource.owner.dept == "eng" };"#,
    r#"@id("group") permit (principal in Group::"g0", action == Action::"share", resource);"#,
    r#"@id("note") permit (principal, action == Action::"edit", resource) when { resource has note && resource.note == "open" };"#,
    r#"@id("approve") @challenge("approval") forbid (principal, action == Action::"share", resource) when { resource.level > 2 };"#,
    r#"@id("risky") @challenge("approval") forbid (principal, action, resource) when { context has risk_score && context.risk_score > 70 };"#,
    r#"@id("calm-edit") permit (principal, action == Action::"edit", resource) when { context has risk_score && context.risk_score < 30 && resource.dept == principal.dept };"#,
];

const ACTIONS: [&str; 4] = ["edit", "remove", "share", "view"];

/// A random store: `users` users (department, level, groups, risk score, contained), three
/// groups (`g1` and `g2` may sit in `g0`), two folders (`f1` may sit in `f0`) and `docs`
/// documents.
#[derive(Debug, Clone)]
struct World {
    policies: Vec<usize>,
    users: Vec<User>,
    group_parents: (bool, bool),
    folder_parent: bool,
    docs: Vec<Doc>,
}

/// Department `eng` (else `ops`), level, groups, risk score, contained.
type User = (bool, i64, Vec<usize>, Option<i64>, bool);

#[derive(Debug, Clone)]
struct Doc {
    owner: usize,
    eng: bool,
    level: i64,
    locked: bool,
    draft: bool,
    readers: Vec<usize>,
    folders: Vec<usize>,
    note: Option<bool>,
}

fn doc_strategy(users: usize) -> impl Strategy<Value = Doc> {
    (
        0..users,
        any::<bool>(),
        0i64..4,
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(0usize..3, 0..3),
        proptest::collection::vec(0usize..2, 0..2),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(
            |(owner, eng, level, locked, draft, readers, folders, note)| Doc {
                owner,
                eng,
                level,
                locked,
                draft,
                readers,
                folders,
                note,
            },
        )
}

fn world() -> impl Strategy<Value = World> {
    (1usize..6).prop_flat_map(|n| {
        (
            proptest::collection::vec(0usize..POLICIES.len(), 1..6),
            proptest::collection::vec(
                (
                    any::<bool>(),
                    0i64..4,
                    proptest::collection::vec(0usize..3, 0..3),
                    proptest::option::of(prop_oneof![Just(10i64), Just(50), Just(90)]),
                    proptest::bool::weighted(0.15),
                ),
                n,
            ),
            (any::<bool>(), any::<bool>()),
            any::<bool>(),
            proptest::collection::vec(doc_strategy(n), 0..10),
        )
            .prop_map(
                |(policies, users, group_parents, folder_parent, docs)| World {
                    policies,
                    users,
                    group_parents,
                    folder_parent,
                    docs,
                },
            )
    })
}

fn engine(w: &World) -> Engine {
    let mut ids = w.policies.clone();
    ids.sort_unstable();
    ids.dedup();
    let text: Vec<&str> = ids.iter().map(|i| POLICIES[*i]).collect();
    let bundle = Bundle::from_sources(&BundleSources {
        policies: vec![("p.cedar".into(), text.join("\n"))],
        schema: Some(("s.cedarschema".into(), SCHEMA.into())),
        entities: None,
        links: None,
    })
    .unwrap();
    let e = Engine::new(bundle);
    let g = |i: usize| json!({"type": "Group", "id": format!("g{i}")});
    let mut ents = vec![
        json!({"uid": g(0), "attrs": {}, "parents": []}),
        json!({"uid": g(1), "attrs": {}, "parents": if w.group_parents.0 { vec![g(0)] } else { vec![] }}),
        json!({"uid": g(2), "attrs": {}, "parents": if w.group_parents.1 { vec![g(0)] } else { vec![] }}),
        json!({"uid": {"type": "Folder", "id": "f0"}, "attrs": {}, "parents": []}),
        json!({"uid": {"type": "Folder", "id": "f1"}, "attrs": {},
               "parents": if w.folder_parent { vec![json!({"type": "Folder", "id": "f0"})] } else { vec![] }}),
    ];
    let mut scores = Vec::new();
    let mut contained = Vec::new();
    for (i, (eng, level, groups, risk, held)) in w.users.iter().enumerate() {
        let uid = json!({"type": "User", "id": format!("u{i}")});
        ents.push(json!({
            "uid": uid,
            "attrs": {"dept": if *eng { "eng" } else { "ops" }, "level": level},
            "parents": groups.iter().map(|x| g(*x)).collect::<Vec<_>>(),
        }));
        if let Some(score) = risk {
            scores.push(json!({"principal": uid, "score": score}));
        }
        if *held {
            contained.push(uid);
        }
    }
    e.set_risk_scores(&Value::Array(scores), true).unwrap();
    e.set_containments(&Value::Array(contained)).unwrap();
    for (i, d) in w.docs.iter().enumerate() {
        let mut attrs = json!({
            "owner": {"__entity": {"type": "User", "id": format!("u{}", d.owner)}},
            "dept": if d.eng { "eng" } else { "ops" },
            "level": d.level,
            "tags": if d.locked { vec!["locked", "x"] } else { vec!["x"] },
            "title": if d.draft { "draft-1" } else { "final" },
            "readers": d.readers.iter().map(|x| json!({"__entity": g(*x)})).collect::<Vec<_>>(),
        });
        if let Some(open) = d.note {
            attrs["note"] = json!(if open { "open" } else { "closed" });
        }
        ents.push(json!({
            "uid": {"type": "Doc", "id": format!("d{i:02}")},
            "attrs": attrs,
            "parents": d.folders.iter().map(|f| json!({"type": "Folder", "id": format!("f{f}")})).collect::<Vec<_>>(),
        }));
    }
    e.upsert_entities(ents).unwrap();
    e
}

fn verdict(e: &Engine, user: &str, action: &str, doc: &str) -> Verdict {
    let req = CheckRequest::from_value(json!({
        "principal": {"type": "User", "id": user},
        "action": action,
        "resource": {"type": "Doc", "id": doc},
    }))
    .unwrap();
    e.decide(&req).unwrap().verdict
}

/// Reads every page of a search with `limit`; returns the result and challenge ids (or
/// names) in order.
fn read_all(
    e: &Engine,
    kind: SearchKind,
    body: &Value,
    limit: usize,
) -> (Vec<String>, Vec<String>) {
    let mut results = Vec::new();
    let mut challenges = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let mut b = body.clone();
        b["page"] = json!({"limit": limit, "token": token});
        let page = e.search_json(kind, &b).unwrap();
        let r = page.to_response();
        let got = r["results"].as_array().unwrap();
        assert!(got.len() <= limit, "{kind:?} page over its limit: {r}");
        assert_eq!(r["page"]["count"], got.len());
        let key = |v: &Value| {
            v.get("id")
                .or_else(|| v.get("name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        };
        results.extend(got.iter().map(key));
        challenges.extend(
            r["context"]["challenges"]
                .as_array()
                .unwrap()
                .iter()
                .map(key),
        );
        token = page.next_token.clone();
        pages += 1;
        if token.is_empty() {
            break;
        }
        assert_eq!(got.len(), limit, "a page before the last one is full");
        assert!(pages < 100);
    }
    (results, challenges)
}

fn split(v: &[(String, Verdict)]) -> (Vec<String>, Vec<String>) {
    let pick = |want: Verdict| {
        v.iter()
            .filter(|(_, x)| *x == want)
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>()
    };
    (pick(Verdict::Allow), pick(Verdict::Challenge))
}

fn check_world(w: &World) {
    let e = engine(w);
    let users: Vec<String> = (0..w.users.len()).map(|i| format!("u{i}")).collect();
    let docs: Vec<String> = (0..w.docs.len()).map(|i| format!("d{i:02}")).collect();
    for a in ACTIONS {
        for u in &users {
            let want = split(
                &docs
                    .iter()
                    .map(|d| (d.clone(), verdict(&e, u, a, d)))
                    .collect::<Vec<_>>(),
            );
            let body = json!({"subject": {"type": "User", "id": u}, "action": {"name": a},
                              "resource": {"type": "Doc"}});
            for limit in 1..=docs.len() + 1 {
                assert_eq!(
                    read_all(&e, SearchKind::Resource, &body, limit),
                    want,
                    "resource search {u} {a} limit {limit} on {w:?}"
                );
            }
        }
        for d in &docs {
            let want = split(
                &users
                    .iter()
                    .map(|u| (u.clone(), verdict(&e, u, a, d)))
                    .collect::<Vec<_>>(),
            );
            let body = json!({"subject": {"type": "User"}, "action": {"name": a},
                              "resource": {"type": "Doc", "id": d}});
            for limit in 1..=users.len() + 1 {
                assert_eq!(
                    read_all(&e, SearchKind::Subject, &body, limit),
                    want,
                    "subject search {a} {d} limit {limit} on {w:?}"
                );
            }
        }
    }
    for u in &users {
        for d in &docs {
            let want = split(
                &ACTIONS
                    .iter()
                    .map(|a| ((*a).to_owned(), verdict(&e, u, a, d)))
                    .collect::<Vec<_>>(),
            );
            let body =
                json!({"subject": {"type": "User", "id": u}, "resource": {"type": "Doc", "id": d}});
            for limit in 1..=ACTIONS.len() + 1 {
                assert_eq!(
                    read_all(&e, SearchKind::Action, &body, limit),
                    want,
                    "action search {u} {d} limit {limit} on {w:?}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn searches_equal_brute_force(w in world()) {
        check_world(&w);
    }
}

fn fixed_world() -> World {
    World {
        policies: (0..POLICIES.len()).collect(),
        users: vec![
            (true, 3, vec![1], None, false),
            (false, 0, vec![], Some(90), false),
            (true, 1, vec![0, 2], Some(10), false),
            (true, 2, vec![2], Some(50), true),
        ],
        group_parents: (true, false),
        folder_parent: true,
        docs: (0..12)
            .map(|i| Doc {
                owner: i % 3,
                eng: i % 2 == 0,
                level: i64::try_from(i % 4).unwrap(),
                locked: i % 5 == 0,
                draft: i % 3 == 1,
                readers: vec![i % 3],
                folders: if i % 4 == 0 { vec![1] } else { vec![] },
                note: (i % 3 == 0).then_some(i % 2 == 0),
            })
            .collect(),
    }
}

#[test]
fn every_policy_at_once_equals_brute_force() {
    check_world(&fixed_world());
}

#[test]
fn resource_and_subject_searches_use_plans() {
    let e = engine(&fixed_world());
    let body = json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"},
                      "resource": {"type": "Doc"}});
    let p = e.search_json(SearchKind::Resource, &body).unwrap();
    assert_eq!(p.method, SearchMethod::Plan);
    assert!(!p.results.is_empty());
    let body = json!({"subject": {"type": "User"}, "action": {"name": "view"},
                      "resource": {"type": "Doc", "id": "d00"}});
    let p = e.search_json(SearchKind::Subject, &body).unwrap();
    assert_eq!(p.method, SearchMethod::Plan);
    assert!(!p.results.is_empty());
}

#[test]
fn a_token_is_bound_to_its_request_and_its_versions() {
    let e = engine(&fixed_world());
    let body = json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"},
                      "resource": {"type": "Doc"}, "page": {"limit": 1}});
    let first = e.search_json(SearchKind::Resource, &body).unwrap();
    assert_eq!(first.results.len(), 1);
    assert!(!first.next_token.is_empty());
    // Another request (another subject, another action, another context) with the token.
    for (k, v) in [
        ("subject", json!({"type": "User", "id": "u1"})),
        ("action", json!({"name": "edit"})),
        ("context", json!({"x": 1})),
    ] {
        let mut other = body.clone();
        other[k] = v;
        other["page"]["token"] = json!(first.next_token);
        match e.search_json(SearchKind::Resource, &other) {
            Err(SearchError::Request(err)) => assert_eq!(err.field, "page.token", "{k}"),
            r => panic!("{k}: {r:?}"),
        }
    }
    // A token that is not one.
    let mut junk = body.clone();
    junk["page"]["token"] = json!("not-a-token");
    match e.search_json(SearchKind::Resource, &junk) {
        Err(SearchError::Request(err)) => assert_eq!(err.field, "page.token"),
        r => panic!("{r:?}"),
    }
    // The same request with the token goes on; the limit may change.
    let mut next = body.clone();
    next["page"] = json!({"token": first.next_token, "limit": 2});
    let second = e.search_json(SearchKind::Resource, &next).unwrap();
    assert!(!second.results.is_empty());
    assert!(!second.results.contains(&first.results[0]));
    // After an entity changes, the token is refused as stale.
    e.upsert_entities(vec![
        json!({"uid": {"type": "Folder", "id": "f9"}, "attrs": {}, "parents": []}),
    ])
    .unwrap();
    assert_eq!(
        e.search_json(SearchKind::Resource, &next).unwrap_err(),
        SearchError::Stale
    );
}

#[test]
fn bad_requests_name_their_field() {
    let e = engine(&fixed_world());
    let cases = [
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Doc", "id": "d1"}}),
            "resource.id",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User"}, "action": {"name": "view"}, "resource": {"type": "Doc"}}),
            "subject.id",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "nope"}, "resource": {"type": "Doc"}}),
            "action.name",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Nope"}}),
            "resource.type",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Doc"}, "page": {"limit": 0}}),
            "page.limit",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Doc"}, "page": {"token": 3}}),
            "page.token",
        ),
        (
            SearchKind::Resource,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Doc"}, "extra": 1}),
            "extra",
        ),
        (
            SearchKind::Subject,
            json!({"subject": {"type": "Nope"}, "action": {"name": "view"}, "resource": {"type": "Doc", "id": "d1"}}),
            "subject.type",
        ),
        (
            SearchKind::Subject,
            json!({"subject": {"type": "User"}, "action": {"name": "view"}, "resource": {"type": "Doc", "id": "d1"}, "context": 3}),
            "context",
        ),
        (
            SearchKind::Action,
            json!({"subject": {"type": "User", "id": "u0"}, "action": {"name": "view"}, "resource": {"type": "Doc", "id": "d1"}}),
            "action",
        ),
        (
            SearchKind::Action,
            json!({"subject": {"type": "User", "id": "u0"}, "resource": {"type": "Doc", "id": "d1", "properties": {"a": 1}}}),
            "resource.properties",
        ),
    ];
    for (kind, body, field) in cases {
        match e.search_json(kind, &body) {
            Err(SearchError::Request(err)) => assert_eq!(err.field, field, "{body}"),
            r => panic!("{body}: {r:?}"),
        }
    }
}

#[test]
fn the_limit_is_capped_by_the_setting() {
    let e = engine(&fixed_world());
    e.configure_search(2);
    let body = json!({"subject": {"type": "User"}, "action": {"name": "view"},
                      "resource": {"type": "Doc", "id": "d00"}, "page": {"limit": 50}});
    let p = e.search_json(SearchKind::Subject, &body).unwrap();
    assert!(p.results.len() <= 2);
}
