//! What every request handler of the listener shares ([`Shared`]): the engine, the metrics,
//! the settings ([`Config`]), the decision log a decision's record goes to ([`Logged`]), the
//! readiness flags the control plane sets, the feeds it follows ([`FeedReport`]), and the
//! resource and challenge sources it installs. Below both transports (`crate::http`,
//! `crate::grpc`), which hold it as their state.

use crate::auth::Authenticator;
use crate::challenges::Challenges;
use crate::clock::now_ms;
use crate::decision_log::{DecisionLog, Durability, NotWritten, Record, Ticket};
use crate::metrics::{Metrics, Transport};
use crate::pb::authorizer_server::SERVICE_NAME;
use crate::problem::Problem;
use crate::resources::Fetcher;
use arc_swap::ArcSwapOption;
use pdp_core::decision::{uid_key, Call};
use pdp_core::{Decision, Engine, EntityUid, QueryPlan};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Longest feed error text kept (bytes): `/readyz` shows it, so it stays short.
pub const MAX_FEED_ERROR: usize = 300;

/// One feed the control plane follows (docs/api.md, "Readiness and feeds"): when it last
/// synced, its last error, and the version it last applied.
#[derive(Debug, Clone)]
struct Feed {
    /// Longest time without a successful sync before the feed is stale.
    max_staleness: Duration,
    /// When it was started: the age of a feed that never synced counts from here.
    since: Instant,
    /// The last successful sync: when (monotonic) and when (wall clock, ms since the epoch).
    last_ok: Option<(Instant, u64)>,
    /// The last failure: when (wall clock, ms) and its bounded text.
    last_error: Option<(u64, String)>,
    /// Failures since it was started.
    errors: u64,
    /// The version (cursor) last applied, as the feed numbers them.
    version: Option<u64>,
}

impl Feed {
    fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_ok.map_or(self.since, |(at, _)| at))
    }
}

/// What one followed feed looks like now ([`Shared::feeds`]), for `/readyz` and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedReport {
    /// The feed's name (`bundle`, `principals`, `resources`, `work_items`, `containments`).
    pub name: String,
    /// Time since its last successful sync (since it was started when it never synced).
    pub age: Duration,
    /// Its staleness bound.
    pub max_staleness: Duration,
    /// Whether `age` is past `max_staleness`: the decision point is then not ready.
    pub stale: bool,
    /// Wall-clock time of the last successful sync, ms since the Unix epoch.
    pub last_ok_ms: Option<u64>,
    /// The last failure (wall-clock ms, text), kept after a success until the next failure.
    pub last_error: Option<(u64, String)>,
    /// Failures since it was started.
    pub errors: u64,
    /// The version last applied.
    pub version: Option<u64>,
}

