//! Query plans as Python objects: the response of `Engine.plan` (docs/plans.md), built straight
//! from [`QueryPlan`] with the keys and order of `QueryPlan::to_response`.
//!
//! A memoised plan shares its filter (`Arc<Filter>`) with the side memo and the plan cache
//! (`pdp_core::plan_outcome`), so one filter is answered many times. Building its dicts, lists
//! and strings anew each time was a large part of a memoised plan (measured with `perf`:
//! `filter_py` and freeing its output about a third of a tinytodo plan, more on
//! github_example, whose filters list every group of the principal; docs/benchmarks.md,
//! "Query plans"). [`FilterTrees`] keeps the Python tree built for each such
//! filter and hands every caller its own copy of the containers: dicts and lists are copied,
//! so a caller that edits its response changes no one else's, while the immutable leaves
//! (str, int, float, bool, None) are shared.

use crate::to_py;
use pdp_core::{Filter, QueryPlan};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Most filter trees a [`FilterTrees`] keeps. Past it, trees of filters no one holds any more
/// are dropped, and if that is not enough, all of them.
const TREES_MAX: usize = 1024;

/// A filter's Python form, as [`FilterTrees::get`] returns it (the caller's own copy).
pub(crate) struct PyFilter<'py> {
    /// The filter tree (`Filter::to_json` as Python objects).
    pub(crate) filter: Bound<'py, PyDict>,
    /// The attribute names the filter uses, sorted (the response's `attributes`).
    pub(crate) attributes: Bound<'py, PyList>,
    /// Whether the filter has `unknown`/`unmappable` nodes.
    pub(crate) needs_row_checks: bool,
}

/// One kept tree. The `Weak` keeps the filter's allocation, so no other filter can take its
/// address (the key) while the entry lives.
struct Tree {
    filter: Weak<Filter>,
    /// The filter tree, with where its containers are.
    shape: Arc<Shape>,
    attributes: Py<PyList>,
    needs_row_checks: bool,
}

/// The Python trees of shared filters, by the address of the filter (see the module docs).
/// Safe to share between threads; each call holds the lock only to look up or insert.
#[derive(Default)]
pub(crate) struct FilterTrees {
    trees: Mutex<HashMap<usize, Tree>>,
}

impl FilterTrees {
    /// The Python form of `f`, a fresh copy of the kept tree when there is one. A tree is
    /// built and kept only for a filter held beyond the plan and its plan-cache entry (more
    /// than two strong references: the side memo has it, so later plans will answer with it
    /// again); other filters are built for this call alone.
    ///
    /// # Errors
    /// Python's, when allocating an object fails.
    pub(crate) fn get<'py>(&self, py: Python<'py>, f: &Arc<Filter>) -> PyResult<PyFilter<'py>> {
        let key = Arc::as_ptr(f) as usize;
        let kept = {
            let g = self
                .trees
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            g.get(&key).map(|t| {
                (
                    Arc::clone(&t.shape),
                    t.attributes.clone_ref(py),
                    t.needs_row_checks,
                )
            })
        };
        // Copied outside the lock: allocating may run Python code (the cyclic GC's finalizers)
        // that plans again.
        if let Some((shape, attributes, needs_row_checks)) = kept {
            return PyFilter::copy(&shape, attributes.bind(py), needs_row_checks);
        }
        let built = PyFilter {
            filter: filter_py(py, f)?,
            attributes: PyList::new(py, f.attributes())?,
            needs_row_checks: f.needs_row_checks(),
        };
        if Arc::strong_count(f) <= 2 {
            return Ok(built);
        }
        // The kept tree is never handed out: this caller too gets a copy.
        let shape = self.keep(f, &built);
        PyFilter::copy(&shape, &built.attributes, built.needs_row_checks)
    }

    /// Keeps `built` as the tree of `f`, first making room when full (see [`TREES_MAX`]).
    /// Returns the kept tree's shape.
    fn keep(&self, f: &Arc<Filter>, built: &PyFilter<'_>) -> Arc<Shape> {
        let shape = Arc::new(Shape::of_dict(&built.filter));
        let tree = Tree {
            filter: Arc::downgrade(f),
            shape: Arc::clone(&shape),
            attributes: built.attributes.clone().unbind(),
            needs_row_checks: built.needs_row_checks,
        };
        let stale = {
            let mut g = self
                .trees
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut stale = Vec::new();
            if g.len() >= TREES_MAX {
                let (live, dead): (HashMap<_, _>, HashMap<_, _>) = std::mem::take(&mut *g)
                    .into_iter()
                    .partition(|(_, t)| t.filter.strong_count() > 0);
                stale.extend(dead.into_values());
                if live.len() >= TREES_MAX {
                    stale.extend(live.into_values());
                } else {
                    *g = live;
                }
            }
            stale.extend(g.insert(Arc::as_ptr(f) as usize, tree));
            stale
        };
        // Freed outside the lock.
        drop(stale);
        shape
    }
}

