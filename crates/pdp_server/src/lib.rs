//! `pdp_server`: the decision point's I/O around the pure engine [`pdp_core`], in Rust and
//! without Python (docs/architecture.md#rust-and-python): its network front, its decision log
//! on disk, and reading policy bundles from disk.
//!
//! The network front (docs/api.md) is one TCP listener serving the gRPC
//! `svc.authz.v1.Authorizer` (tonic, with gRPC health checking and server reflection) and the
//! HTTP decision API, AuthZEN 1.0 and the health/version/metrics routes (axum) on the same
//! port. HTTP/1.1 and HTTP/2 (h2c with prior knowledge, which is what gRPC clients speak on a
//! plaintext port) are told apart per connection by hyper's auto builder; requests are routed by
//! path, and gRPC paths (`/svc.authz.v1.Authorizer/...`) never collide with HTTP ones. The gRPC
//! code is generated at build time from `proto/svc/authz/v1/authz.proto` (`build.rs`).
//!
//! [`start`] binds the listener and serves an [`Engine`] on a multi-threaded Tokio runtime of
//! its own, calling the engine directly: no request ever takes Python's GIL. It returns a
//! [`Running`] server, whose [`Shared`] state takes the control plane's signals (readiness,
//! bundle reloads); [`Running::stop`] stops it. `crates/pdp_py` exposes this to Python as
//! `svc._pdp_core.Server`; `svc.pdp.server` starts and stops it and keeps the control plane.
//!
//! * [`http`]: HTTP routes, RFC 9457 problem details, AuthZEN.
//! * [`grpc`]: the tonic service: messages mapped to and from the decision core's request and
//!   decision types.
//! * [`metrics`]: Prometheus metrics.
//! * [`auth`]: bearer-token authentication of callers (docs/auth.md).
//! * [`decision_log`]: the queue and on-disk spool (a write-ahead log with group commit) that
//!   decision records wait in for the broker (docs/history.md, "Durability of the decision
//!   log"); `svc._pdp_core.DecisionLog` in Python.
//! * [`resources`]: resources and work items fetched on a miss from a source the control
//!   plane installs (the context service's reads by id, docs/context.md).
//! * [`challenges`]: challenges resolved on a `challenge` verdict and waited for, through a
//!   source the control plane installs (the challenge service, docs/challenges.md).
//! * [`bundle_dir`]: reads a bundle directory into [`pdp_core::BundleSources`]
//!   (docs/bundles.md).

#![warn(missing_docs)]
pub mod auth;
pub mod bundle_dir;
pub mod challenges;
pub mod decision_log;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod resources;

use arc_swap::ArcSwapOption;
use decision_log::{DecisionLog, Durability, NotWritten, Record, Ticket};
use metrics::Transport;
use pdp_core::decision::{uid_key, Call};
use pdp_core::{Decision, Engine, EntityUid, QueryPlan};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Listener settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to bind, e.g. `127.0.0.1` or `0.0.0.0`.
    pub host: String,
    /// Port to bind (8080 by default, docs/architecture.md#limits); 0 picks a free one.
    pub port: u16,
    /// Largest request body accepted, in bytes; larger bodies get `413`.
    pub max_body_bytes: usize,
    /// Tokio worker threads; 0 means one per available core.
    pub workers: usize,
    /// Base URL published in `/.well-known/authzen-configuration`; `None` derives it from the
    /// request's `Host` header.
    pub public_url: Option<String>,
    /// Release reported by `/version`.
    pub version: String,
    /// Also serve the benchmark ceiling: `POST /v1/noop` and gRPC `svc.authz.v1.NoopAuthorizer`
    /// (parse the request, answer a fixed allow). Off unless asked for.
    pub noop_routes: bool,
    /// This decision point's name in decision records (`pdp`, docs/history.md#schema).
    pub pdp_name: String,
    /// Most evaluations one AuthZEN `evaluations` request may carry; more is a `400` naming
    /// the limit (docs/api.md, "Limits").
    pub max_batch_items: usize,
    /// Who may call (docs/auth.md): every route but the probes needs a bearer token when set;
    /// `None` serves everyone (loopback only, which `svc.pdp.server` enforces).
    pub auth: Option<Arc<auth::Authenticator>>,
    /// Whether the principals come from a feed the control plane loads (the context service,
    /// docs/context.md): the `principals` readiness flag then starts unset, and `/readyz`
    /// answers 503 until the control plane sets it. Otherwise it is set at start.
    pub await_principals: bool,
}

