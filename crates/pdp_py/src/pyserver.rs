//! `svc._pdp_core.Server`: starts and stops the decision point's listener (see
//! [`pdp_server`]) from Python, and takes the control plane's readiness and reload signals.
//! Every method that waits releases the GIL; requests never take it.

use pdp_core::EntityUid;
use pdp_server::auth::{AuthConfig, Authenticator};
use pdp_server::challenges::{
    Ask, ChallengeSource, Challenges, Found, GetFuture, ResolveFuture, State, Status,
};
use pdp_server::resources::{FetchFuture, Fetcher, LoadFuture, Missing, ResourceSource};
use pdp_server::{Config, Running};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One followed feed as a Python dict ([`Server::feeds`]).
pub struct FeedView(pdp_server::shared::FeedReport);

impl<'py> IntoPyObject<'py> for FeedView {
    type Target = pyo3::types::PyDict;
    type Output = Bound<'py, Self::Target>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        let f = self.0;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("feed", f.name)?;
        d.set_item("age_secs", f.age.as_secs_f64())?;
        d.set_item("max_staleness_secs", f.max_staleness.as_secs_f64())?;
        d.set_item("stale", f.stale)?;
        d.set_item("last_success_ms", f.last_ok_ms)?;
        d.set_item("last_error", f.last_error.map(|(_, e)| e))?;
        d.set_item("errors", f.errors)?;
        d.set_item("version", f.version)?;
        Ok(d)
    }
}

/// The decision point's gRPC + HTTP listener over one engine (see `svc.pdp.server`).
#[pyclass(frozen, module = "svc._pdp_core")]
pub struct Server {
    engine: Arc<pdp_core::Engine>,
    log: Option<Arc<pdp_server::decision_log::DecisionLog>>,
    config: Config,
    running: Mutex<Option<Running>>,
}

impl Server {
    /// Publishes readiness to gRPC health when it changed (feeds turn stale with time).
    fn publish(&self, py: Python<'_>, shared: &Arc<pdp_server::Shared>) -> PyResult<()> {
        py.detach(|| {
            self.with_running(|r| r.block_on(shared.publish_health()))
                .map(|_| ())
        })
    }

    fn with_running<T>(&self, f: impl FnOnce(&Running) -> T) -> PyResult<T> {
        let guard = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard
            .as_ref()
            .map(f)
            .ok_or_else(|| PyRuntimeError::new_err("the server is not running; call start() first"))
    }
}

