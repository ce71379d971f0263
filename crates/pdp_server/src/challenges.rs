//! Challenges resolved and waited for (docs/challenges.md#the-decision-point;
//! docs/architecture.md#challenge-resolution): a `challenge` verdict asks a
//! [`ChallengeSource`] (the challenge service's `Resolve`) for the challenge of the request's
//! fingerprint and answers its `challenge_qid`; `WaitForChallenge` and
//! `POST /v1/access/challenge` wait for that challenge's answer.
//!
//! [`Challenges`] holds what the listener knows of each challenge it resolved or was asked
//! about: who it belongs to (principal and on_behalf_of of its check) and its last
//! [`Status`], in a `tokio::sync::watch` channel. A wait is a future subscribed to that
//! channel: thousands of waits cost a few hundred bytes each and no thread. The control plane
//! pushes every change it learns from the challenge service into the channel
//! ([`Challenges::changed`]), which wakes the waits of that challenge at once.
//!
//! * **Resolve** ([`Challenges::resolve`]): a `challenge` verdict in enforce mode calls the
//!   source with the fingerprint's fields and the decision's qid, within a deadline. A
//!   challenge `PASSED` (grant live) turns the verdict into `allow` and appends
//!   [`REASON_CHALLENGE_PASSED`] to `policies`; `REJECTED` (before `expires_at`) turns it
//!   into `deny` with [`REASON_CHALLENGE_REJECTED`]; `PENDING` leaves `challenge`. A source
//!   that fails or does not answer in time leaves the verdict `challenge` without a qid,
//!   counted in `svc_pdp_challenge_calls_total{outcome}`. In monitor mode nothing is
//!   resolved (nobody is asked to answer for a request that goes through anyway).
//! * **Wait** ([`Challenges::wait`]): a qid this listener holds is answered from its channel;
//!   one it does not hold yet is asked for once ([`ChallengeSource::get`], the service's
//!   `GetChallenge`, which answers `NOT_FOUND` for anyone but the principal and on_behalf_of of
//!   its check). A wait naming another principal or on_behalf_of than the challenge's gets
//!   [`WaitError::NotFound`], as an unknown qid does. The first wait of a pending challenge asks
//!   the source to follow it ([`ChallengeSource::follow`]); a pending challenge past
//!   `expires_at` is `EXPIRED` without anyone saying so.
//! * **Containment** ([`Challenges::containments_changed`]): with the engine installed
//!   ([`Challenges::with_containments`]), a wait whose principal or on_behalf_of is contained
//!   in the engine answers [`State::Rejected`] at once (`retry` false: the retry is denied
//!   `svc:contained` before any policy runs), whether it was held when the containment came or
//!   started after it. The control plane calls `containments_changed` after every change to
//!   the engine's containment list, which wakes every held wait to look again. The challenge
//!   itself is left as the service has it: once the principal is lifted, waits answer the
//!   service's state again (docs/challenges.md#containment-during-a-wait).
//! * **Bounds**: at most `max_entries` challenges are held (least recently used dropped first;
//!   a wait on a dropped one ends with the state it last saw); at most
//!   [`MAX_CONCURRENT_CALLS`] source calls run at once.

use crate::clock::now_ms;
use crate::metrics::{CallOutcome, Metrics};
use pdp_core::{Decision, Engine, EntityUid, Mode, Verdict};
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Appended to `policies` when a passed challenge turned the verdict into `allow`.
pub const REASON_CHALLENGE_PASSED: &str = "svc:challenge_passed";
/// Appended to `policies` when a rejected challenge turned the verdict into `deny`.
pub const REASON_CHALLENGE_REJECTED: &str = "svc:challenge_rejected";

/// Most source calls (`Resolve`, `GetChallenge`) running at once; for `pdp_py` each holds a
/// thread of Tokio's blocking pool.
pub const MAX_CONCURRENT_CALLS: usize = 32;

/// A challenge's state (docs/challenges.md#states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Waiting for its answers until `expires_at`.
    Pending,
    /// Every kind answered: the fingerprint is allowed until `grant_expires_at`.
    Passed,
    /// Rejected: the fingerprint is denied until `expires_at`.
    Rejected,
    /// Not answered before `expires_at`.
    Expired,
}

impl State {
    /// Parses `pending`, `passed`, `rejected`, `expired` (lowercase); `None` otherwise.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "passed" => Some(Self::Passed),
            "rejected" => Some(Self::Rejected),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }

    /// The wire name: `pending`, `passed`, `rejected` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Passed => "passed",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    /// Whether no later change is expected (anything but pending).
    pub fn is_final(self) -> bool {
        self != Self::Pending
    }
}

