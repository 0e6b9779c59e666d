//! Streaming SQL: streams with watermarks, window table functions, and continuous views whose
//! results are emitted as micro-batches arrive (see `docs/streaming.md`).
//!
//! - `crate::rewrite`: `CREATE STREAM`, `CREATE CONTINUOUS VIEW`, `CHECKPOINT` and `RESTORE`,
//!   rewritten for DataFusion's parser;
//! - `interval.rs`: durations in those statements and their options;
//! - `windows.rs`: `TUMBLE`, `HOP` and `SESSION` in `FROM`;
//! - `state.rs`: a stream's writers, watermark, late rows and kept micro-batches;
//! - `view.rs`: continuous views and their emit modes;
//! - `sink.rs`: `INSERT INTO` a stream;
//! - `checkpoint.rs`: `CHECKPOINT` and `RESTORE`;
//! - `tail.rs`: a folder of files tailed into a stream;
//! - this file: the session's streams and views, and the embedding API
//!   ([`StreamWriter`], [`Subscription`]).

pub mod checkpoint;
pub mod feed;
pub mod interval;
mod join;
mod panes;
mod sink;
pub mod state;
pub mod tail;
pub mod view;
pub mod windows;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, Set, SqlOption, Statement as SqlStatement,
};
use tokio::sync::mpsc::Receiver;

use crate::device::GpuContext;
use crate::error::{Result, SpateError};
pub use checkpoint::CheckpointStream;
use datafusion::common::Column;
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::{Expr, ExprFunctionExt, lit};
pub use feed::Feed;
pub use state::StreamConfig;
use state::{HostRowsTable, Stream, StreamTable};
pub use tail::FolderTail;
pub use view::Emit;
use view::{ContinuousView, LatestRows};
pub use windows::{WindowFunctionKind, WindowTableFunction};

/// Default rows per micro-batch.
pub const DEFAULT_FLUSH_ROWS: usize = 65_536;
/// Default age of the oldest waiting row at which a micro-batch is cut.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(10);

/// A stream's state as `\streams` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// The stream's name.
    pub name: String,
    /// The event-time column.
    pub time_column: String,
    /// The watermark, as microseconds since the epoch (`None` before any event; `i64::MAX`
    /// once every writer finished).
    pub watermark_micros: Option<i64>,
    /// The latest event time accepted less the watermark, in microseconds.
    pub lag_micros: Option<i64>,
    /// Rows pushed.
    pub events: u64,
    /// Rows sent to `<stream>$late`.
    pub late_rows: u64,
    /// Micro-batches cut.
    pub micro_batches: u64,
    /// Rows waiting for the next micro-batch.
    pub waiting_rows: usize,
    /// Rows kept for the views, and their bytes (device bytes on a GPU backend).
    pub kept_rows: usize,
    pub kept_bytes: usize,
    /// The continuous views reading it.
    pub views: Vec<String>,
    /// Those of its views that keep their window state as panes (`panes.rs`), with the rows
    /// of state each holds.
    pub pane_rows: Vec<(String, usize)>,
    /// Why a micro-batch cut by the flush interval failed, until a push or flush reports it.
    pub timed_failure: Option<String>,
}