impl<'py> PyFilter<'py> {
    /// The caller's own copy of a kept filter tree.
    ///
    /// # Errors
    /// Python's, when allocating an object fails.
    fn copy(
        shape: &Shape,
        attributes: &Bound<'py, PyList>,
        needs_row_checks: bool,
    ) -> PyResult<Self> {
        let py = attributes.py();
        // SAFETY: the GIL is held (`py`), and a kept tree is never handed out or changed.
        let filter =
            unsafe { Bound::from_owned_ptr_or_err(py, shape.copy_raw())?.cast_into::<PyDict>()? };
        Ok(Self {
            filter,
            attributes: attributes.get_slice(0, usize::MAX),
            needs_row_checks,
        })
    }
}

/// Where the containers of a kept tree of dicts and lists are, found once when the tree is
/// kept, so that a copy visits only them. Walking every item of every dict on each copy was a
/// fifth of a memoised github_example plan, whose filters hold about 35 dicts and lists.
enum Shape {
    /// A dict, and the containers among its values by key.
    Dict(Py<PyDict>, Vec<(Py<PyAny>, Shape)>),
    /// A list, and the containers among its items by index (ascending).
    List(Py<PyList>, Vec<(ffi::Py_ssize_t, Shape)>),
}

impl Shape {
    /// The shape of a dict (a filter tree, or a dict inside one).
    fn of_dict(d: &Bound<'_, PyDict>) -> Self {
        let inner = d
            .iter()
            .filter_map(|(k, v)| Self::of(&v).map(|s| (k.unbind(), s)))
            .collect();
        Self::Dict(d.clone().unbind(), inner)
    }

