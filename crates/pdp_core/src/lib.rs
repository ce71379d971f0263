//! `pdp_core`: the decision core of svc, in pure Rust on the `cedar-policy` crate.
//!
//! * [`bundle`]: policy bundles (policies, schema, entities, template links), validated strictly.
//! * [`store`]: the in-memory entity store (principals, resources, work items, containments,
//!   registrations, risk scores), swapped atomically.
//! * [`request`]: the check request of SPEC 2.4.
//! * [`engine`]: [`Engine::decide`], the check semantics of SPEC 2.4 and DESIGN 3-4.
//! * [`plan`]: query plans, Cedar residuals turned into row filters (SPEC 2.6, DESIGN 5).
//!
//! The crate knows nothing of Python; `crates/pdp_py` wraps it as `svc._pdp_core`.

pub mod bundle;
pub mod engine;
pub mod error;
pub mod plan;
pub mod request;
pub mod store;

pub use bundle::{Bundle, BundleSources, PolicyMeta, TemplateLink, CHALLENGE_KINDS};
pub use engine::{Decision, Engine, Mode, Outcome, Verdict, Versions};
pub use error::{BundleError, RequestError, SourceError};
pub use plan::{Cmp, Filter, PlanError, Residual};
pub use request::CheckRequest;
pub use store::{Store, StoredEntity, WorkItem};
