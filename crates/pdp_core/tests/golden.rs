//! Runs the golden corpus of tests/testdata/golden through the Rust engine (the Python tests
//! run the same files through the binding). Format: tests/golden.py.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::{Engine, Mode};
mod bundle_dir;
use serde_json::Value;
use std::path::PathBuf;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata")
}

fn engine_for(doc: &Value) -> Engine {
    let bundle = bundle_dir::load(
        &testdata()
            .join("bundles")
            .join(doc["bundle"].as_str().unwrap()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let engine = Engine::new(bundle);
    let setup = &doc["setup"];
    if let Some(Value::Array(es)) = setup.get("entities") {
        engine.upsert_entities(es.clone()).unwrap();
    }
    if let Some(v) = setup.get("service_accounts") {
        engine.register_service_accounts(v).unwrap();
    }
    if let Some(v) = setup.get("work_items") {
        engine.upsert_work_items(v).unwrap();
    }
    if let Some(v) = setup.get("contained") {
        engine.set_containments(v).unwrap();
    }
    if let Some(v) = setup.get("risk_scores") {
        engine.set_risk_scores(v, false).unwrap();
    }
    if let Some(Value::String(m)) = setup.get("mode") {
        engine.set_mode(Mode::parse(m).unwrap());
    }
    engine
}

#[test]
fn golden_corpus() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(testdata().join("golden"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut failures = Vec::new();
    let mut n = 0;
    for f in files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let engine = engine_for(&doc);
        for case in doc["cases"].as_array().unwrap() {
            n += 1;
            let name = format!(
                "{}: {}",
                f.file_stem().unwrap().to_string_lossy(),
                case["name"]
            );
            match (
                engine.decide_json(&case["request"]),
                case.get("expect"),
                case.get("error"),
            ) {
                (Ok(d), Some(want), _) => {
                    let mut got = d.to_response();
                    got.as_object_mut().unwrap().remove("qid");
                    let mut want = want.clone();
                    want.as_object_mut()
                        .unwrap()
                        .entry("mode")
                        .or_insert_with(|| Value::String("enforce".into()));
                    if got != want {
                        failures.push(format!("{name}\n  got  {got}\n  want {want}"));
                    }
                }
                (Err(e), _, Some(want)) => {
                    let field = want["field"].as_str().unwrap();
                    let contains = want["contains"].as_str().unwrap();
                    if e.field != field || !e.to_string().contains(contains) {
                        failures.push(format!("{name}\n  got error {e:?}\n  want {want}"));
                    }
                }
                (Ok(d), _, _) => failures.push(format!(
                    "{name}: expected an error, got {}",
                    d.to_response()
                )),
                (Err(e), _, _) => failures.push(format!("{name}: unexpected error {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} golden cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
