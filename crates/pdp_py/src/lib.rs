//! `svc._pdp_core`: the Python binding of `pdp_core` (the engine) and `pdp_server` (the
//! listener, the decision log, reading bundle directories). Thin by design: it converts Python
//! objects to JSON values and back, maps errors to Python exceptions in one place, and
//! releases the GIL around every evaluation. `svc.pdp` is the public wrapper; the stub
//! `python/svc/_pdp_core.pyi` documents every class and method.
//!
//! * this file: `Engine` (checks, plans, store writes), `set_limits`, `outline_policies`, the
//!   exceptions, and `evaluate_many`'s batch scheduler (`Batch`), which decides a batch on a
//!   thread pool while the calling thread reads the requests from Python;
//! * `pyplan`: query plans as Python objects;
//! * `pyserver`: `Server`, the listener of [`pdp_server`];
//! * `pylog`: `DecisionLog` and `LogBatch`, over [`pdp_server::decision_log`].

use pdp_core::{Bundle, BundleSources, Engine as CoreEngine, Mode};
use pdp_core::{BundleError as CoreBundleError, RequestError as CoreRequestError};
use pdp_core::{CheckRequest, Decision, PlanRequest, Prefetch, TemplateLink, Verdict};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

mod pylog;
mod pyplan;
mod pysearch;
mod pyserver;

/// The extension's Rust heap: mimalloc (docs/dependencies.md). A check allocates and frees
/// many small objects (Cedar values, slices, responses); glibc's allocator was 7% of one, and
/// `evaluate_many`'s threads share its arenas. Python objects keep CPython's own allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc 3's `mi_option_generic_collect` (its place in `mi_option_e`, `mimalloc.h`), for
/// which libmimalloc-sys has no constant.
const MI_OPTION_GENERIC_COLLECT: libmimalloc_sys::mi_option_t = 34;
/// mimalloc's default for it: a thread's heap is collected every 10,000 allocations that miss
/// the fast path.
const GENERIC_COLLECT_DEFAULT: std::os::raw::c_long = 10_000;
/// svc's value: ten times rarer.
const GENERIC_COLLECT: std::os::raw::c_long = 100_000;

/// Makes mimalloc collect a thread's heap ten times less often than its default.
///
/// A collection walks every page of the thread's heap. The thread that loaded 100,000
/// principals owns a heap of some 16,000 pages, so each collection missed the cache about 6,000
/// times and pushed the check's own entities out of it: averaged over the checks between two
/// collections, 4 of a check's 28 cache misses (`valgrind --tool=callgrind --cache-sim=yes`
/// over `benches/bench_evaluate.py`'s mix). Memory is still returned, only later. The value
/// is left alone when it is not mimalloc's default, which is also what a `MIMALLOC_GENERIC_COLLECT`
/// environment variable sets, or what a different mimalloc would hold at that place.
fn tune_allocator() {
    // SAFETY: the option calls take and return plain integers; mimalloc checks the option
    // index itself.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_GENERIC_COLLECT) == GENERIC_COLLECT_DEFAULT {
            libmimalloc_sys::mi_option_set(MI_OPTION_GENERIC_COLLECT, GENERIC_COLLECT);
        }
    }
}

create_exception!(
    _pdp_core,
    BundleError,
    PyException,
    "A policy bundle could not be loaded; `.errors` lists every problem as dicts with `file`, `line`, `column`, `policy`, `message`."
);
create_exception!(
    _pdp_core,
    RequestError,
    PyValueError,
    "A request or store update is malformed or breaks the schema; `.field` names the field at fault."
);

fn bundle_err(py: Python<'_>, e: &CoreBundleError) -> PyErr {
    let err = BundleError::new_err(e.to_string());
    let list = PyList::empty(py);
    for se in &e.errors {
        let d = PyDict::new(py);
        let _ = d.set_item("file", &se.file);
        let _ = d.set_item("line", se.line);
        let _ = d.set_item("column", se.column);
        let _ = d.set_item("policy", se.policy.as_deref());
        let _ = d.set_item("message", &se.message);
        let _ = list.append(d);
    }
    let _ = err.value(py).setattr("errors", list);
    err
}

pub(crate) fn request_err(py: Python<'_>, e: &CoreRequestError) -> PyErr {
    let err = RequestError::new_err(e.to_string());
    let _ = err.value(py).setattr("field", &e.field);
    let _ = err.value(py).setattr("reason", &e.message);
    err
}

