//! Prometheus metrics of the decision point (`GET /metrics`, docs/api.md; every component serves
//! them: docs/architecture.md#what-every-component-serves). Label sets are small and fixed, so
//! every series used on the request path is resolved
//! once at start and then only incremented (one atomic add; no label lookup per request).

use crate::decision_log::LogStats;
use pdp_core::{Mode, Verdict};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::time::Duration;

/// How a request reached the decision point (the `transport` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `POST /v1/access/evaluation` and `/v1/access/plan`.
    Http,
    /// `svc.authz.v1.Authorizer`.
    Grpc,
    /// `POST /access/v1/evaluation(s)`.
    Authzen,
}

impl Transport {
    const ALL: [Transport; 3] = [Self::Http, Self::Grpc, Self::Authzen];

    fn index(self) -> usize {
        match self {
            Self::Http => 0,
            Self::Grpc => 1,
            Self::Authzen => 2,
        }
    }

    /// The label value: `http`, `grpc` or `authzen`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
            Self::Authzen => "authzen",
        }
    }
}

/// How a call to a source the control plane installs ended: the `outcome` label of
/// `svc_pdp_challenge_calls_total` (the challenge service, `crate::challenges`) and of
/// `svc_pdp_resource_fetches_total` (resource fetches, `crate::resources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The source answered in time.
    Ok,
    /// The source answered an error.
    Failed,
    /// The source did not answer within the timeout.
    Timeout,
}

impl CallOutcome {
    const ALL: [CallOutcome; 3] = [Self::Ok, Self::Failed, Self::Timeout];

    /// The label value: `ok`, `failed` or `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Timeout => "timeout",
        }
    }
}

const VERDICTS: [Verdict; 3] = [Verdict::Allow, Verdict::Challenge, Verdict::Deny];
const MODES: [Mode; 2] = [Mode::Enforce, Mode::Monitor];

fn verdict_index(v: Verdict) -> usize {
    match v {
        Verdict::Allow => 0,
        Verdict::Challenge => 1,
        Verdict::Deny => 2,
    }
}

fn mode_index(m: Mode) -> usize {
    match m {
        Mode::Enforce => 0,
        Mode::Monitor => 1,
    }
}

/// Latency buckets in seconds: 10 us to 100 ms, for a call whose target is well under 1 ms.
const LATENCY_BUCKETS: [f64; 14] = [
    10e-6, 25e-6, 50e-6, 75e-6, 100e-6, 150e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
    100e-3,
];

/// Buckets of one search page, in seconds: 50 us to 2.5 s (a page of the largest limit that
/// checks candidates one by one over a large store takes seconds; docs/benchmarks.md).
const SEARCH_BUCKETS: [f64; 14] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0,
    2.5,
];

/// Buckets of the decision log's group commits and of durable answers' waits, in seconds:
/// 50 us to 1 s (a commit window is at most 1 s, docs/history.md).
const LOG_BUCKETS: [f64; 14] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
    1.0,
];

