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
//! The modules, each using only those listed before it (a test keeps this order,
//! tests/test_crate_layout.py; docs/architecture.md#code-layout-and-conventions); this crate
//! root only declares them, re-exports [`Shared`] and [`Config`], and starts the listener:
//!
//! * [`decision_log`]: the queue and on-disk spool (a write-ahead log with group commit) that
//!   decision records wait in for the broker (docs/history.md, "Durability of the decision
//!   log"); `svc._pdp_core.DecisionLog` in Python.
//! * [`bundle_dir`]: reads a bundle directory into [`pdp_core::BundleSources`]
//!   (docs/bundles.md).
//! * `clock`: the wall clock in milliseconds.
//! * [`logline`]: lines on standard error, at most one a minute per kind of failure.
//! * [`pb`]: the code generated from the proto (`build.rs`).
//! * [`problem`]: RFC 9457 problem details and bounded error texts, for every HTTP answer.
//! * [`metrics`]: Prometheus metrics.
//! * [`auth`]: bearer-token authentication of callers (docs/auth.md).
//! * [`resources`]: resources and work items fetched on a miss from a source the control
//!   plane installs (the context service's reads by id, docs/context.md).
//! * [`challenges`]: challenges resolved on a `challenge` verdict and waited for, through a
//!   source the control plane installs (the challenge service, docs/challenges.md).
//! * [`shared`]: what every request handler shares ([`Shared`], [`Config`]).
//! * [`waits`]: a challenge wait as both transports take it.
//! * [`http`]: HTTP routes, AuthZEN.
//! * [`grpc`]: the tonic service: messages mapped to and from the decision core's request and
//!   decision types.

#![warn(missing_docs)]
pub mod auth;
pub mod bundle_dir;
pub mod challenges;
mod clock;
pub mod decision_log;
pub mod grpc;
pub mod http;
pub mod logline;
pub mod metrics;
pub mod pb;
pub mod problem;
pub mod resources;
pub mod shared;
pub mod waits;

pub use shared::{Config, LogUnavailable, Logged, Shared};

use decision_log::{DecisionLog, Durability};
use pdp_core::Engine;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

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
    let shared = Arc::new(Shared::new(engine, config, metrics, log, health));
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
