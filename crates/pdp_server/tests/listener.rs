//! `pdp_server` on its own, without Python: the listener over a real socket on 127.0.0.1,
//! serving a bundle directory read by `bundle_dir`, with a decision log spooled to disk. The
//! Python suite (tests/test_server.py, tests/test_decision_log.py) covers every route and
//! transport through the binding; this checks the crate's own wiring: readiness as the control
//! plane sets it (docs/architecture.md#what-every-component-serves), a check answered over
//! HTTP/1.1 (docs/api.md), and its record in the spool before the answer in durable mode
//! (docs/history.md, "Durability of the decision log").
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::Engine;
use pdp_server::decision_log::{DecisionLog, Durability, LogConfig};
use pdp_server::{bundle_dir, Config, Running};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata")
}

fn config() -> Config {
    Config {
        host: "127.0.0.1".into(),
        port: 0,
        max_body_bytes: 1 << 20,
        workers: 1,
        public_url: None,
        version: "test".into(),
        noop_routes: false,
        pdp_name: "pdp-test".into(),
        max_batch_items: 1000,
        auth: None,
    }
}

/// One HTTP/1.1 exchange on a new connection: the status code and the body as JSON.
fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}

fn open_log(name: &str) -> (Arc<DecisionLog>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("svc-listener-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = DecisionLog::open(&LogConfig {
        queue_bound: 100,
        spool_dir: dir.clone(),
        spool_max_bytes: 1 << 20,
        segment_bytes: 1 << 16,
        commit_interval: Duration::ZERO,
        fsync: false,
        durability: Durability::Durable,
    })
    .unwrap();
    (Arc::new(log), dir)
}

#[test]
fn serves_checks_from_a_bundle_directory_and_spools_their_records() {
    let engine = Arc::new(Engine::new(
        bundle_dir::load(&testdata().join("bundles/corp")).unwrap(),
    ));
    let (log, spool) = open_log("check");
    let mut running: Running = pdp_server::start(engine, config(), Some(log.clone())).unwrap();
    let addr = running.local_addr;
    assert_ne!(addr.port(), 0);

    let (status, body) = call(addr, "GET", "/healthz", None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(addr, "GET", "/readyz", None);
    assert_eq!(status, 503);
    assert_eq!(
        body["detail"],
        "not ready: waiting for a policy bundle and the containment list"
    );
    running
        .block_on(running.shared.set_ready(Some(true), Some(true)))
        .unwrap();
    let (status, body) = call(addr, "GET", "/readyz", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true);

    // The first case of tests/testdata/golden/verdicts.json.
    let request = json!({
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    });
    let (status, answer) = call(addr, "POST", "/v1/access/evaluation", Some(&request));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["verdict"], "allow");
    assert_eq!(
        answer["policies"],
        json!(["owner-full-access", "view-own-department"])
    );

    // Durable mode answered only once the record was written: it is readable at once.
    let batch = log.read(10, Duration::ZERO).unwrap();
    assert_eq!(batch.records.len(), 1);
    let rec = &batch.records[0];
    assert_eq!(rec.key, b"Human::alice");
    let value: Value = serde_json::from_slice(&rec.value).unwrap();
    assert_eq!(value["qid"], answer["qid"]);
    assert_eq!(value["call"], "check");
    assert_eq!(value["transport"], "http");
    assert_eq!(value["verdict"], "allow");
    assert_eq!(value["pdp"], "pdp-test");

    running.stop(Duration::from_secs(5));
    assert!(
        TcpStream::connect(addr).is_err(),
        "still accepting after stop"
    );
    log.close().unwrap();
    let _ = std::fs::remove_dir_all(&spool);
}