/// Converts a Python object built of dict/list/tuple/str/int/float/bool/None to JSON.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<Value> {
    if depth > 64 {
        return Err(PyValueError::new_err("value nests deeper than 64 levels"));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        let i: i64 = obj.extract().map_err(|_| {
            PyValueError::new_err("integer does not fit in 64 bits (Cedar's `Long`)")
        })?;
        return Ok(Value::Number(i.into()));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err("NaN and infinity are not JSON numbers"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = k
                .cast::<PyString>()
                .map_err(|_| PyTypeError::new_err("object keys must be strings"))?
                .to_str()?
                .to_owned();
            m.insert(key, to_json(&v, depth + 1)?);
        }
        return Ok(Value::Object(m));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l
            .iter()
            .map(|v| to_json(&v, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|v| to_json(&v, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    Err(PyTypeError::new_err(format!(
        "cannot convert `{}` to JSON: expected dict, list, str, int, float, bool or None",
        obj.get_type().name()?
    )))
}

/// A plain entity reference `{"type": str, "id": str}` with a valid type name, parsed without
/// building JSON; `None` for anything else (the generic path then parses it and names what is
/// wrong).
fn plain_uid(v: &Bound<'_, PyAny>, field: &str) -> Option<pdp_core::EntityUid> {
    let d = v.cast::<PyDict>().ok()?;
    if d.len() != 2 {
        return None;
    }
    let ty = d.get_item(intern!(v.py(), "type")).ok()??;
    let id = d.get_item(intern!(v.py(), "id")).ok()??;
    let ty = ty.cast::<PyString>().ok()?.to_str().ok()?;
    let id = id.cast::<PyString>().ok()?.to_str().ok()?;
    pdp_core::request::uid_from_parts(ty, id, field).ok()
}

/// Reads a request dict from Python: plain entity references in the fields `uids` names go
/// straight to entity uids (slot `i` for `uids[i]`), everything else through JSON. Non-dicts
/// come back as JSON in `Err`.
///
/// With `prefetch`, the lookups of those uids are prefetched as the request is read
/// ([`pdp_core::Prefetcher`]): each uid's table slot as soon as it is parsed, and the records
/// once the whole dict is read, so that their memory loads overlap with reading the request.
///
/// # Errors
/// `TypeError`/`ValueError` for keys or values that are not JSON.
#[allow(clippy::type_complexity)]
fn read_request<const N: usize>(
    obj: &Bound<'_, PyAny>,
    uids: [&str; N],
    prefetch: Option<&pdp_core::Prefetcher>,
) -> PyResult<Result<(Vec<(String, Value)>, [Option<pdp_core::EntityUid>; N]), Value>> {
    let Ok(d) = obj.cast::<PyDict>() else {
        return Ok(Err(to_json(obj, 0)?));
    };
    let mut rest = Vec::with_capacity(d.len());
    let mut parsed: [Option<pdp_core::EntityUid>; N] = std::array::from_fn(|_| None);
    // Prefetch keys of the uids parsed so far, in the order they were parsed.
    let (mut keys, mut n) = ([0u64; N], 0);
    for (k, v) in d.iter() {
        let key = k
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err("object keys must be strings"))?
            .to_str()?;
        let slot = uids
            .iter()
            .zip(parsed.iter_mut())
            .find(|(f, _)| **f == key)
            .and_then(|(_, slot)| Some((slot, plain_uid(&v, key)?)));
        match slot {
            Some((slot, u)) => {
                if let (Some(p), Some(k)) = (prefetch, keys.get_mut(n)) {
                    *k = CoreEngine::prefetch_key(&u);
                    p.prefetch(std::slice::from_ref(k), Prefetch::Slot);
                    n += 1;
                }
                *slot = Some(u);
            }
            None => {
                rest.push((key.to_owned(), to_json(&v, 1)?));
            }
        }
    }
    if let (Some(p), Some(keys)) = (prefetch, keys.get(..n)) {
        p.prefetch(keys, Prefetch::Record);
    }
    Ok(Ok((rest, parsed)))
}

/// Reads one check request from Python: a dict's plain `principal` and `resource` references
/// straight to entity uids, the rest through JSON ([`CheckRequest::from_object`]).
///
/// # Errors
/// Outer: `TypeError`/`ValueError` for values that are not JSON. Inner: the request's own
/// [`CoreRequestError`].
fn check_request(
    obj: &Bound<'_, PyAny>,
    prefetch: Option<&pdp_core::Prefetcher>,
) -> PyResult<Result<CheckRequest, CoreRequestError>> {
    Ok(
        match read_request(obj, ["principal", "resource"], prefetch)? {
            Ok((rest, [principal, resource])) => {
                CheckRequest::from_object(rest, principal, resource)
            }
            Err(v) => CheckRequest::from_value(v),
        },
    )
}

/// Reads one plan request from Python: a dict's plain `principal` reference straight to an
/// entity uid, the rest through JSON ([`PlanRequest::from_object`]).
///
/// # Errors
/// As [`check_request`].
fn plan_request(obj: &Bound<'_, PyAny>) -> PyResult<Result<PlanRequest, CoreRequestError>> {
    Ok(match read_request(obj, ["principal"], None)? {
        Ok((rest, [principal])) => PlanRequest::from_object(rest, principal),
        Err(v) => PlanRequest::from_json(&v),
    })
}

/// The CPUs this process may use ([`std::thread::available_parallelism`]), read once: on Linux
/// it reads the cgroup's CPU quota from files, which cost about 30 us per `evaluate_many` call
/// when asked every time.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

/// The thread pool `evaluate_many`'s deciding helpers run on ([`Batch::run`]): `helpers`
/// threads (one per extra core, the same every call), made on first use in each process. A
/// process forked from one that had made its pool inherits the pool but not its threads, and
/// a task sent there would never run, so a pool made under another process id is set aside
/// (leaked: dropping it would signal threads that do not exist here) and a new one made.
/// `None` for no helpers, or when the pool cannot be made (then the calling thread decides
/// alone).
fn helper_pool(helpers: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);
    if helpers == 0 {
        return None;
    }
    let pid = std::process::id();
    let mut g = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, pool)) = g.as_ref() {
        if *owner == pid {
            return Some(Arc::clone(pool));
        }
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(helpers)
            .thread_name(|i| format!("svc-evaluate-many-{i}"))
            .build()
            .ok()?,
    );
    if let Some(old) = g.replace((pid, Arc::clone(&pool))) {
        std::mem::forget(old);
    }
    Some(pool)
}

