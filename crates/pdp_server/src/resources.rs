//! Resources fetched on a miss (docs/context.md#the-decision-point-following-it): a check
//! whose resource (or work item) the engine does not hold asks a [`ResourceSource`] for it
//! before it is decided, so a decision point following the context service holds only the
//! resources it was asked about, not all of them.
//!
//! [`Fetcher`] wraps a source with what keeps it cheap and bounded:
//!
//! * **one fetch per request**: the misses of one request (an AuthZEN batch's included) go to
//!   the source together;
//! * **one fetch per id at a time**: a check whose id is being fetched by another request waits
//!   for that fetch instead of starting its own;
//! * **absent ids remembered**: an id the source does not know is kept in a bounded set
//!   (least recently asked dropped first) and not fetched again until [`Fetcher::forget`]
//!   names it (the change feed wrote it), so a flood of checks on unknown ids makes no flood
//!   of fetches;
//! * **a deadline**: a fetch that fails or takes longer than the timeout lets the check be
//!   decided without the resource (as if no source were configured), counted in
//!   `svc_pdp_resource_fetches_total{outcome}`. A late answer still lands in the engine for the
//!   next check: the source's task is not cancelled;
//! * **a bound on fetches at once** ([`MAX_CONCURRENT_FETCHES`]): a request that finds them
//!   all busy waits for one within its deadline, then is decided without (a `timeout`), so a
//!   flood of distinct unknown ids cannot pile up blocked tasks behind a slow source.
//!
//! The listener holds no fetcher unless the control plane installs one
//! ([`crate::shared::Shared::set_resource_source`]); without one, a check reads one atomic flag more
//! and nothing else changes.

use crate::metrics::{CallOutcome, Metrics};
use pdp_core::{Engine, EntityUid};
use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// What a check lacks: resources by uid, work items by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Missing {
    /// Resources neither the store nor the bundle holds.
    pub resources: Vec<EntityUid>,
    /// Work items the store does not hold.
    pub work_items: Vec<String>,
}

impl Missing {
    /// Whether nothing is missing.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.work_items.is_empty()
    }
}

/// What a source answered: of what was asked, what it does not know (or could not store).
/// What it found it has written into the engine before answering.
pub type Absent = Missing;

/// The future a [`ResourceSource`] answers with: the ids it does not know, or why it failed.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Absent, String>> + Send + 'static>>;

/// Where resources and work items missing from the engine come from (the context service's
/// reads by id, `POST /v1/resources/get` and `/v1/work-items/get`, docs/context.md).
pub trait ResourceSource: Send + Sync {
    /// Fetches `missing` and writes what it finds into the engine (upserts), then answers
    /// what it did not find. Runs detached from the request: a check that stops waiting (the
    /// deadline) does not cancel it. Errors are a text for the log and the metric.
    fn fetch(&self, missing: Missing) -> FetchFuture;

    /// Reads every resource of `resource_type` the source holds into the engine, and keeps
    /// the type whole from then on (docs/search.md: a resource search's candidates are all
    /// the resources of its type). Answers once the type is whole (at once when it already
    /// is); an error is a text for the log. By default the source cannot list: an error.
    fn load_type(&self, resource_type: &str) -> LoadFuture {
        let why = format!("this resource source cannot list the resources of `{resource_type}`");
        Box::pin(async move { Err(why) })
    }
}

/// The future [`ResourceSource::load_type`] answers with.
pub type LoadFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'static>>;

/// Why [`Fetcher::load_type`] could not make a type whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The source answered an error (the text).
    #[error("the context service's resources of the type could not be read: {0}")]
    Failed(String),
    /// The source did not answer within the load timeout (it goes on: a later search may
    /// find the type whole).
    #[error("the context service's resources of the type are still being read")]
    Timeout,
}

/// A key of the absent set and of fetches in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Resource(EntityUid),
    WorkItem(String),
}

struct Book {
    /// Ids the source answered unknown, least recently asked first out.
    absent: lru::LruCache<Key, (), foldhash::fast::RandomState>,
    /// Moves on every [`Fetcher::forget`]: a fetch that started before records no absents.
    generation: u64,
    /// Ids being fetched, with the channel their fetch closes when done.
    in_flight: HashMap<Key, watch::Receiver<()>, foldhash::fast::RandomState>,
}

/// Most fetches one [`Fetcher`] runs at once (each holds one of the source's tasks, for
/// `pdp_py` a thread of Tokio's blocking pool waiting for the GIL and the context service).
pub const MAX_CONCURRENT_FETCHES: usize = 32;

/// How long a resource search waits, by default, for its type to be read whole
/// ([`Fetcher::load_type`]).
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`ResourceSource`] with the absent set, single flight, deadline and bound of the module
/// docs.
pub struct Fetcher {
    source: Arc<dyn ResourceSource>,
    timeout: Duration,
    /// How long a search waits for its resource type to be read whole.
    load_timeout: Duration,
    book: Mutex<Book>,
    permits: Arc<tokio::sync::Semaphore>,
}

/// Removes a request's keys from the in-flight map when its fetch ends or its future is
/// dropped (a client gone), and closes their channel (dropping the sender), waking waiters.
struct Flight<'a> {
    fetcher: &'a Fetcher,
    keys: Vec<Key>,
    _done: watch::Sender<()>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut book = self.fetcher.book();
        for k in &self.keys {
            book.in_flight.remove(k);
        }
    }
}