/// Every metric of the decision point, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// `svc_pdp_decisions_total{transport,verdict,mode}`, indexed [transport][verdict][mode].
    decisions: Vec<IntCounter>,
    /// `svc_pdp_decision_duration_seconds{transport}` (engine time of one check).
    decision_latency: Vec<Histogram>,
    plans: IntCounterVec,
    plan_latency: Histogram,
    /// `svc_pdp_searches_total{kind,method}`: AuthZEN search pages answered (docs/search.md).
    searches: IntCounterVec,
    /// `svc_pdp_search_results_total{kind}`: results on those pages.
    search_results: IntCounterVec,
    /// `svc_pdp_search_duration_seconds{kind}`: engine time of one search page.
    search_latency: HistogramVec,
    plan_cache_hits: IntCounter,
    plan_cache_misses: IntCounter,
    plans_cached: IntGauge,
    rejected: IntCounterVec,
    bundle_reloads: IntCounterVec,
    bundle_error: IntGauge,
    policy_version: IntGauge,
    principals_version: IntGauge,
    ready: IntGauge,
    challenge_unavailable: IntCounter,
    /// `svc_pdp_challenge_calls_total{outcome}`: calls of the challenge service (`Resolve`,
    /// `GetChallenge`), indexed as [`CallOutcome`].
    challenge_calls: Vec<IntCounter>,
    /// `svc_pdp_challenge_waits`: challenge waits in progress.
    challenge_waits: IntGauge,
    /// `svc_pdp_resource_fetches_total{outcome}`: fetches of missing resources
    /// (`crate::resources`), indexed as [`CallOutcome`].
    resource_fetches: Vec<IntCounter>,
    /// `svc_pdp_record_errors_total`: decision records that did not serialise (not written).
    record_errors: IntCounter,
    log_records: IntCounterVec,
    log_queued: IntGauge,
    log_spool_pending: IntGauge,
    log_spool_bytes: IntGauge,
    log_window: Gauge,
    log_durable: IntGauge,
    /// `svc_pdp_decision_log_commit_duration_seconds`: write (and fsync) time of one group
    /// commit, observed by the log's writer thread.
    pub log_commit: Histogram,
    /// `svc_pdp_decision_log_wait_seconds`: how long a durable answer waited for its record.
    pub log_wait: Histogram,
    /// `svc_pdp_feed_age_seconds{feed}`: time since each followed feed's last successful sync.
    feed_age: GaugeVec,
    /// `svc_pdp_feed_max_staleness_seconds{feed}`: each feed's staleness bound.
    feed_max_staleness: GaugeVec,
    /// `svc_pdp_feed_stale{feed}`: 1 while the feed is past its bound.
    feed_stale: IntGaugeVec,
    /// `svc_pdp_feed_version{feed}`: the version each feed last applied.
    feed_version: IntGaugeVec,
    /// `svc_pdp_feed_errors_total{feed}`: failures of each feed.
    feed_errors: IntCounterVec,
}

fn counter_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(c.clone()));
    c
}

fn gauge(reg: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(g.clone()));
    g
}

fn gauge_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(g.clone()));
    g
}

fn int_gauge_vec(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(g.clone()));
    g
}

fn histogram(reg: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(h.clone()));
    h
}

fn counter(reg: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(name, &e));
    let _ = reg.register(Box::new(c.clone()));
    c
}

/// Metric names and help texts are constants checked by the tests; a failure here is a bug in
/// this file, reported loudly rather than serving without metrics.
#[allow(clippy::panic)]
fn unreachable_metric(name: &str, e: &prometheus::Error) -> ! {
    panic!("metric `{name}` is malformed: {e}")
}