/// Smallest batch worth splitting over threads (below it, handing chunks to a helper costs more
/// than it saves).
const PARALLEL_MIN: usize = 64;

/// Requests per unit of work handed between the threads of an `evaluate_many` batch. Handing
/// over each request alone cost several cache lines moving between cores per request (the
/// claim counter, the parsed counter, the request and result slots); a chunk pays that once.
const CHUNK: usize = 16;

/// The decisions of one chunk, in request order.
type ChunkResults = Vec<Result<Decision, CoreRequestError>>;

/// `e`, the error of request `i` of a batch, with its field prefixed `requests[i].`.
fn in_batch(i: usize, e: CoreRequestError) -> CoreRequestError {
    CoreRequestError::new(format!("requests[{i}].{}", e.field), e.message)
}

/// The shared state of one pipelined `evaluate_many` batch (see [`Batch::run`]).
struct Batch<'a> {
    engine: &'a CoreEngine,
    /// Parsed chunks no thread has taken yet: (chunk number, its requests).
    queue: Mutex<VecDeque<(usize, Vec<CheckRequest>)>>,
    /// Set once no more chunks will be queued (every request parsed, or one did not parse).
    sealed: AtomicBool,
    /// Set when the batch is over: deciders stop.
    abort: AtomicBool,
    /// The decisions of chunk `c`, set by whichever thread decided it.
    results: Vec<OnceLock<ChunkResults>>,
}

