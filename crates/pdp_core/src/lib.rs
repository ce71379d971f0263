//! `pdp_core`: the decision core of svc, in pure Rust on the `cedar-policy` crate.
//!
//! * [`bundle`]: policy bundles (policies, schema, entities, template links), validated strictly.
//! * [`store`]: the in-memory entity store (principals, resources, work items, containments,
//!   registrations, risk scores), swapped atomically.
//! * [`request`]: the check and plan requests (docs/decisions.md#request).
//! * [`decision`]: the decision model ([`Decision`], [`QueryPlan`], [`Verdict`], [`Mode`]) and
//!   the serialisable views responses and decision-log records are written from.
//! * [`engine`]: [`Engine::decide`], the check semantics of docs/decisions.md, and
//!   [`Engine::plan`], the query plans of docs/plans.md; the engine's state holds each
//!   bundle's memos beside it.
//! * [`limits`]: bounds on inline entities and on hierarchy depth, process-wide settings.
//! * [`residual_filter`]: partial-evaluation residuals to filter trees; [`plan_outcome`]: what
//!   they mean together (outcomes, challenges, agent and person), and the plan cache.
//! * [`outline`]: what each policy of a Cedar file is and reads (the portal's explanations).
//! * [`search`]: the AuthZEN 1.0 searches (subject, resource, action) and their page tokens
//!   (docs/search.md).
//!
//! The crate knows nothing of Python or of the network; `crates/pdp_server` serves it over gRPC
//! and HTTP, and `crates/pdp_py` wraps it as `svc._pdp_core`.

pub mod bundle;
mod condition;
pub mod decision;
pub mod engine;
pub mod error;
mod intern;
pub mod limits;
mod lookups;
mod maps;
mod memo;
pub mod outline;
pub mod plan_outcome;
pub mod request;
pub mod residual_filter;
mod scope;
pub mod search;
pub mod store;

pub use bundle::{Bundle, BundleSources, PolicyMeta, TemplateLink, CHALLENGE_KINDS};
pub use cedar_policy::EntityUid;
pub use decision::{Decision, Mode, Outcome, PlanOutcome, QueryPlan, Verdict};
pub use engine::{Engine, Prefetcher, Versions};
pub use error::{BundleError, RequestError, SourceError};
pub use request::{CheckRequest, PlanRequest};
pub use residual_filter::{Cmp, Filter, PlanError, Residual};
pub use search::{SearchError, SearchKind, SearchPage, SearchRequest};
pub use store::{Prefetch, Store, StoredEntity, WorkItem};
