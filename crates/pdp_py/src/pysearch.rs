//! The AuthZEN searches from Python (`Engine.search_subjects`, `search_resources`,
//! `search_actions`; docs/search.md): the request as a dict in AuthZEN's shape, the answer as
//! the dict `POST /access/v1/search/<kind>` returns.

use crate::{request_err, to_json, to_py};
use pdp_core::search::{SearchError, SearchKind, SearchPage, SearchResult, STALE_MESSAGE};
use pdp_core::{Engine as CoreEngine, RequestError as CoreRequestError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

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
    response_dict(py, &page)
}

/// `SearchPage::to_response` built into a dict, the results straight from the page (one dict
/// per result, each entity type's name made once), the rest through its JSON.
fn response_dict<'py>(py: Python<'py>, page: &SearchPage) -> PyResult<Bound<'py, PyAny>> {
    let d = PyDict::new(py);
    let results = PyList::empty(py);
    // A result of the last type met and that type's name (results share one type).
    let mut type_name: Option<(&pdp_core::EntityUid, Bound<'py, PyString>)> = None;
    for r in &page.results {
        let item = PyDict::new(py);
        match r {
            SearchResult::Entity(u) => {
                let ty = match &type_name {
                    Some((t, s)) if t.type_name() == u.type_name() => s.clone(),
                    _ => {
                        let s = PyString::new(py, &u.type_name().to_string());
                        type_name = Some((u, s.clone()));
                        s
                    }
                };
                item.set_item(intern!(py, "type"), ty)?;
                item.set_item(intern!(py, "id"), PyString::new(py, u.id().unescaped()))?;
            }
            SearchResult::Action(n) => item.set_item(intern!(py, "name"), PyString::new(py, n))?,
        }
        results.append(item)?;
    }
    d.set_item(intern!(py, "results"), results)?;
    for (k, v) in page.response_rest() {
        d.set_item(k, to_py(py, &v)?)?;
    }
    Ok(d.into_any())
}
