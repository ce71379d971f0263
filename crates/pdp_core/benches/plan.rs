#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! Criterion bench of [`Engine::plan_json`] on Cedar's example apps (for profiling the plan path
//! in Rust; `benches/bench_plan.py` is the bench of record, against cedarpy).
//!
//! Each app's plan mix comes from its own `ALLOW`/`DENY` request files: the request's principal,
//! action and context, and the type of its resource as `resource_type` (requests whose plan is
//! refused, for example for a context the plan cannot take, are dropped). tinytodo has no request
//! files: its mix is `GetList`, `UpdateList` and `DeleteList` on `List` by each of its users.
//! The mix is planned cyclically, one request per iteration, without `plan_qid`, with the plan
//! memo on (`<app>`) and off (`<app>/cold`: every call runs Cedar's partial evaluation).
//!
//! Run: `cargo bench -p pdp_core --bench plan` (apps under the repository's
//! `tests/testdata/cedar-examples`, or `$SVC_CEDAR_EXAMPLES`).

use criterion::{criterion_group, criterion_main, Criterion};
use pdp_core::Engine;
#[path = "../tests/bundle_dir/mod.rs"]
mod bundle_dir;
use serde_json::{json, Value};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

const APPS: [&str; 5] = [
    "document_cloud",
    "tinytodo",
    "github_example",
    "streaming_service",
    "tags_n_roles",
];

fn examples_dir() -> PathBuf {
    std::env::var_os("SVC_CEDAR_EXAMPLES").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/cedar-examples"),
        PathBuf::from,
    )
}

/// `Type::"id"` or `{type, id}` -> the type name.
fn type_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.split("::\"").next().unwrap_or_default().to_owned(),
        _ => v["type"].as_str().unwrap_or_default().to_owned(),
    }
}

fn mix(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for sub in ["ALLOW", "DENY"] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let r: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
            out.push(json!({
                "principal": r["principal"],
                "action": r["action"],
                "resource_type": type_of(&r["resource"]),
                "context": r.get("context").cloned().unwrap_or_else(|| json!({})),
            }));
        }
    }
    if out.is_empty() {
        for user in ["kesha", "aaron", "andrew", "emina"] {
            for action in ["GetList", "UpdateList", "DeleteList"] {
                out.push(json!({
                    "principal": {"type": "User", "id": user},
                    "action": action,
                    "resource_type": "List",
                }));
            }
        }
    }
    out
}

fn bench_plan(c: &mut Criterion) {
    let root = examples_dir();
    let mut group = c.benchmark_group("plan_json");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for app in APPS {
        let dir = root.join(app);
        let Ok(bundle) = bundle_dir::load(&dir) else {
            eprintln!("plan bench: {} does not load, skipping", dir.display());
            continue;
        };
        let engine = Engine::new(bundle);
        let reqs: Vec<Value> = mix(&dir)
            .into_iter()
            .filter(|r| engine.plan_json(r).is_ok())
            .collect();
        eprintln!("plan bench: {app}: {} plan requests", reqs.len());
        if reqs.is_empty() {
            continue;
        }
        // Memo on (the default), then off: every cold call runs Cedar's partial evaluation.
        for (name, memo) in [(app.to_owned(), true), (format!("{app}/cold"), false)] {
            engine.set_plan_memo(memo);
            let mut i = 0usize;
            group.bench_function(name, |b| {
                b.iter(|| {
                    let r = &reqs[i % reqs.len()];
                    i += 1;
                    black_box(engine.plan_json(black_box(r)).unwrap().to_response())
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