/// The streams and continuous views of a session.
pub(crate) struct Catalog {
    ctx: SessionContext,
    gpu: Option<Arc<GpuContext>>,
    streams: Mutex<HashMap<String, Arc<Stream>>>,
    views: Mutex<HashMap<String, Arc<ContinuousView>>>,
    /// The statements that declared them, in order, for a checkpoint.
    statements: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

fn option_text(options: &CreateTableOptions) -> HashMap<String, String> {
    let list: &[SqlOption] = match options {
        CreateTableOptions::With(o)
        | CreateTableOptions::Options(o)
        | CreateTableOptions::Plain(o)
        | CreateTableOptions::TableProperties(o) => o,
        CreateTableOptions::None => &[],
    };
    list.iter()
        .filter_map(|o| match o {
            SqlOption::KeyValue { key, value } => {
                let text = value.to_string();
                let text = text
                    .strip_prefix('\'')
                    .and_then(|t| t.strip_suffix('\''))
                    .map(|t| t.replace("''", "'"))
                    .unwrap_or(text);
                Some((key.value.to_ascii_lowercase(), text))
            }
            _ => None,
        })
        .collect()
}

/// A file or folder a stream reads or writes that failed, and why.
pub(crate) fn source_error(path: &std::path::Path, message: impl std::fmt::Display) -> SpateError {
    SpateError::Source {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// A table name as the catalog holds it: unquoted letters in lower case (DataFusion's rule).
fn normalized(name: &str) -> String {
    datafusion::common::TableReference::from(name)
        .table()
        .to_string()
}

fn config_error(message: String) -> SpateError {
    SpateError::Config { message }
}

impl Catalog {
    pub(crate) fn new(ctx: SessionContext, gpu: Option<Arc<GpuContext>>) -> Self {
        Catalog {
            ctx,
            gpu,
            streams: Mutex::new(HashMap::new()),
            views: Mutex::new(HashMap::new()),
            statements: Mutex::new(Vec::new()),
        }
    }

    fn lock_streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_views(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ContinuousView>>> {
        self.views.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn statements(&self) -> Vec<String> {
        self.statements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn record(&self, statement: &SqlStatement) {
        self.statements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(statement.to_string());
    }

    pub(crate) fn sorted_streams(&self) -> Vec<Arc<Stream>> {
        let mut streams: Vec<Arc<Stream>> = self.lock_streams().values().cloned().collect();
        streams.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        streams
    }

    pub(crate) fn sorted_views(&self) -> Vec<Arc<ContinuousView>> {
        let mut views: Vec<Arc<ContinuousView>> = self.lock_views().values().cloned().collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        views
    }

    /// Runs `statement` when it is one of Spate's streaming statements (see `crate::rewrite`), giving
    /// its result; `None` for any other.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        statement: &SqlStatement,
    ) -> Result<Option<DataFrame>> {
        match statement {
            SqlStatement::Set(Set::SingleAssignment {
                variable, values, ..
            }) => {
                let name = variable.to_string().to_ascii_lowercase();
                let restore = name == crate::rewrite::RESTORE_VARIABLE;
                if name != crate::rewrite::CHECKPOINT_VARIABLE && !restore {
                    return Ok(None);
                }
                let folder = match values.as_slice() {
                    [value] => {
                        let text = value.to_string();
                        text.strip_prefix('\'')
                            .and_then(|t| t.strip_suffix('\''))
                            .map(|t| t.replace("''", "'"))
                            .unwrap_or(text)
                    }
                    _ => return Err(config_error("CHECKPOINT takes one folder".into())),
                };
                let folder = std::path::Path::new(&folder);
                let report = if restore {
                    // A restore runs the checkpoint's statements through `execute` again.
                    Box::pin(self.restore(folder)).await?
                } else {
                    self.checkpoint(folder).await?
                };
                Ok(Some(self.checkpoint_report(&report)?))
            }
            SqlStatement::CreateTable(create) => {
                let options = option_text(&create.table_options);
                let Some(time) = options.get(crate::rewrite::STREAM_OPTION).cloned() else {
                    return Ok(None);
                };
                let mut plain = create.clone();
                plain.table_options = CreateTableOptions::None;
                let state = self.ctx.state();
                let plan = state
                    .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
                        SqlStatement::CreateTable(plain),
                    )))
                    .await?;
                let datafusion::logical_expr::LogicalPlan::Ddl(
                    datafusion::logical_expr::DdlStatement::CreateMemoryTable(table),
                ) = plan
                else {
                    return Err(config_error(
                        "CREATE STREAM takes column definitions, not a query".into(),
                    ));
                };
                let schema: SchemaRef = Arc::new(table.input.schema().as_arrow().clone());
                self.create_stream(table.name.table(), schema, &time, &options)?;
                self.record(statement);
                Ok(Some(self.done()?))
            }
            SqlStatement::CreateView(create) => {
                let options = option_text(&create.options);
                let Some(mode) = options.get(crate::rewrite::EMIT_OPTION) else {
                    return Ok(None);
                };
                let emit = if mode == "update" {
                    Emit::OnUpdate
                } else {
                    Emit::OnWindowClose
                };
                let query = datafusion::sql::parser::Statement::Statement(Box::new(
                    SqlStatement::Query(create.query.clone()),
                ));
                let plan = self.ctx.state().statement_to_plan(query).await?;
                self.create_view(&normalized(&create.name.to_string()), plan, emit)
                    .await?;
                self.record(statement);
                Ok(Some(self.done()?))
            }
            _ => Ok(None),
        }
    }

    /// Declares stream `name` with `schema`, its event time `time` and the `options` of
    /// `CREATE STREAM … WITH (…)`.
    pub(crate) fn create_stream(
        self: &Arc<Self>,
        name: &str,
        schema: SchemaRef,
        time: &str,
        options: &HashMap<String, String>,
    ) -> Result<()> {
        let (time_column, field) = schema
            .fields()
            .iter()
            .enumerate()
            .find(|(_, f)| f.name() == time || f.name().eq_ignore_ascii_case(time))
            .ok_or_else(|| config_error(format!("stream '{name}' has no column '{time}'")))?;
        let DataType::Timestamp(unit, _) = field.data_type() else {
            return Err(config_error(format!(
                "stream '{name}': the watermark column '{time}' is {}, not a timestamp",
                field.data_type()
            )));
        };
        let micros = |key: &str| -> Result<Option<i64>> {
            options
                .get(key)
                .map(|v| interval::parse_duration_micros(v))
                .transpose()
        };
        let known = [
            crate::rewrite::STREAM_OPTION,
            crate::rewrite::DELAY_OPTION,
            "lateness",
            "idle_timeout",
            "flush_rows",
            "flush_interval",
        ];
        if let Some(unknown) = options.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(config_error(format!(
                "stream '{name}': unknown option '{unknown}' (lateness, idle_timeout, \
                 flush_rows, flush_interval)"
            )));
        }
        let delay = options
            .get(crate::rewrite::DELAY_OPTION)
            .map(|d| d.parse::<i64>())
            .transpose()
            .map_err(|_| config_error("a watermark delay that is not a number".into()))?
            .unwrap_or(0);
        let flush_rows = options
            .get("flush_rows")
            .map(|r| r.parse::<usize>())
            .transpose()
            .map_err(|_| config_error(format!("stream '{name}': flush_rows must be a row count")))?
            .unwrap_or(DEFAULT_FLUSH_ROWS);
        let duration = |m: Option<i64>| m.map(|m| Duration::from_micros(m.unsigned_abs()));
        let config = StreamConfig {
            name: name.to_string(),
            schema: Arc::clone(&schema),
            time_column,
            unit: *unit,
            delay: state::micros_to_ticks(*unit, delay),
            lateness: state::micros_to_ticks(*unit, micros("lateness")?.unwrap_or(0)),
            idle_timeout: duration(micros("idle_timeout")?),
            flush_rows,
            flush_interval: duration(micros("flush_interval")?).or(Some(DEFAULT_FLUSH_INTERVAL)),
        };
        let key = name.to_string();
        if self.lock_streams().contains_key(&key) || self.ctx.table_exist(name)? {
            return Err(config_error(format!(
                "a table or stream named '{name}' exists already"
            )));
        }
        let stream = Arc::new(Stream::new(config, self.gpu.clone()));
        self.ctx.register_table(
            name,
            Arc::new(StreamTable {
                stream: Arc::clone(&stream),
                catalog: Arc::downgrade(self),
            }),
        )?;
        self.ctx.register_table(
            datafusion::common::TableReference::bare(format!("{name}$late")),
            Arc::new(HostRowsTable::new(
                Arc::clone(&stream.config.schema),
                datafusion::datasource::TableType::Base,
                {
                    let stream = Arc::clone(&stream);
                    move || stream.late_batches()
                },
            )),
        )?;
        self.lock_streams().insert(key, Arc::clone(&stream));
        self.start_timer(&stream);
        Ok(())
    }

    /// Flushes `stream` whenever its oldest waiting row reaches the flush interval, while the
    /// catalog lives (it holds only a weak reference).
    fn start_timer(self: &Arc<Self>, stream: &Arc<Stream>) {
        let Some(interval) = stream.config.flush_interval else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let catalog: Weak<Catalog> = Arc::downgrade(self);
        let stream = Arc::downgrade(stream);
        let tick = interval.max(Duration::from_micros(100));
        handle.spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let (Some(catalog), Some(stream)) = (catalog.upgrade(), stream.upgrade()) else {
                    return;
                };
                if stream.is_due()
                    && let Err(e) = catalog.flush(&stream).await
                {
                    // Nobody waits on the timer: the next push or flush reports it.
                    stream.note_timed_failure(e.to_string());
                }
            }
        });
    }

    async fn create_view(
        &self,
        name: &str,
        plan: datafusion::logical_expr::LogicalPlan,
        emit: Emit,
    ) -> Result<()> {
        if self.lock_views().contains_key(name) || self.ctx.table_exist(name)? {
            return Err(config_error(format!(
                "a table or view named '{name}' exists already"
            )));
        }
        let view = Arc::new(ContinuousView::new(name.to_string(), plan, emit)?);
        // Other views' retention has let go of rows the new view's open windows would need.
        if let Some(busy) = view
            .streams
            .iter()
            .find(|s| s.counters.events.load(std::sync::atomic::Ordering::Relaxed) > 0)
        {
            return Err(config_error(format!(
                "stream '{}' has taken rows already: create continuous view '{name}' before \
                 rows are pushed (or in a new session, with RESTORE)",
                busy.config.name
            )));
        }
        self.ctx.register_table(
            name,
            Arc::new(HostRowsTable::new(
                view.schema(),
                datafusion::datasource::TableType::View,
                {
                    let view = Arc::clone(&view);
                    move || view.history()
                },
            )),
        )?;
        self.lock_views()
            .insert(name.to_string(), Arc::clone(&view));
        Ok(())
    }

    pub(crate) fn stream(&self, name: &str) -> Result<Arc<Stream>> {
        self.lock_streams()
            .get(&normalized(name))
            .cloned()
            .ok_or_else(|| {
                config_error(format!(
                    "no stream named '{name}' (CREATE STREAM {name} (…, WATERMARK FOR …) makes one)"
                ))
            })
    }

    pub(crate) fn view(&self, name: &str) -> Result<Arc<ContinuousView>> {
        self.lock_views()
            .get(&normalized(name))
            .cloned()
            .ok_or_else(|| {
                config_error(format!(
                    "no continuous view named '{name}' (CREATE CONTINUOUS VIEW {name} AS … makes \
                 one)"
                ))
            })
    }

    /// What a declaration returns: no rows, as DataFusion's DDL.
    fn done(&self) -> Result<DataFrame> {
        let empty = datafusion::logical_expr::LogicalPlan::EmptyRelation(
            datafusion::logical_expr::EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(datafusion::common::DFSchema::empty()),
            },
        );
        Ok(DataFrame::new(self.ctx.state(), empty))
    }

    /// `(stream, events, watermark)` per stream of a checkpoint.
    fn checkpoint_report(&self, streams: &[CheckpointStream]) -> Result<DataFrame> {
        use arrow::array::{ArrayRef, Int64Array, StringArray, UInt64Array};
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("stream", DataType::Utf8, false),
            arrow::datatypes::Field::new("events", DataType::UInt64, false),
            arrow::datatypes::Field::new("watermark", DataType::Int64, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                streams.iter().map(|s| s.name.as_str()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                streams.iter().map(|s| s.events),
            )),
            Arc::new(Int64Array::from_iter(streams.iter().map(|s| s.watermark))),
        ];
        Ok(self
            .ctx
            .read_batch(RecordBatch::try_new(schema, columns)?)?)
    }

    /// Cuts a micro-batch of `stream`'s waiting rows and advances every view reading it, then
    /// lets go of the rows no view needs.
    pub(crate) async fn flush(&self, stream: &Arc<Stream>) -> Result<()> {
        let _one_at_a_time = stream.flushing.lock().await;
        self.flush_locked(stream).await
    }

    /// [`Catalog::flush`], with the stream's flush lock held by the caller.
    pub(crate) async fn flush_locked(&self, stream: &Arc<Stream>) -> Result<()> {
        let taken = stream.take_micro_batch().await?;
        let views: Vec<Arc<ContinuousView>> = self
            .lock_views()
            .values()
            .filter(|v| v.streams.iter().any(|s| Arc::ptr_eq(s, stream)))
            .cloned()
            .collect();
        // A view that fails leaves the others to advance and the retention to run; the rows
        // were taken, so the error says so (pushing them again would repeat them).
        let mut failure = None;
        for view in &views {
            if let Err(e) = view.advance(&self.ctx, taken.as_ref()).await {
                failure.get_or_insert(SpateError::Execution {
                    message: format!(
                        "continuous view '{}' failed on a micro-batch of stream '{}' (its rows \
                         were taken): {e}",
                        view.name, stream.config.name
                    ),
                });
            }
        }
        // Every view's horizon bounds what the stream keeps; without views, nothing is kept.
        let keep_from = views
            .iter()
            .map(|v| v.keep_from())
            .try_fold(i64::MAX, |low, k| k.map(|k| low.min(k)));
        // One need per key and order, the most rows asked: two equal row numberings would be
        // merged into one by DataFusion's optimizer, leaving a window without its function.
        let mut latest: Vec<LatestRows> = Vec::new();
        for need in views.iter().flat_map(|v| v.latest_rows().iter()) {
            match latest
                .iter_mut()
                .find(|l| l.keys == need.keys && l.order == need.order)
            {
                Some(l) => l.rows = l.rows.max(need.rows),
                None => latest.push(need.clone()),
            }
        }
        match keep_from {
            Some(keep_from) if latest.is_empty() => drop(stream.take_before(keep_from)),
            Some(keep_from) => self.carry_latest(stream, keep_from, &latest).await?,
            None => {}
        }
        failure.map_or(Ok(()), Err)
    }

    /// Lets go of `stream`'s micro-batches older than `keep_from`, keeping of them each key's
    /// latest rows the views' LAGs read (`latest`): a query over those micro-batches and the
    /// rows carried before, on the session's backend, whose result is kept in their place.
    async fn carry_latest(
        &self,
        stream: &Arc<Stream>,
        keep_from: i64,
        latest: &[LatestRows],
    ) -> Result<()> {
        let old = stream.take_before(keep_from);
        if old.iter().all(|k| k.carried) {
            // Nothing new to let go of: what was carried stays as it is.
            stream.put_back(old);
            return Ok(());
        }
        let column = |name: &str| Expr::Column(Column::from_name(name));
        let mut df = self.ctx.read_table(Arc::new(stream.table_of(old)))?;
        let mut keep: Option<Expr> = None;
        let mut numbers = Vec::new();
        for (i, need) in latest.iter().enumerate() {
            let name = format!("__spate_latest_{i}");
            // Newest first, ties broken as the LAG breaks them, the other way round.
            let order = need
                .order
                .iter()
                .map(|(c, asc)| column(c).sort(!asc, *asc))
                .collect();
            numbers.push(
                row_number()
                    .partition_by(need.keys.iter().map(|k| column(k)).collect())
                    .order_by(order)
                    .build()?
                    .alias(&name),
            );
            let wanted = column(&name).lt_eq(lit(need.rows as u64));
            keep = Some(match keep {
                None => wanted,
                Some(k) => k.or(wanted),
            });
        }
        let originals: Vec<Expr> = stream
            .config
            .schema
            .fields()
            .iter()
            .map(|f| column(f.name()))
            .collect();
        df = df.window(numbers)?;
        if let Some(keep) = keep {
            df = df.filter(keep)?;
        }
        let batches = df.select(originals)?.collect().await?;
        let rows = arrow::compute::concat_batches(&stream.config.schema, &batches)?;
        if rows.num_rows() > 0 {
            stream.keep(rows, true).await?;
        }
        Ok(())
    }

    pub(crate) fn infos(&self) -> Vec<StreamInfo> {
        let streams: Vec<Arc<Stream>> = self.lock_streams().values().cloned().collect();
        let views: Vec<Arc<ContinuousView>> = self.lock_views().values().cloned().collect();
        let mut infos: Vec<StreamInfo> = streams
            .iter()
            .map(|s| {
                let unit = s.config.unit;
                let watermark = s.watermark();
                let kept = s.lock_kept();
                StreamInfo {
                    name: s.config.name.clone(),
                    time_column: s.config.schema.field(s.config.time_column).name().clone(),
                    watermark_micros: watermark.map(|w| {
                        if w == i64::MAX {
                            w
                        } else {
                            state::ticks_to_micros(unit, w)
                        }
                    }),
                    lag_micros: match (s.latest(), watermark) {
                        (Some(l), Some(w)) if w != i64::MAX => {
                            Some(state::ticks_to_micros(unit, l.saturating_sub(w)))
                        }
                        _ => None,
                    },
                    events: s.counters.events.load(std::sync::atomic::Ordering::Relaxed),
                    late_rows: s.counters.late.load(std::sync::atomic::Ordering::Relaxed),
                    micro_batches: s
                        .counters
                        .micro_batches
                        .load(std::sync::atomic::Ordering::Relaxed),
                    waiting_rows: s.waiting_rows(),
                    kept_rows: kept.iter().map(|k| k.count).sum(),
                    kept_bytes: kept.iter().map(|k| k.bytes).sum(),
                    views: {
                        let mut names: Vec<String> = views
                            .iter()
                            .filter(|v| v.streams.iter().any(|x| Arc::ptr_eq(x, s)))
                            .map(|v| v.name.clone())
                            .collect();
                        names.sort();
                        names
                    },
                    pane_rows: {
                        let mut panes: Vec<(String, usize)> = views
                            .iter()
                            .filter(|v| v.streams.iter().any(|x| Arc::ptr_eq(x, s)))
                            .filter_map(|v| v.pane_rows().map(|n| (v.name.clone(), n)))
                            .collect();
                        panes.sort();
                        panes
                    },
                    timed_failure: s.pending_timed_failure(),
                }
            })
            .collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        infos
    }
}