impl<'a> Batch<'a> {
    fn new(engine: &'a CoreEngine, n: usize) -> Self {
        Self {
            engine,
            queue: Mutex::new(VecDeque::new()),
            sealed: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            results: (0..n.div_ceil(CHUNK)).map(|_| OnceLock::new()).collect(),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(usize, Vec<CheckRequest>)>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the oldest queued chunk and decides it; `false` when none is queued. The requests
    /// are dropped here, on the deciding thread. A decision that panics becomes that request's
    /// error instead of leaving its chunk undecided.
    ///
    /// While deciding request `j` of the chunk, the lookups of request `j + 1` (records) and
    /// `j + 2` (table slots) are prefetched ([`pdp_core::Prefetcher`]), so that on a
    /// large store their memory loads overlap with a decision instead of stalling one.
    fn decide_chunk(&self) -> bool {
        let Some((c, reqs)) = self.queue().pop_front() else {
            return false;
        };
        let prefetch = self.engine.prefetcher();
        // Each request's prefetch keys (at most three: principal, resource, on_behalf_of).
        let keys: Vec<([u64; 3], usize)> = reqs
            .iter()
            .map(|r| {
                let mut k = [0; 3];
                let n = k
                    .iter_mut()
                    .zip(CoreEngine::prefetch_keys(r))
                    .map(|(slot, key)| *slot = key)
                    .count();
                (k, n)
            })
            .collect();
        let keys_of = |j: usize| keys.get(j).and_then(|(k, n)| k.get(..*n));
        // The first request's slots and record, and the second's slots; then, at each
        // request, the next one's records and the slots of the one after.
        for k in (0..2).filter_map(keys_of) {
            prefetch.prefetch(k, Prefetch::Slot);
        }
        if let Some(k) = keys_of(0) {
            prefetch.prefetch(k, Prefetch::Record);
        }
        let out: ChunkResults = reqs
            .iter()
            .enumerate()
            .map(|(j, req)| {
                let i = c * CHUNK + j;
                if let Some(k) = keys_of(j + 1) {
                    prefetch.prefetch(k, Prefetch::Record);
                }
                if let Some(k) = keys_of(j + 2) {
                    prefetch.prefetch(k, Prefetch::Slot);
                }
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.engine.decide(req)))
                    .unwrap_or_else(|_| {
                        Err(CoreRequestError::new("request", "the decision panicked"))
                    })
                    .map_err(|e| in_batch(i, e))
            })
            .collect();
        drop(reqs);
        if let Some(slot) = self.results.get(c) {
            let _ = slot.set(out);
        }
        true
    }

    /// Decides chunks as they are queued until none is left and none will come.
    fn drain(&self) {
        while !self.abort.load(Ordering::Relaxed) {
            if self.decide_chunk() {
                continue;
            }
            if self.sealed.load(Ordering::Acquire) && self.queue().is_empty() {
                break;
            }
            std::thread::yield_now();
        }
    }