impl Fetcher {
    /// A fetcher over `source`: a fetch not answered within `timeout` is given up;
    /// `max_absent` ids (at least 1) are remembered as absent.
    pub fn new(source: Arc<dyn ResourceSource>, timeout: Duration, max_absent: usize) -> Self {
        let cap = NonZeroUsize::new(max_absent).unwrap_or(NonZeroUsize::MIN);
        Self {
            source,
            timeout,
            load_timeout: DEFAULT_LOAD_TIMEOUT,
            book: Mutex::new(Book {
                absent: lru::LruCache::with_hasher(cap, foldhash::fast::RandomState::default()),
                generation: 0,
                in_flight: HashMap::default(),
            }),
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_FETCHES)),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets how long [`Fetcher::load_type`] waits for a type to be read whole (default
    /// [`DEFAULT_LOAD_TIMEOUT`]).
    #[must_use]
    pub fn with_load_timeout(mut self, timeout: Duration) -> Self {
        self.load_timeout = timeout;
        self
    }

    /// Makes the engine hold every resource of `resource_type` the source holds
    /// ([`ResourceSource::load_type`]), waiting at most the load timeout. The source's load
    /// is not cancelled by a timeout: it goes on, and a later call finds it done.
    ///
    /// # Errors
    /// [`LoadError::Failed`] when the source failed; [`LoadError::Timeout`] when it did not
    /// answer in time.
    pub async fn load_type(&self, resource_type: &str) -> Result<(), LoadError> {
        let task = tokio::spawn(self.source.load_type(resource_type));
        match tokio::time::timeout(self.load_timeout, task).await {
            Err(_) => Err(LoadError::Timeout),
            Ok(Err(e)) => Err(LoadError::Failed(e.to_string())),
            Ok(Ok(Err(e))) => Err(LoadError::Failed(e)),
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }

    /// Forgets that these ids are absent (the change feed named them: they may exist now).
    /// `resources` are uids; work items are ids.
    pub fn forget(&self, resources: &[EntityUid], work_items: &[String]) {
        let mut book = self.book();
        for u in resources {
            book.absent.pop(&Key::Resource(u.clone()));
        }
        for w in work_items {
            book.absent.pop(&Key::WorkItem(w.clone()));
        }
        book.generation += 1;
    }

    /// How many ids are remembered as absent.
    pub fn absent_len(&self) -> usize {
        self.book().absent.len()
    }

    /// Makes sure the engine holds what a request's checks name, as far as the source can
    /// tell within the timeout: `resources` and `work_items` are every check's (repeats are
    /// fine). Asks the engine what it lacks ([`Engine::missing`]), skips ids remembered absent,
    /// waits for ids another request is fetching, and fetches the rest in one call. Never
    /// fails: a failed or late fetch is counted in `metrics` and the checks are decided with
    /// what the engine holds.
    pub async fn ensure(
        &self,
        engine: &Engine,
        metrics: &Metrics,
        resources: &[&EntityUid],
        work_items: &[&str],
    ) {
        let (res, items) = engine.missing(resources, work_items);
        if res.is_empty() && items.is_empty() {
            return;
        }
        let mut wait = Vec::new();
        let mut ask = Missing::default();
        let mut keys = Vec::new();
        let (flight, generation) = {
            let mut book = self.book();
            let all = res
                .into_iter()
                .map(Key::Resource)
                .chain(items.into_iter().map(Key::WorkItem));
            for k in all {
                if book.absent.get(&k).is_some() || keys.contains(&k) {
                    continue;
                }
                if let Some(rx) = book.in_flight.get(&k) {
                    wait.push(rx.clone());
                    continue;
                }
                keys.push(k);
            }
            let flight = if keys.is_empty() {
                None
            } else {
                let (tx, rx) = watch::channel(());
                for k in &keys {
                    book.in_flight.insert(k.clone(), rx.clone());
                    match k {
                        Key::Resource(u) => ask.resources.push(u.clone()),
                        Key::WorkItem(w) => ask.work_items.push(w.clone()),
                    }
                }
                Some(Flight {
                    fetcher: self,
                    keys,
                    _done: tx,
                })
            };
            (flight, book.generation)
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        if let Some(flight) = flight {
            // A task of its own holds the permit until the source answers, even past the
            // deadline: the bound is on fetches running, not on requests waiting.
            let (permits, source) = (self.permits.clone(), self.source.clone());
            let task = tokio::spawn(async move {
                let permit = tokio::time::timeout_at(deadline, permits.acquire_owned()).await;
                // Not within the deadline (or the semaphore closed, which it never is): skip.
                let _permit = permit.ok()?.ok()?;
                Some(source.fetch(ask).await)
            });
            let outcome = match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(None)) | Err(_) => CallOutcome::Timeout,
                Ok(Err(e)) => {
                    crate::logline::warn(
                        "resource-fetch",
                        format_args!("fetching missing resources failed: {e}"),
                    );
                    CallOutcome::Failed
                }
                Ok(Ok(Some(Ok(absent)))) => {
                    let mut book = self.book();
                    // A feed change during the fetch may have written one of these: remember
                    // nothing rather than something stale.
                    if book.generation == generation {
                        for u in absent.resources {
                            book.absent.put(Key::Resource(u), ());
                        }
                        for w in absent.work_items {
                            book.absent.put(Key::WorkItem(w), ());
                        }
                    }
                    CallOutcome::Ok
                }
                Ok(Ok(Some(Err(e)))) => {
                    crate::logline::warn(
                        "resource-fetch",
                        format_args!("fetching missing resources failed: {e}"),
                    );
                    CallOutcome::Failed
                }
            };
            metrics.resource_fetch(outcome);
            drop(flight);
        }
        for mut rx in wait {
            // Ends when the other fetch's flight is dropped (its sender closes).
            let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
        }
    }
}