/// What is known of a challenge now. Times are epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The state as the challenge service last said.
    pub state: State,
    /// When a pending challenge expires (and until when a rejected one denies).
    pub expires_at_ms: Option<u64>,
    /// Until when a passed challenge allows its request.
    pub grant_expires_at_ms: Option<u64>,
    /// The kinds not answered yet (empty when unknown).
    pub pending: Vec<String>,
}

impl Status {
    /// The state at `now_ms`: a pending challenge past `expires_at` is [`State::Expired`]
    /// (the service reads expiry the same way, docs/challenges.md#states).
    pub fn effective(&self, now_ms: u64) -> State {
        match (self.state, self.expires_at_ms) {
            (State::Pending, Some(e)) if now_ms >= e => State::Expired,
            (s, _) => s,
        }
    }

    /// Whether retrying the check now gets another answer: passed with a live grant (the
    /// retry is allowed) or expired (the retry opens a new challenge).
    pub fn retry(&self, now_ms: u64) -> bool {
        match self.effective(now_ms) {
            State::Passed => self.grant_expires_at_ms.is_none_or(|g| now_ms < g),
            State::Expired => true,
            State::Pending | State::Rejected => false,
        }
    }
}

/// A challenge as the source answers it: its qid and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The challenge's qid (UUIDv7).
    pub qid: String,
    /// Its status.
    pub status: Status,
}

/// What `Resolve` is asked: the request's fingerprint fields and the decision's qid
/// (docs/challenges.md#fingerprint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The principal.
    pub principal: EntityUid,
    /// The person it acts for, if any.
    pub on_behalf_of: Option<EntityUid>,
    /// The action's id (`delete`).
    pub action: String,
    /// The resource.
    pub resource: EntityUid,
    /// The challenge kinds of the verdict, sorted.
    pub challenges: Vec<String>,
    /// The decision's qid.
    pub decision_qid: String,
}

/// The future of [`ChallengeSource::resolve`]: the challenge, or why the call failed.
pub type ResolveFuture = Pin<Box<dyn Future<Output = Result<Found, String>> + Send + 'static>>;

/// The future of [`ChallengeSource::get`]: the challenge, `None` when the service does not
/// know it for that principal and on_behalf_of (`NOT_FOUND`), or why the call failed.
pub type GetFuture = Pin<Box<dyn Future<Output = Result<Option<Found>, String>> + Send + 'static>>;

/// The challenge service as the listener sees it (installed by the control plane;
/// `svc.pdp.challenge_client` in Python).
pub trait ChallengeSource: Send + Sync {
    /// Opens or finds the challenge of `ask`'s fingerprint (`ChallengeService.Resolve`).
    /// Runs detached from the check: a check past its deadline does not cancel it.
    fn resolve(&self, ask: Ask) -> ResolveFuture;

    /// One challenge, for the principal and on_behalf_of of its check
    /// (`ChallengeService.GetChallenge`).
    fn get(&self, qid: String, principal: EntityUid, on_behalf_of: Option<EntityUid>) -> GetFuture;

    /// Asks the control plane to push this pending challenge's changes
    /// ([`Challenges::changed`]) until it is final: called once per challenge, when its first
    /// wait starts. Must not block.
    fn follow(&self, qid: String, principal: EntityUid, on_behalf_of: Option<EntityUid>);
}

/// The principal and on_behalf_of a challenge belongs to.
type Owner = (EntityUid, Option<EntityUid>);

struct Entry {
    owner: Owner,
    tx: watch::Sender<Status>,
    followed: bool,
}

/// Why a wait has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// No such challenge for this principal and on_behalf_of (or none at all).
    NotFound,
    /// The challenge service did not answer (the text says why).
    Unavailable(String),
}

/// A [`ChallengeSource`] with the challenges this listener knows, their waits, a deadline on
/// calls and a bound on calls at once (module docs).
pub struct Challenges {
    source: Arc<dyn ChallengeSource>,
    timeout: Duration,
    entries: Mutex<lru::LruCache<String, Entry, foldhash::fast::RandomState>>,
    permits: Arc<Semaphore>,
    /// The engine whose containment list ends waits; `None`: containment ends no wait.
    engine: Option<Arc<Engine>>,
    /// Moves on every [`Challenges::containments_changed`]: wakes every held wait.
    containments: watch::Sender<u64>,
}