    /// Runs the batch `list` as a pipeline over the machine's cores, so that the parts that
    /// need the GIL (reading each request dict, building each response dict) overlap with the
    /// decisions, which run without it:
    ///
    /// 1. `helpers` tasks on rayon's global thread pool (one per extra core) decide chunks of
    ///    [`CHUNK`] requests as soon as they are parsed, while this thread parses them under
    ///    the GIL;
    /// 2. this thread then builds the responses in order under the GIL, and whenever the next
    ///    chunk is not decided yet it decides a queued one itself with the GIL released.
    ///
    /// Returns the responses in request order. On failure, the error of the first request (by
    /// index) that fails, to parse or to decide; nothing after a request that does not parse is
    /// decided.
    fn run<'py>(
        &self,
        py: Python<'py>,
        list: &Bound<'py, PyList>,
        helpers: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        // The helpers run on a rayon pool whose threads persist between batches (a thread
        // spawned per batch cost about 0.1 ms, and started on a cold stack and heap);
        // `in_place_scope` runs `respond` on this thread, which holds the GIL, and returns once
        // the helpers are done. A decision that panics is caught in `decide_chunk`, so a
        // helper does not panic; if it did, the panic would surface here as Python's
        // `PanicException`.
        match helper_pool(helpers) {
            Some(pool) => pool.in_place_scope(|s| {
                for _ in 0..helpers {
                    s.spawn(|_| self.drain());
                }
                let out = self.respond(py, list);
                self.abort.store(true, Ordering::Relaxed);
                out
            }),
            // No helpers: this thread decides every chunk itself.
            None => self.respond(py, list),
        }
    }

    fn respond<'py>(
        &self,
        py: Python<'py>,
        list: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut failed: Option<PyErr> = None;
        let mut parsed = 0;
        let mut chunk: Vec<CheckRequest> = Vec::with_capacity(CHUNK);
        for (i, r) in list.iter().enumerate() {
            // Decided later, perhaps on another thread: [`Batch::decide_chunk`] prefetches.
            match check_request(&r, None) {
                Ok(Ok(req)) => {
                    chunk.push(req);
                    parsed = i + 1;
                    if chunk.len() == CHUNK {
                        let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                        self.queue().push_back((i / CHUNK, full));
                    }
                }
                Ok(Err(e)) => {
                    failed = Some(request_err(py, &in_batch(i, e)));
                    break;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if !chunk.is_empty() {
            self.queue().push_back(((parsed - 1) / CHUNK, chunk));
        }
        self.sealed.store(true, Ordering::Release);
        if parsed < list.len() && failed.is_none() {
            // Requests from `parsed` on are never decided; an earlier one that fails to decide
            // still comes first.
            failed = Some(PyValueError::new_err(
                "requests: the list changed while it was read",
            ));
        }
        let out = PyList::empty(py);
        for done in self.results.iter().take(parsed.div_ceil(CHUNK)) {
            let decisions = loop {
                if let Some(d) = done.get() {
                    break d;
                }
                // Not decided yet: decide a queued chunk here (or, when none is queued, let the
                // helper that holds this one finish it).
                py.detach(|| {
                    if !self.decide_chunk() {
                        std::thread::yield_now();
                    }
                });
            };
            for d in decisions {
                match d {
                    Ok(d) if failed.is_none() => out.append(response_dict(py, d)?)?,
                    Ok(_) => {}
                    Err(e) => return Err(request_err(py, e)),
                }
            }
        }
        failed.map_or(Ok(out), Err)
    }
}

/// Converts JSON to Python objects.
pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.into_pyobject(py)?.into_any(),
            None => n.as_f64().unwrap_or(0.0).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// `Decision::to_response` built straight into a dict (same keys, same order), without the
/// intermediate JSON value.
fn response_dict<'py>(py: Python<'py>, d: &Decision) -> PyResult<Bound<'py, PyDict>> {
    let m = PyDict::new(py);
    m.set_item(intern!(py, "qid"), PyString::new(py, &d.qid))?;
    m.set_item(intern!(py, "verdict"), verdict_str(py, d.verdict))?;
    m.set_item(intern!(py, "challenges"), PyList::new(py, &d.challenges)?)?;
    m.set_item(
        intern!(py, "policies"),
        PyList::new(py, &d.principal_outcome.policies)?,
    )?;
    if let Some(o) = &d.on_behalf_of_outcome {
        let od = PyDict::new(py);
        od.set_item(intern!(py, "verdict"), verdict_str(py, o.verdict))?;
        od.set_item(intern!(py, "challenges"), PyList::new(py, &o.challenges)?)?;
        od.set_item(intern!(py, "policies"), PyList::new(py, &o.policies)?)?;
        m.set_item(intern!(py, "on_behalf_of"), od)?;
    }
    m.set_item(intern!(py, "mode"), mode_name(py, d.mode))?;
    Ok(m)
}

/// The wire name of a mode as one shared Python string.
pub(crate) fn mode_name(py: Python<'_>, mode: Mode) -> &Bound<'_, PyString> {
    match mode {
        Mode::Enforce => intern!(py, "enforce"),
        Mode::Monitor => intern!(py, "monitor"),
    }
}

/// The wire name of `v` as one shared Python string (no new string per response).
fn verdict_str(py: Python<'_>, v: Verdict) -> &Bound<'_, PyString> {
    match v {
        Verdict::Allow => intern!(py, "allow"),
        Verdict::Challenge => intern!(py, "challenge"),
        Verdict::Deny => intern!(py, "deny"),
    }
}

/// Reads `policies=` (a text, or a mapping of file name to text) into `(file, text)` pairs.
fn policy_sources(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(vec![("<policies>".to_owned(), s.to_str()?.to_owned())]);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut out: Vec<(String, String)> = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            out.push((k.extract()?, v.extract()?));
        }
        out.sort();
        return Ok(out);
    }
    Err(PyTypeError::new_err(
        "`policies` must be Cedar text or a mapping of file name to Cedar text",
    ))
}

fn text_or_json(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    let v = to_json(obj, 0)?;
    serde_json::to_string(&v).map_err(|e| PyValueError::new_err(format!("`{what}`: {e}")))
}