impl Metrics {
    /// Registers every metric; series on the request path are resolved here once.
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions_vec = counter_vec(
            &registry,
            "svc_pdp_decisions_total",
            "Decisions made, by transport, verdict and mode (monitor: the verdict that would have applied).",
            &["transport", "verdict", "mode"],
        );
        let mut decisions = Vec::new();
        for t in Transport::ALL {
            for v in VERDICTS {
                for m in MODES {
                    decisions.push(decisions_vec.with_label_values(&[
                        t.as_str(),
                        v.as_str(),
                        m.as_str(),
                    ]));
                }
            }
        }
        let lat_vec = HistogramVec::new(
            HistogramOpts::new(
                "svc_pdp_decision_duration_seconds",
                "Time the engine spent on one check, by transport.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["transport"],
        )
        .unwrap_or_else(|e| unreachable_metric("svc_pdp_decision_duration_seconds", &e));
        let _ = registry.register(Box::new(lat_vec.clone()));
        let decision_latency = Transport::ALL
            .iter()
            .map(|t| lat_vec.with_label_values(&[t.as_str()]))
            .collect();
        let plan_latency = Histogram::with_opts(
            HistogramOpts::new(
                "svc_pdp_plan_duration_seconds",
                "Time the engine spent on one query plan.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .unwrap_or_else(|e| unreachable_metric("svc_pdp_plan_duration_seconds", &e));
        let _ = registry.register(Box::new(plan_latency.clone()));
        let search_latency = HistogramVec::new(
            HistogramOpts::new(
                "svc_pdp_search_duration_seconds",
                "Time the engine spent on one AuthZEN search page, by kind (subject, resource, action).",
            )
            .buckets(SEARCH_BUCKETS.to_vec()),
            &["kind"],
        )
        .unwrap_or_else(|e| unreachable_metric("svc_pdp_search_duration_seconds", &e));
        let _ = registry.register(Box::new(search_latency.clone()));
        let fetches_vec = counter_vec(
            &registry,
            "svc_pdp_resource_fetches_total",
            "Fetches of resources and work items a check named and the engine lacked, by outcome (ok, failed, timeout: the check was decided without them).",
            &["outcome"],
        );
        let resource_fetches = CallOutcome::ALL
            .iter()
            .map(|o| fetches_vec.with_label_values(&[o.as_str()]))
            .collect();
        let calls_vec = counter_vec(
            &registry,
            "svc_pdp_challenge_calls_total",
            "Calls of the challenge service (Resolve on a challenge verdict, GetChallenge on a wait for a challenge not held yet), by outcome (ok, failed, timeout: the verdict stays challenge without a challenge_qid, or the wait answers 503).",
            &["outcome"],
        );
        let challenge_calls = CallOutcome::ALL
            .iter()
            .map(|o| calls_vec.with_label_values(&[o.as_str()]))
            .collect();
        let challenge_waits = gauge(
            &registry,
            "svc_pdp_challenge_waits",
            "Challenge waits in progress (WaitForChallenge, POST /v1/access/challenge).",
        );
        Self {
            resource_fetches,
            challenge_calls,
            challenge_waits,
            decisions,
            decision_latency,
            plans: counter_vec(
                &registry,
                "svc_pdp_plans_total",
                "Query plans made, by transport and outcome.",
                &["transport", "outcome"],
            ),
            plan_latency,
            searches: counter_vec(
                &registry,
                "svc_pdp_searches_total",
                "AuthZEN search pages answered, by kind (subject, resource, action) and method (plan: the query plan's filter over stored rows; checks: one check per candidate).",
                &["kind", "method"],
            ),
            search_results: counter_vec(
                &registry,
                "svc_pdp_search_results_total",
                "Results on the AuthZEN search pages answered, by kind.",
                &["kind"],
            ),
            search_latency,
            plan_cache_hits: counter(
                &registry,
                "svc_pdp_plan_cache_hits_total",
                "Plan requests answered with a pinned plan from the plan cache (paging).",
            ),
            plan_cache_misses: counter(
                &registry,
                "svc_pdp_plan_cache_misses_total",
                "Plan requests that built a new plan.",
            ),
            plans_cached: gauge(
                &registry,
                "svc_pdp_plans_cached",
                "Plans held in the plan cache for paging.",
            ),
            rejected: counter_vec(
                &registry,
                "svc_pdp_requests_rejected_total",
                "Requests refused before a decision, by HTTP status (gRPC maps to the same).",
                &["status"],
            ),
            bundle_reloads: counter_vec(
                &registry,
                "svc_pdp_bundle_reloads_total",
                "Bundle reloads, by result (ok, error).",
                &["result"],
            ),
            bundle_error: gauge(
                &registry,
                "svc_pdp_bundle_error",
                "1 while the last bundle reload failed (the previous bundle keeps serving).",
            ),
            policy_version: gauge(
                &registry,
                "svc_pdp_policy_version",
                "Version of the policy bundle in force.",
            ),
            principals_version: gauge(
                &registry,
                "svc_pdp_principals_version",
                "Version of the principals snapshot in force.",
            ),
            ready: gauge(
                &registry,
                "svc_pdp_ready",
                "1 once a bundle, the containment list and the principals are loaded, while no followed feed is stale.",
            ),
            challenge_unavailable: counter(
                &registry,
                "svc_pdp_challenge_unavailable_total",
                "Challenge waits refused because no challenge service is connected.",
            ),
            record_errors: counter(
                &registry,
                "svc_pdp_record_errors_total",
                "Decision records that could not be serialised, and so were not written.",
            ),
            log_records: counter_vec(
                &registry,
                "svc_pdp_decision_log_records_total",
                "Decision-log records by state: pushed (made), spooled (written to the spool, the write-ahead log), sent (acknowledged by the broker), replayed (of sent, written by an earlier run), dropped (spool full or unwritable; never silently).",
                &["state"],
            ),
            log_queued: gauge(
                &registry,
                "svc_pdp_decision_log_queued",
                "Decision-log records in memory waiting for their group commit: what a kill of the process would lose now.",
            ),
            log_spool_pending: gauge(
                &registry,
                "svc_pdp_decision_log_spool_pending",
                "Decision-log records in the spool not yet acknowledged by the broker.",
            ),
            log_spool_bytes: gauge(
                &registry,
                "svc_pdp_decision_log_spool_pending_bytes",
                "Bytes of the spool not yet acknowledged by the broker.",
            ),
            log_window: {
                let name = "svc_pdp_decision_log_commit_window_seconds";
                let g = Gauge::new(
                    name,
                    "The decision log's group-commit window in force (log_commit_ms; 0 in durable mode): a kill loses at most the records of the last one.",
                )
                .unwrap_or_else(|e| unreachable_metric(name, &e));
                let _ = registry.register(Box::new(g.clone()));
                g
            },
            log_durable: gauge(
                &registry,
                "svc_pdp_decision_log_durable",
                "1 when decisions are answered only once their record is written (log_durability=durable).",
            ),
            log_commit: histogram(
                &registry,
                "svc_pdp_decision_log_commit_duration_seconds",
                "Time one group commit of the decision log took to write (and fsync, with log_fsync).",
                &LOG_BUCKETS,
            ),
            log_wait: histogram(
                &registry,
                "svc_pdp_decision_log_wait_seconds",
                "How long a decision's answer waited for its record's group commit (durable mode only).",
                &LOG_BUCKETS,
            ),
            feed_age: gauge_vec(
                &registry,
                "svc_pdp_feed_age_seconds",
                "Seconds since each followed feed's last successful sync (since it started, when it never synced); past svc_pdp_feed_max_staleness_seconds the decision point is not ready.",
                &["feed"],
            ),
            feed_max_staleness: gauge_vec(
                &registry,
                "svc_pdp_feed_max_staleness_seconds",
                "Each followed feed's staleness bound (feed_max_staleness_secs).",
                &["feed"],
            ),
            feed_stale: int_gauge_vec(
                &registry,
                "svc_pdp_feed_stale",
                "1 while a followed feed has had no successful sync within its bound (the decision point is then not ready; the last good state keeps serving).",
                &["feed"],
            ),
            feed_version: int_gauge_vec(
                &registry,
                "svc_pdp_feed_version",
                "The version (cursor) each followed feed last applied.",
                &["feed"],
            ),
            feed_errors: counter_vec(
                &registry,
                "svc_pdp_feed_errors_total",
                "Failures of each followed feed: requests that failed and changes that could not be applied.",
                &["feed"],
            ),
            registry,
        }
    }

    /// Publishes a feed started with bound `max_staleness` (its errors start at 0).
    pub fn feed_started(&self, feed: &str, max_staleness: Duration) {
        self.feed_stopped(feed);
        self.feed_max_staleness
            .with_label_values(&[feed])
            .set(max_staleness.as_secs_f64());
        self.feed_errors.with_label_values(&[feed]);
        self.feed_age.with_label_values(&[feed]).set(0.0);
        self.feed_stale.with_label_values(&[feed]).set(0);
    }

    /// Removes a feed's series (it is no longer followed).
    pub fn feed_stopped(&self, feed: &str) {
        let _ = self.feed_age.remove_label_values(&[feed]);
        let _ = self.feed_max_staleness.remove_label_values(&[feed]);
        let _ = self.feed_stale.remove_label_values(&[feed]);
        let _ = self.feed_version.remove_label_values(&[feed]);
        let _ = self.feed_errors.remove_label_values(&[feed]);
    }

    /// Counts one failure of `feed`.
    pub fn feed_error(&self, feed: &str) {
        self.feed_errors.with_label_values(&[feed]).inc();
    }

    /// Sets a feed's gauges: its age, whether it is stale, and its last applied version.
    pub fn feed_state(&self, feed: &str, age: Duration, stale: bool, version: Option<u64>) {
        self.feed_age
            .with_label_values(&[feed])
            .set(age.as_secs_f64());
        self.feed_stale
            .with_label_values(&[feed])
            .set(i64::from(stale));
        if let Some(v) = version {
            self.feed_version
                .with_label_values(&[feed])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }

    /// Publishes the decision log's settings: its commit window and whether it is durable.
    pub fn log_settings(&self, window: Duration, durable: bool) {
        self.log_window.set(window.as_secs_f64());
        self.log_durable.set(i64::from(durable));
    }

    /// Brings the decision-log series up to `s` (counters only move forward).
    fn log_stats(&self, s: &LogStats) {
        for (state, v) in [
            ("pushed", s.pushed),
            ("sent", s.sent),
            ("spooled", s.spooled),
            ("replayed", s.replayed),
            ("dropped", s.dropped),
        ] {
            let c = self.log_records.with_label_values(&[state]);
            let delta = v.saturating_sub(c.get());
            if delta > 0 {
                c.inc_by(delta);
            }
        }
        let g = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        self.log_queued.set(g(s.queued_now));
        self.log_spool_pending.set(g(s.spool_pending));
        self.log_spool_bytes.set(g(s.spool_pending_bytes));
    }

    /// Counts one decision and its engine time (`latency_us`, microseconds).
    pub fn decision(&self, t: Transport, verdict: Verdict, mode: Mode, latency_us: u64) {
        let i = t.index() * 6 + verdict_index(verdict) * 2 + mode_index(mode);
        if let Some(c) = self.decisions.get(i) {
            c.inc();
        }
        if let Some(h) = self.decision_latency.get(t.index()) {
            h.observe(micros(latency_us));
        }
    }

    /// Counts one plan: its outcome, whether it came from the cache, and its engine time.
    pub fn plan(&self, t: Transport, outcome: &str, pinned: bool, latency_us: u64) {
        self.plans.with_label_values(&[t.as_str(), outcome]).inc();
        if pinned {
            self.plan_cache_hits.inc();
        } else {
            self.plan_cache_misses.inc();
        }
        self.plan_latency.observe(micros(latency_us));
    }

    /// Counts one AuthZEN search page (docs/search.md): its kind and method, its number of
    /// results, and its engine time (`latency_us`, microseconds).
    pub fn search(&self, kind: &str, method: &str, results: usize, latency_us: u64) {
        self.searches.with_label_values(&[kind, method]).inc();
        self.search_results
            .with_label_values(&[kind])
            .inc_by(u64::try_from(results).unwrap_or(u64::MAX));
        self.search_latency
            .with_label_values(&[kind])
            .observe(micros(latency_us));
    }

    /// Counts a request refused with HTTP status `status` (or its gRPC equivalent).
    pub fn rejected(&self, status: u16) {
        self.rejected
            .with_label_values(&[status.to_string().as_str()])
            .inc();
    }

    /// Counts a challenge wait refused for want of a challenge service.
    pub fn challenge_unavailable(&self) {
        self.challenge_unavailable.inc();
    }

    /// Counts one call of the challenge service by its outcome.
    pub fn challenge_call(&self, outcome: CallOutcome) {
        let i = match outcome {
            CallOutcome::Ok => 0,
            CallOutcome::Failed => 1,
            CallOutcome::Timeout => 2,
        };
        if let Some(c) = self.challenge_calls.get(i) {
            c.inc();
        }
    }

    /// Counts a challenge wait in progress until the returned guard is dropped.
    pub fn challenge_wait_started(&self) -> WaitGuard {
        self.challenge_waits.inc();
        WaitGuard(self.challenge_waits.clone())
    }

    /// Counts one fetch of missing resources by its outcome.
    pub fn resource_fetch(&self, outcome: CallOutcome) {
        let i = match outcome {
            CallOutcome::Ok => 0,
            CallOutcome::Failed => 1,
            CallOutcome::Timeout => 2,
        };
        if let Some(c) = self.resource_fetches.get(i) {
            c.inc();
        }
    }

    /// Counts a decision record that could not be serialised (and was not written).
    pub fn record_error(&self) {
        self.record_errors.inc();
    }

    /// Records the result of a bundle reload.
    pub fn bundle_reload(&self, ok: bool) {
        self.bundle_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        self.bundle_error.set(i64::from(!ok));
    }

    /// The text exposition of every metric, after refreshing the gauges read from the engine
    /// and the decision log.
    pub fn render(
        &self,
        policy_version: u64,
        principals_version: u64,
        plans: usize,
        ready: bool,
        log: Option<LogStats>,
    ) -> String {
        if let Some(s) = &log {
            self.log_stats(s);
        }
        self.policy_version
            .set(i64::try_from(policy_version).unwrap_or(i64::MAX));
        self.principals_version
            .set(i64::try_from(principals_version).unwrap_or(i64::MAX));
        self.plans_cached
            .set(i64::try_from(plans).unwrap_or(i64::MAX));
        self.ready.set(i64::from(ready));
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// A challenge wait counted in `svc_pdp_challenge_waits` until dropped.
pub struct WaitGuard(IntGauge);

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[allow(clippy::cast_precision_loss)]
fn micros(us: u64) -> f64 {
    us as f64 / 1e6
}