    /// The shape of `o`, or `None` when it is not a dict or list (a leaf).
    fn of(o: &Bound<'_, PyAny>) -> Option<Self> {
        if o.is_exact_instance_of::<PyDict>() {
            Some(Self::of_dict(o.cast::<PyDict>().ok()?))
        } else if o.is_exact_instance_of::<PyList>() {
            let l = o.cast::<PyList>().ok()?;
            let inner = l
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let i = ffi::Py_ssize_t::try_from(i).ok()?;
                    Self::of(&v).map(|s| (i, s))
                })
                .collect();
            Some(Self::List(l.clone().unbind(), inner))
        } else {
            None
        }
    }

    /// A copy of the tree through CPython's C API: every dict and list is new, every leaf
    /// (str, int, float, bool, None) is shared.
    ///
    /// # Safety
    /// The GIL is held and no dict or list of the tree changes while this runs (kept trees
    /// are never handed out). Returns a new reference, or null with a Python error set (when
    /// allocating fails).
    unsafe fn copy_raw(&self) -> *mut ffi::PyObject {
        match self {
            Self::Dict(src, inner) => {
                // The copy shares every value; the containers among them are then replaced.
                let c = ffi::PyDict_Copy(src.as_ptr());
                if c.is_null() {
                    return c;
                }
                for (k, sub) in inner {
                    let nv = sub.copy_raw();
                    let failed = nv.is_null() || ffi::PyDict_SetItem(c, k.as_ptr(), nv) < 0;
                    ffi::Py_XDECREF(nv);
                    if failed {
                        ffi::Py_DECREF(c);
                        return std::ptr::null_mut();
                    }
                }
                c
            }
            Self::List(src, inner) => {
                let o = src.as_ptr();
                let n = ffi::PyList_Size(o);
                let c = ffi::PyList_New(n);
                if c.is_null() {
                    return c;
                }
                let mut subs = inner.iter().peekable();
                for i in 0..n {
                    let nv = match subs.next_if(|(j, _)| *j == i) {
                        Some((_, sub)) => sub.copy_raw(),
                        None => {
                            // Borrowed; in range, as the kept list does not change.
                            let v = ffi::PyList_GetItem(o, i);
                            ffi::Py_INCREF(v);
                            v
                        }
                    };
                    if nv.is_null() {
                        // The slots not yet set are null, which freeing the list allows.
                        ffi::Py_DECREF(c);
                        return nv;
                    }
                    // Steals `nv`.
                    ffi::PyList_SetItem(c, i, nv);
                }
                c
            }
        }
    }
}