fn sources(
    policies: &Bound<'_, PyAny>,
    schema: Option<&Bound<'_, PyAny>>,
    entities: Option<&Bound<'_, PyAny>>,
    links: Option<&Bound<'_, PyAny>>,
) -> PyResult<BundleSources> {
    Ok(BundleSources {
        policies: policy_sources(policies)?,
        schema: schema
            .filter(|s| !s.is_none())
            .map(|s| text_or_json(s, "schema").map(|t| ("<schema>".to_owned(), t)))
            .transpose()?,
        entities: entities
            .filter(|s| !s.is_none())
            .map(|s| text_or_json(s, "entities").map(|t| ("<entities>".to_owned(), t)))
            .transpose()?,
        links: links
            .filter(|s| !s.is_none())
            .map(|s| text_or_json(s, "links").map(|t| ("<links>".to_owned(), t)))
            .transpose()?,
    })
}

/// The in-process decision engine (see `svc.pdp.Engine`).
#[pyclass(frozen, module = "svc._pdp_core")]
struct Engine {
    inner: Arc<CoreEngine>,
    /// Python trees of the filters memoised plans share (see [`pyplan`]).
    trees: pyplan::FilterTrees,
}

impl Engine {
    /// The engine, shared with the network front (`Server`).
    pub(crate) fn shared(&self) -> Arc<CoreEngine> {
        self.inner.clone()
    }

    fn build(py: Python<'_>, src: &BundleSources) -> PyResult<Bundle> {
        py.detach(|| Bundle::from_sources(src))
            .map_err(|e| bundle_err(py, &e))
    }

