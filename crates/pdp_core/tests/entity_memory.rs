//! The heap a loaded directory snapshot keeps per entity (docs/decisions.md, "What the store
//! keeps per entity"; docs/benchmarks.md, "Memory per entity").
//!
//! A global allocator that counts the bytes live on the heap (this test binary's only), around
//! `Engine::replace_entities` of people in groups in the demo company's shape: `department`,
//! `title`, `active`, `manager`, one to three groups.

use pdp_core::bundle::{Bundle, BundleSources};
use pdp_core::engine::Engine;
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes it has handed out and not yet taken back.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from `System` with layout `l` (every allocation goes through it).
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: as `alloc` and `dealloc`.
        let q = unsafe { System.realloc(p, l, n) };
        if !q.is_null() {
            LIVE.fetch_add(n, Ordering::Relaxed);
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes live on the heap now.
fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// `people` humans in `people / 10` groups, as `benches/bench_entity_memory.py` makes them.
fn snapshot(people: usize) -> Vec<Value> {
    let groups = (people / 10).max(1);
    let mut out: Vec<Value> = (0..groups)
        .map(|i| json!({"uid": {"type": "Group", "id": format!("g{i}")}, "attrs": {}, "parents": []}))
        .collect();
    for i in 0..people {
        let mut member_of: Vec<usize> = [1, 7, 13]
            .iter()
            .take(1 + i % 3)
            .map(|k| (i * k) % groups)
            .collect();
        member_of.sort_unstable();
        member_of.dedup();
        out.push(json!({
            "uid": {"type": "Human", "id": format!("user{i}@example.com")},
            "attrs": {
                "department": "Engineering",
                "title": "Engineer",
                "active": i % 10 != 0,
                "manager": {"__entity": {"type": "Human", "id": format!("user{}@example.com", i / 8 * 8)}},
            },
            "parents": member_of.iter().map(|g| json!({"type": "Group", "id": format!("g{g}")})).collect::<Vec<_>>(),
        }));
    }
    out
}

/// An engine with the demo company's schema (`level` optional) and one policy.
fn engine() -> Result<Engine, String> {
    let schema = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/svc/demo/bundle/company.cedarschema"
    ))
    .map_err(|e| e.to_string())?
    .replace("level: Long,", "level?: Long,");
    let src = BundleSources {
        policies: vec![(
            "p.cedar".into(),
            "permit(principal, action, resource) when { principal is Human && principal.active };"
                .into(),
        )],
        schema: Some(("company.cedarschema".into(), schema)),
        entities: None,
        links: None,
    };
    Bundle::from_sources(&src)
        .map(Engine::new)
        .map_err(|e| e.to_string())
}

/// 20,000 people in 2,000 groups keep under 1,000 bytes of heap per entity once loaded (the
/// issue's target for the whole process's resident memory; the heap is most of it), and the
/// snapshot is what the engine decides with.
#[test]
fn a_loaded_snapshot_keeps_under_a_kilobyte_per_entity() -> Result<(), String> {
    let engine = engine()?;
    let people = 20_000;
    // `replace_entities` drops the JSON it is given: the count before it leaves the JSON out.
    let before = live();
    let snapshot = snapshot(people);
    let entities = snapshot.len();
    let n = engine
        .replace_entities(snapshot)
        .map_err(|e| e.to_string())?;
    let kept = live() - before;
    assert_eq!(n, entities);
    let per_entity = kept / entities;
    eprintln!("{entities} entities: {per_entity} bytes of heap per entity");
    assert!(per_entity < 1_000, "{per_entity} bytes per entity");
    // Decisions read the compact records: attributes, groups and the manager reference.
    let decide = |id: &str| -> Result<String, String> {
        let req = pdp_core::CheckRequest::from_json(&json!({
            "principal": {"type": "Human", "id": id},
            "action": {"type": "Action", "id": "read"},
            "resource": {"type": "Document", "id": "d"},
        }))
        .map_err(|e| e.to_string())?;
        let d = engine.decide(&req).map_err(|e| e.to_string())?;
        Ok(format!("{:?}", d.verdict))
    };
    assert_eq!(decide("user1@example.com")?, "Allow");
    assert_eq!(decide("user10@example.com")?, "Deny");
    Ok(())
}
