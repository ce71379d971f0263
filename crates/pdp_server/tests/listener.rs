//! `pdp_server` on its own, without Python: the listener over a real socket on 127.0.0.1,
//! serving a bundle directory read by `bundle_dir`, with a decision log spooled to disk. The
//! Python suite (tests/test_server.py, tests/test_decision_log.py) covers every route and
//! transport through the binding; this checks the crate's own wiring: readiness as the control
//! plane sets it (docs/architecture.md#what-every-component-serves), a check answered over
//! HTTP/1.1 (docs/api.md), and its record in the spool before the answer in durable mode
//! (docs/history.md, "Durability of the decision log"); challenges resolved and waited for
//! through a challenge source (docs/challenges.md#the-decision-point).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use pdp_core::Engine;
use pdp_server::challenges::{
    Ask, ChallengeSource, Challenges, Found, GetFuture, ResolveFuture, State, Status,
};
use pdp_server::decision_log::{DecisionLog, Durability, LogConfig};
use pdp_server::resources::{FetchFuture, Fetcher, Missing, ResourceSource};
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
        await_principals: false,
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
        .block_on(running.shared.set_ready(Some(true), Some(true), None))
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

/// A source that upserts `Document::"fresh"` when asked for it, knows no other id, and counts
/// the ids it was asked for.
struct Source {
    engine: Arc<Engine>,
    asked: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ResourceSource for Source {
    fn fetch(&self, missing: Missing) -> FetchFuture {
        let engine = self.engine.clone();
        let asked = self.asked.clone();
        Box::pin(async move {
            let mut absent = Missing::default();
            for u in missing.resources {
                asked.lock().unwrap().push(u.to_string());
                if u.to_string() == r#"Document::"fresh""# {
                    engine
                        .upsert_entities(vec![json!({
                            "uid": {"type": "Document", "id": "fresh"},
                            "attrs": {"owner": {"__entity": {"type": "Human", "id": "alice"}},
                                      "department": "sales", "sensitivity": "internal", "tags": []},
                            "parents": [],
                        })])
                        .unwrap();
                } else {
                    absent.resources.push(u);
                }
            }
            Ok(absent)
        })
    }
}

