//! `spate._spate.Session`: one Spate engine (a DataFusion session on a resolved backend) and
//! the tables registered in it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyString;
use spate::arrow::datatypes::SchemaRef;
use spate::arrow::record_batch::RecordBatch;
use spate::datafusion::common::TableReference;
use spate::parse_byte_size;
use spate::{Backend, Engine, FileFormat};

use crate::errors::{self, IntoPyResult, Origin};
use crate::frame::PyFrame;
use crate::interchange;
use crate::runtime::wait;

/// Where a file table is registered before it replaces the table of its real name, so that a
/// registration that fails leaves the old table in place.
const STAGING_PREFIX: &str = "__spate_staging_";

/// Numbers staging names apart when several threads register at once.
static STAGING: AtomicU64 = AtomicU64::new(0);

/// A Spate session.
#[pyclass(name = "Session", module = "spate._spate", frozen, skip_from_py_object)]
#[derive(Debug)]
pub struct PySession {
    engine: Arc<Engine>,
}

/// A byte size given as an int or as text such as "4G".
fn byte_size(value: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<usize>> {
    let Some(value) = value else {
        return Ok(None);
    };
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(text) = value.cast::<PyString>() {
        return parse_byte_size(&text.to_cow()?)
            .map(Some)
            .map_err(|e| errors::invalid(format!("{what}: {e}")));
    }
    match value.extract::<usize>() {
        Ok(0) | Err(_) => Err(errors::invalid(format!(
            "{what}: expected a positive number of bytes or a size such as '4G', got {value}"
        ))),
        Ok(bytes) => Ok(Some(bytes)),
    }
}

/// Splits batches into slices of at most `rows` rows (zero-copy) dealt round-robin into
/// `partitions` partitions, so that a scan of one big imported table runs on every core.
fn partition(batches: Vec<RecordBatch>, rows: usize, partitions: usize) -> Vec<Vec<RecordBatch>> {
    let partitions = partitions.max(1);
    let rows = rows.max(1);
    let mut out = vec![Vec::new(); partitions];
    let mut next = 0;
    for batch in batches {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let length = rows.min(batch.num_rows() - offset);
            out[next % partitions].push(batch.slice(offset, length));
            next += 1;
            offset += length;
        }
    }
    out
}

impl PySession {
    /// Removes table `name` (and its cache); returns whether it existed.
    fn drop_table(&self, name: &str) -> Result<bool, spate::SpateError> {
        self.engine.deregister(name)
    }

    /// Moves the table registered as `staged` to `name`, replacing any table of that name.
    /// An invalid `name` drops the staged table and fails.
    fn adopt(&self, staged: &str, name: &str) -> PyResult<()> {
        let context = self.engine.context();
        let staged_ref = TableReference::bare(staged);
        if let Err(e) = self.drop_table(name) {
            let _ = context.deregister_table(staged_ref);
            return Err(errors::to_py(e, Origin::Frame));
        }
        let provider = context
            .deregister_table(staged_ref)
            .py(Origin::Frame)?
            .ok_or_else(|| errors::internal(format!("staged table '{staged}' vanished")))?;
        context
            .register_table(TableReference::bare(name.to_ascii_lowercase()), provider)
            .py(Origin::Frame)?;
        Ok(())
    }