impl Challenges {
    /// Challenges over `source`: a call not answered within `timeout` is given up; at most
    /// `max_entries` challenges (at least 1) are held.
    pub fn new(source: Arc<dyn ChallengeSource>, timeout: Duration, max_entries: usize) -> Self {
        let cap = NonZeroUsize::new(max_entries).unwrap_or(NonZeroUsize::MIN);
        Self {
            source,
            timeout,
            entries: Mutex::new(lru::LruCache::with_hasher(
                cap,
                foldhash::fast::RandomState::default(),
            )),
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_CALLS)),
            engine: None,
            containments: watch::Sender::new(0),
        }
    }

    /// These challenges with `engine`'s containment list ending waits (module docs): a wait
    /// whose principal or on_behalf_of `engine` holds contained answers [`State::Rejected`].
    /// Returns the challenges; call [`Challenges::containments_changed`] after each change
    /// to that list.
    #[must_use]
    pub fn with_containments(mut self, engine: Arc<Engine>) -> Self {
        self.engine = Some(engine);
        self
    }

    /// Whether `owner`'s principal or on_behalf_of is contained in the installed engine
    /// (false without one).
    fn contained(&self, owner: &Owner) -> bool {
        self.engine.as_ref().is_some_and(|e| {
            let store = e.store();
            store.is_contained(&owner.0) || owner.1.as_ref().is_some_and(|o| store.is_contained(o))
        })
    }

    /// The engine's containment list changed: wakes every held wait, so that the waits of a
    /// principal now contained answer [`State::Rejected`] at once (module docs). Returns how
    /// many held challenges belong to a contained principal or on_behalf_of now (0 without
    /// an engine installed).
    pub fn containments_changed(&self) -> usize {
        self.containments.send_modify(|g| *g = g.wrapping_add(1));
        let Some(engine) = &self.engine else {
            return 0;
        };
        let store = engine.store();
        self.entries()
            .iter()
            .filter(|(_, e)| {
                store.is_contained(&e.owner.0)
                    || e.owner.1.as_ref().is_some_and(|o| store.is_contained(o))
            })
            .count()
    }

    fn entries(
        &self,
    ) -> std::sync::MutexGuard<'_, lru::LruCache<String, Entry, foldhash::fast::RandomState>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many challenges are held.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether no challenge is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs a source call in a task of its own (not cancelled when the caller stops
    /// waiting), holding one of the [`MAX_CONCURRENT_CALLS`] permits, within the timeout.
    async fn call<T: Send + 'static>(
        &self,
        fut: Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'static>>,
    ) -> Result<T, (CallOutcome, String)> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let permits = self.permits.clone();
        let task = tokio::spawn(async move {
            let permit = tokio::time::timeout_at(deadline, permits.acquire_owned()).await;
            let _permit = permit.ok()?.ok()?;
            Some(fut.await)
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Some(Ok(v)))) => Ok(v),
            Ok(Ok(Some(Err(e)))) => Err((CallOutcome::Failed, e)),
            Ok(Err(e)) => Err((CallOutcome::Failed, e.to_string())),
            Ok(Ok(None)) | Err(_) => Err((
                CallOutcome::Timeout,
                format!(
                    "the challenge service did not answer within {} ms",
                    self.timeout.as_millis()
                ),
            )),
        }
    }

    /// Records `status` for `qid`, owned by `owner`; answers a receiver of its channel.
    fn record(&self, qid: &str, owner: Owner, status: Status) -> watch::Receiver<Status> {
        let mut entries = self.entries();
        if let Some(e) = entries.get_mut(qid) {
            if e.owner == owner {
                e.tx.send_replace(status);
                return e.tx.subscribe();
            }
        }
        let (tx, rx) = watch::channel(status);
        entries.put(
            qid.to_owned(),
            Entry {
                owner,
                tx,
                followed: false,
            },
        );
        rx
    }

    /// A change of challenge `qid` pushed by the control plane: wakes its waits. Returns
    /// whether the listener holds that challenge (changes of others are ignored).
    pub fn changed(&self, qid: &str, status: Status) -> bool {
        let entries = self.entries();
        match entries.peek(qid) {
            Some(e) => {
                e.tx.send_replace(status);
                true
            }
            None => false,
        }
    }

    /// Resolves a `challenge` verdict (module docs): calls the source with `d`'s fingerprint,
    /// records the challenge, and turns `d`'s verdict into `allow` (passed) or `deny`
    /// (rejected). Returns the challenge's qid; `None` when `d` is not a `challenge` in
    /// enforce mode, or the source failed or was late (counted in `metrics`).
    pub async fn resolve(&self, d: &mut Decision, metrics: &Metrics) -> Option<String> {
        if d.verdict != Verdict::Challenge || d.mode != Mode::Enforce {
            return None;
        }
        let mut challenges = d.challenges.clone();
        challenges.sort();
        challenges.dedup();
        let ask = Ask {
            principal: d.principal.clone(),
            on_behalf_of: d.on_behalf_of.clone(),
            action: d.action.id().unescaped().to_owned(),
            resource: d.resource.clone(),
            challenges,
            decision_qid: d.qid.clone(),
        };
        let found = match self.call(self.source.resolve(ask)).await {
            Ok(f) => f,
            Err((outcome, e)) => {
                metrics.challenge_call(outcome);
                crate::logline::warn(
                    "challenge-resolve",
                    format_args!("resolving the challenge of decision {} failed: {e}", d.qid),
                );
                return None;
            }
        };
        metrics.challenge_call(CallOutcome::Ok);
        let now = now_ms();
        match found.status.effective(now) {
            State::Passed if found.status.grant_expires_at_ms.is_none_or(|g| now < g) => {
                d.verdict = Verdict::Allow;
                d.challenges.clear();
                d.principal_outcome
                    .policies
                    .push(REASON_CHALLENGE_PASSED.to_owned());
            }
            State::Rejected => {
                d.verdict = Verdict::Deny;
                d.challenges.clear();
                d.principal_outcome
                    .policies
                    .push(REASON_CHALLENGE_REJECTED.to_owned());
            }
            _ => {}
        }
        let owner = (d.principal.clone(), d.on_behalf_of.clone());
        drop(self.record(&found.qid, owner, found.status));
        Some(found.qid)
    }

    /// Waits up to `wait` for challenge `qid`, asked by `principal` (acting for
    /// `on_behalf_of`), to leave `PENDING` (module docs). Returns its status then, with the
    /// effective state (expiry applied); a `wait` of zero only looks.
    ///
    /// # Errors
    /// [`WaitError::NotFound`] for an unknown qid or another principal or on_behalf_of;
    /// [`WaitError::Unavailable`] when the qid had to be asked for and the source failed or
    /// was late.
    pub async fn wait(
        &self,
        qid: &str,
        principal: &EntityUid,
        on_behalf_of: Option<&EntityUid>,
        wait: Duration,
        metrics: &Metrics,
    ) -> Result<Status, WaitError> {
        let deadline = tokio::time::Instant::now() + wait;
        let owner: Owner = (principal.clone(), on_behalf_of.cloned());
        let known = {
            let mut entries = self.entries();
            match entries.get_mut(qid) {
                Some(e) if e.owner != owner => return Err(WaitError::NotFound),
                Some(e) => {
                    let first = !e.followed;
                    e.followed = true;
                    Some((e.tx.subscribe(), first))
                }
                None => None,
            }
        };
        let (mut rx, first) = match known {
            Some(k) => k,
            None => {
                let get = self
                    .source
                    .get(qid.to_owned(), principal.clone(), on_behalf_of.cloned());
                match self.call(get).await {
                    Ok(Some(found)) if found.qid == qid => {
                        metrics.challenge_call(CallOutcome::Ok);
                        let rx = self.record(qid, owner.clone(), found.status);
                        let first = self.entries().get_mut(qid).is_some_and(|e| {
                            let first = !e.followed;
                            e.followed = true;
                            first
                        });
                        (rx, first)
                    }
                    Ok(_) => {
                        metrics.challenge_call(CallOutcome::Ok);
                        return Err(WaitError::NotFound);
                    }
                    Err((outcome, e)) => {
                        metrics.challenge_call(outcome);
                        return Err(WaitError::Unavailable(e));
                    }
                }
            }
        };
        if first && !rx.borrow().state.is_final() {
            self.source
                .follow(qid.to_owned(), owner.0.clone(), owner.1.clone());
        }
        let _waiting = metrics.challenge_wait_started();
        let mut contained_rx = self.containments.subscribe();
        loop {
            contained_rx.borrow_and_update();
            let status = rx.borrow_and_update().clone();
            if self.contained(&owner) {
                // Contained: the wait ends with a deny (module docs).
                return Ok(Status {
                    state: State::Rejected,
                    grant_expires_at_ms: None,
                    ..status
                });
            }
            let now = now_ms();
            let state = status.effective(now);
            if state.is_final() {
                return Ok(Status { state, ..status });
            }
            // Wake at the wait's end, or at expiry, whichever comes first.
            let until = status.expires_at_ms.map_or(deadline, |e| {
                deadline
                    .min(tokio::time::Instant::now() + Duration::from_millis(e.saturating_sub(now)))
            });
            let woken = tokio::time::timeout_at(until, async {
                tokio::select! {
                    changed = rx.changed() => changed,
                    // A containment change: look again (the sender lives as long as `self`).
                    _ = contained_rx.changed() => Ok(()),
                }
            });
            match woken.await {
                Ok(Ok(())) => {}
                // The entry was dropped (the bound): answer what was last seen.
                Ok(Err(_)) => return Ok(Status { state, ..status }),
                Err(_) => {
                    let state = status.effective(now_ms());
                    if state.is_final() || tokio::time::Instant::now() >= deadline {
                        return Ok(Status { state, ..status });
                    }
                }
            }
        }
    }
}