#[test]
fn fetches_missing_resources_once_and_waits_for_the_principals() {
    let engine = Arc::new(Engine::new(
        bundle_dir::load(&testdata().join("bundles/corp")).unwrap(),
    ));
    let mut cfg = config();
    cfg.await_principals = true;
    let running: Running = pdp_server::start(engine.clone(), cfg, None).unwrap();
    let addr = running.local_addr;
    running
        .block_on(running.shared.set_ready(Some(true), Some(true), None))
        .unwrap();
    let (status, body) = call(addr, "GET", "/readyz", None);
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["detail"],
        "not ready: waiting for the principals snapshot"
    );
    running
        .block_on(running.shared.set_ready(None, None, Some(true)))
        .unwrap();
    assert_eq!(call(addr, "GET", "/readyz", None).0, 200);

    let check = |id: &str| {
        let request = json!({
            "principal": {"type": "Human", "id": "alice"},
            "action": "view",
            "resource": {"type": "Document", "id": id},
        });
        let (status, answer) = call(addr, "POST", "/v1/access/evaluation", Some(&request));
        assert_eq!(status, 200, "{answer}");
        answer
    };
    // Without a source, a resource the engine lacks is decided without its attributes.
    assert_eq!(check("fresh")["verdict"], "deny");
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let source = Source {
        engine: engine.clone(),
        asked: asked.clone(),
    };
    running
        .shared
        .set_resource_source(Some(Arc::new(Fetcher::new(
            Arc::new(source),
            Duration::from_secs(5),
            100,
        ))));
    // Fetched on the miss: alice owns it.
    let answer = check("fresh");
    assert_eq!(answer["verdict"], "allow", "{answer}");
    assert_eq!(answer["policies"], json!(["owner-full-access"]));
    // Held now: not fetched again. An unknown id is fetched once, then remembered absent.
    check("fresh");
    for _ in 0..3 {
        assert_eq!(check("nowhere")["verdict"], "deny");
    }
    // A bundle entity is held: never fetched.
    check("design");
    assert_eq!(
        *asked.lock().unwrap(),
        [r#"Document::"fresh""#, r#"Document::"nowhere""#]
    );
    // Once the feed names it, an absent id is fetched again.
    let fetcher = running.shared.resource_source().unwrap();
    assert_eq!(fetcher.absent_len(), 1);
    fetcher.forget(&[r#"Document::"nowhere""#.parse().unwrap()], &[]);
    check("nowhere");
    assert_eq!(asked.lock().unwrap().len(), 3);
    let (_, metrics) = call_text(addr, "/metrics");
    assert!(
        metrics.contains(r#"svc_pdp_resource_fetches_total{outcome="ok"} 3"#),
        "{metrics}"
    );
}

/// `GET path` over HTTP/1.1: the status and the body as text.
fn call_text(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

/// A source that answers after `delay`, upserting `Document::"late"`, or fails when `fail`.
struct Slow {
    engine: Arc<Engine>,
    delay: Duration,
    fail: bool,
}

impl ResourceSource for Slow {
    fn fetch(&self, missing: Missing) -> FetchFuture {
        let (engine, delay, fail) = (self.engine.clone(), self.delay, self.fail);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if fail {
                return Err("the source is down".to_owned());
            }
            for u in &missing.resources {
                engine
                    .upsert_entities(vec![json!({
                        "uid": {"type": "Document", "id": u.id().unescaped()},
                        "attrs": {"owner": {"__entity": {"type": "Human", "id": "alice"}},
                                  "department": "sales", "sensitivity": "internal", "tags": []},
                        "parents": [],
                    })])
                    .unwrap();
            }
            Ok(Missing::default())
        })
    }
}

#[test]
fn a_late_or_failed_fetch_decides_without_the_resource() {
    let engine = Arc::new(Engine::new(
        bundle_dir::load(&testdata().join("bundles/corp")).unwrap(),
    ));
    let running: Running = pdp_server::start(engine.clone(), config(), None).unwrap();
    running
        .block_on(running.shared.set_ready(Some(true), Some(true), None))
        .unwrap();
    let addr = running.local_addr;
    let verdict = |id: &str| {
        let request = json!({
            "principal": {"type": "Human", "id": "alice"},
            "action": "view",
            "resource": {"type": "Document", "id": id},
        });
        let (status, answer) = call(addr, "POST", "/v1/access/evaluation", Some(&request));
        assert_eq!(status, 200, "{answer}");
        answer["verdict"].as_str().unwrap().to_owned()
    };
    let install = |delay_ms: u64, fail: bool| {
        let source = Slow {
            engine: engine.clone(),
            delay: Duration::from_millis(delay_ms),
            fail,
        };
        running
            .shared
            .set_resource_source(Some(Arc::new(Fetcher::new(
                Arc::new(source),
                Duration::from_millis(50),
                100,
            ))));
    };
    install(0, true);
    assert_eq!(verdict("down"), "deny");
    install(300, false);
    // Past the deadline: decided without it; the answer lands later, for the next check.
    assert_eq!(verdict("late"), "deny");
    let late = r#"Document::"late""#.parse().unwrap();
    let landed = (0..1500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        engine.missing(&[&late], &[]).0.is_empty()
    });
    assert!(landed, "the late answer never landed");
    assert_eq!(verdict("late"), "allow");
    running.shared.set_resource_source(None);
    let (_, metrics) = call_text(addr, "/metrics");
    for (outcome, n) in [("ok", 0), ("failed", 1), ("timeout", 1)] {
        let line = format!(r#"svc_pdp_resource_fetches_total{{outcome="{outcome}"}} {n}"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}

/// The challenge service as a map in memory: `Resolve` opens one pending challenge per
/// fingerprint (or answers the one there), `GetChallenge` answers it to its owner only,
/// `follow` records what it was asked to follow. `fail` makes every call fail.
#[derive(Default)]
struct FakeChallenges {
    /// fingerprint text -> (qid, owner, status)
    book: std::sync::Mutex<Vec<(String, String, String, Status)>>,
    followed: std::sync::Mutex<Vec<String>>,
    fail: std::sync::atomic::AtomicBool,
}

fn owner_text(p: &pdp_core::EntityUid, o: Option<&pdp_core::EntityUid>) -> String {
    format!("{p}/{}", o.map(ToString::to_string).unwrap_or_default())
}

impl ChallengeSource for FakeChallenges {
    fn resolve(&self, ask: Ask) -> ResolveFuture {
        let fp = format!(
            "{}|{}|{}|{}",
            owner_text(&ask.principal, ask.on_behalf_of.as_ref()),
            ask.action,
            ask.resource,
            ask.challenges.join(",")
        );
        let mut book = self.book.lock().unwrap();
        let answer = if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            Err("the challenge service is down".to_owned())
        } else if let Some((_, qid, _, st)) = book.iter().find(|e| e.0 == fp) {
            Ok(Found {
                qid: qid.clone(),
                status: st.clone(),
            })
        } else {
            let qid = format!("c{}", book.len() + 1);
            let st = Status {
                state: State::Pending,
                expires_at_ms: Some(u64::MAX / 2),
                grant_expires_at_ms: None,
                pending: ask.challenges.clone(),
            };
            let owner = owner_text(&ask.principal, ask.on_behalf_of.as_ref());
            book.push((fp, qid.clone(), owner, st.clone()));
            Ok(Found { qid, status: st })
        };
        Box::pin(async move { answer })
    }

    fn get(
        &self,
        qid: String,
        principal: pdp_core::EntityUid,
        on_behalf_of: Option<pdp_core::EntityUid>,
    ) -> GetFuture {
        let owner = owner_text(&principal, on_behalf_of.as_ref());
        let found = self
            .book
            .lock()
            .unwrap()
            .iter()
            .find(|e| e.1 == qid && e.2 == owner)
            .map(|e| Found {
                qid: e.1.clone(),
                status: e.3.clone(),
            });
        Box::pin(async move { Ok(found) })
    }

    fn follow(&self, qid: String, _: pdp_core::EntityUid, _: Option<pdp_core::EntityUid>) {
        self.followed.lock().unwrap().push(qid);
    }
}

impl FakeChallenges {
    /// Sets a challenge's status, as an answer through the service would.
    fn set(&self, qid: &str, st: &Status) {
        for e in self.book.lock().unwrap().iter_mut() {
            if e.1 == qid {
                e.3 = st.clone();
            }
        }
    }
}

fn metric(addr: SocketAddr, name: &str) -> String {
    let (_, text) = call_text(addr, "/metrics");
    text.lines()
        .find(|l| l.starts_with(name))
        .map(|l| l.rsplit(' ').next().unwrap().to_owned())
        .unwrap_or_default()
}

#[test]
fn resolves_challenges_and_holds_waits_until_a_change_is_pushed() {
    let dir = std::env::temp_dir().join(format!("svc-listener-challenge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("schema.cedarschema"),
        "entity Human;\nentity Document;\naction delete appliesTo { principal: [Human], resource: [Document] };\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policies.cedar"),
        "@id(\"delete-needs-reason\") @challenge(\"justification\")\npermit (principal is Human, action == Action::\"delete\", resource is Document);\n",
    )
    .unwrap();
    let engine = Arc::new(Engine::new(bundle_dir::load(&dir).unwrap()));
    let running: Running = pdp_server::start(engine, config(), None).unwrap();
    let addr = running.local_addr;
    running
        .block_on(running.shared.set_ready(Some(true), Some(true), None))
        .unwrap();
    let check = |who: &str, doc: &str| {
        let request = json!({
            "principal": {"type": "Human", "id": who},
            "action": "delete",
            "resource": {"type": "Document", "id": doc},
        });
        let (status, answer) = call(addr, "POST", "/v1/access/evaluation", Some(&request));
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let wait = |qid: &str, who: &str, secs: u64| {
        let request = json!({
            "challenge_qid": qid,
            "principal": {"type": "Human", "id": who},
            "wait_secs": secs,
        });
        call(addr, "POST", "/v1/access/challenge", Some(&request))
    };

    // No source: no qid, and waits answer 503 as in standalone mode.
    assert!(check("ana", "d1").get("challenge_qid").is_none());
    assert_eq!(wait("c1", "ana", 0).0, 503);

    let fake = Arc::new(FakeChallenges::default());
    running
        .shared
        .set_challenge_source(Some(Arc::new(Challenges::new(
            fake.clone(),
            Duration::from_secs(5),
            100,
        ))));
    let first = check("ana", "d1");
    assert_eq!(first["verdict"], "challenge");
    assert_eq!(first["challenge_qid"], "c1");
    assert_eq!(check("ana", "d2")["challenge_qid"], "c2");

    // Only ana may wait on c1; an unknown qid is not found either.
    let (status, answer) = wait("c1", "bo", 0);
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["type"], "urn:svc:problem:challenge-not-found");
    assert_eq!(wait("c9", "ana", 0).0, 404);
    let (status, look) = wait("c1", "ana", 0);
    assert_eq!(status, 200, "{look}");
    assert_eq!(look["outcome"], "pending");
    assert_eq!(look["pending"], json!(["justification"]));
    assert_eq!(look["retry"], false);

    // A wait is held until the change is pushed.
    let waiter = std::thread::spawn(move || wait_owned(addr, "c1", "ana", 25));
    while metric(addr, "svc_pdp_challenge_waits ") != "1" {
        std::thread::sleep(Duration::from_millis(10));
    }
    let passed = Status {
        state: State::Passed,
        expires_at_ms: Some(u64::MAX / 2),
        grant_expires_at_ms: Some(u64::MAX / 2),
        pending: Vec::new(),
    };
    fake.set("c1", &passed);
    let challenges = running.shared.challenge_source().unwrap();
    assert!(challenges.changed("c1", passed));
    assert!(!challenges.changed("c404", look_status()));
    let (status, done) = waiter.join().unwrap();
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["outcome"], "passed");
    assert_eq!(done["retry"], true);
    assert_eq!(*fake.followed.lock().unwrap(), ["c1"]);

    // The retry is allowed and names the challenge.
    let retry = check("ana", "d1");
    assert_eq!(retry["verdict"], "allow", "{retry}");
    assert_eq!(retry["challenge_qid"], "c1");
    assert_eq!(
        retry["policies"],
        json!(["delete-needs-reason", "svc:challenge_passed"])
    );

    // A challenge this listener does not hold is asked for once, then held.
    fake.book.lock().unwrap().push((
        "elsewhere".into(),
        "c7".into(),
        owner_text(&r#"Human::"ana""#.parse().unwrap(), None),
        Status {
            state: State::Pending,
            expires_at_ms: Some(1),
            grant_expires_at_ms: None,
            pending: vec!["justification".into()],
        },
    ));
    let (status, expired) = wait("c7", "ana", 25);
    assert_eq!(status, 200, "{expired}");
    assert_eq!(expired["outcome"], "expired");
    assert_eq!(expired["retry"], true);
    assert_eq!(challenges.len(), 3);

    // A source that fails leaves the verdict a challenge without a qid, counted.
    fake.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    let failed = check("ana", "d3");
    assert_eq!(failed["verdict"], "challenge");
    assert!(failed.get("challenge_qid").is_none(), "{failed}");
    assert_eq!(
        metric(addr, r#"svc_pdp_challenge_calls_total{outcome="failed"}"#),
        "1"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Containment during a wait (docs/challenges.md#containment-during-a-wait): a held wait of
/// the contained principal answers `rejected` at once (retry false) and the retry is denied
/// `svc:contained`; another principal's wait stays held; after the lift the challenge's own
/// state answers again.
#[test]
fn containment_ends_held_waits_with_a_deny() {
    let dir = std::env::temp_dir().join(format!("svc-listener-contain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("schema.cedarschema"),
        "entity Human;\nentity Document;\naction delete appliesTo { principal: [Human], resource: [Document] };\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policies.cedar"),
        "@id(\"delete-needs-reason\") @challenge(\"justification\")\npermit (principal is Human, action == Action::\"delete\", resource is Document);\n",
    )
    .unwrap();
    let engine = Arc::new(Engine::new(bundle_dir::load(&dir).unwrap()));
    let running: Running = pdp_server::start(engine.clone(), config(), None).unwrap();
    let addr = running.local_addr;
    running
        .block_on(running.shared.set_ready(Some(true), Some(true), None))
        .unwrap();
    let fake = Arc::new(FakeChallenges::default());
    running.shared.set_challenge_source(Some(Arc::new(
        Challenges::new(fake.clone(), Duration::from_secs(5), 100)
            .with_containments(engine.clone()),
    )));
    let check = |who: &str| {
        let request = json!({
            "principal": {"type": "Human", "id": who},
            "action": "delete",
            "resource": {"type": "Document", "id": "d1"},
        });
        let (status, answer) = call(addr, "POST", "/v1/access/evaluation", Some(&request));
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let ana_qid = check("ana")["challenge_qid"].as_str().unwrap().to_owned();
    let bo_qid = check("bo")["challenge_qid"].as_str().unwrap().to_owned();

    // Two waits of ana and one of bo are held.
    let waits: Vec<_> = [
        (ana_qid.clone(), "ana"),
        (ana_qid.clone(), "ana"),
        (bo_qid.clone(), "bo"),
    ]
    .into_iter()
    .map(|(qid, who)| std::thread::spawn(move || wait_owned(addr, &qid, who, 25)))
    .collect();
    while metric(addr, "svc_pdp_challenge_waits ") != "3" {
        std::thread::sleep(Duration::from_millis(10));
    }
    let challenges = running.shared.challenge_source().unwrap();
    // A change that contains nobody ends nothing.
    assert_eq!(challenges.containments_changed(), 0);
    engine
        .set_contained(&json!([{"type": "Human", "id": "ana"}]), true)
        .unwrap();
    assert_eq!(challenges.containments_changed(), 1);
    let mut waits = waits.into_iter();
    for w in waits.by_ref().take(2) {
        let (status, answer) = w.join().unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["outcome"], "rejected");
        assert_eq!(answer["retry"], false);
        assert_eq!(answer["grant_expires_at"], Value::Null);
    }
    // bo's wait is still held; ana's retry is denied as contained; a new wait ends at once.
    assert_eq!(metric(addr, "svc_pdp_challenge_waits "), "1");
    let retry = check("ana");
    assert_eq!(retry["verdict"], "deny", "{retry}");
    assert_eq!(retry["policies"], json!(["svc:contained"]));
    let (status, again) = wait_owned(addr, &ana_qid, "ana", 25);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["outcome"], "rejected");
    // Another principal still learns nothing of ana's challenge.
    assert_eq!(wait_owned(addr, &ana_qid, "bo", 0).0, 404);

    // Lifted: the challenge answers as the service has it (still pending).
    engine
        .set_contained(&json!([{"type": "Human", "id": "ana"}]), false)
        .unwrap();
    assert_eq!(challenges.containments_changed(), 0);
    let (status, look) = wait_owned(addr, &ana_qid, "ana", 0);
    assert_eq!(status, 200, "{look}");
    assert_eq!(look["outcome"], "pending");

    // bo's wait ends with its own answer.
    let passed = Status {
        state: State::Passed,
        expires_at_ms: Some(u64::MAX / 2),
        grant_expires_at_ms: Some(u64::MAX / 2),
        pending: Vec::new(),
    };
    assert!(challenges.changed(&bo_qid, passed));
    let (status, done) = waits.next().unwrap().join().unwrap();
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["outcome"], "passed");
    let _ = std::fs::remove_dir_all(&dir);
}

fn look_status() -> Status {
    Status {
        state: State::Pending,
        expires_at_ms: None,
        grant_expires_at_ms: None,
        pending: Vec::new(),
    }
}

/// A challenge wait over HTTP/1.1 (owned arguments, for a thread).
fn wait_owned(addr: SocketAddr, qid: &str, who: &str, secs: u64) -> (u16, Value) {
    let request = json!({
        "challenge_qid": qid,
        "principal": {"type": "Human", "id": who},
        "wait_secs": secs,
    });
    call(addr, "POST", "/v1/access/challenge", Some(&request))
}

#[test]
fn a_feed_without_a_sync_within_its_bound_makes_the_listener_unready() {
    let engine = Arc::new(Engine::new(
        bundle_dir::load(&testdata().join("bundles/corp")).unwrap(),
    ));
    let running: Running = pdp_server::start(engine, config(), None).unwrap();
    let addr = running.local_addr;
    let shared = running.shared.clone();
    running
        .block_on(shared.set_ready(Some(true), Some(true), None))
        .unwrap();
    // A long bound: the feed counts from its start and is not stale yet.
    shared.follow_feed("resources", Duration::from_secs(3600));
    assert!(shared.feed_synced("resources", Some(41)));
    assert!(!shared.feed_synced("unknown", None));
    let (status, body) = call(addr, "GET", "/readyz", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["feeds"]["resources"]["version"], 41);

    // A short one: once it passes without a sync, the listener is not ready and says why.
    shared.follow_feed("resources", Duration::from_millis(20));
    assert!(shared.feed_synced("resources", Some(41)));
    assert!(shared.feed_failed("resources", &"x".repeat(2_000)));
    let body = loop {
        let (status, body) = call(addr, "GET", "/readyz", None);
        if status == 503 {
            break body;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stale = &body["stale_feeds"][0];
    assert_eq!(stale["feed"], "resources");
    assert_eq!(stale["version"], 41);
    assert_eq!(stale["errors"], 1);
    assert!(stale["last_success"].is_string());
    assert_eq!(stale["last_error"].as_str().unwrap().len(), 303);
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .starts_with("not ready: feed `resources` is stale"));
    assert!(!shared.ready());
    assert_eq!(
        metric(addr, "svc_pdp_feed_errors_total{feed=\"resources\"}"),
        "1"
    );
    assert_eq!(metric(addr, "svc_pdp_feed_stale{feed=\"resources\"}"), "1");
    assert_eq!(
        metric(addr, "svc_pdp_feed_version{feed=\"resources\"}"),
        "41"
    );
    assert_eq!(metric(addr, "svc_pdp_ready"), "0");

    // No longer followed: ready again, and its series are gone.
    shared.unfollow_feed("resources");
    assert_eq!(call(addr, "GET", "/readyz", None).0, 200);
    assert_eq!(metric(addr, "svc_pdp_feed_stale{feed=\"resources\"}"), "");
}
