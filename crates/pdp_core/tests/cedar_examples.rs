//! Every request in `tests/testdata/cedar-examples/*/ALLOW` and `DENY` decides as its folder
//! says, and every example application loads as a bundle directory as it stands.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::{Engine, Verdict};
mod bundle_dir;
use std::path::PathBuf;

/// The example applications' directories under the repository's
/// `tests/testdata/cedar-examples` (see its README.md), in a stable order.
///
/// Panics, naming the path, when that directory is missing, unreadable or holds fewer than the
/// five apps: the data is part of the repository, so its absence is a broken checkout, never a
/// reason to skip.
fn app_dirs() -> Vec<PathBuf> {
    let root =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/cedar-examples");
    let entries = std::fs::read_dir(&root).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the Cedar example apps are part of the repository (tests/testdata/cedar-examples)",
            root.display()
        )
    });
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 5,
        "{}: {} example apps, want the five (document_cloud, github_example, streaming_service, tags_n_roles, tinytodo)",
        root.display(),
        dirs.len()
    );
    dirs
}

#[test]
fn every_example_app_loads_and_decides_as_its_folder_says() {
    let apps = app_dirs();
    let mut checked = 0;
    for app in &apps {
        let bundle = bundle_dir::load(app).unwrap_or_else(|e| panic!("{}: {e}", app.display()));
        let engine = Engine::new(bundle);
        for (folder, want) in [("ALLOW", Verdict::Allow), ("DENY", Verdict::Deny)] {
            let dir = app.join(folder);
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).unwrap().flatten() {
                let req: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
                let d = engine
                    .decide_json(&req)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.path().display()));
                assert_eq!(d.verdict, want, "{}", f.path().display());
                checked += 1;
            }
        }
    }
    assert_eq!(apps.len(), 5);
    assert!(checked >= 20, "only {checked} requests checked");
}

/// Every check of every (principal, action, resource) the example apps' entities and schemas
/// allow (capped per app) decides as Cedar's own authorizer does, and names the policies Cedar
/// gives as its reasons: the satisfied permits when it allows, the satisfied forbids when a
/// forbid denies. This holds svc's pruning (policies by scope, entities by slice) and its
/// early stop on a satisfied forbid (`Scoped::satisfied`) to Cedar's semantics.
#[test]
fn every_decision_names_what_cedars_authorizer_names() {
    use cedar_policy::{Authorizer, Context, Decision, Entities, PolicySet, Request, Schema};
    use std::collections::BTreeMap;

    let apps = app_dirs();
    let mut compared = 0;
    for dir in &apps {
        // Cedar's side gets the policies, schema and entities exactly as the bundle read them
        // (policies renamed by `@id`, TinyTodo's entity map converted), with Cedar's closure,
        // and the schema's action entities (their hierarchy is what `action in` reads).
        let bundle = bundle_dir::load(dir).unwrap();
        let schema: Schema = bundle.schema().unwrap().clone();
        let policies: PolicySet = bundle.policy_set().clone();
        let entities = Entities::from_entities(bundle.entities().cloned(), None)
            .unwrap()
            .add_entities(schema.action_entities().unwrap(), None)
            .unwrap();
        let engine = Engine::new(bundle);

        // The contexts the app's own requests send, per action; `{}` for the others.
        let mut contexts: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
        for folder in ["ALLOW", "DENY"] {
            let Ok(files) = std::fs::read_dir(dir.join(folder)) else {
                continue;
            };
            for f in files.flatten() {
                let req: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
                let action = req["action"].as_str().unwrap().to_owned();
                let seen = contexts.entry(action).or_default();
                if !seen.contains(&req["context"]) {
                    seen.push(req["context"].clone());
                }
            }
        }
        let uids: Vec<cedar_policy::EntityUid> = entities.iter().map(|e| e.uid()).collect();
        let actions: Vec<cedar_policy::EntityUid> = schema.actions().cloned().collect();
        let authorizer = Authorizer::new();
        let of_types =
            |types: Option<Vec<&cedar_policy::EntityTypeName>>| -> Vec<&cedar_policy::EntityUid> {
                let types = types.unwrap_or_default();
                uids.iter()
                    .filter(|u| types.contains(&u.type_name()))
                    .collect()
            };
        let mut n = 0usize;
        for action in &actions {
            let sent = contexts
                .get(&action.to_string())
                .cloned()
                .unwrap_or_else(|| vec![serde_json::json!({})]);
            let principals = of_types(schema.principals_for_action(action).map(Iterator::collect));
            let resources = of_types(schema.resources_for_action(action).map(Iterator::collect));
            for context_json in &sent {
                for &principal in &principals {
                    for &resource in &resources {
                        let Ok(context) =
                            Context::from_json_value(context_json.clone(), Some((&schema, action)))
                        else {
                            continue;
                        };
                        let Ok(request) = Request::new(
                            principal.clone(),
                            action.clone(),
                            resource.clone(),
                            context,
                            Some(&schema),
                        ) else {
                            continue;
                        };
                        let cedar = authorizer.is_authorized(&request, &policies, &entities);
                        let svc = engine
                            .decide_json(&serde_json::json!({
                                "principal": principal.to_string(),
                                "action": action.to_string(),
                                "resource": resource.to_string(),
                                "context": context_json,
                            }))
                            .unwrap_or_else(|e| panic!("{principal} {action} {resource}: {e}"));
                        let want = if cedar.decision() == Decision::Allow {
                            Verdict::Allow
                        } else {
                            Verdict::Deny
                        };
                        let mut reasons: Vec<String> = cedar
                            .diagnostics()
                            .reason()
                            .map(ToString::to_string)
                            .collect();
                        reasons.sort();
                        let what = format!("{}: {principal} {action} {resource}", dir.display());
                        assert_eq!(svc.verdict, want, "{what}");
                        assert_eq!(svc.principal_outcome.policies, reasons, "{what}");
                        n += 1;
                    }
                }
            }
        }
        assert!(n > 0, "{}: no check compared", dir.display());
        compared += n;
    }
    eprintln!("{compared} checks compared with Cedar's authorizer");
}