#[pymethods]
impl Server {
    #[new]
    #[pyo3(signature = (engine, host="127.0.0.1", port=8080, max_body_bytes=1_048_576, workers=0, public_url=None, version=None, noop_routes=false, decision_log=None, pdp_name=None, max_batch_items=1_000, auth_issuer=None, auth_audience="svc-pdp", auth_callers=Vec::new(), auth_leeway_secs=30, auth_cache_entries=10_000, auth_cache_ttl_secs=60, await_principals=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &crate::Engine,
        host: &str,
        port: u16,
        max_body_bytes: usize,
        workers: usize,
        public_url: Option<String>,
        version: Option<String>,
        noop_routes: bool,
        decision_log: Option<&crate::pylog::DecisionLog>,
        pdp_name: Option<String>,
        max_batch_items: usize,
        auth_issuer: Option<String>,
        auth_audience: &str,
        auth_callers: Vec<String>,
        auth_leeway_secs: u64,
        auth_cache_entries: usize,
        auth_cache_ttl_secs: u64,
        await_principals: bool,
    ) -> PyResult<Self> {
        let auth = match auth_issuer {
            None => None,
            Some(issuer) => {
                if issuer.is_empty() || auth_audience.is_empty() {
                    return Err(PyValueError::new_err(
                        "auth_issuer and auth_audience must not be empty",
                    ));
                }
                if auth_callers.is_empty() {
                    return Err(PyValueError::new_err(
                        "auth_callers is empty: every request would be refused; list the callers' `sub` values (docs/auth.md)",
                    ));
                }
                Some(Arc::new(Authenticator::new(AuthConfig {
                    issuer,
                    audience: auth_audience.to_owned(),
                    callers: auth_callers.into_iter().collect(),
                    leeway_secs: auth_leeway_secs,
                    cache_entries: auth_cache_entries,
                    cache_ttl_secs: auth_cache_ttl_secs,
                })))
            }
        };
        Ok(Self {
            engine: engine.shared(),
            log: decision_log.map(|l| l.inner.clone()),
            config: Config {
                host: host.to_owned(),
                port,
                max_body_bytes,
                workers,
                public_url,
                version: version.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
                noop_routes,
                pdp_name: pdp_name.unwrap_or_else(|| "svc-pdp".to_owned()),
                max_batch_items,
                auth,
                await_principals,
            },
            running: Mutex::new(None),
        })
    }

    /// Loads the issuer's keys (a JWK Set document as JSON text, RFC 7517 section 5) for
    /// bearer-token checks, replacing the previous ones and dropping every cached verification.
    /// Works before and after `start()`. Returns how many RS256/ES256 keys were taken; raises
    /// `ValueError` naming the problem when the text is not a JWK Set or holds no usable key
    /// (the keys in force stay), `RuntimeError` when the server was made without `auth_issuer`.
    fn set_jwks(&self, jwks: &str) -> PyResult<usize> {
        let auth = self.config.auth.as_ref().ok_or_else(|| {
            PyRuntimeError::new_err("this server checks no tokens (made without auth_issuer)")
        })?;
        auth.set_jwks(jwks).map_err(PyValueError::new_err)
    }

    /// Whether every route but the probes needs a bearer token (made with `auth_issuer`).
    #[getter]
    fn auth_enabled(&self) -> bool {
        self.config.auth.is_some()
    }

    /// Binds and starts serving; returns the bound port. Raises `OSError` when the address
    /// cannot be bound (port taken), `RuntimeError` when already running.
    fn start(&self, py: Python<'_>) -> PyResult<u16> {
        let mut guard = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.is_some() {
            return Err(PyRuntimeError::new_err("the server is already running"));
        }
        let engine = self.engine.clone();
        let config = self.config.clone();
        let log = self.log.clone();
        let running = py
            .detach(|| pdp_server::start(engine, config, log))
            .map_err(|e| {
                PyOSError::new_err((
                    e.raw_os_error().unwrap_or(0),
                    format!(
                        "cannot serve on {}:{}: {e}",
                        self.config.host, self.config.port
                    ),
                ))
            })?;
        let port = running.local_addr.port();
        *guard = Some(running);
        Ok(port)
    }

    /// Stops accepting, lets requests in flight finish (up to `grace_secs`), and stops.
    #[pyo3(signature = (grace_secs=5.0))]
    fn stop(&self, py: Python<'_>, grace_secs: f64) {
        let taken = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut r) = taken {
            let grace = Duration::from_secs_f64(grace_secs.clamp(0.0, 600.0));
            py.detach(move || r.stop(grace));
        }
    }

    /// The bound port, or `None` when not running.
    #[getter]
    fn port(&self) -> Option<u16> {
        self.with_running(|r| r.local_addr.port()).ok()
    }

    /// Whether the server is running.
    #[getter]
    fn running(&self) -> bool {
        self.port().is_some()
    }

    /// Sets the readiness flags (`/readyz`, gRPC health: ready when all three are set);
    /// `None` leaves a flag unchanged. `principals` starts set unless the server was made with
    /// `await_principals=True` (docs/context.md).
    #[pyo3(signature = (bundle=None, containments=None, principals=None))]
    fn set_ready(
        &self,
        py: Python<'_>,
        bundle: Option<bool>,
        containments: Option<bool>,
        principals: Option<bool>,
    ) -> PyResult<()> {
        let shared = self.with_running(|r| r.shared.clone())?;
        py.detach(|| {
            self.with_running(|r| r.block_on(shared.set_ready(bundle, containments, principals)))
                .map(|_| ())
        })
    }

    /// Installs `fetch` as the source of resources and work items a check names and the engine
    /// lacks (docs/context.md#the-decision-point-following-it), or removes it (`None`).
    ///
    /// `fetch(resources, work_items)` takes the missing resources as `(type, id)` pairs and the
    /// missing work items' ids, writes what it finds into the engine, and returns the
    /// `(resources, work_items)` it does not know, which are not asked for again until
    /// `forget_absent` names them (at most `max_absent` remembered, least recently asked
    /// dropped first). It is called from a worker thread with the GIL, once for the misses of
    /// one request; a call that raises or takes longer than `timeout_ms` lets the checks be
    /// decided without what it fetches (`svc_pdp_resource_fetches_total{outcome}`).
    ///
    /// `load_type(type)`, when given, reads every resource of the type into the engine and
    /// keeps the type whole, returning once it is (at once when it already is); an AuthZEN
    /// resource search calls it first (docs/search.md) and answers 503 when it raises or takes
    /// longer than `load_timeout_ms`. Without it, resource search sees what the engine holds.
    /// Raises `RuntimeError` when the server is not running.
    #[pyo3(signature = (fetch, timeout_ms=200, max_absent=100_000, load_type=None, load_timeout_ms=30_000))]
    fn set_resource_source(
        &self,
        fetch: Option<Py<PyAny>>,
        timeout_ms: u64,
        max_absent: usize,
        load_type: Option<Py<PyAny>>,
        load_timeout_ms: u64,
    ) -> PyResult<()> {
        let fetcher = fetch.map(|f| {
            Arc::new(
                Fetcher::new(
                    Arc::new(PySource {
                        fetch: Arc::new(f),
                        load_type: load_type.map(Arc::new),
                    }),
                    Duration::from_millis(timeout_ms),
                    max_absent,
                )
                .with_load_timeout(Duration::from_millis(load_timeout_ms)),
            )
        });
        self.with_running(|r| r.shared.set_resource_source(fetcher))
    }

    /// Forgets that these resources (`(type, id)` pairs) and work items are absent: the change
    /// feed named them. Returns nothing; a pair that is not an entity reference is skipped.
    /// No effect without a resource source; raises `RuntimeError` when the server is not
    /// running.
    #[pyo3(signature = (resources, work_items=Vec::new()))]
    fn forget_absent(
        &self,
        resources: Vec<(String, String)>,
        work_items: Vec<String>,
    ) -> PyResult<()> {
        let Some(f) = self.with_running(|r| r.shared.resource_source())? else {
            return Ok(());
        };
        f.forget(&uids(&resources), &work_items);
        Ok(())
    }

    /// Installs `source` as the challenge service (docs/challenges.md#the-decision-point), or
    /// removes it (`None`: challenge verdicts carry no `challenge_qid`, waits answer 503).
    ///
    /// `source` has three methods, each called from a worker thread with the GIL:
    ///
    /// * `resolve(principal, on_behalf_of, action, resource, challenges, decision_qid)`: on a
    ///   `challenge` verdict in enforce mode; entity references are `(type, id)` pairs
    ///   (`on_behalf_of` may be `None`), `challenges` the sorted kinds. Returns the challenge
    ///   as `(qid, state, expires_at_ms, grant_expires_at_ms, pending)`: `state` one of
    ///   `pending`, `passed`, `rejected`, `expired`; times in epoch milliseconds or `None`;
    ///   `pending` the kinds not answered yet.
    /// * `get(qid, principal, on_behalf_of)`: on a wait for a challenge this listener does not
    ///   hold yet; the same tuple, or `None` when the service does not know it for them.
    /// * `follow(qid, principal, on_behalf_of)`: once per pending challenge, when its first
    ///   wait starts; must return at once and push the challenge's changes with
    ///   `challenge_changed` until it is final.
    ///
    /// A call that raises or takes longer than `timeout_ms` leaves the verdict `challenge`
    /// without a qid (or answers the wait 503), counted in
    /// `svc_pdp_challenge_calls_total{outcome}`. At most `max_entries` challenges are held
    /// (least recently used dropped first). A wait whose principal or on_behalf_of the
    /// engine holds contained answers `rejected` at once; call `containments_changed` after
    /// changing the engine's containment list so held waits see it. Raises `RuntimeError`
    /// when the server is not running.
    #[pyo3(signature = (source, timeout_ms=2_000, max_entries=100_000))]
    fn set_challenge_source(
        &self,
        source: Option<Py<PyAny>>,
        timeout_ms: u64,
        max_entries: usize,
    ) -> PyResult<()> {
        let challenges = source.map(|s| {
            Arc::new(
                Challenges::new(
                    Arc::new(PyChallenges(Arc::new(s))),
                    Duration::from_millis(timeout_ms),
                    max_entries,
                )
                .with_containments(self.engine.clone()),
            )
        });
        self.with_running(|r| r.shared.set_challenge_source(challenges))
    }

    /// Pushes a change of challenge `qid` (from the challenge service's watch): wakes its
    /// waits at once. `state` is `pending`, `passed`, `rejected` or `expired`; times are
    /// epoch milliseconds; `pending` the kinds not answered yet. Returns whether the listener
    /// holds that challenge (changes of others are ignored). Raises `ValueError` for an
    /// unknown state, `RuntimeError` when the server is not running or has no challenge
    /// source.
    #[pyo3(signature = (qid, state, expires_at_ms=None, grant_expires_at_ms=None, pending=Vec::new()))]
    fn challenge_changed(
        &self,
        qid: &str,
        state: &str,
        expires_at_ms: Option<u64>,
        grant_expires_at_ms: Option<u64>,
        pending: Vec<String>,
    ) -> PyResult<bool> {
        let state = parse_state(state).map_err(PyValueError::new_err)?;
        let c = self
            .with_running(|r| r.shared.challenge_source())?
            .ok_or_else(|| PyRuntimeError::new_err("no challenge source is installed"))?;
        Ok(c.changed(
            qid,
            Status {
                state,
                expires_at_ms,
                grant_expires_at_ms,
                pending,
            },
        ))
    }

    /// Tells the listener that the engine's containment list changed (`Engine.contain`,
    /// `lift`, `set_containments`): every held challenge wait looks again, and the waits of a
    /// principal (or on_behalf_of) now contained answer `rejected` at once
    /// (docs/challenges.md#containment-during-a-wait). Returns how many held challenges
    /// belong to a contained principal or on_behalf_of now (0 without a challenge source).
    /// Raises `RuntimeError` when the server is not running.
    fn containments_changed(&self) -> PyResult<usize> {
        self.with_running(|r| {
            r.shared
                .challenge_source()
                .map_or(0, |c| c.containments_changed())
        })
    }

    /// How many challenges the listener holds (0 without a challenge source).
    #[getter]
    fn challenges_held(&self) -> usize {
        self.with_running(|r| r.shared.challenge_source().map_or(0, |c| c.len()))
            .unwrap_or(0)
    }

    /// Records a bundle reload: `error=None` for success, else the text shown on `/readyz`.
    #[pyo3(signature = (error=None))]
    fn bundle_reloaded(&self, error: Option<String>) -> PyResult<()> {
        self.with_running(|r| r.shared.bundle_reloaded(error))
    }

    /// Starts following `feed` (docs/api.md, "Readiness and feeds"): `/readyz` answers 503
    /// naming it once it has had no successful sync (`feed_synced`) for longer than
    /// `max_staleness_secs` (counted from this call while it never synced). Calling it again
    /// restarts the feed. Raises `ValueError` for an empty name or a bound that is not a
    /// finite positive number, `RuntimeError` when the server is not running.
    fn follow_feed(&self, py: Python<'_>, feed: &str, max_staleness_secs: f64) -> PyResult<()> {
        if feed.is_empty() || feed.len() > 64 {
            return Err(PyValueError::new_err("a feed name is 1 to 64 bytes"));
        }
        let bound = Duration::try_from_secs_f64(max_staleness_secs)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "max_staleness_secs must be a finite number above 0, not {max_staleness_secs}"
                ))
            })?;
        let shared = self.with_running(|r| r.shared.clone())?;
        shared.follow_feed(feed, bound);
        self.publish(py, &shared)
    }

    /// Stops following `feed` (it no longer counts for readiness; its series leave
    /// `/metrics`). Unknown names are ignored. Raises `RuntimeError` when not running.
    fn unfollow_feed(&self, py: Python<'_>, feed: &str) -> PyResult<()> {
        let shared = self.with_running(|r| r.shared.clone())?;
        shared.unfollow_feed(feed);
        self.publish(py, &shared)
    }

    /// Records a successful sync of `feed` now and the `version` it applied (`None` keeps the
    /// last). Returns False when `feed` is not followed. Raises `RuntimeError` when not
    /// running.
    #[pyo3(signature = (feed, version=None))]
    fn feed_synced(&self, py: Python<'_>, feed: &str, version: Option<u64>) -> PyResult<bool> {
        let shared = self.with_running(|r| r.shared.clone())?;
        let known = shared.feed_synced(feed, version);
        self.publish(py, &shared)?;
        Ok(known)
    }

    /// Records a failure of `feed` (`error`: what failed, cut to 300 bytes on `/readyz`),
    /// counted in `svc_pdp_feed_errors_total`. Returns False when `feed` is not followed.
    /// Raises `RuntimeError` when not running.
    fn feed_failed(&self, py: Python<'_>, feed: &str, error: &str) -> PyResult<bool> {
        let shared = self.with_running(|r| r.shared.clone())?;
        let known = shared.feed_failed(feed, error);
        self.publish(py, &shared)?;
        Ok(known)
    }

    /// The followed feeds as `/readyz` sees them now: one dict per feed, by name, with
    /// `feed`, `age_secs`, `max_staleness_secs`, `stale`, `last_success_ms`, `last_error`,
    /// `errors` and `version`. Empty when not running.
    #[getter]
    fn feeds(&self) -> Vec<FeedView> {
        self.with_running(|r| r.shared.feeds())
            .unwrap_or_default()
            .into_iter()
            .map(FeedView)
            .collect()
    }

    /// Whether `/readyz` would answer ready.
    #[getter]
    fn ready(&self) -> bool {
        self.with_running(|r| r.shared.ready()).unwrap_or(false)
    }

    fn __repr__(&self) -> String {
        match self.port() {
            Some(p) => format!("Server(http://{}:{p}, running)", self.config.host),
            None => format!("Server({}:{}, stopped)", self.config.host, self.config.port),
        }
    }
}

