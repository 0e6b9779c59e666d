//! A stream's rows: what writers push, the watermark, late rows, and the rows it keeps for its
//! continuous views.
//!
//! **Arrival and lateness.** A push is judged row by row in arrival order. A row is late when
//! its event time is NULL or below the watermark as it stood when the row arrived: the lowest
//! `max event time - delay` over the writers still sending, less the allowed lateness, never
//! moving back. Late rows go to the side table `<stream>$late`, and are counted; the others
//! wait for the next micro-batch. So what a stream accepts depends on the order of arrival,
//! never on how rows were cut into micro-batches. A writer silent for longer than the idle
//! timeout stops holding the watermark back; once every writer has finished, the watermark
//! passes every time and every window closes.
//!
//! **Micro-batches.** A push flushes once `flush_rows` rows wait or the oldest waiting row is
//! `flush_interval` old (a timer flushes a quiet stream too). A flush uploads the rows once on
//! a GPU backend (a one-batch [`DeviceTable`], which the spill coordinator may move to host
//! memory under pressure), keeps them, and advances the continuous views that read the stream.
//! Reading the stream as a table (`SELECT … FROM tx`) scans the rows it keeps.
//!
//! **Retention.** After the views have advanced, each kept micro-batch whose latest time is
//! below every view's horizon (`view.rs`) is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{Array, BooleanArray, Int64Array};
use arrow::compute::{cast, concat_batches, filter_record_batch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_plan::ExecutionPlan;

use crate::device::GpuContext;
use crate::error::{Result, SpateError};
use crate::exec::cache::{DeviceTable, GpuCachedScanExec};

/// How a stream was declared (`CREATE STREAM … WITH (…)`).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// The stream's name.
    pub name: String,
    /// Its columns.
    pub schema: SchemaRef,
    /// The event-time column (a timestamp).
    pub time_column: usize,
    /// The event-time column's unit.
    pub unit: TimeUnit,
    /// `WATERMARK FOR ts AS ts - delay`, in the time column's ticks.
    pub delay: i64,
    /// How far below the watermark a row is still accepted, in ticks.
    pub lateness: i64,
    /// A writer silent this long stops holding the watermark back.
    pub idle_timeout: Option<Duration>,
    /// A micro-batch is cut once this many rows wait.
    pub flush_rows: usize,
    /// … or once the oldest waiting row is this old.
    pub flush_interval: Option<Duration>,
}

/// Ticks of `unit` in `micros` microseconds (rounded down for seconds and milliseconds).
pub fn micros_to_ticks(unit: TimeUnit, micros: i64) -> i64 {
    match unit {
        TimeUnit::Second => micros / 1_000_000,
        TimeUnit::Millisecond => micros / 1_000,
        TimeUnit::Microsecond => micros,
        TimeUnit::Nanosecond => micros.saturating_mul(1_000),
    }
}

/// Microseconds in `ticks` of `unit`.
pub fn ticks_to_micros(unit: TimeUnit, ticks: i64) -> i64 {
    match unit {
        TimeUnit::Second => ticks.saturating_mul(1_000_000),
        TimeUnit::Millisecond => ticks.saturating_mul(1_000),
        TimeUnit::Microsecond => ticks,
        TimeUnit::Nanosecond => ticks / 1_000,
    }
}

/// One writer's part in the watermark.
#[derive(Debug)]
struct Writer {
    /// The latest event time it has sent.
    latest: Option<i64>,
    last_push: Instant,
    finished: bool,
    /// Dropped without finishing: no longer holds the watermark back.
    detached: bool,
}

/// A kept micro-batch.
#[derive(Debug, Clone)]
pub(crate) enum Rows {
    Host(RecordBatch),
    Device(Arc<DeviceTable>),
}

#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) rows: Rows,
    pub(crate) count: usize,
    pub(crate) bytes: usize,
    /// The latest event time among them.
    pub(crate) latest: i64,
    /// Rows carried for the views' LAGs (each key's latest), not a micro-batch.
    pub(crate) carried: bool,
}