/// `text` cut to [`MAX_FEED_ERROR`] bytes at a character boundary (`...` marks a cut).
fn feed_error_text(text: &str) -> String {
    if text.len() <= MAX_FEED_ERROR {
        return text.to_owned();
    }
    let mut end = MAX_FEED_ERROR;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

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
    pub auth: Option<Arc<Authenticator>>,
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
    pub metrics: Metrics,
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
    resources: ArcSwapOption<Fetcher>,
    /// Whether `challenges` holds a source: read first, as `has_resources`.
    has_challenges: AtomicBool,
    challenges: ArcSwapOption<Challenges>,
    bundle_error: RwLock<Option<String>>,
    /// The feeds the control plane follows, by name ([`Shared::follow_feed`]).
    feeds: RwLock<BTreeMap<String, Feed>>,
    /// What gRPC health last published (SERVING or not), so feed reports publish changes only.
    serving: AtomicBool,
    health: tonic_health::server::HealthReporter,
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

impl From<LogUnavailable> for Problem {
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
    /// The state of a listener serving `engine` with `config`, counting into `metrics`,
    /// logging into `log` (`None`: nothing is logged) and reporting gRPC health through
    /// `health`. No readiness flag is set but `principals`, unless
    /// [`Config::await_principals`]; no resource or challenge source is installed.
    pub(crate) fn new(
        engine: Arc<Engine>,
        config: Config,
        metrics: Metrics,
        log: Option<Arc<DecisionLog>>,
        health: tonic_health::server::HealthReporter,
    ) -> Self {
        let principals_at_start = !config.await_principals;
        Self {
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
            feeds: RwLock::new(BTreeMap::new()),
            serving: AtomicBool::new(false),
            health,
        }
    }

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
    /// ([`Challenges`]); checks and waits in flight keep the one they started
    /// with.
    pub fn set_challenge_source(&self, source: Option<Arc<Challenges>>) {
        let on = source.is_some();
        self.challenges.store(source);
        self.has_challenges.store(on, Ordering::Release);
    }

    /// The installed challenge source, if any.
    pub fn challenge_source(&self) -> Option<Arc<Challenges>> {
        if self.has_challenges.load(Ordering::Acquire) {
            self.challenges.load_full()
        } else {
            None
        }
    }

    /// After a check is decided: resolves its `challenge` verdict when a challenge source is
    /// installed ([`Challenges::resolve`]), which may turn it into `allow` or
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
                crate::logline::warn(
                    "record-unserialisable",
                    format_args!("the decision record of `{qid}` is not written: {e}"),
                );
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
    /// bundle, the containment list and the principals (docs/context.md) are loaded, and no
    /// followed feed is stale ([`Shared::follow_feed`]).
    pub fn ready(&self) -> bool {
        self.flags_ready() && !self.any_stale(Instant::now())
    }

    /// Whether the three readiness flags are set (staleness aside).
    fn flags_ready(&self) -> bool {
        self.bundle_loaded.load(Ordering::Acquire)
            && self.containments_loaded.load(Ordering::Acquire)
            && self.principals_loaded.load(Ordering::Acquire)
    }

    fn read_feeds(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Feed>> {
        self.feeds
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_feeds(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Feed>> {
        self.feeds
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn any_stale(&self, now: Instant) -> bool {
        self.read_feeds()
            .values()
            .any(|f| f.age(now) > f.max_staleness)
    }

    /// Starts following `feed` (docs/api.md, "Readiness and feeds"): from now on the decision
    /// point is not ready while `feed` has had no successful sync ([`Shared::feed_synced`])
    /// for longer than `max_staleness`; a feed that never synced counts from this call.
    /// Calling it again restarts the feed (its history is dropped).
    pub fn follow_feed(&self, feed: &str, max_staleness: Duration) {
        self.write_feeds().insert(
            feed.to_owned(),
            Feed {
                max_staleness,
                since: Instant::now(),
                last_ok: None,
                last_error: None,
                errors: 0,
                version: None,
            },
        );
        self.metrics.feed_started(feed, max_staleness);
    }

    /// Stops following `feed`: it no longer counts for readiness, and its series leave
    /// `/metrics`. Unknown feeds are ignored.
    pub fn unfollow_feed(&self, feed: &str) {
        if self.write_feeds().remove(feed).is_some() {
            self.metrics.feed_stopped(feed);
        }
    }

    /// Records a successful sync of `feed` now, and the `version` it applied (`None` keeps the
    /// last). Returns false when `feed` is not followed (nothing is recorded).
    pub fn feed_synced(&self, feed: &str, version: Option<u64>) -> bool {
        let mut feeds = self.write_feeds();
        let Some(f) = feeds.get_mut(feed) else {
            return false;
        };
        f.last_ok = Some((Instant::now(), now_ms()));
        if version.is_some() {
            f.version = version;
        }
        true
    }

    /// Records a failure of `feed` (a request or a change it could not apply): counted in
    /// `svc_pdp_feed_errors_total` and shown, cut to [`MAX_FEED_ERROR`] bytes, on `/readyz`.
    /// Returns false when `feed` is not followed (nothing is recorded).
    pub fn feed_failed(&self, feed: &str, error: &str) -> bool {
        let mut feeds = self.write_feeds();
        let Some(f) = feeds.get_mut(feed) else {
            return false;
        };
        f.errors += 1;
        f.last_error = Some((now_ms(), feed_error_text(error)));
        drop(feeds);
        self.metrics.feed_error(feed);
        true
    }

    /// Every followed feed as it is now, by name.
    pub fn feeds(&self) -> Vec<FeedReport> {
        let now = Instant::now();
        self.read_feeds()
            .iter()
            .map(|(name, f)| {
                let age = f.age(now);
                FeedReport {
                    name: name.clone(),
                    age,
                    max_staleness: f.max_staleness,
                    stale: age > f.max_staleness,
                    last_ok_ms: f.last_ok.map(|(_, ms)| ms),
                    last_error: f.last_error.clone(),
                    errors: f.errors,
                    version: f.version,
                }
            })
            .collect()
    }

    /// Brings the feed gauges of `/metrics` up to now (ages, staleness, versions).
    pub fn refresh_feed_metrics(&self) {
        for r in self.feeds() {
            self.metrics.feed_state(&r.name, r.age, r.stale, r.version);
        }
    }

    /// Publishes readiness to gRPC health (`grpc.health.v1`) when it changed since the last
    /// publication: feeds turn stale with time alone, so the control plane calls this after
    /// each feed report (and `/readyz` is always computed on the spot).
    pub async fn publish_health(&self) {
        let ready = self.ready();
        if self.serving.swap(ready, Ordering::AcqRel) != ready {
            self.set_health(ready).await;
        }
    }

    async fn set_health(&self, ready: bool) {
        let status = if ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        self.health.set_service_status(SERVICE_NAME, status).await;
        self.health.set_service_status("", status).await;
    }

    /// Whether the control plane has loaded the principals snapshot (set at start unless
    /// [`Config::await_principals`]).
    pub fn principals_loaded(&self) -> bool {
        self.principals_loaded.load(Ordering::Acquire)
    }

    /// Installs (`Some`) or removes (`None`) the fetcher of missing resources
    /// ([`Fetcher`]); checks in flight keep the one they started with.
    pub fn set_resource_source(&self, fetcher: Option<Arc<Fetcher>>) {
        let on = fetcher.is_some();
        self.resources.store(fetcher);
        self.has_resources.store(on, Ordering::Release);
    }

    /// The installed fetcher of missing resources, if any.
    pub fn resource_source(&self) -> Option<Arc<Fetcher>> {
        if self.has_resources.load(Ordering::Acquire) {
            self.resources.load_full()
        } else {
            None
        }
    }

    /// Before checks are decided: fetches what they name and the engine lacks, when a source is
    /// installed ([`Fetcher::ensure`]; `resources`, `work_items`: every check's).
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
    /// (`grpc.health.v1`) follows: SERVING when all three are set and no feed is stale, else
    /// NOT_SERVING.
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
        let ready = self.ready();
        self.serving.store(ready, Ordering::Release);
        self.set_health(ready).await;
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

#[cfg(test)]
mod tests {
    use super::{feed_error_text, MAX_FEED_ERROR};

    #[test]
    fn feed_errors_are_cut_at_a_character_boundary() {
        assert_eq!(feed_error_text("HTTP 500"), "HTTP 500");
        let long = "é".repeat(MAX_FEED_ERROR);
        let cut = feed_error_text(&long);
        assert!(cut.ends_with("..."));
        assert!(cut.len() <= MAX_FEED_ERROR + 3);
        assert!(cut.trim_end_matches("...").chars().all(|c| c == 'é'));
    }
}
