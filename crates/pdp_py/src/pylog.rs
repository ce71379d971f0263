//! `svc._pdp_core.DecisionLog`: the decision log's spool and group-commit writer (see
//! `pdp_server::decision_log` and docs/history.md, "Durability of the decision log") for the
//! Python shipper. Records cross to Python in batches: one `read` call, one GIL acquisition,
//! up to `max` records. Every call that waits releases the GIL.

use pdp_server::decision_log::{DecisionLog as CoreLog, Durability, LogConfig, Record, SpoolBatch};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The decision log's spool on disk and its group-commit writer (see `svc.pdp.decision_log`).
#[pyclass(frozen, module = "svc._pdp_core")]
pub struct DecisionLog {
    pub(crate) inner: Arc<CoreLog>,
}

/// A batch read from the log; hand it back to `ack` once the broker has all of it.
#[pyclass(frozen, module = "svc._pdp_core")]
pub struct LogBatch {
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

#[pymethods]
impl DecisionLog {
    #[new]
    #[pyo3(signature = (spool_dir, queue_bound=100_000, spool_max_bytes=1_073_741_824, segment_bytes=16_777_216, commit_ms=5, fsync=false, durability="window"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        spool_dir: PathBuf,
        queue_bound: usize,
        spool_max_bytes: u64,
        segment_bytes: u64,
        commit_ms: u64,
        fsync: bool,
        durability: &str,
    ) -> PyResult<Self> {
        let durability = Durability::parse(durability).ok_or_else(|| {
            PyValueError::new_err(format!(
                "log_durability=`{durability}` is not one of window, durable"
            ))
        })?;
        let cfg = LogConfig {
            queue_bound,
            spool_dir: spool_dir.clone(),
            spool_max_bytes,
            segment_bytes,
            commit_interval: Duration::from_millis(commit_ms),
            fsync,
            durability,
        };
        let inner = py.detach(|| CoreLog::open(&cfg)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidInput {
                return PyValueError::new_err(e.to_string());
            }
            PyOSError::new_err(format!(
                "cannot open the decision-log spool `{}`: {e}",
                spool_dir.display()
            ))
        })?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Queues one record (as the server does per decision). In durable mode, returns once it
    /// is written (GIL released) and raises `OSError` when it was dropped.
    fn push(&self, py: Python<'_>, key: Vec<u8>, value: Vec<u8>) -> PyResult<()> {
        let ticket = self.inner.push(Record { key, value });
        if self.inner.durability() == Durability::Durable {
            py.detach(move || ticket.wait())
                .map_err(|e| PyOSError::new_err(e.to_string()))?;
        }
        Ok(())
    }

    /// Writes what waits in memory now and returns once it is written.
    fn flush(&self, py: Python<'_>) {
        let inner = self.inner.clone();
        py.detach(move || inner.flush());
    }

    /// Writes what waits in memory, stops the writer thread and saves the cursor; later pushes
    /// are written at once. Raises `OSError` when the cursor cannot be saved.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.close())
            .map_err(|e| PyOSError::new_err(format!("cannot save the spool's cursor: {e}")))
    }

    /// Reads up to `max` written records in spool order, waiting up to `timeout` seconds for
    /// the first; returns `(records, batch)`, records as `[(key, value), ...]`. Raises
    /// `OSError` when a segment cannot be read.
    #[pyo3(signature = (max=5000, timeout=0.1))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        max: usize,
        timeout: f64,
    ) -> PyResult<(Bound<'py, PyList>, LogBatch)> {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let inner = self.inner.clone();
        let mut batch = py
            .detach(move || inner.read(max, t))
            .map_err(|e| PyOSError::new_err(format!("cannot read the spool: {e}")))?;
        let list = records_to_py(py, &std::mem::take(&mut batch.records))?;
        Ok((
            list,
            LogBatch {
                batch: Mutex::new(Some(batch)),
            },
        ))
    }

    /// Records that the broker acknowledged all of `batch` (acknowledging twice is harmless).
    /// Raises `OSError` when the cursor cannot be saved.
    fn ack(&self, py: Python<'_>, batch: &LogBatch) -> PyResult<()> {
        let taken = batch
            .batch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(b) = taken {
            let inner = self.inner.clone();
            py.detach(move || inner.ack(&b))
                .map_err(|e| PyOSError::new_err(format!("cannot save the spool's cursor: {e}")))?;
        }
        Ok(())
    }

    /// Forgets the batches in flight; the next `read` starts again at the cursor.
    fn rewind(&self) {
        self.inner.rewind();
    }

    /// The group-commit window in force, in milliseconds (`log_commit_ms`; 0 in durable mode).
    #[getter]
    fn commit_ms(&self) -> u64 {
        u64::try_from(self.inner.commit_interval().as_millis()).unwrap_or(u64::MAX)
    }

    /// `window` or `durable` (`log_durability`).
    #[getter]
    fn durability(&self) -> &'static str {
        self.inner.durability().as_str()
    }

    /// Whether every group commit is fsynced (`log_fsync`).
    #[getter]
    fn fsync(&self) -> bool {
        self.inner.fsync()
    }

    /// `pushed`, `queued_now`, `spooled`, `sent`, `replayed`, `dropped`, `spool_pending`,
    /// `spool_pending_bytes`, `commits`, `io_errors`.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("pushed", s.pushed)?;
        d.set_item("queued_now", s.queued_now)?;
        d.set_item("spooled", s.spooled)?;
        d.set_item("sent", s.sent)?;
        d.set_item("replayed", s.replayed)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("spool_pending", s.spool_pending)?;
        d.set_item("spool_pending_bytes", s.spool_pending_bytes)?;
        d.set_item("commits", s.commits)?;
        d.set_item("io_errors", self.inner.io_errors())?;
        Ok(d)
    }
}
