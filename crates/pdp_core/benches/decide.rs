#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! Criterion bench of [`Engine::decide_json`] on Cedar's example apps.
//!
//! For `document_cloud` and `tinytodo` (bundle directories under
//! the repository's `tests/testdata/cedar-examples`, or `$SVC_CEDAR_EXAMPLES`) and for 10
//! and 100,000 synthetic principals in the store, the bench decides a fixed mix of 64 requests
//! cyclically (one request per iteration):
//!
//! * `decide_json`: request JSON -> [`pdp_core::Decision`] (what `Engine.evaluate` does in Rust);
//! * `decide_json+response`: the same plus [`pdp_core::Decision::to_response`], the JSON the
//!   Python binding converts back to a dict.
//!
//! The synthetic stores match `benches/bench_evaluate.py`: document_cloud users with a personal
//! group each, 100 documents with their ACLs; tinytodo users in squads, 100 lists shared with
//! squads. Every user has the same shape whatever the store size, so only the size varies.
//!
//! Run: `cargo bench -p pdp_core --bench decide`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pdp_core::Engine;
#[path = "../tests/bundle_dir/mod.rs"]
mod bundle_dir;
use serde_json::{json, Value};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

const SIZES: [usize; 2] = [10, 100_000];
const DOCS: usize = 100;
const LISTS: usize = 100;
const SQUADS: usize = 5;
const MIX: usize = 64;

/// Store sizes to bench: [`SIZES`], or the comma-separated list in `$SVC_BENCH_SIZES` (for
/// example `10` for a quick profile without building the 100,000-principal stores).
fn sizes() -> Vec<usize> {
    std::env::var("SVC_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| SIZES.to_vec())
}

fn examples_dir() -> PathBuf {
    std::env::var_os("SVC_CEDAR_EXAMPLES").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/cedar-examples"),
        PathBuf::from,
    )
}

/// Deterministic xorshift64*, so the request mix is the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn uid(ty: &str, id: &str) -> Value {
    json!({"type": ty, "id": id})
}

fn eref(ty: &str, id: &str) -> Value {
    json!({"__entity": {"type": ty, "id": id}})
}

fn user(i: usize) -> String {
    format!("user-{i}")
}

fn owner(k: usize, n: usize) -> usize {
    (k * 7_919) % n
}

/// Synthetic entities and request mix for document_cloud with `n` users.
fn document_cloud(n: usize, rng: &mut Rng) -> (Vec<Value>, Vec<Value>) {
    let mut ents = Vec::with_capacity(2 * n + 4 * DOCS);
    for i in 0..n {
        let u = user(i);
        let personal = format!("{u}-personal");
        ents.push(json!({
            "uid": uid("User", &u),
            "attrs": {"personalGroup": eref("Group", &personal), "blocked": [eref("User", &user((i + 1) % n))]},
            "parents": [uid("Group", &personal)],
        }));
        let mut shares = vec![uid("DocumentShare", &format!("doc-{}-view", i % DOCS))];
        if i % 3 == 0 {
            shares.push(uid(
                "DocumentShare",
                &format!("doc-{}-modify", (i + 1) % DOCS),
            ));
        }
        ents.push(json!({"uid": uid("Group", &personal), "attrs": {"owner": eref("User", &u)}, "parents": shares}));
    }
    for k in 0..DOCS {
        let d = format!("doc-{k}");
        ents.push(json!({
            "uid": uid("Document", &d),
            "attrs": {
                "owner": eref("User", &user(owner(k, n))),
                "isPrivate": k % 4 == 0,
                "publicAccess": (["view", "edit", "none"][k % 3]),
                "viewACL": eref("DocumentShare", &format!("{d}-view")),
                "modifyACL": eref("DocumentShare", &format!("{d}-modify")),
                "manageACL": eref("DocumentShare", &format!("{d}-manage")),
            },
            "parents": [],
        }));
        for acl in ["view", "modify", "manage"] {
            ents.push(json!({"uid": uid("DocumentShare", &format!("{d}-{acl}")), "attrs": {}, "parents": []}));
        }
    }
    let req = |p: Value, action: &str, r: Value, auth: bool| {
        json!({"principal": p, "action": format!("Action::\"{action}\""), "resource": r,
               "context": {"is_authenticated": auth}})
    };
    let doc = |k: usize| uid("Document", &format!("doc-{k}"));
    let u = |i: usize| uid("User", &user(i));
    let reqs = (0..MIX)
        .map(|m| {
            let (i, k) = (rng.below(n), rng.below(DOCS));
            match m % 9 {
                0 => req(u(i), "CreateDocument", uid("Drive", "drive"), true),
                1 => req(u(owner(k, n)), "ViewDocument", doc(k), true),
                2 => req(u(i), "ViewDocument", doc(i % DOCS), true),
                3 => req(u(i), "ViewDocument", doc(k), true),
                4 => req(u(owner(k, n)), "ModifyDocument", doc(k), true),
                5 => req(u((owner(k, n) + 1) % n), "ModifyDocument", doc(k), true),
                6 => req(uid("Public", "public"), "ViewDocument", doc(k), true),
                7 => req(
                    u(i),
                    "DeleteGroup",
                    uid("Group", &format!("{}-personal", user(i))),
                    true,
                ),
                _ => req(u(i), "CreateDocument", uid("Drive", "drive"), false),
            }
        })
        .collect();
    (ents, reqs)
}