/// Python callables as a [`ResourceSource`] (see `Server.set_resource_source`).
struct PySource {
    fetch: Arc<Py<PyAny>>,
    load_type: Option<Arc<Py<PyAny>>>,
}

impl ResourceSource for PySource {
    fn load_type(&self, resource_type: &str) -> LoadFuture {
        let Some(f) = self.load_type.clone() else {
            let why = format!("no source lists the resources of `{resource_type}`");
            return Box::pin(async move { Err(why) });
        };
        let ty = resource_type.to_owned();
        let task = tokio::task::spawn_blocking(move || {
            Python::attach(|py| f.call1(py, (ty,)).map(drop).map_err(|e| e.to_string()))
        });
        Box::pin(async move { task.await.map_err(|e| e.to_string())? })
    }

    fn fetch(&self, missing: Missing) -> FetchFuture {
        let f = self.fetch.clone();
        let task = tokio::task::spawn_blocking(move || {
            let resources: Vec<(String, String)> = missing.resources.iter().map(parts).collect();
            Python::attach(|py| -> Result<Missing, String> {
                let answer = f
                    .call1(py, (resources, missing.work_items))
                    .map_err(|e| e.to_string())?;
                let (res, items): (Vec<(String, String)>, Vec<String>) = answer
                    .extract(py)
                    .map_err(|e: PyErr| format!("fetch returned {e}"))?;
                Ok(Missing {
                    resources: uids(&res),
                    work_items: items,
                })
            })
        });
        Box::pin(async move { task.await.map_err(|e| e.to_string())? })
    }
}

