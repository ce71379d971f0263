//! The AuthZEN searches from Python (`Engine.search_subjects`, `search_resources`,
//! `search_actions`; docs/search.md): the request as a dict in AuthZEN's shape, the answer as
//! the dict `POST /access/v1/search/<kind>` returns.

use crate::{request_err, to_json, to_py};
use pdp_core::search::{SearchError, SearchKind, STALE_MESSAGE};
use pdp_core::{Engine as CoreEngine, RequestError as CoreRequestError};
use pyo3::prelude::*;

/// Runs one search of `kind` with the GIL released; returns the AuthZEN response as a dict.
///
/// # Errors
/// `RequestError` with `field` naming the AuthZEN field (`page.token` when the token was
/// issued on policies or entities that have changed since: start again without it).
pub(crate) fn search<'py>(
    py: Python<'py>,
    engine: &CoreEngine,
    kind: SearchKind,
    request: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let v = to_json(request, 0)?;
    let page = py
        .detach(|| engine.search_json(kind, &v))
        .map_err(|e| match e {
            SearchError::Request(e) => request_err(py, &e),
            SearchError::Stale => request_err(
                py,
                &CoreRequestError::new(
                    "page.token",
                    STALE_MESSAGE.trim_start_matches("page.token: "),
                ),
            ),
        })?;
    to_py(py, &page.to_response())
}