#[derive(Debug, Default)]
struct Ingest {
    writers: HashMap<u64, Writer>,
    next_writer: u64,
    waiting: Vec<RecordBatch>,
    /// Rows pushed since the last micro-batch was cut, late ones included: what `flush_rows`
    /// counts, so a micro-batch follows the pushes whatever is late.
    arrived: usize,
    oldest_waiting: Option<Instant>,
    late: Vec<RecordBatch>,
    /// The watermark in ticks (`None` before any event), never moving back.
    watermark: Option<i64>,
    /// The watermark when the last micro-batch was cut: what the views close windows by, so
    /// that a window closes only once the rows before the watermark are in what they read.
    cut_watermark: Option<i64>,
    /// The latest event time accepted.
    latest: Option<i64>,
    /// After a restore: the latest time the checkpointed writers had sent, which the first
    /// new writer starts from.
    inherited: Option<i64>,
}

/// A stream's state in a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct StreamSnapshot {
    pub(crate) events: u64,
    pub(crate) micro_batches: u64,
    pub(crate) watermark: Option<i64>,
    pub(crate) latest: Option<i64>,
    pub(crate) kept: Vec<RecordBatch>,
    pub(crate) late: Vec<RecordBatch>,
}

/// Counts shown by `\streams` and [`crate::Engine::streams`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) events: AtomicU64,
    pub(crate) late: AtomicU64,
    pub(crate) micro_batches: AtomicU64,
}

/// A stream: its declaration, what waits, what it keeps, and its views.
#[derive(Debug)]
pub struct Stream {
    pub(crate) config: StreamConfig,
    pub(crate) gpu: Option<Arc<GpuContext>>,
    ingest: Mutex<Ingest>,
    pub(crate) kept: Mutex<Vec<Kept>>,
    /// Held while a micro-batch is flushed: flushes happen one at a time.
    pub(crate) flushing: tokio::sync::Mutex<()>,
    /// Why the flush timer's last flush failed, for the next push or flush to report.
    timed_failure: Mutex<Option<String>>,
    pub(crate) counters: Counters,
}

