//! The decision engine: one bundle plus one entity store, swapped atomically, and `decide`.
//!
//! One file per job: `state` (the state, its caches and versions, [`Engine`] itself),
//! `writes` (bundle and store writes), `check` (checks), `plan` (query plans) and `slice` (the
//! entities a check or plan reads), `search` (the AuthZEN searches, docs/search.md).
//!
//! Check semantics (docs/decisions.md, docs/architecture.md#verdicts-challenges-and-mode):
//!
//! 1. A contained principal, or a `ServiceAccount` that is not registered, is denied before any
//!    policy runs (`svc:contained`, `svc:unregistered`).
//! 2. Verdict of one principal from the satisfied policies: a plain `forbid` -> `deny`; else a
//!    `@challenge` forbid (with some permit satisfied) or only `@challenge` permits -> `challenge`
//!    with the union of their kinds; else a plain `permit` -> `allow`; else `deny`.
//! 3. `human_present = false` turns a challenge that needs `verification` into `deny`.
//! 4. An agent acting for a person: both are checked, deny > challenge > allow, every challenge
//!    that fires is required.
//! 5. The mode is reported, never applied.

mod check;
mod plan;
mod search;
mod slice;
mod state;
mod writes;

pub use crate::decision::{
    rfc3339_ms, uid_key, Decision, Mode, Outcome, PlanOutcome, QueryPlan, Verdict,
};
pub use crate::request::INJECTED_CONTEXT;
pub use check::{REASON_CONTAINED, REASON_HUMAN_NOT_PRESENT, REASON_UNREGISTERED};
pub use state::{Engine, Prefetcher, Versions};