/// The wire name of a plan outcome, interned.
fn outcome_name(py: Python<'_>, o: pdp_core::PlanOutcome) -> &Bound<'_, PyString> {
    use pdp_core::PlanOutcome;
    match o {
        PlanOutcome::AlwaysAllowed => intern!(py, "always_allowed"),
        PlanOutcome::AlwaysDenied => intern!(py, "always_denied"),
        PlanOutcome::Challenge => intern!(py, "challenge"),
        PlanOutcome::Conditional => intern!(py, "conditional"),
    }
}

/// The wire name of a comparison, interned.
fn cmp_name(py: Python<'_>, cmp: pdp_core::residual_filter::Cmp) -> &Bound<'_, PyString> {
    use pdp_core::residual_filter::Cmp;
    match cmp {
        Cmp::Eq => intern!(py, "eq"),
        Cmp::Ne => intern!(py, "ne"),
        Cmp::Lt => intern!(py, "lt"),
        Cmp::Le => intern!(py, "le"),
        Cmp::Gt => intern!(py, "gt"),
        Cmp::Ge => intern!(py, "ge"),
    }
}

/// `Filter::to_json` built straight into Python objects (same keys, same order).
pub(crate) fn filter_py<'py>(py: Python<'py>, f: &Filter) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let op = intern!(py, "op");
    let attr_list = |a: &[String]| PyList::new(py, a);
    let list = |args: &[Filter]| -> PyResult<Bound<'py, PyList>> {
        let l = PyList::empty(py);
        for a in args {
            l.append(filter_py(py, a)?)?;
        }
        Ok(l)
    };
    // `{"type", "id"}` of an entity, as `Filter::to_json` writes it.
    macro_rules! uid_dict {
        ($u:expr) => {{
            let e = PyDict::new(py);
            e.set_item(intern!(py, "type"), $u.type_name().to_string())?;
            e.set_item(intern!(py, "id"), $u.id().unescaped())?;
            e
        }};
    }
    let values = |vs: &[Value]| -> PyResult<Bound<'py, PyList>> {
        let l = PyList::empty(py);
        for v in vs {
            l.append(to_py(py, v)?)?;
        }
        Ok(l)
    };
    match f {
        Filter::True => d.set_item(op, intern!(py, "true"))?,
        Filter::False => d.set_item(op, intern!(py, "false"))?,
        Filter::And(args) => {
            d.set_item(op, intern!(py, "and"))?;
            d.set_item(intern!(py, "args"), list(args)?)?;
        }
        Filter::Or(args) => {
            d.set_item(op, intern!(py, "or"))?;
            d.set_item(intern!(py, "args"), list(args)?)?;
        }
        Filter::Not(arg) => {
            d.set_item(op, intern!(py, "not"))?;
            d.set_item(intern!(py, "arg"), filter_py(py, arg)?)?;
        }
        Filter::Compare { attr, cmp, value } => {
            d.set_item(op, intern!(py, "compare"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
            d.set_item(intern!(py, "cmp"), cmp_name(py, *cmp))?;
            d.set_item(intern!(py, "value"), to_py(py, value)?)?;
        }
        Filter::Has { attr } => {
            d.set_item(op, intern!(py, "has"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
        }
        Filter::Contains { attr, value } => {
            d.set_item(op, intern!(py, "contains"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
            d.set_item(intern!(py, "value"), to_py(py, value)?)?;
        }
        Filter::ContainsAny { attr, values: vs } => {
            d.set_item(op, intern!(py, "contains_any"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
            d.set_item(intern!(py, "values"), values(vs)?)?;
        }
        Filter::ContainsAll { attr, values: vs } => {
            d.set_item(op, intern!(py, "contains_all"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
            d.set_item(intern!(py, "values"), values(vs)?)?;
        }
        Filter::Like { attr, pattern } => {
            d.set_item(op, intern!(py, "like"))?;
            d.set_item(intern!(py, "attr"), attr_list(attr)?)?;
            d.set_item(intern!(py, "pattern"), pattern)?;
        }
        Filter::In { entity } => {
            d.set_item(op, intern!(py, "in"))?;
            d.set_item(intern!(py, "entity"), uid_dict!(entity))?;
        }
        Filter::Is { entity } => {
            d.set_item(op, intern!(py, "is"))?;
            d.set_item(intern!(py, "entity"), uid_dict!(entity))?;
        }
        Filter::Unknown { detail } => {
            d.set_item(op, intern!(py, "unknown"))?;
            d.set_item(intern!(py, "detail"), detail)?;
        }
        Filter::Unmappable { detail } => {
            d.set_item(op, intern!(py, "unmappable"))?;
            d.set_item(intern!(py, "detail"), detail)?;
        }
    }
    Ok(d)
}

/// `QueryPlan::to_response` built straight into a dict (same keys, same order).
pub(crate) fn plan_dict<'py>(
    py: Python<'py>,
    p: &QueryPlan,
    trees: &FilterTrees,
) -> PyResult<Bound<'py, PyDict>> {
    let m = PyDict::new(py);
    m.set_item(intern!(py, "qid"), &p.qid)?;
    m.set_item(intern!(py, "outcome"), outcome_name(py, p.outcome))?;
    let (needs, attrs) = match &p.filter {
        Some(f) => {
            let t = trees.get(py, f)?;
            m.set_item(intern!(py, "filter"), t.filter)?;
            (t.needs_row_checks, t.attributes)
        }
        None => (false, PyList::empty(py)),
    };
    m.set_item(intern!(py, "challenges"), PyList::new(py, &p.challenges)?)?;
    m.set_item(
        intern!(py, "challenge_could_widen"),
        p.challenge_could_widen,
    )?;
    m.set_item(intern!(py, "needs_row_checks"), needs)?;
    m.set_item(intern!(py, "attributes"), attrs)?;
    m.set_item(intern!(py, "policies"), PyList::new(py, &p.policies)?)?;
    m.set_item(intern!(py, "mode"), crate::mode_name(py, p.mode))?;
    m.set_item(intern!(py, "policy_version"), p.policy_version)?;
    m.set_item(intern!(py, "principals_version"), p.principals_version)?;
    m.set_item(intern!(py, "max_age_secs"), p.max_age_secs)?;
    m.set_item(intern!(py, "pinned"), p.pinned)?;
    Ok(m)
}
