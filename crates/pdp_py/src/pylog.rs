//! `svc._pdp_core.DecisionLog`: the decision log's queue and spool (see
//! `pdp_core::decision_log`) for the Python shipper. Records cross to Python in batches: one
//! `drain` call, one GIL acquisition, up to `max` records.

use pdp_core::decision_log::{DecisionLog as CoreLog, LogConfig, Record, SpoolBatch};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The decision log's in-memory queue and on-disk spool (see `svc.pdp.decision_log`).
#[pyclass(frozen, module = "svc._pdp_core")]
pub struct DecisionLog {
    pub(crate) inner: Arc<CoreLog>,
}

/// A batch read from the spool; hand it back to `spool_commit` once the broker has it.
#[pyclass(frozen, module = "svc._pdp_core")]
pub struct SpoolBatchHandle {
    batch: Mutex<Option<SpoolBatch>>,
}

fn records_to_py<'py>(py: Python<'py>, recs: &[Record]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for r in recs {
        out.append(PyTuple::new(
            py,
            [PyBytes::new(py, &r.key), PyBytes::new(py, &r.value)],
        )?)?;
    }
    Ok(out)
}

fn records_from_py(records: &Bound<'_, PyAny>) -> PyResult<Vec<Record>> {
    let mut out = Vec::new();
    for item in records.try_iter()? {
        let (key, value): (Vec<u8>, Vec<u8>) = item?.extract().map_err(|_| {
            PyValueError::new_err("records must be (key: bytes, value: bytes) pairs")
        })?;
        out.push(Record { key, value });
    }
    Ok(out)
}

#[pymethods]
impl DecisionLog {
    #[new]
    #[pyo3(signature = (spool_dir, queue_bound=100_000, spool_max_bytes=1_073_741_824, segment_bytes=16_777_216))]
    fn new(
        py: Python<'_>,
        spool_dir: PathBuf,
        queue_bound: usize,
        spool_max_bytes: u64,
        segment_bytes: u64,
    ) -> PyResult<Self> {
        let cfg = LogConfig {
            queue_bound,
            spool_dir: spool_dir.clone(),
            spool_max_bytes,
            segment_bytes,
        };
        let inner = py.detach(|| CoreLog::open(&cfg)).map_err(|e| {
            PyOSError::new_err(format!(
                "cannot open the decision-log spool `{}`: {e}",
                spool_dir.display()
            ))
        })?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Queues one record (as the server does per decision).
    fn push(&self, key: Vec<u8>, value: Vec<u8>) {
        self.inner.push(Record { key, value });
    }

    /// Takes up to `max` records, waiting up to `timeout` seconds for the first (GIL released
    /// while waiting); returns `[(key, value), ...]`.
    #[pyo3(signature = (max=5000, timeout=0.1))]
    fn drain<'py>(
        &self,
        py: Python<'py>,
        max: usize,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyList>> {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let inner = self.inner.clone();
        let recs = py.detach(move || inner.drain(max, t));
        records_to_py(py, &recs)
    }

    /// Writes records the broker could not take to the spool (fsynced); returns how many were
    /// spooled (the rest were dropped for want of space, and counted).
    fn spool(&self, py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<u64> {
        let recs = records_from_py(records)?;
        let inner = self.inner.clone();
        Ok(py.detach(move || inner.spool(&recs)))
    }

    /// Reads up to `max` spooled records from the replay position; returns
    /// `(records, batch)`. Raises `OSError` when a segment cannot be read.
    #[pyo3(signature = (max=5000))]
    fn spool_read<'py>(
        &self,
        py: Python<'py>,
        max: usize,
    ) -> PyResult<(Bound<'py, PyList>, SpoolBatchHandle)> {
        let inner = self.inner.clone();
        let batch = py
            .detach(move || inner.spool_read(max))
            .map_err(|e| PyOSError::new_err(format!("cannot read the spool: {e}")))?;
        let list = records_to_py(py, &batch.records)?;
        Ok((
            list,
            SpoolBatchHandle {
                batch: Mutex::new(Some(batch)),
            },
        ))
    }

    /// Moves the replay position past `batch` (call once the broker acknowledged all of it).
    /// Committing a batch twice is harmless. Raises `OSError` when the cursor cannot be written.
    fn spool_commit(&self, py: Python<'_>, batch: &SpoolBatchHandle) -> PyResult<()> {
        let taken = batch
            .batch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(b) = taken {
            let inner = self.inner.clone();
            py.detach(move || inner.spool_commit(&b))
                .map_err(|e| PyOSError::new_err(format!("cannot commit the spool: {e}")))?;
        }
        Ok(())
    }

    /// Counts `n` records the broker acknowledged.
    fn mark_sent(&self, n: u64) {
        self.inner.mark_sent(n);
    }

    /// `pushed`, `queued_now`, `sent`, `spooled`, `replayed`, `dropped`, `spool_pending`,
    /// `spool_pending_bytes`, `io_errors`.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("pushed", s.pushed)?;
        d.set_item("queued_now", s.queued_now)?;
        d.set_item("sent", s.sent)?;
        d.set_item("spooled", s.spooled)?;
        d.set_item("replayed", s.replayed)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("spool_pending", s.spool_pending)?;
        d.set_item("spool_pending_bytes", s.spool_pending_bytes)?;
        d.set_item("io_errors", self.inner.io_errors())?;
        Ok(d)
    }
}