impl Stream {
    pub(crate) fn new(config: StreamConfig, gpu: Option<Arc<GpuContext>>) -> Self {
        Stream {
            config,
            gpu,
            ingest: Mutex::new(Ingest::default()),
            kept: Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(()),
            timed_failure: Mutex::new(None),
            counters: Counters::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ingest> {
        self.ingest.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_kept(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps why a flush of the timer failed.
    pub(crate) fn note_timed_failure(&self, message: String) {
        *self.timed_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
    }

    /// Why the flush timer's last flush failed, while no push or flush has reported it.
    pub(crate) fn pending_timed_failure(&self) -> Option<String> {
        self.timed_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The failure of a flush of the timer since the last call, as an error.
    pub(crate) fn timed_failure(&self) -> Result<()> {
        let failure = self
            .timed_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failure {
            None => Ok(()),
            Some(message) => Err(SpateError::Execution {
                message: format!(
                    "a micro-batch of stream '{}' cut by its flush interval failed: {message}",
                    self.config.name
                ),
            }),
        }
    }

    /// A new writer's id.
    pub(crate) fn add_writer(&self) -> u64 {
        let mut ingest = self.lock();
        let id = ingest.next_writer;
        ingest.next_writer += 1;
        let inherited = ingest.inherited.take();
        ingest.writers.insert(
            id,
            Writer {
                latest: inherited,
                last_push: Instant::now(),
                finished: false,
                detached: false,
            },
        );
        id
    }

    /// Ends writer `id`: it no longer holds the watermark back, and once every writer has
    /// finished the watermark passes every event time.
    pub(crate) fn finish_writer(&self, id: u64) {
        let mut ingest = self.lock();
        if let Some(w) = ingest.writers.get_mut(&id) {
            w.finished = true;
        }
        self.advance_watermark(&mut ingest, Instant::now());
    }

    /// A writer dropped without finishing stops holding the watermark back (and goes: the
    /// latest time it sent is in the stream's latest).
    pub(crate) fn detach_writer(&self, id: u64) {
        let mut ingest = self.lock();
        ingest.writers.remove(&id);
        // A stream whose other writers all finished ends now.
        self.advance_watermark(&mut ingest, Instant::now());
    }

    /// The watermark writers other than `except` allow, before lateness: the lowest
    /// `latest - delay` of those still sending, or `None` when none holds it back.
    fn held_by_others(&self, ingest: &Ingest, except: Option<u64>, now: Instant) -> Option<i64> {
        ingest
            .writers
            .iter()
            .filter(|(id, w)| Some(**id) != except && self.holds_back(w, now))
            .filter_map(|(_, w)| w.latest)
            .map(|t| t.saturating_sub(self.config.delay))
            .min()
    }

    fn holds_back(&self, w: &Writer, now: Instant) -> bool {
        let idle = self
            .config
            .idle_timeout
            .is_some_and(|limit| now.duration_since(w.last_push) > limit);
        !w.finished && !w.detached && !idle && w.latest.is_some()
    }

    /// Moves the watermark as far as the writers allow (never back).
    fn advance_watermark(&self, ingest: &mut Ingest, now: Instant) {
        let all_finished = ingest.writers.values().any(|w| w.finished)
            && ingest.writers.values().all(|w| w.finished || w.detached);
        let allowed = if all_finished {
            Some(i64::MAX)
        } else {
            // With nobody holding it back, the latest time accepted sets it.
            self.held_by_others(ingest, None, now)
                .or_else(|| ingest.latest.map(|t| t.saturating_sub(self.config.delay)))
                .map(|w| w.saturating_sub(self.config.lateness))
        };
        if allowed > ingest.watermark {
            ingest.watermark = allowed;
        }
    }

    /// The watermark now, in ticks (`None` before any event); idle writers are let go here.
    pub(crate) fn watermark(&self) -> Option<i64> {
        let mut ingest = self.lock();
        self.advance_watermark(&mut ingest, Instant::now());
        ingest.watermark
    }

    /// The watermark as the last micro-batch was cut: every row below it is in the kept rows.
    pub(crate) fn cut_watermark(&self) -> Option<i64> {
        self.lock().cut_watermark
    }

    /// The latest event time accepted.
    pub(crate) fn latest(&self) -> Option<i64> {
        self.lock().latest
    }

    /// Rows waiting for the next micro-batch.
    pub(crate) fn waiting_rows(&self) -> usize {
        self.lock().waiting.iter().map(RecordBatch::num_rows).sum()
    }

    /// The late rows so far.
    pub(crate) fn late_batches(&self) -> Vec<RecordBatch> {
        self.lock().late.clone()
    }

    /// `batch` with the stream's columns, by name, cast where the types differ.
    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let schema = &self.config.schema;
        if batch.schema().fields() == schema.fields() {
            return Ok(RecordBatch::try_new(
                Arc::clone(schema),
                batch.columns().to_vec(),
            )?);
        }
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                let (i, _) = batch.schema().column_with_name(f.name()).ok_or_else(|| {
                    SpateError::Config {
                        message: format!(
                            "a batch pushed to stream '{}' has no column '{}'",
                            self.config.name,
                            f.name()
                        ),
                    }
                })?;
                let column = batch.column(i);
                if column.data_type() == f.data_type() {
                    Ok(Arc::clone(column))
                } else {
                    cast(column, f.data_type()).map_err(|e| SpateError::Config {
                        message: format!(
                            "column '{}' pushed to stream '{}' is {}, and cannot be read as {}: \
                             {e}",
                            f.name(),
                            self.config.name,
                            column.data_type(),
                            f.data_type()
                        ),
                    })
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    /// Takes `batch` from writer `writer`: late rows to the side table, the others to wait for
    /// the next micro-batch. True when a micro-batch is due.
    pub(crate) fn accept(&self, writer: u64, batch: RecordBatch) -> Result<bool> {
        let batch = self.conform(batch)?;
        let times = cast(batch.column(self.config.time_column), &DataType::Int64)?;
        let times =
            times
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| SpateError::Internal {
                    message: "an event-time column that did not cast to Int64".into(),
                })?;
        let now = Instant::now();
        let mut ingest = self.lock();
        let floor = ingest.watermark;
        let others = self.held_by_others(&ingest, Some(writer), now);
        let Some(state) = ingest.writers.get(&writer) else {
            return Err(SpateError::Config {
                message: format!(
                    "writer {writer} of stream '{}' has finished",
                    self.config.name
                ),
            });
        };
        let mut running = state.latest;
        let (delay, lateness) = (self.config.delay, self.config.lateness);
        let mut on_time = Vec::with_capacity(times.len());
        for i in 0..times.len() {
            let mine = running.map(|t| t.saturating_sub(delay));
            let held = match (others, mine) {
                (Some(o), Some(m)) => Some(o.min(m)),
                (o, m) => o.or(m),
            };
            let threshold = held.map(|h| h.saturating_sub(lateness)).max(floor);
            let keep = times.is_valid(i) && threshold.is_none_or(|th| times.value(i) >= th);
            if keep {
                let t = times.value(i);
                running = Some(running.map_or(t, |r| r.max(t)));
            }
            on_time.push(keep);
        }
        let mask = BooleanArray::from(on_time);
        let kept = filter_record_batch(&batch, &mask)?;
        let late = filter_record_batch(&batch, &arrow::compute::not(&mask)?)?;
        if let Some(state) = ingest.writers.get_mut(&writer) {
            state.latest = running;
            state.last_push = now;
        }
        ingest.latest = ingest.latest.max(running);
        self.counters
            .events
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        ingest.arrived += batch.num_rows();
        if late.num_rows() > 0 {
            self.counters
                .late
                .fetch_add(late.num_rows() as u64, Ordering::Relaxed);
            ingest.late.push(late);
        }
        if kept.num_rows() > 0 {
            ingest.oldest_waiting.get_or_insert(now);
            ingest.waiting.push(kept);
        }
        self.advance_watermark(&mut ingest, now);
        Ok(self.due(&ingest, now))
    }

    fn due(&self, ingest: &Ingest, now: Instant) -> bool {
        ingest.arrived >= self.config.flush_rows.max(1)
            || ingest.oldest_waiting.is_some_and(|t| {
                self.config
                    .flush_interval
                    .is_some_and(|limit| now.duration_since(t) >= limit)
            })
    }

    /// True when the rows waiting are due to be flushed (the timer's question).
    pub(crate) fn is_due(&self) -> bool {
        let ingest = self.lock();
        self.due(&ingest, Instant::now())
    }

    /// Takes the waiting rows as one micro-batch and keeps it (uploaded once on a GPU
    /// backend). Returns it, as kept (`None` when no row was waiting).
    pub(crate) async fn take_micro_batch(&self) -> Result<Option<Kept>> {
        let waiting = {
            let mut ingest = self.lock();
            self.advance_watermark(&mut ingest, Instant::now());
            ingest.cut_watermark = ingest.watermark;
            ingest.arrived = 0;
            ingest.oldest_waiting = None;
            std::mem::take(&mut ingest.waiting)
        };
        if waiting.is_empty() {
            return Ok(None);
        }
        let batch = concat_batches(&self.config.schema, &waiting)?;
        let kept = self.keep(batch, false).await?;
        self.counters.micro_batches.fetch_add(1, Ordering::Relaxed);
        Ok(Some(kept))
    }

    /// Keeps `batch` for the views: uploaded once on a GPU backend. `carried`: rows kept for
    /// the views' LAGs when their micro-batches went.
    pub(crate) async fn keep(&self, batch: RecordBatch, carried: bool) -> Result<Kept> {
        let count = batch.num_rows();
        let times = cast(batch.column(self.config.time_column), &DataType::Int64)?;
        let latest =
            arrow::compute::max(times.as_any().downcast_ref::<Int64Array>().ok_or_else(|| {
                SpateError::Internal {
                    message: "an event-time column that did not cast to Int64".into(),
                }
            })?)
            .unwrap_or(i64::MIN);
        let kept = match &self.gpu {
            Some(gpu) => {
                let gpu = Arc::clone(gpu);
                let schema = Arc::clone(&self.config.schema);
                let table = tokio::task::spawn_blocking(move || {
                    DeviceTable::load(&gpu, schema, vec![vec![batch]], usize::MAX, Vec::new())
                        .map(|t| (Arc::new(t), gpu))
                })
                .await
                .map_err(|e| SpateError::Internal {
                    message: format!("uploading a micro-batch stopped: {e}"),
                })??;
                let (table, gpu) = table;
                let spillable: std::sync::Weak<dyn crate::exec::coordinator::Spillable> =
                    Arc::downgrade(&table) as _;
                gpu.register_spillable(spillable);
                Kept {
                    bytes: table.device_bytes(),
                    rows: Rows::Device(table),
                    count,
                    latest,
                    carried,
                }
            }
            None => Kept {
                bytes: batch.get_array_memory_size(),
                rows: Rows::Host(batch),
                count,
                latest,
                carried,
            },
        };
        self.lock_kept().push(kept.clone());
        Ok(kept)
    }

    /// What a checkpoint saves of the stream: the rows kept and those waiting (pushed since
    /// the checkpoint's flush), with the counts and the watermark as they stand together.
    pub(crate) fn snapshot(&self) -> Result<StreamSnapshot> {
        let kept = self.lock_kept();
        let ingest = self.lock();
        let mut rows = Vec::with_capacity(kept.len() + ingest.waiting.len());
        for k in kept.iter() {
            match &k.rows {
                Rows::Host(b) => rows.push(b.clone()),
                Rows::Device(t) => rows.extend(t.to_host()?),
            }
        }
        rows.extend(ingest.waiting.iter().cloned());
        Ok(StreamSnapshot {
            events: self.counters.events.load(Ordering::Relaxed),
            micro_batches: self.counters.micro_batches.load(Ordering::Relaxed),
            watermark: ingest.watermark,
            latest: ingest.latest,
            kept: rows,
            late: ingest.late.clone(),
        })
    }

    /// Puts a checkpoint's state back into a stream with no rows and no writers yet. The next
    /// writer carries on from the latest event time the old writers had sent.
    pub(crate) async fn restore(&self, snapshot: StreamSnapshot) -> Result<()> {
        {
            let mut ingest = self.lock();
            if !ingest.writers.is_empty() || ingest.watermark.is_some() {
                return Err(SpateError::Config {
                    message: format!(
                        "stream '{}' has taken rows already; restore into a new session",
                        self.config.name
                    ),
                });
            }
            ingest.watermark = snapshot.watermark;
            ingest.cut_watermark = snapshot.watermark;
            ingest.latest = snapshot.latest;
            ingest.inherited = snapshot.latest;
            let late: u64 = snapshot.late.iter().map(|b| b.num_rows() as u64).sum();
            ingest.late = snapshot.late;
            self.counters.late.store(late, Ordering::Relaxed);
            self.counters
                .events
                .store(snapshot.events, Ordering::Relaxed);
            self.counters
                .micro_batches
                .store(snapshot.micro_batches, Ordering::Relaxed);
        }
        for batch in snapshot.kept {
            if batch.num_rows() > 0 {
                self.keep(batch, false).await?;
            }
        }
        Ok(())
    }

    /// Takes out the kept micro-batches (and carried rows) whose latest time is below
    /// `keep_from`, and returns them.
    pub(crate) fn take_before(&self, keep_from: i64) -> Vec<Kept> {
        let mut kept = self.lock_kept();
        let (old, young): (Vec<Kept>, Vec<Kept>) =
            kept.drain(..).partition(|k| k.latest < keep_from);
        *kept = young;
        old
    }

    /// Puts back micro-batches taken out by [`Stream::take_before`].
    pub(crate) fn put_back(&self, parts: Vec<Kept>) {
        self.lock_kept().extend(parts);
    }

    /// A table of `parts` of the stream's rows, for a query over them.
    pub(crate) fn table_of(self: &Arc<Self>, parts: Vec<Kept>) -> KeptTable {
        KeptTable {
            stream: Arc::clone(self),
            parts,
        }
    }
}

/// The stream read as a table: the rows it keeps. `INSERT INTO` pushes rows (`sink.rs`).
#[derive(Debug)]
pub(crate) struct StreamTable {
    pub(crate) stream: Arc<Stream>,
    pub(crate) catalog: std::sync::Weak<super::Catalog>,
}

#[async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.stream.config.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(datafusion::error::DataFusionError::Plan(format!(
                "stream '{}' takes rows appended (INSERT INTO), not {insert_op}",
                self.stream.config.name
            )));
        }
        let sink = super::sink::StreamSink {
            stream: Arc::clone(&self.stream),
            catalog: std::sync::Weak::clone(&self.catalog),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let kept = self.stream.lock_kept().clone();
        scan_kept(&self.stream, kept, state, projection, filters, limit).await
    }
}