    fn build_dir(py: Python<'_>, path: PathBuf) -> PyResult<Bundle> {
        py.detach(|| pdp_server::bundle_dir::load(&path))
            .map_err(|e| bundle_err(py, &e))
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (policies, schema=None, entities=None, links=None))]
    fn new(
        py: Python<'_>,
        policies: &Bound<'_, PyAny>,
        schema: Option<&Bound<'_, PyAny>>,
        entities: Option<&Bound<'_, PyAny>>,
        links: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let src = sources(policies, schema, entities, links)?;
        Ok(Self {
            inner: Arc::new(CoreEngine::new(Self::build(py, &src)?)),
            trees: pyplan::FilterTrees::default(),
        })
    }

    #[staticmethod]
    fn from_bundle_dir(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(CoreEngine::new(Self::build_dir(py, path)?)),
            trees: pyplan::FilterTrees::default(),
        })
    }

    fn load_bundle_dir(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let b = Self::build_dir(py, path)?;
        py.detach(|| self.inner.replace_bundle(b))
            .map_err(|e| bundle_err(py, &e))
    }

    #[pyo3(signature = (policies, schema=None, entities=None, links=None))]
    fn load_bundle(
        &self,
        py: Python<'_>,
        policies: &Bound<'_, PyAny>,
        schema: Option<&Bound<'_, PyAny>>,
        entities: Option<&Bound<'_, PyAny>>,
        links: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let src = sources(policies, schema, entities, links)?;
        let b = Self::build(py, &src)?;
        py.detach(|| self.inner.replace_bundle(b))
            .map_err(|e| bundle_err(py, &e))
    }

    fn link_templates(&self, py: Python<'_>, links: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = to_json(links, 0)?;
        let parsed = TemplateLink::parse_list(&v).map_err(|e| request_err(py, &e))?;
        self.inner
            .link_templates(&parsed)
            .map_err(|e| bundle_err(py, &e))
    }

    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let prefetch = self.inner.prefetcher();
        let req = check_request(request, Some(&prefetch))?.map_err(|e| request_err(py, &e))?;
        drop(prefetch);
        let d = py
            .detach(|| self.inner.decide(&req))
            .map_err(|e| request_err(py, &e))?;
        Ok(response_dict(py, &d)?.into_any())
    }

    fn plan<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = plan_request(request)?.map_err(|e| request_err(py, &e))?;
        let p = py
            .detach(|| self.inner.plan(&req))
            .map_err(|e| request_err(py, &e))?;
        Ok(pyplan::plan_dict(py, &p, &self.trees)?.into_any())
    }

    #[pyo3(signature = (max_age_secs=300, capacity=10_000, memo=true))]
    fn configure_plans(&self, max_age_secs: u64, capacity: usize, memo: bool) {
        self.inner.configure_plans(max_age_secs, capacity);
        self.inner.set_plan_memo(memo);
    }

    /// AuthZEN subject search: who may do `action` on `resource` (docs/search.md); one page, as the dict
    /// `POST /access/v1/search/...` answers. Raises `RequestError` naming the field.
    fn search_subjects<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        pysearch::search(py, &self.inner, pdp_core::SearchKind::Subject, request)
    }

    /// AuthZEN resource search: which resources of `resource.type` the subject may do `action` on (docs/search.md); one page, as the dict
    /// `POST /access/v1/search/...` answers. Raises `RequestError` naming the field.
    fn search_resources<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        pysearch::search(py, &self.inner, pdp_core::SearchKind::Resource, request)
    }

    /// AuthZEN action search: what the subject may do to the resource (docs/search.md); one page, as the dict
    /// `POST /access/v1/search/...` answers. Raises `RequestError` naming the field.
    fn search_actions<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        pysearch::search(py, &self.inner, pdp_core::SearchKind::Action, request)
    }

    /// Sets the largest `page.limit` a search takes (larger ones are lowered to it), and
    /// whether subject search plans with the principal unknown (docs/search.md).
    #[pyo3(signature = (max_limit=1000, subject_plans=true))]
    fn configure_search(&self, max_limit: usize, subject_plans: bool) {
        self.inner.configure_search(max_limit);
        self.inner.set_subject_plans(subject_plans);
    }

    #[pyo3(signature = (prune_slices=true))]
    fn configure_checks(&self, prune_slices: bool) {
        self.inner.set_slice_pruning(prune_slices);
    }

    #[getter]
    fn plans_cached(&self) -> usize {
        self.inner.plans_cached()
    }

    fn decide<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let v = to_json(request, 0)?;
        let d = py
            .detach(|| self.inner.decide_value(v))
            .map_err(|e| request_err(py, &e))?;
        to_py(py, &d.to_record("in-process"))
    }

    fn evaluate_many<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let list = requests
            .cast::<PyList>()
            .map_err(|_| PyTypeError::new_err("`requests` must be a list of request dicts"))?;
        let threads = cores();
        let helpers = if list.len() < PARALLEL_MIN {
            0
        } else {
            threads - 1
        };
        let out = Batch::new(&self.inner, list.len()).run(py, list, helpers)?;
        Ok(out)
    }

    fn upsert_entities(&self, py: Python<'_>, entities: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Value::Array(v) = to_json(entities, 0)? else {
            return Err(PyTypeError::new_err(
                "`entities` must be a list of entity dicts",
            ));
        };
        py.detach(|| self.inner.upsert_entities(v))
            .map_err(|e| request_err(py, &e))
    }

    fn replace_entities(&self, py: Python<'_>, entities: &Bound<'_, PyAny>) -> PyResult<usize> {
        let Value::Array(v) = to_json(entities, 0)? else {
            return Err(PyTypeError::new_err(
                "`entities` must be a list of entity dicts",
            ));
        };
        py.detach(|| self.inner.replace_entities(v))
            .map_err(|e| request_err(py, &e))
    }

    fn remove_entities(&self, py: Python<'_>, uids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let v = to_json(uids, 0)?;
        self.inner
            .remove_entities(&v)
            .map_err(|e| request_err(py, &e))
    }

    fn register_service_accounts(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let v = to_json(records, 0)?;
        self.inner
            .register_service_accounts(&v)
            .map_err(|e| request_err(py, &e))
    }

    fn unregister_service_accounts(&self, ids: Vec<String>) -> usize {
        self.inner.unregister_service_accounts(&ids)
    }

    fn upsert_work_items(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<usize> {
        let v = to_json(items, 0)?;
        self.inner
            .upsert_work_items(&v)
            .map_err(|e| request_err(py, &e))
    }

    fn remove_work_items(&self, ids: Vec<String>) -> usize {
        self.inner.remove_work_items(&ids)
    }

    fn set_containments(&self, py: Python<'_>, principals: &Bound<'_, PyAny>) -> PyResult<usize> {
        let v = to_json(principals, 0)?;
        self.inner
            .set_containments(&v)
            .map_err(|e| request_err(py, &e))
    }

    fn contain(&self, py: Python<'_>, principals: &Bound<'_, PyAny>) -> PyResult<usize> {
        let v = to_json(principals, 0)?;
        self.inner
            .set_contained(&v, true)
            .map_err(|e| request_err(py, &e))
    }

    fn lift(&self, py: Python<'_>, principals: &Bound<'_, PyAny>) -> PyResult<usize> {
        let v = to_json(principals, 0)?;
        self.inner
            .set_contained(&v, false)
            .map_err(|e| request_err(py, &e))
    }

    #[pyo3(signature = (scores, replace=false))]
    fn set_risk_scores(
        &self,
        py: Python<'_>,
        scores: &Bound<'_, PyAny>,
        replace: bool,
    ) -> PyResult<usize> {
        let v = to_json(scores, 0)?;
        self.inner
            .set_risk_scores(&v, replace)
            .map_err(|e| request_err(py, &e))
    }

    fn set_mode(&self, py: Python<'_>, mode: &str) -> PyResult<()> {
        let m = Mode::parse(mode).map_err(|e| request_err(py, &e))?;
        self.inner.set_mode(m);
        Ok(())
    }

    #[getter]
    fn mode(&self) -> &'static str {
        self.inner.mode().as_str()
    }

    #[getter]
    fn versions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let v = self.inner.versions();
        let d = PyDict::new(py);
        d.set_item("policy_version", v.policy_version)?;
        d.set_item("principals_version", v.principals_version)?;
        d.set_item("resources_version", v.resources_version)?;
        Ok(d)
    }

    #[getter]
    fn policy_names(&self) -> Vec<String> {
        let b = self.inner.bundle();
        let mut names: Vec<String> = b.policy_meta().map(|m| m.name.clone()).collect();
        names.sort();
        names
    }

    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner
            .bundle()
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[getter]
    fn store_size(&self) -> usize {
        self.inner.store().len()
    }

    fn __repr__(&self) -> String {
        let v = self.inner.versions();
        format!(
            "Engine(policies={}, policy_version={}, principals_version={}, mode={})",
            self.inner.bundle().policy_meta().count(),
            v.policy_version,
            v.principals_version,
            self.inner.mode().as_str()
        )
    }
}