/// Synthetic entities and request mix for tinytodo with `n` users.
fn tinytodo(n: usize, rng: &mut Rng) -> (Vec<Value>, Vec<Value>) {
    let app = uid("Application", "TinyTodo");
    let mut ents: Vec<Value> = (0..SQUADS)
        .map(|s| json!({"uid": uid("Team", &format!("squad-{s}")), "attrs": {}, "parents": [app]}))
        .collect();
    for i in 0..n {
        ents.push(json!({
            "uid": uid("User", &user(i)),
            "attrs": {"joblevel": i % 10, "location": (["ABC17", "DEF33", "XYZ77"][i % 3])},
            "parents": [app, uid("Team", ["temp", "admin", "interns"][i % 3]),
                        uid("Team", &format!("squad-{}", i % SQUADS))],
        }));
    }
    for k in 0..LISTS {
        let tasks: Vec<Value> = (0..3)
            .map(|t| json!({"id": t, "name": format!("task {t}"), "state": "open"}))
            .collect();
        ents.push(json!({
            "uid": uid("List", &format!("list-{k}")),
            "attrs": {
                "name": format!("list {k}"),
                "owner": eref("User", &user(owner(k, n))),
                "readers": eref("Team", &format!("squad-{}", k % SQUADS)),
                "editors": eref("Team", &format!("squad-{}", (k + 1) % SQUADS)),
                "tasks": tasks,
            },
            "parents": [app],
        }));
    }
    let req = |p: Value, action: &str, r: &Value| json!({"principal": p, "action": format!("Action::\"{action}\""), "resource": r});
    let u = |i: usize| uid("User", &user(i));
    let reqs = (0..MIX)
        .map(|m| {
            let (i, k) = (rng.below(n), rng.below(LISTS));
            let list = uid("List", &format!("list-{k}"));
            let mut member =
                |squad: usize| u(rng.below((n - squad).div_ceil(SQUADS)) * SQUADS + squad);
            match m % 7 {
                0 => req(u(i), "GetLists", &app),
                1 => req(u(i), "CreateList", &app),
                2 => req(member(k % SQUADS), "GetList", &list),
                3 => req(member((k + 2) % SQUADS), "GetList", &list),
                4 => req(member((k + 1) % SQUADS), "UpdateList", &list),
                5 => req(u(owner(k, n)), "CreateTask", &list),
                _ => req(u(i), "DeleteList", &list),
            }
        })
        .collect();
    (ents, reqs)
}

fn bench_decide(c: &mut Criterion) {
    let root = examples_dir();
    let mut group = c.benchmark_group("decide_json");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for app in ["document_cloud", "tinytodo"] {
        let dir = root.join(app);
        if !dir.is_dir() {
            eprintln!(
                "decide bench: {} not found, skipping {app} (set SVC_CEDAR_EXAMPLES)",
                dir.display()
            );
            continue;
        }
        for n in sizes() {
            let bundle = match bundle_dir::load(&dir) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("decide bench: {app} does not load, skipping: {e:?}");
                    break;
                }
            };
            let engine = Engine::new(bundle);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ n as u64);
            let (ents, reqs) = if app == "tinytodo" {
                tinytodo(n, &mut rng)
            } else {
                document_cloud(n, &mut rng)
            };
            let count = ents.len();
            assert_eq!(engine.upsert_entities(ents).unwrap(), count);
            // Every request of the mix must decide (no request error).
            let allowed = reqs
                .iter()
                .filter(|r| engine.decide_json(r).unwrap().verdict == pdp_core::Verdict::Allow)
                .count();
            eprintln!(
                "decide bench: {app} N={n}: {} entities in store, {allowed}/{MIX} requests allowed",
                engine.store().len()
            );

            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(app, n), |b| {
                b.iter(|| {
                    let r = &reqs[i % MIX];
                    i += 1;
                    black_box(engine.decide_json(black_box(r)).unwrap())
                });
            });
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(format!("{app}+response"), n), |b| {
                b.iter(|| {
                    let r = &reqs[i % MIX];
                    i += 1;
                    black_box(engine.decide_json(black_box(r)).unwrap().to_response())
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_decide);
criterion_main!(benches);