/// What every request handler shares.
pub struct Shared {
    /// The engine deciding every request.
    pub engine: Arc<Engine>,
    /// Prometheus metrics.
    pub metrics: metrics::Metrics,
    /// Settings.
    pub config: Config,
    /// Where every decision's record goes (docs/architecture.md#how-records-flow); `None` logs
    /// nothing.
    pub log: Option<Arc<DecisionLog>>,
    bundle_loaded: AtomicBool,
    containments_loaded: AtomicBool,
    principals_loaded: AtomicBool,
    /// Whether `resources` holds a fetcher: read first, so a check without a source pays one
    /// relaxed load.
    has_resources: AtomicBool,
    resources: ArcSwapOption<resources::Fetcher>,
    /// Whether `challenges` holds a source: read first, as `has_resources`.
    has_challenges: AtomicBool,
    challenges: ArcSwapOption<challenges::Challenges>,
    bundle_error: RwLock<Option<String>>,
    health: tonic_health::server::HealthReporter,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A decision's record on its way to the decision log, from [`Shared::decided`] /
/// [`Shared::planned`]. Await [`Logged::written`] before answering: with
/// `log_durability=durable` it resolves once the record's group commit is written (the Tokio
/// worker is free meanwhile: the writer thread wakes it); otherwise at once.
#[must_use = "await `written()` before answering, so durable mode can hold the answer"]
pub struct Logged(Option<(Ticket, prometheus::Histogram)>);

impl Logged {
    /// Resolves once the answer may go out (see [`Logged`]).
    ///
    /// # Errors
    /// [`LogUnavailable`] in durable mode when the record was dropped (spool full, write
    /// error): the decision must not be answered.
    pub async fn written(self) -> Result<(), LogUnavailable> {
        let Some((ticket, waited)) = self.0 else {
            return Ok(());
        };
        let start = std::time::Instant::now();
        let res = ticket.written().await;
        waited.observe(start.elapsed().as_secs_f64());
        res.map_err(LogUnavailable)
    }
}

/// A decision not answered because durable mode could not write its record: `503
/// decision-log-unavailable` over HTTP, `UNAVAILABLE` over gRPC, with the same text.
#[derive(Debug)]
pub struct LogUnavailable(pub NotWritten);

impl LogUnavailable {
    /// The text both transports answer.
    pub fn detail(&self) -> String {
        format!(
            "the decision is not answered: log_durability=durable answers only once the \
             decision's record is written, and {}",
            self.0
        )
    }
}

impl From<LogUnavailable> for http::Problem {
    fn from(e: LogUnavailable) -> Self {
        Self::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "decision-log-unavailable",
            "The decision could not be logged",
            e.detail(),
        )
    }
}

impl From<LogUnavailable> for tonic::Status {
    fn from(e: LogUnavailable) -> Self {
        Self::unavailable(e.detail())
    }
}

impl Shared {
    fn log_record(&self, key: Vec<u8>, value: Vec<u8>) -> Logged {
        let Some(log) = &self.log else {
            return Logged(None);
        };
        let ticket = log.push(Record { key, value });
        Logged(
            (log.durability() == Durability::Durable)
                .then(|| (ticket, self.metrics.log_wait.clone())),
        )
    }

    /// Counts a decision and queues its record (key = principal, `Type::id`;
    /// docs/architecture.md#how-records-flow), with the `challenge_qid` its challenge
    /// verdict resolved to (`None`: no challenge service, or not a challenge).
    pub fn decided(&self, d: &Decision, t: Transport, challenge_qid: Option<&str>) -> Logged {
        self.metrics.decision(t, d.verdict, d.mode, d.latency_us);
        if self.log.is_none() {
            return Logged(None);
        }
        let mut rec = d.record(&self.config.pdp_name);
        rec.call = Some(Call::Check);
        rec.transport = Some(t.as_str());
        rec.challenge_qid = challenge_qid;
        self.log_view(&d.principal, &d.qid, &rec)
    }

    /// Installs (`Some`) or removes (`None`) the challenge service's source
    /// ([`challenges::Challenges`]); checks and waits in flight keep the one they started
    /// with.
    pub fn set_challenge_source(&self, source: Option<Arc<challenges::Challenges>>) {
        let on = source.is_some();
        self.challenges.store(source);
        self.has_challenges.store(on, Ordering::Release);
    }

    /// The installed challenge source, if any.
    pub fn challenge_source(&self) -> Option<Arc<challenges::Challenges>> {
        if self.has_challenges.load(Ordering::Acquire) {
            self.challenges.load_full()
        } else {
            None
        }
    }