/// Sets the decision core's process-wide limits (docs/decisions.md, "Limits"); `None` leaves
/// a limit as it is. Returns the limits now in force as `(max_entity_depth,
/// max_inline_entities)`. `max_entity_depth` (parent links to the farthest ancestor, at least 1)
/// bounds inline entities, entity-store writes and bundles' `entities.json` loaded from then
/// on; `max_inline_entities` bounds the inline entities of one check.
#[pyfunction]
#[pyo3(signature = (max_entity_depth=None, max_inline_entities=None))]
fn set_limits(
    max_entity_depth: Option<usize>,
    max_inline_entities: Option<usize>,
) -> (usize, usize) {
    if let Some(n) = max_entity_depth {
        pdp_core::limits::set_max_entity_depth(n);
    }
    if let Some(n) = max_inline_entities {
        pdp_core::limits::set_max_inline_entities(n);
    }
    (
        pdp_core::limits::max_entity_depth(),
        pdp_core::limits::max_inline_entities(),
    )
}

/// Outlines the policies and templates of one `.cedar` file (`pdp_core::outline`): per statement
/// its name, effect, text, lines, scope, the attribute paths it reads and the entity literals it
/// names, as dicts. `first_index` counts the statements of the bundle's earlier files, so
/// unnamed policies get their bundle names. A syntax error raises `BundleError` with Cedar's
/// errors at their lines and columns.
#[pyfunction]
#[pyo3(signature = (text, file="policies.cedar", first_index=0))]
fn outline_policies<'py>(
    py: Python<'py>,
    text: &str,
    file: &str,
    first_index: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let out =
        pdp_core::outline::outline(file, text, first_index).map_err(|e| bundle_err(py, &e))?;
    let value = serde_json::to_value(&out).map_err(|e| PyValueError::new_err(e.to_string()))?;
    to_py(py, &value)
}

#[pymodule]
fn _pdp_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_allocator();
    let py = m.py();
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(set_limits, m)?)?;
    m.add_function(wrap_pyfunction!(outline_policies, m)?)?;
    m.add_class::<pyserver::Server>()?;
    m.add_class::<pylog::DecisionLog>()?;
    m.add_class::<pylog::LogBatch>()?;
    m.add("BundleError", py.get_type::<BundleError>())?;
    m.add("RequestError", py.get_type::<RequestError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
