//! Streams from Python: `spate._spate.StreamWriter` pushes Arrow data into a stream and
//! `spate._spate.Subscription` receives what a continuous view emits (`spate/streaming.py`
//! wraps both).

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use spate::arrow::record_batch::RecordBatch;
use tokio::sync::Mutex;

use crate::errors::{IntoPyResult, Origin};
use crate::interchange;
use crate::runtime::wait;

/// A writer of one stream.
#[derive(Debug)]
#[pyclass(
    name = "StreamWriter",
    module = "spate._spate",
    frozen,
    skip_from_py_object
)]
pub struct PyStreamWriter {
    writer: Arc<Mutex<Option<spate::StreamWriter>>>,
    name: String,
}

impl PyStreamWriter {
    pub(crate) fn new(writer: spate::StreamWriter, name: String) -> Self {
        PyStreamWriter {
            writer: Arc::new(Mutex::new(Some(writer))),
            name,
        }
    }
}

fn finished(name: &str) -> spate::SpateError {
    spate::SpateError::Config {
        message: format!("this writer of stream '{name}' has finished"),
    }
}

#[pymethods]
impl PyStreamWriter {
    /// Pushes Arrow data (anything with `__arrow_c_stream__` or `__arrow_c_array__`); late
    /// rows go to the stream's `$late` table.
    fn push(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (_, batches): (_, Vec<RecordBatch>) = interchange::import(data)?;
        let writer = Arc::clone(&self.writer);
        let name = self.name.clone();
        wait(py, async move {
            let guard = writer.lock().await;
            let writer = guard.as_ref().ok_or_else(|| finished(&name))?;
            for batch in batches {
                writer.push(batch).await?;
            }
            Ok::<(), spate::SpateError>(())
        })?
        .py(Origin::Frame)
    }

    /// Cuts a micro-batch of what waits and advances the views.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let writer = Arc::clone(&self.writer);
        let name = self.name.clone();
        wait(py, async move {
            let guard = writer.lock().await;
            guard.as_ref().ok_or_else(|| finished(&name))?.flush().await
        })?
        .py(Origin::Frame)
    }

    /// Ends the writer; once every writer has finished, every window closes.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let writer = Arc::clone(&self.writer);
        let name = self.name.clone();
        wait(py, async move {
            let taken = writer.lock().await.take();
            taken.ok_or_else(|| finished(&name))?.finish().await
        })?
        .py(Origin::Frame)
    }
}

/// What a continuous view emits, from the subscription on.
#[derive(Debug)]
#[pyclass(
    name = "Subscription",
    module = "spate._spate",
    frozen,
    skip_from_py_object
)]
pub struct PySubscription {
    subscription: Arc<Mutex<spate::Subscription>>,
}

impl PySubscription {
    pub(crate) fn new(subscription: spate::Subscription) -> Self {
        PySubscription {
            subscription: Arc::new(Mutex::new(subscription)),
        }
    }
}

#[pymethods]
impl PySubscription {
    /// The next batch as an Arrow C stream capsule, waiting up to `timeout` seconds (forever
    /// when None). Returns `(capsule, False)`, `(None, False)` on a timeout, or `(None, True)`
    /// once the view has emitted its last.
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(Option<Bound<'py, PyCapsule>>, bool)> {
        let subscription = Arc::clone(&self.subscription);
        let limit = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        let next = wait(py, async move {
            let mut subscription = subscription.lock().await;
            match limit {
                None => Some(subscription.next_batch().await),
                Some(limit) => tokio::time::timeout(limit, subscription.next_batch())
                    .await
                    .ok(),
            }
        })?;
        match next {
            None => Ok((None, false)),
            Some(None) => Ok((None, true)),
            Some(Some(batch)) => {
                let schema = batch.schema();
                Ok((Some(interchange::export(py, schema, vec![batch])?), false))
            }
        }
    }
}

/// A folder tailed into a stream.
#[derive(Debug)]
#[pyclass(
    name = "FolderTail",
    module = "spate._spate",
    frozen,
    skip_from_py_object
)]
pub struct PyFolderTail {
    tail: Arc<Mutex<Option<spate::FolderTail>>>,
}

impl PyFolderTail {
    pub(crate) fn new(tail: spate::FolderTail) -> Self {
        PyFolderTail {
            tail: Arc::new(Mutex::new(Some(tail))),
        }
    }

    fn end(&self, py: Python<'_>, finish: bool) -> PyResult<u64> {
        let tail = Arc::clone(&self.tail);
        wait(py, async move {
            let Some(tail) = tail.lock().await.take() else {
                return Err(spate::SpateError::Config {
                    message: "this folder tail has ended".into(),
                });
            };
            if finish {
                tail.finish().await
            } else {
                tail.stop().await
            }
        })?
        .py(Origin::Frame)
    }
}

#[pymethods]
impl PyFolderTail {
    /// Files read so far.
    fn files_read(&self) -> u64 {
        self.tail
            .try_lock()
            .ok()
            .and_then(|t| t.as_ref().map(spate::FolderTail::files_read))
            .unwrap_or(0)
    }

    /// Stops tailing; returns the files read.
    fn stop(&self, py: Python<'_>) -> PyResult<u64> {
        self.end(py, false)
    }

    /// Reads what is left, finishes the writer; returns the files read.
    fn finish(&self, py: Python<'_>) -> PyResult<u64> {
        self.end(py, true)
    }
}