    /// After a check is decided: resolves its `challenge` verdict when a challenge source is
    /// installed ([`challenges::Challenges::resolve`]), which may turn it into `allow` or
    /// `deny`; returns the challenge's qid. Any other verdict, or no source, returns `None`
    /// after one relaxed atomic load.
    pub async fn resolve_challenge(&self, d: &mut Decision) -> Option<String> {
        if d.verdict != pdp_core::Verdict::Challenge || !self.has_challenges.load(Ordering::Relaxed)
        {
            return None;
        }
        let c = self.challenges.load_full()?;
        c.resolve(d, &self.metrics).await
    }

    /// Queues the record `view` of decision `qid` under `principal`'s key. A record that does
    /// not serialise is not written (never as an empty record): it is counted in
    /// `svc_pdp_record_errors_total` and reported on standard error.
    fn log_view(&self, principal: &EntityUid, qid: &str, view: &impl serde::Serialize) -> Logged {
        match serde_json::to_vec(view) {
            Ok(value) => self.log_record(uid_key(principal).into_bytes(), value),
            Err(e) => {
                self.metrics.record_error();
                eprintln!("svc pdp: the decision record of `{qid}` is not written: {e}");
                Logged(None)
            }
        }
    }

    /// Counts a plan and queues its record.
    pub fn planned(&self, p: &QueryPlan, t: Transport) -> Logged {
        self.metrics
            .plan(t, p.outcome.as_str(), p.pinned, p.latency_us);
        if self.log.is_none() {
            return Logged(None);
        }
        let rec = p.record(&self.config.pdp_name, t.as_str(), now_ms());
        self.log_view(&p.principal, &p.qid, &rec)
    }

    /// Queues the record of one search page (docs/search.md, docs/history.md#schema): one
    /// record per search call, `call` `search`, with the number of results. Its key is the
    /// subject's (`Type::id`), or the resource's for a subject search.
    pub fn searched(&self, p: &pdp_core::SearchPage, t: Transport) -> Logged {
        self.metrics.search(
            p.kind.as_str(),
            p.method.as_str(),
            p.results.len(),
            p.latency_us,
        );
        if self.log.is_none() {
            return Logged(None);
        }
        let Some(key) = p.subject.as_ref().or(p.resource.as_ref()) else {
            return Logged(None);
        };
        let at = pdp_core::decision::rfc3339_ms(now_ms());
        let rec = p.to_record(&self.config.pdp_name, t.as_str(), &at);
        self.log_view(key, &p.qid, &rec)
    }

    /// Whether the decision point can serve (docs/architecture.md#what-every-component-serves): a
    /// bundle, the containment list and the principals (docs/context.md) are loaded.
    pub fn ready(&self) -> bool {
        self.bundle_loaded.load(Ordering::Acquire)
            && self.containments_loaded.load(Ordering::Acquire)
            && self.principals_loaded.load(Ordering::Acquire)
    }

    /// Whether the control plane has loaded the principals snapshot (set at start unless
    /// [`Config::await_principals`]).
    pub fn principals_loaded(&self) -> bool {
        self.principals_loaded.load(Ordering::Acquire)
    }

    /// Installs (`Some`) or removes (`None`) the fetcher of missing resources
    /// ([`resources::Fetcher`]); checks in flight keep the one they started with.
    pub fn set_resource_source(&self, fetcher: Option<Arc<resources::Fetcher>>) {
        let on = fetcher.is_some();
        self.resources.store(fetcher);
        self.has_resources.store(on, Ordering::Release);
    }

    /// The installed fetcher of missing resources, if any.
    pub fn resource_source(&self) -> Option<Arc<resources::Fetcher>> {
        if self.has_resources.load(Ordering::Acquire) {
            self.resources.load_full()
        } else {
            None
        }
    }

    /// Before checks are decided: fetches what they name and the engine lacks, when a source is
    /// installed ([`resources::Fetcher::ensure`]; `resources`, `work_items`: every check's).
    /// Without a source it returns at once, after one relaxed atomic load.
    pub async fn ensure_resources(&self, resources: &[&EntityUid], work_items: &[&str]) {
        if !self.has_resources.load(Ordering::Relaxed) {
            return;
        }
        if let Some(f) = self.resources.load_full() {
            f.ensure(&self.engine, &self.metrics, resources, work_items)
                .await;
        }
    }

    /// Whether the control plane has loaded a policy bundle.
    pub fn bundle_loaded(&self) -> bool {
        self.bundle_loaded.load(Ordering::Acquire)
    }

