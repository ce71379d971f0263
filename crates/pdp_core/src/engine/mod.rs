//! The decision engine: one bundle plus one entity store, swapped atomically, and `decide`.
//!
//! One file per job, each using only the ones listed before it (a test keeps this order,
//! tests/test_crate_layout.py; docs/architecture.md#code-layout-and-conventions):
//!
//! 1. `snapshot`: one snapshot of what the engine decides with (bundle, its caches, store,
//!    closed hierarchy, mode, versions) and the lookups made on it;
//! 2. `slice`: the entities a check or plan reads;
//! 3. `index`: a snapshot's search index (entities by type, columns, prepared plans);
//! 4. `state`: [`Engine`] itself, the snapshot in force swapped atomically, its versions;
//! 5. `writes`: bundle and store writes;
//! 6. `check`: checks, and the contexts checks and plans take;
//! 7. `plan`: query plans (docs/plans.md);
//! 8. `search`: the AuthZEN searches (docs/search.md), on checks and plans.
//!
//! The engine's methods are spread over these files (`impl Engine` in each), and a method
//! calls only the methods of its own file and of the files below it.
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
mod index;
mod plan;
mod search;
mod slice;
mod snapshot;
mod state;
mod writes;

pub use crate::decision::{
    rfc3339_ms, uid_key, Decision, Mode, Outcome, PlanOutcome, QueryPlan, Verdict,
};
pub use crate::request::INJECTED_CONTEXT;
pub use check::{REASON_CONTAINED, REASON_HUMAN_NOT_PRESENT, REASON_UNREGISTERED};
pub use state::{Engine, Prefetcher, Versions};
