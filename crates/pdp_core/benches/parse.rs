//! Criterion bench of reading a check request body (JSON bytes) into a
//! [`pdp_core::CheckRequest`], the way `POST /v1/access/evaluation` does:
//!
//! * `value+from_value`: bytes -> `serde_json::Value` -> [`CheckRequest::from_value`] (the
//!   request object built, then its fields picked by hand);
//! * `from_slice`: bytes -> [`CheckRequest::from_slice`] (serde derive, one pass).
//!
//! Two bodies: a typical check (three entity references, a small context) and one with ten
//! inline entities. The heap is mimalloc, as in the server (the `svc._pdp_core` extension).

use criterion::{criterion_group, criterion_main, Criterion};
use pdp_core::CheckRequest;
use serde_json::{json, Value};
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The request bodies the bench reads, by name.
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let typical = json!({
        "principal": {"type": "ServiceAccount", "id": "build.bot"},
        "action": "view",
        "resource": {"type": "Document", "id": "design-2024"},
        "on_behalf_of": "Human::\"alice\"",
        "context": {"risk_score": 12, "destination": "internal", "ip": "10.0.0.7"},
        "human_present": false,
    });
    let entities: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "uid": {"type": "Document", "id": format!("doc-{i}")},
                "attrs": {"owner": {"__entity": {"type": "Human", "id": "alice"}},
                          "department": "eng", "sensitivity": "internal", "tags": ["a", "b"]},
                "parents": [{"type": "Folder", "id": "root"}],
            })
        })
        .collect();
    let mut inline = typical.clone();
    if let Some(o) = inline.as_object_mut() {
        o.insert("entities".into(), Value::Array(entities));
    }
    [("typical", typical), ("10 inline entities", inline)]
        .into_iter()
        .filter_map(|(n, v)| serde_json::to_vec(&v).ok().map(|b| (n, b)))
        .collect()
}

fn parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_check_body");
    for (name, body) in bodies() {
        group.bench_function(format!("{name}/value+from_value"), |b| {
            b.iter(|| {
                let v: Value = serde_json::from_slice(black_box(&body)).ok()?;
                CheckRequest::from_value(v).ok()
            });
        });
        group.bench_function(format!("{name}/from_slice"), |b| {
            b.iter(|| CheckRequest::from_slice(black_box(&body)).ok());
        });
    }
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