    /// Whether the control plane has loaded the containment list.
    pub fn containments_loaded(&self) -> bool {
        self.containments_loaded.load(Ordering::Acquire)
    }

    /// Why the last bundle reload failed, while the previous bundle keeps serving.
    pub fn bundle_error(&self) -> Option<String> {
        self.bundle_error
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets the readiness flags the control plane owns (a policy bundle, the containment list,
    /// the principals snapshot); `None` leaves a flag as it is. gRPC health
    /// (`grpc.health.v1`) follows: SERVING when all three are set, else NOT_SERVING.
    pub async fn set_ready(
        &self,
        bundle: Option<bool>,
        containments: Option<bool>,
        principals: Option<bool>,
    ) {
        if let Some(b) = bundle {
            self.bundle_loaded.store(b, Ordering::Release);
        }
        if let Some(c) = containments {
            self.containments_loaded.store(c, Ordering::Release);
        }
        if let Some(p) = principals {
            self.principals_loaded.store(p, Ordering::Release);
        }
        let status = if self.ready() {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        self.health
            .set_service_status(grpc::SERVICE_NAME, status)
            .await;
        self.health.set_service_status("", status).await;
    }

    /// Records the outcome of a bundle reload: `None` for success (clears the error), else the
    /// error text shown on `/readyz` and counted in `svc_pdp_bundle_reloads_total`.
    pub fn bundle_reloaded(&self, error: Option<String>) {
        self.metrics.bundle_reload(error.is_none());
        *self
            .bundle_error
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = error;
    }
}

/// A started server: stop it with [`Running::stop`] (also on drop).
pub struct Running {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// The bound address (the real port when 0 was asked for).
    pub local_addr: SocketAddr,
    /// Shared state, for the control plane.
    pub shared: Arc<Shared>,
}

/// Binds the listener and starts serving `engine` on a new runtime.
///
/// # Errors
/// The `std::io::Error` of building the runtime or binding (`AddrInUse` when the port is taken,
/// `AddrNotAvailable` for a host this machine does not have).
pub fn start(
    engine: Arc<Engine>,
    config: Config,
    log: Option<Arc<DecisionLog>>,
) -> std::io::Result<Running> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if config.workers > 0 {
        rt.worker_threads(config.workers);
    }
    let runtime = rt.enable_all().thread_name("svc-pdp").build()?;
    let (health, health_service) = tonic_health::server::health_reporter();
    let metrics = metrics::Metrics::new();
    if let Some(l) = &log {
        metrics.log_settings(l.commit_interval(), l.durability() == Durability::Durable);
        let commit = metrics.log_commit.clone();
        l.observe_commits(move |c| commit.observe(c.duration.as_secs_f64()));
    }
    let principals_at_start = !config.await_principals;
    let shared = Arc::new(Shared {
        engine,
        metrics,
        config,
        log,
        bundle_loaded: AtomicBool::new(false),
        containments_loaded: AtomicBool::new(false),
        principals_loaded: AtomicBool::new(principals_at_start),
        has_resources: AtomicBool::new(false),
        resources: ArcSwapOption::empty(),
        has_challenges: AtomicBool::new(false),
        challenges: ArcSwapOption::empty(),
        bundle_error: RwLock::new(None),
        health,
    });
    let addr = format!("{}:{}", shared.config.host, shared.config.port);
    let listener = runtime.block_on(TcpListener::bind(&addr))?;
    let local_addr = listener.local_addr()?;
    runtime.block_on(shared.set_ready(None, None, None));
    let app = http::router(
        shared.clone(),
        grpc::routes(shared.clone(), health_service)?,
    );
    let (tx, rx) = oneshot::channel::<()>();
    let task = runtime.spawn(async move {
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            // Small responses go out at once; gRPC writes headers, data and trailers apart.
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Ok(Running {
        runtime: Some(runtime),
        shutdown: Some(tx),
        task: Some(task),
        local_addr,
        shared,
    })
}

impl Running {
    /// Stops accepting, lets requests in flight finish (up to `grace`), then stops the runtime.
    /// Calling it twice is harmless.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let (Some(rt), Some(task)) = (self.runtime.as_ref(), self.task.take()) {
            let _ = rt.block_on(async { tokio::time::timeout(grace, task).await });
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }

    /// Runs `f` on the server's runtime (for async control-plane calls).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> Option<F::Output> {
        self.runtime.as_ref().map(|rt| rt.block_on(f))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}