/// A state's name as a [`State`].
fn parse_state(s: &str) -> Result<State, String> {
    State::parse(s).ok_or_else(|| {
        format!("unknown challenge state `{s}`: expected pending, passed, rejected or expired")
    })
}

/// A challenge as Python answers it: `(qid, state, expires_at_ms, grant_expires_at_ms,
/// pending)`.
type PyChallenge = (String, String, Option<u64>, Option<u64>, Vec<String>);

fn found(c: PyChallenge) -> Result<Found, String> {
    let (qid, state, expires_at_ms, grant_expires_at_ms, pending) = c;
    Ok(Found {
        qid,
        status: Status {
            state: parse_state(&state)?,
            expires_at_ms,
            grant_expires_at_ms,
            pending,
        },
    })
}

/// A Python object with `resolve`, `get` and `follow` as a [`ChallengeSource`] (see
/// `Server.set_challenge_source`).
struct PyChallenges(Arc<Py<PyAny>>);

impl ChallengeSource for PyChallenges {
    fn resolve(&self, ask: Ask) -> ResolveFuture {
        let src = self.0.clone();
        let task = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> Result<Found, String> {
                let answer = src
                    .call_method1(
                        py,
                        "resolve",
                        (
                            parts(&ask.principal),
                            ask.on_behalf_of.as_ref().map(parts),
                            ask.action,
                            parts(&ask.resource),
                            ask.challenges,
                            ask.decision_qid,
                        ),
                    )
                    .map_err(|e| e.to_string())?;
                let c: PyChallenge = answer
                    .extract(py)
                    .map_err(|e: PyErr| format!("resolve returned {e}"))?;
                found(c)
            })
        });
        Box::pin(async move { task.await.map_err(|e| e.to_string())? })
    }

    fn get(&self, qid: String, principal: EntityUid, on_behalf_of: Option<EntityUid>) -> GetFuture {
        let src = self.0.clone();
        let task = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> Result<Option<Found>, String> {
                let answer = src
                    .call_method1(
                        py,
                        "get",
                        (qid, parts(&principal), on_behalf_of.as_ref().map(parts)),
                    )
                    .map_err(|e| e.to_string())?;
                let c: Option<PyChallenge> = answer
                    .extract(py)
                    .map_err(|e: PyErr| format!("get returned {e}"))?;
                c.map(found).transpose()
            })
        });
        Box::pin(async move { task.await.map_err(|e| e.to_string())? })
    }

    fn follow(&self, qid: String, principal: EntityUid, on_behalf_of: Option<EntityUid>) {
        let src = self.0.clone();
        drop(tokio::task::spawn_blocking(move || {
            Python::attach(|py| {
                let args = (
                    qid.clone(),
                    parts(&principal),
                    on_behalf_of.as_ref().map(parts),
                );
                if let Err(e) = src.call_method1(py, "follow", args) {
                    pdp_server::logline::warn(
                        "challenge-follow",
                        format_args!("following challenge {qid} failed: {e}"),
                    );
                }
            });
        }));
    }
}

/// A uid as `(type, id)`, the id unescaped.
fn parts(u: &EntityUid) -> (String, String) {
    (u.type_name().to_string(), u.id().unescaped().to_owned())
}

/// `(type, id)` pairs as uids; a pair that is not a valid reference is skipped.
fn uids(pairs: &[(String, String)]) -> Vec<EntityUid> {
    pairs
        .iter()
        .filter_map(|(t, i)| pdp_core::request::uid_from_parts(t, i, "resource").ok())
        .collect()
}

impl Drop for Server {
    fn drop(&mut self) {
        let taken = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut r) = taken {
            r.stop(Duration::from_secs(1));
        }
    }
}