    fn frame_of_table(&self, py: Python<'_>, name: &str) -> PyResult<PyFrame> {
        let engine = Arc::clone(&self.engine);
        let table = name.to_ascii_lowercase();
        let df = wait(
            py,
            async move { engine.context().table(table.as_str()).await },
        )?
        .py(Origin::Frame)?;
        Ok(PyFrame::new(Arc::clone(&self.engine), df))
    }
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (
        backend = "auto",
        gpu_memory_limit = None,
        fallback = "cpu",
        memory_limit = None,
        target_partitions = None,
        batch_size = None,
        options = None,
        devices = None,
        remote = None,
    ))]
    fn new(
        py: Python<'_>,
        backend: &str,
        gpu_memory_limit: Option<Bound<'_, PyAny>>,
        fallback: &str,
        memory_limit: Option<Bound<'_, PyAny>>,
        target_partitions: Option<usize>,
        batch_size: Option<usize>,
        options: Option<HashMap<String, String>>,
        devices: Option<Bound<'_, PyAny>>,
        remote: Option<String>,
    ) -> PyResult<Self> {
        let backend = backend.parse::<Backend>().py(Origin::Frame)?;
        let mut builder = Engine::builder()
            .backend(backend)
            .option("spate.gpu.fallback", fallback);
        if let Some(bytes) = byte_size(gpu_memory_limit.as_ref(), "gpu_memory_limit")? {
            builder = builder.gpu_memory_limit(bytes);
        }
        if let Some(bytes) = byte_size(memory_limit.as_ref(), "memory_limit")? {
            builder = builder.memory_limit(bytes);
        }
        if let Some(partitions) = target_partitions {
            builder = builder.target_partitions(partitions);
        }
        if let Some(rows) = batch_size {
            builder = builder.batch_size(rows);
        }
        for (key, value) in options.unwrap_or_default() {
            builder = builder.option(key, value);
        }
        if let Some(devices) = devices {
            // A count (4) or a list such as "cuda:0,1,3".
            let text = match devices.extract::<usize>() {
                Ok(n) => n.to_string(),
                Err(_) => devices.extract::<String>().map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err(
                        "devices must be a count such as 4 or a string such as 'cuda:0,1,3'",
                    )
                })?,
            };
            builder = builder.devices(text.parse::<spate::Devices>().py(Origin::Frame)?);
        }
        if let Some(url) = remote {
            builder = builder.remote(url);
        }
        // Opening a GPU probes the driver and may compile kernels: no GIL needed for that.
        let engine = py.detach(|| builder.build()).py(Origin::Frame)?;
        Ok(PySession {
            engine: Arc::new(engine),
        })
    }

    /// The backend operators run on: `cuda`, `emulated` or `cpu` (never `auto`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.engine.backend().resolved.as_str()
    }

    /// The backend that was asked for.
    #[getter]
    fn requested_backend(&self) -> &'static str {
        self.engine.backend().requested.as_str()
    }

    /// Why the session runs on its backend.
    #[getter]
    fn backend_reason(&self) -> String {
        self.engine.backend().reason.clone()
    }

    /// Plans one SQL statement (DDL and `SET` take effect now) and returns it as a lazy frame.
    fn sql(&self, py: Python<'_>, query: String) -> PyResult<PyFrame> {
        let engine = Arc::clone(&self.engine);
        let df = wait(py, async move { engine.sql(&query).await })?.py(Origin::Sql)?;
        Ok(PyFrame::new(Arc::clone(&self.engine), df))
    }

    /// The registered table `name` as a frame.
    fn table(&self, py: Python<'_>, name: &str) -> PyResult<PyFrame> {
        self.frame_of_table(py, name)
    }

    /// Registers a file or folder as table `name`, replacing any table of that name (unless
    /// the file cannot be registered: then the old table stays); `format` is parquet, csv,
    /// ndjson or arrow, or None to go by the file extension.
    #[pyo3(signature = (name, path, format = None))]
    fn register_file(
        &self,
        py: Python<'_>,
        name: String,
        path: std::path::PathBuf,
        format: Option<&str>,
    ) -> PyResult<()> {
        let format = format
            .map(str::parse::<FileFormat>)
            .transpose()
            .py(Origin::Frame)?;
        let engine = Arc::clone(&self.engine);
        let staged = format!(
            "{STAGING_PREFIX}{}",
            STAGING.fetch_add(1, Ordering::Relaxed)
        );
        let table = staged.clone();
        wait(py, async move {
            match format {
                None => engine.register(&table, &path).await,
                Some(format) => engine.register_format(&table, &path, format).await,
            }
        })?
        .py(Origin::Frame)?;
        self.adopt(&staged, &name)
    }

    /// Registers Arrow data (anything with `__arrow_c_stream__` or `__arrow_c_array__`) as
    /// table `name`, without copying it, replacing any table of that name once the data has
    /// been read.
    fn register_arrow(&self, name: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (schema, batches): (SchemaRef, Vec<RecordBatch>) = interchange::import(data)?;
        let config = self.engine.context().copied_config();
        let partitions = partition(batches, config.batch_size(), config.target_partitions());
        self.drop_table(name).py(Origin::Frame)?;
        self.engine
            .register_partitions(name, schema, partitions)
            .py(Origin::Frame)
    }

    /// Registers a frame's plan as the view `name`, replacing any table of that name. The
    /// plan holds the tables it reads, so a view of the table it replaces still works.
    fn register_frame(&self, name: &str, frame: &PyFrame) -> PyResult<()> {
        self.drop_table(name).py(Origin::Frame)?;
        self.engine
            .register_view(name, frame.df.clone())
            .py(Origin::Frame)
    }

    /// Removes table `name` and its cached copy; returns whether it existed.
    fn deregister(&self, name: &str) -> PyResult<bool> {
        self.drop_table(name).py(Origin::Frame)
    }

    /// The registered tables, sorted.
    fn tables(&self) -> Vec<String> {
        self.engine
            .table_names()
            .into_iter()
            .filter(|name| !name.starts_with(STAGING_PREFIX))
            .collect()
    }

    /// Loads table `name` into GPU memory (host memory on `cpu`); returns a description.
    fn cache_table(&self, py: Python<'_>, name: String) -> PyResult<String> {
        let engine = Arc::clone(&self.engine);
        let cached = wait(py, async move { engine.cache_table(&name).await })?.py(Origin::Frame)?;
        Ok(format!("{cached:?}"))
    }

    /// Frees a cached table.
    fn uncache_table(&self, name: &str) -> PyResult<()> {
        self.engine
            .uncache_table(name)
            .py(Origin::Frame)
            .map(|_| ())
    }

    /// A writer pushing into stream `name` (`CREATE STREAM`).
    fn stream_writer(&self, name: &str) -> PyResult<crate::stream::PyStreamWriter> {
        let writer = self.engine.stream_writer(name).py(Origin::Frame)?;
        Ok(crate::stream::PyStreamWriter::new(writer, name.to_string()))
    }

    /// Tails `folder` into stream `stream` (files of `format`, or of the files there).
    #[pyo3(signature = (stream, folder, format = None, poll = 0.05))]
    fn tail_folder(
        &self,
        py: Python<'_>,
        stream: &str,
        folder: std::path::PathBuf,
        format: Option<&str>,
        poll: f64,
    ) -> PyResult<crate::stream::PyFolderTail> {
        let format = format
            .map(str::parse::<FileFormat>)
            .transpose()
            .py(Origin::Frame)?;
        let engine = Arc::clone(&self.engine);
        let stream = stream.to_string();
        let poll = std::time::Duration::from_secs_f64(poll.max(0.001));
        // The tail's task starts on the shared runtime.
        let tail = wait(py, async move {
            engine.tail_folder(&stream, &folder, format, poll)
        })?
        .py(Origin::Frame)?;
        Ok(crate::stream::PyFolderTail::new(tail))
    }

    /// What continuous view `name` emits from now on.
    fn subscribe(&self, name: &str) -> PyResult<crate::stream::PySubscription> {
        let subscription = self.engine.subscribe(name).py(Origin::Frame)?;
        Ok(crate::stream::PySubscription::new(subscription))
    }

    /// The streams: (name, time column, watermark µs, lag µs, events, late rows,
    /// micro-batches, waiting rows, kept rows, kept bytes, views).
    #[allow(
        clippy::type_complexity,
        reason = "a plain tuple for the Python side to name"
    )]
    fn streams(
        &self,
    ) -> Vec<(
        String,
        String,
        Option<i64>,
        Option<i64>,
        u64,
        u64,
        u64,
        usize,
        usize,
        usize,
        Vec<String>,
    )> {
        self.engine
            .streams()
            .into_iter()
            .map(|s| {
                (
                    s.name,
                    s.time_column,
                    s.watermark_micros,
                    s.lag_micros,
                    s.events,
                    s.late_rows,
                    s.micro_batches,
                    s.waiting_rows,
                    s.kept_rows,
                    s.kept_bytes,
                    s.views,
                )
            })
            .collect()
    }

    /// Writes a checkpoint of the streams and views; returns (stream, events taken) each.
    fn checkpoint(
        &self,
        py: Python<'_>,
        folder: std::path::PathBuf,
    ) -> PyResult<Vec<(String, u64)>> {
        let engine = Arc::clone(&self.engine);
        let report =
            wait(py, async move { engine.checkpoint(&folder).await })?.py(Origin::Frame)?;
        Ok(report.into_iter().map(|s| (s.name, s.events)).collect())
    }

    /// Restores a checkpoint into this session; returns (stream, events taken) each.
    fn restore(&self, py: Python<'_>, folder: std::path::PathBuf) -> PyResult<Vec<(String, u64)>> {
        let engine = Arc::clone(&self.engine);
        let report = wait(py, async move { engine.restore(&folder).await })?.py(Origin::Frame)?;
        Ok(report.into_iter().map(|s| (s.name, s.events)).collect())
    }

    fn __repr__(&self) -> String {
        format!(
            "Session(backend='{}', requested='{}')",
            self.backend(),
            self.requested_backend()
        )
    }
}