/// Some of a stream's kept rows as a table (the micro-batches a LAG's latest rows are taken
/// from).
#[derive(Debug)]
pub(crate) struct KeptTable {
    stream: Arc<Stream>,
    parts: Vec<Kept>,
}

#[async_trait]
impl TableProvider for KeptTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.stream.config.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        scan_kept(
            &self.stream,
            self.parts.clone(),
            state,
            projection,
            filters,
            limit,
        )
        .await
    }
}

/// A scan of `kept` micro-batches of `stream`: their device batches handed to the GPU
/// operators on a GPU backend, a memory scan on the CPU.
async fn scan_kept(
    stream: &Stream,
    kept: Vec<Kept>,
    state: &dyn Session,
    projection: Option<&Vec<usize>>,
    filters: &[Expr],
    limit: Option<usize>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let schema = Arc::clone(&stream.config.schema);
    match &stream.gpu {
        Some(gpu) => {
            let parts: Vec<Arc<DeviceTable>> = kept
                .iter()
                .filter_map(|k| match &k.rows {
                    Rows::Device(t) => Some(Arc::clone(t)),
                    Rows::Host(_) => None,
                })
                .collect();
            let table = DeviceTable::merged(gpu, schema, &parts)
                .map_err(datafusion::error::DataFusionError::from)?;
            Ok(Arc::new(GpuCachedScanExec::new(
                Arc::new(table),
                projection.cloned(),
            )?))
        }
        None => {
            let batches = kept
                .iter()
                .filter_map(|k| match &k.rows {
                    Rows::Host(b) => Some(b.clone()),
                    Rows::Device(_) => None,
                })
                .collect();
            MemTable::try_new(schema, vec![batches])?
                .scan(state, projection, filters, limit)
                .await
        }
    }
}

/// Rows held on the host, read when a query scans them: a stream's late rows
/// (`<stream>$late`) and what a continuous view has emitted.
pub(crate) struct HostRowsTable {
    schema: SchemaRef,
    table_type: TableType,
    rows: Box<dyn Fn() -> Vec<RecordBatch> + Send + Sync>,
}

impl HostRowsTable {
    pub(crate) fn new(
        schema: SchemaRef,
        table_type: TableType,
        rows: impl Fn() -> Vec<RecordBatch> + Send + Sync + 'static,
    ) -> Self {
        HostRowsTable {
            schema,
            table_type,
            rows: Box::new(rows),
        }
    }
}

impl std::fmt::Debug for HostRowsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRowsTable")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl TableProvider for HostRowsTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        self.table_type
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        MemTable::try_new(self.schema(), vec![(self.rows)()])?
            .scan(state, projection, filters, limit)
            .await
    }
}