/// Pushes record batches into a stream (`Engine::stream_writer`). Each writer holds the
/// watermark back by its own latest event time; [`StreamWriter::finish`] lets it go.
pub struct StreamWriter {
    catalog: Arc<Catalog>,
    stream: Arc<Stream>,
    id: u64,
    finished: bool,
}

impl std::fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWriter")
            .field("stream", &self.stream.config.name)
            .field("writer", &self.id)
            .finish()
    }
}

impl StreamWriter {
    pub(crate) fn new(catalog: Arc<Catalog>, stream: Arc<Stream>) -> Self {
        let id = stream.add_writer();
        StreamWriter {
            catalog,
            stream,
            id,
            finished: false,
        }
    }

    /// The stream's columns; pushed batches are matched to them by name.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.stream.config.schema)
    }

    /// Pushes `batch`: late rows go to `<stream>$late`, the others into the next
    /// micro-batch, which is cut here when it is due.
    pub async fn push(&self, batch: RecordBatch) -> Result<()> {
        if self.finished {
            return Err(config_error(format!(
                "stream '{}': this writer has finished",
                self.stream.config.name
            )));
        }
        self.stream.timed_failure()?;
        if self.stream.accept(self.id, batch)? {
            self.catalog.flush(&self.stream).await?;
        }
        Ok(())
    }

    /// Cuts a micro-batch of whatever waits now, and advances the views.
    pub async fn flush(&self) -> Result<()> {
        self.stream.timed_failure()?;
        self.catalog.flush(&self.stream).await
    }

    /// Ends this writer and flushes. Once every writer of the stream has finished, the
    /// watermark passes every event time and every window closes.
    pub async fn finish(mut self) -> Result<()> {
        self.finished = true;
        self.stream.finish_writer(self.id);
        self.catalog.flush(&self.stream).await
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.finished {
            self.stream.detach_writer(self.id);
        }
    }
}

/// The results of a continuous view as they are emitted (`Engine::subscribe`): a
/// `futures::Stream` of record batches, ending once every writer of the view's streams has
/// finished and the last rows are out, or when the session ends.
#[derive(Debug)]
pub struct Subscription {
    schema: SchemaRef,
    receiver: Receiver<RecordBatch>,
}

impl Subscription {
    pub(crate) fn new(view: &ContinuousView) -> Self {
        Subscription {
            schema: view.schema(),
            receiver: view.subscribe(),
        }
    }

    /// The schema of the batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The next batch, waiting for it; `None` once the view has emitted its last (every writer
    /// of its streams finished) or is gone.
    pub async fn next_batch(&mut self) -> Option<RecordBatch> {
        self.receiver.recv().await
    }

    /// A batch already emitted, without waiting.
    pub fn try_next_batch(&mut self) -> Option<RecordBatch> {
        self.receiver.try_recv().ok()
    }
}

impl futures::Stream for Subscription {
    type Item = RecordBatch;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RecordBatch>> {
        self.receiver.poll_recv(cx)
    }
}
