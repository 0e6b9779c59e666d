//! Continuous views: a query over streams (and tables) whose results are emitted as the
//! watermark moves.
//!
//! **Final rows.** A view's output must hold `window_end` (a window table function's) or the
//! stream's event-time column (per-event features). A row is final once the watermark `W`
//! passes it: `window_end <= W` (no row still to come falls in the window), or `ts < W` (every
//! row at or before `ts` has arrived). `C` below is the latest final value.
//!
//! **Each micro-batch** runs the view's query over the rows the streams keep, on the session's
//! backend (GPU operators over the micro-batches already on the device), and downloads its
//! result once:
//! - `EMIT ON WINDOW CLOSE` emits the rows that became final, `C_prev < f <= C`;
//! - `EMIT ON UPDATE` emits a changelog: the rows with `f > C_prev` against those it emitted
//!   before and that were not final then. An `op` column says `+` (a row added) or `-` (a row
//!   retracted). Adding up the changelog gives the final rows, which equal the batch query's.
//!
//! **Panes.** A view that aggregates a TUMBLE or HOP window with decomposable aggregates keeps
//! its window state as panes instead (`panes.rs`): each micro-batch is merged into partial
//! aggregates per key and pane, the query reads those, and the stream keeps no rows for it.
//!
//! **Horizon.** The rows a stream must keep for the view follow from its plan: a TUMBLE or HOP
//! window keeps rows `size` behind `C`, a `RANGE BETWEEN INTERVAL … PRECEDING` frame its
//! interval, SESSION windows keep the open sessions (their earliest `window_start`, which the
//! output must then hold). A `LAG` over the stream's rows, keyed and ordered by its columns
//! (time first), keeps each key's latest rows however old ([`LatestRows`]). Frames the
//! watermark cannot bound (`ROWS`, unbounded preceding, a LAG over filtered or joined rows)
//! keep every row.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::row::{OwnedRow, Row, RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{
    Expr, LogicalPlan, WindowFrameBound, WindowFrameUnits, expr::WindowFunction, lit,
};
use datafusion::prelude::SessionContext;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::interval::interval_expr_micros;
use super::panes::Panes;
use super::state::{Kept, Stream, StreamTable, micros_to_ticks};
use super::windows::{Window, WindowedTable};
use crate::error::{Result, SpateError};

/// When a continuous view emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// Final rows, once the watermark closes them.
    OnWindowClose,
    /// A changelog of additions and retractions, every micro-batch.
    OnUpdate,
}

/// How far behind the final bound a view needs its streams' rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Horizon {
    /// This many microseconds.
    Bounded(i64),
    /// The open sessions' earliest start.
    Sessions,
    /// Every row.
    Unbounded,
}

impl Horizon {
    fn widen(self, other: Horizon) -> Horizon {
        use Horizon::*;
        match (self, other) {
            (Unbounded, _) | (_, Unbounded) => Unbounded,
            // The open sessions' floor says nothing of a look-back beside them.
            (Sessions, Bounded(b)) | (Bounded(b), Sessions) if b > 0 => Unbounded,
            (Sessions, _) | (_, Sessions) => Sessions,
            (Bounded(a), Bounded(b)) => Bounded(a.max(b)),
        }
    }
}

/// What a view has emitted, and to whom it sends.
#[derive(Debug, Default)]
struct Emitted {
    /// The latest final value `C` so far, in ticks.
    closed: Option<i64>,
    /// `EMIT ON UPDATE`: the rows emitted that were not final yet, with their multiplicity.
    open: HashMap<OwnedRow, i64>,
    /// The earliest start of an open session (SESSION views).
    session_floor: Option<i64>,
    subscribers: Vec<Sender<RecordBatch>>,
    /// The latest emission's delivery to the subscribers (see [`Delivery`]).
    delivery: Option<Delivery>,
    /// Every writer of the view's streams has finished and everything is emitted: the
    /// subscriptions end.
    ended: bool,
    /// Encodes output rows for `open` (rows of one converter compare only with its own).
    converter: Option<RowConverter>,
    /// The latest emissions (about [`HISTORY_ROWS`]), which reading the view as a table
    /// returns.
    history: Vec<RecordBatch>,
    rows: u64,
}

/// An emission on its way to the subscribers: a task of its own, which waits for the one
/// before (so emissions arrive in order) and for each subscriber's queue to have room. The
/// view's advance waits for it, which holds the stream's micro-batches back while a subscriber
/// does not read (backpressure); an advance given up halfway (its caller cancelled) still
/// delivers.
#[derive(Clone)]
struct Delivery(futures::future::Shared<futures::future::BoxFuture<'static, ()>>);

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Delivery")
    }
}

/// A continuous view.
#[derive(Debug)]
pub struct ContinuousView {
    pub(crate) name: String,
    emit: Emit,
    plan: LogicalPlan,
    /// The query's output schema.
    output: SchemaRef,
    /// What is emitted: the output, with `op` first for `EMIT ON UPDATE`.
    emitted_schema: SchemaRef,
    /// The column that decides when a row is final, and whether it is `window_end` (final at
    /// `<= W`) or the event time (final at `< W`).
    final_column: usize,
    window_end: bool,
    window_start: Option<usize>,
    unit: TimeUnit,
    horizon: Horizon,
    /// How far (in ticks) the final bound stays behind the watermark: a join of two streams'
    /// rows pairs rows that far apart (`join.rs`).
    lookahead: i64,
    /// The latest rows per key its LAGs read, whatever their age.
    latest_rows: Vec<LatestRows>,
    /// Its window state as panes, when it keeps one (`panes.rs`).
    panes: Option<Panes>,
    pub(crate) streams: Vec<Arc<Stream>>,
    state: Mutex<Emitted>,
    /// Held while the view advances: two of its streams flushing at once take turns.
    advancing: tokio::sync::Mutex<()>,
}

fn sql_error(message: String) -> SpateError {
    SpateError::Sql {
        message,
        location: None,
    }
}

/// A view's need for each key's latest rows at or before the final bound, whatever their age:
/// `LAG(x, rows) OVER (PARTITION BY keys ORDER BY ts, …)` over a stream's rows. The stream
/// keeps them when it lets older micro-batches go (`Catalog::carry_latest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatestRows {
    /// The stream's columns the rows are keyed by.
    pub(crate) keys: Vec<String>,
    /// The window's order: the stream's time column first, ascending, then any tie-breakers
    /// (column, ascending).
    pub(crate) order: Vec<(String, bool)>,
    /// How many rows per key.
    pub(crate) rows: usize,
}

/// Whether `plan` gives a stream's rows one for one (projections and window functions over
/// its scan): a key's latest rows in the stream are then its latest rows here.
fn rows_of_one_stream(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => source_as_provider(&scan.source)
            .is_ok_and(|p| p.downcast_ref::<StreamTable>().is_some()),
        LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Window(_) => {
            plan.inputs().len() == 1 && rows_of_one_stream(plan.inputs()[0])
        }
        _ => false,
    }
}

/// What [`inspect`] learns of a plan.
struct Inspected {
    streams: Vec<Arc<Stream>>,
    horizon: Horizon,
    latest: Vec<LatestRows>,
    /// How far (µs) a row of one stream may be from the rows of another it is joined with
    /// (`join.rs`): the final bound stays that far behind the watermark.
    lookahead: i64,
}

/// The streams a plan reads, how far back its windows look, which latest rows per key its
/// `LAG`s need (windows not looked at inside a window table function's plan, whose windows are
/// its own: `frames` false), and how far apart its joins of two streams pair rows.
fn inspect(plan: &LogicalPlan, frames: bool) -> Result<Inspected> {
    let mut streams: Vec<Arc<Stream>> = Vec::new();
    let mut horizon = Horizon::Bounded(0);
    let mut latest: Vec<LatestRows> = Vec::new();
    let mut lookahead = 0_i64;
    let mut failure = None;
    let add_stream = |s: &Arc<Stream>, streams: &mut Vec<Arc<Stream>>| {
        if !streams.iter().any(|x| Arc::ptr_eq(x, s)) {
            streams.push(Arc::clone(s));
        }
    };
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(scan) => {
                if let Ok(provider) = source_as_provider(&scan.source) {
                    if let Some(table) = provider.downcast_ref::<StreamTable>() {
                        add_stream(&table.stream, &mut streams);
                    } else if let Some(windowed) = provider.downcast_ref::<WindowedTable>() {
                        horizon = horizon.widen(match windowed.window() {
                            Window::Tumble { size } | Window::Hop { size, .. } => {
                                Horizon::Bounded(size)
                            }
                            Window::Session { .. } => Horizon::Sessions,
                        });
                        // The streams under the window function.
                        let inner = inspect(windowed.plan(), false)?.streams;
                        for s in &inner {
                            add_stream(s, &mut streams);
                        }
                    }
                }
            }
            LogicalPlan::Join(join) => {
                let left = inspect(&join.left, false)?.streams;
                let right = inspect(&join.right, false)?.streams;
                if !left.is_empty() && !right.is_empty() {
                    match super::join::time_bound(join) {
                        // Chained joins add up: a row may pair with one `m1` away, which
                        // pairs with one `m2` further.
                        Ok(m) => lookahead = lookahead.saturating_add(m),
                        Err(e) => {
                            failure = Some(e);
                            return Ok(TreeNodeRecursion::Stop);
                        }
                    }
                }
            }
            LogicalPlan::Window(window) if frames => {
                let one_for_one = rows_of_one_stream(&window.input);
                for e in &window.window_expr {
                    match frame_look_back(e) {
                        Ok((_, Some(need))) if one_for_one => latest.push(need),
                        Ok((h, _)) => horizon = horizon.widen(h),
                        Err(e) => {
                            failure = Some(e);
                            return Ok(TreeNodeRecursion::Stop);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    // A LAG keyed and ordered by the stream's own columns, on its time first.
    if !latest.is_empty() {
        let valid = match streams.as_slice() {
            [stream] => {
                let schema = &stream.config.schema;
                let time = schema.field(stream.config.time_column).name();
                latest.iter().all(|need| {
                    need.order.first().is_some_and(|(c, asc)| c == time && *asc)
                        && need
                            .keys
                            .iter()
                            .chain(need.order.iter().map(|(c, _)| c))
                            .all(|c| schema.column_with_name(c).is_some())
                })
            }
            _ => false,
        };
        if !valid {
            latest.clear();
            horizon = Horizon::Unbounded;
        }
    }
    latest.dedup();
    Ok(Inspected {
        streams,
        horizon,
        latest,
        lookahead,
    })
}

/// Whether `plan` reads a stream (directly or through a window table function).
fn reads_stream(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Ok(p) = source_as_provider(&scan.source)
            && (p.downcast_ref::<StreamTable>().is_some()
                || p.downcast_ref::<WindowedTable>().is_some())
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The group-by column names of each aggregation over a stream's rows in `plan`.
fn aggregates(plan: &LogicalPlan) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Aggregate(a) = node
            && reads_stream(&a.input)
        {
            out.push(
                a.group_expr
                    .iter()
                    .filter_map(|e| match e {
                        Expr::Column(c) => Some(c.name.clone()),
                        _ => None,
                    })
                    .collect(),
            );
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// How far back a window expression looks (with a LAG, the latest rows per key it needs
/// instead), or an error for one that looks ahead.
fn frame_look_back(e: &Expr) -> Result<(Horizon, Option<LatestRows>)> {
    let e = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::WindowFunction(f) = e else {
        return Ok((Horizon::Unbounded, None));
    };
    let WindowFunction { fun, params } = f.as_ref();
    let name = fun.name().to_ascii_lowercase();
    if name == "lead" {
        return Err(SpateError::Unsupported {
            message: "LEAD in a continuous view: it reads rows after the event, which no \
                      watermark closes"
                .into(),
        });
    }
    if matches!(
        name.as_str(),
        "cume_dist" | "percent_rank" | "ntile" | "last_value" | "nth_value"
    ) {
        return Err(SpateError::Unsupported {
            message: format!(
                "`{e}` in a continuous view: it reads the whole partition, rows that no \
                 watermark closes"
            ),
        });
    }
    if params.order_by.first().is_some_and(|s| !s.asc) {
        return Err(SpateError::Unsupported {
            message: format!(
                "`{e}` in a continuous view: a window ordered newest first reads rows that \
                 no watermark closes; order by the event time ascending"
            ),
        });
    }
    let frame = &params.window_frame;
    if !matches!(frame.end_bound, WindowFrameBound::CurrentRow)
        && !matches!(&frame.end_bound, WindowFrameBound::Preceding(_))
    {
        return Err(SpateError::Unsupported {
            message: format!(
                "`{e}` in a continuous view: a frame that ends after the current row reads \
                 rows no watermark closes"
            ),
        });
    }
    if name == "lag" {
        return Ok((Horizon::Unbounded, lag_need(params)));
    }
    Ok((
        match (&frame.units, &frame.start_bound, name.as_str()) {
            (_, _, "row_number" | "rank" | "dense_rank" | "first_value") => Horizon::Unbounded,
            (WindowFrameUnits::Range, WindowFrameBound::Preceding(v), _) if !v.is_null() => {
                match interval_expr_micros(&lit(v.clone()), "a RANGE frame's bound") {
                    Ok(micros) => Horizon::Bounded(micros),
                    Err(_) => Horizon::Unbounded,
                }
            }
            _ => Horizon::Unbounded,
        },
        None,
    ))
}

/// `LAG(x[, rows[, default]]) OVER (PARTITION BY columns ORDER BY columns)`: the latest rows
/// per key it reads; `None` for keys or orders that are not plain columns.
fn lag_need(params: &datafusion::logical_expr::expr::WindowFunctionParams) -> Option<LatestRows> {
    let column = |e: &Expr| match e {
        Expr::Column(c) => Some(c.name.clone()),
        _ => None,
    };
    let rows = match params.args.get(1) {
        None => 1,
        Some(Expr::Literal(v, _)) => match v.cast_to(&DataType::Int64).ok()? {
            ScalarValue::Int64(Some(k)) if k >= 1 => usize::try_from(k).ok()?,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(LatestRows {
        keys: params
            .partition_by
            .iter()
            .map(column)
            .collect::<Option<_>>()?,
        order: params
            .order_by
            .iter()
            .map(|s| column(&s.expr).map(|c| (c, s.asc)))
            .collect::<Option<_>>()?,
        rows,
    })
}

impl ContinuousView {
    /// A view named `name` over `plan` (the query, not yet optimised).
    pub(crate) fn new(name: String, plan: LogicalPlan, emit: Emit) -> Result<Self> {
        let Inspected {
            streams,
            horizon,
            latest: latest_rows,
            lookahead,
        } = inspect(&plan, true)?;
        let Some(first) = streams.first() else {
            return Err(sql_error(format!(
                "continuous view '{name}' reads no stream; CREATE VIEW makes a view of tables"
            )));
        };
        let output: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
        let time_name = first.config.schema.field(first.config.time_column).name();
        let (final_column, window_end) = match output.column_with_name("window_end") {
            Some((i, _)) => (i, true),
            None => match output.column_with_name(time_name) {
                Some((i, _)) => (i, false),
                None => {
                    return Err(sql_error(format!(
                        "continuous view '{name}' must output window_end or the event time \
                         '{time_name}': they say when a row is final"
                    )));
                }
            },
        };
        let unit = first.config.unit;
        if streams.iter().any(|s| s.config.unit != unit) {
            return Err(sql_error(format!(
                "continuous view '{name}' reads streams whose times have different units"
            )));
        }
        // The final column must be the stream's time or a window's end, not something
        // computed from them: an aggregate's rows are final by their window.
        let grouped: Vec<Vec<String>> = aggregates(&plan);
        if !grouped.is_empty() {
            let by_window_end = window_end
                && grouped
                    .iter()
                    .all(|keys| keys.iter().any(|k| k == "window_end"));
            if !by_window_end {
                return Err(sql_error(format!(
                    "continuous view '{name}' aggregates, so it must group by window_end \
                     (a window table function's): a group is final when its window closes"
                )));
            }
        }
        match output.field(final_column).data_type() {
            DataType::Timestamp(u, _) if *u == unit => {}
            other => {
                return Err(sql_error(format!(
                    "continuous view '{name}': '{}' is {other}, not the stream's timestamp \
                     type",
                    output.field(final_column).name()
                )));
            }
        }
        let window_start = output.column_with_name("window_start").map(|(i, _)| i);
        let horizon = if horizon == Horizon::Sessions && window_start.is_none() {
            Horizon::Unbounded
        } else {
            horizon
        };
        // A joined row still to come may pair with rows `lookahead` older than its own.
        let horizon = match horizon {
            _ if lookahead == 0 => horizon,
            Horizon::Bounded(b) => Horizon::Bounded(b.saturating_add(lookahead)),
            Horizon::Sessions | Horizon::Unbounded => Horizon::Unbounded,
        };
        let panes = if horizon == Horizon::Unbounded || !latest_rows.is_empty() {
            None
        } else {
            Panes::of(&plan)?
        };
        let emit_schema = match emit {
            Emit::OnWindowClose => Arc::clone(&output),
            Emit::OnUpdate => {
                let mut fields = vec![Arc::new(Field::new("op", DataType::Utf8, false))];
                fields.extend(output.fields().iter().cloned());
                Arc::new(Schema::new(fields))
            }
        };
        Ok(ContinuousView {
            name,
            emit,
            plan,
            output,
            emitted_schema: emit_schema,
            final_column,
            window_end,
            window_start,
            unit,
            horizon,
            lookahead: micros_to_ticks(unit, lookahead),
            latest_rows,
            panes,
            streams,
            state: Mutex::new(Emitted::default()),
            advancing: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Emitted> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The schema of a checkpoint's open rows: the output, and how many of each.
    pub(crate) fn open_schema(&self) -> SchemaRef {
        let mut fields: Vec<Arc<Field>> = self.output.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(OPEN_COUNT, DataType::Int64, false)));
        Arc::new(Schema::new(fields))
    }

    /// The schema of what the view emits.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.emitted_schema)
    }

    /// A new subscriber's receiving end.
    pub(crate) fn subscribe(&self) -> Receiver<RecordBatch> {
        let (tx, rx) = channel(SUBSCRIPTION_QUEUE);
        let mut state = self.lock();
        // After the end a subscription ends at once (the sender goes with `tx`).
        if !state.ended {
            state.subscribers.push(tx);
        }
        rx
    }

    /// The watermark of the view's streams as their last micro-batches were cut: the lowest.
    fn watermark(&self) -> Option<i64> {
        self.streams
            .iter()
            .map(|s| s.cut_watermark())
            .collect::<Option<Vec<_>>>()
            .and_then(|w| w.into_iter().min())
    }

    /// The latest rows per key the view needs whatever their age (its LAGs).
    pub(crate) fn latest_rows(&self) -> &[LatestRows] {
        &self.latest_rows
    }

    /// Rows of window state it holds as panes (`None`: it keeps no panes).
    pub(crate) fn pane_rows(&self) -> Option<usize> {
        self.panes.as_ref().map(Panes::state_rows)
    }

    /// The earliest event time the view still needs from its streams, in ticks (`None`: all).
    pub(crate) fn keep_from(&self) -> Option<i64> {
        if self.panes.is_some() {
            // Each micro-batch is in the panes once the view has advanced.
            return Some(i64::MAX);
        }
        let state = self.lock();
        let closed = state.closed?;
        match self.horizon {
            Horizon::Bounded(micros) => {
                Some(closed.saturating_sub(micros_to_ticks(self.unit, micros)))
            }
            Horizon::Sessions => Some(state.session_floor.unwrap_or(closed)),
            Horizon::Unbounded => None,
        }
    }

    fn bound(&self, ticks: i64) -> Result<Expr> {
        let ty = self.output.field(self.final_column).data_type();
        Ok(lit(ScalarValue::Int64(Some(ticks)).cast_to(ty)?))
    }

    /// Runs the view for the watermark now and emits what it gives. `fresh` is the
    /// micro-batch its streams took since the last call, if any.
    pub(crate) async fn advance(&self, ctx: &SessionContext, fresh: Option<&Kept>) -> Result<()> {
        let _one_at_a_time = self.advancing.lock().await;
        let fresh_rows = fresh.is_some_and(|k| k.count > 0);
        if let Some(panes) = &self.panes {
            let closed = self.lock().closed;
            panes.merge(ctx, fresh, closed).await?;
        }
        let Some(w) = self.watermark() else {
            return Ok(());
        };
        let closed = if self.window_end {
            w
        } else {
            w.saturating_sub(1)
        };
        // Once every writer has finished (`w` at the end of time) nothing more can pair.
        let closed = if w == i64::MAX {
            closed
        } else {
            closed.saturating_sub(self.lookahead)
        };
        let previous = self.lock().closed;
        let moved = previous != Some(closed);
        let wanted = match self.emit {
            Emit::OnWindowClose => moved,
            Emit::OnUpdate => moved || fresh_rows,
        };
        if !wanted {
            return Ok(());
        }
        let f = Expr::Column(Column::from_name(
            self.output.field(self.final_column).name(),
        ));
        let plan = match &self.panes {
            Some(panes) => panes.final_plan()?,
            None => self.plan.clone(),
        };
        let mut df = ctx.execute_logical_plan(plan).await?;
        if let Some(p) = previous {
            df = df.filter(f.clone().gt(self.bound(p)?))?;
        }
        let need_open = self.emit == Emit::OnUpdate || self.horizon == Horizon::Sessions;
        if !need_open {
            df = df.filter(f.lt_eq(self.bound(closed)?))?;
        }
        let batches = df.collect().await?;
        let rows = concat_batches(&self.output, &batches)?;
        let finals = is_final(&rows, self.final_column, closed)?;
        let out = match self.emit {
            Emit::OnWindowClose => arrow::compute::filter_record_batch(&rows, &finals)?,
            Emit::OnUpdate => self.changelog(&rows, &finals)?,
        };
        let delivery = {
            let mut state = self.lock();
            if self.horizon == Horizon::Sessions
                && let Some(start) = self.window_start
            {
                let open =
                    arrow::compute::filter_record_batch(&rows, &arrow::compute::not(&finals)?)?;
                let starts = cast(open.column(start), &DataType::Int64)?;
                state.session_floor = starts
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .and_then(arrow::compute::min);
            }
            state.closed = Some(closed);
            let delivery = if out.num_rows() > 0 {
                state.rows += out.num_rows() as u64;
                state.history.push(out.clone());
                // Reading the view as a table gives its latest rows, not all it ever emitted.
                let mut held: usize = state.history.iter().map(RecordBatch::num_rows).sum();
                while held > HISTORY_ROWS && state.history.len() > 1 {
                    held -= state.history.remove(0).num_rows();
                }
                // A subscription dropped is let go.
                state.subscribers.retain(|s| !s.is_closed());
                let receivers = state.subscribers.clone();
                let before = state.delivery.take();
                let out = out.clone();
                let task = tokio::spawn(async move {
                    if let Some(before) = before {
                        before.0.await;
                    }
                    for receiver in receivers {
                        let _ = receiver.send(out.clone()).await;
                    }
                });
                let delivery = Delivery(futures::FutureExt::shared(futures::FutureExt::boxed(
                    futures::FutureExt::map(task, |_| ()),
                )));
                state.delivery = Some(delivery.clone());
                Some(delivery)
            } else {
                None
            };
            if w == i64::MAX {
                // Every writer has finished: nothing more will come. The senders on their way
                // close once delivered (set here, so a cancelled wait below still ends them).
                state.ended = true;
                state.subscribers.clear();
            }
            delivery
        };
        if let Some(delivery) = delivery {
            delivery.0.await;
        }
        Ok(())
    }

    /// `EMIT ON UPDATE`: the changes from what was emitted and not final, to `rows`, and the
    /// rows that stay open.
    fn changelog(
        &self,
        rows: &RecordBatch,
        finals: &arrow::array::BooleanArray,
    ) -> Result<RecordBatch> {
        let mut state = self.lock();
        if state.converter.is_none() {
            state.converter = Some(self.row_converter()?);
        }
        let Emitted {
            converter, open, ..
        } = &mut *state;
        let Some(converter) = converter.as_ref() else {
            return Err(SpateError::Internal {
                message: "a view's row converter went missing".into(),
            });
        };
        let encoded = converter.convert_columns(rows.columns())?;
        // Rows are compared borrowed; only those that stay open are copied, to keep.
        let mut now: HashMap<Row<'_>, i64> = HashMap::new();
        let mut open_now: HashMap<OwnedRow, i64> = HashMap::new();
        for (i, row) in encoded.iter().enumerate() {
            *now.entry(row).or_default() += 1;
            if !finals.value(i) {
                *open_now.entry(row.owned()).or_default() += 1;
            }
        }
        let before_owned = std::mem::replace(open, open_now);
        let before: HashMap<Row<'_>, i64> =
            before_owned.iter().map(|(r, &n)| (r.row(), n)).collect();
        let (mut retract, mut add) = (Vec::new(), Vec::new());
        for (&row, &n) in &before {
            let m = now.get(&row).copied().unwrap_or(0);
            retract.extend(std::iter::repeat_n(
                row,
                usize::try_from(n - m).unwrap_or(0),
            ));
        }
        for (&row, &m) in &now {
            let n = before.get(&row).copied().unwrap_or(0);
            add.extend(std::iter::repeat_n(
                row,
                usize::try_from(m - n).unwrap_or(0),
            ));
        }
        let ops: ArrayRef = Arc::new(StringArray::from(
            std::iter::repeat_n("-", retract.len())
                .chain(std::iter::repeat_n("+", add.len()))
                .collect::<Vec<_>>(),
        ));
        let mut columns = vec![ops];
        columns.extend(converter.convert_rows(retract.into_iter().chain(add))?);
        Ok(RecordBatch::try_new(
            Arc::clone(&self.emitted_schema),
            columns,
        )?)
    }

    /// Everything the view has emitted.
    pub(crate) fn history(&self) -> Vec<RecordBatch> {
        self.lock().history.clone()
    }

    /// What a checkpoint saves of the view: the final bound, the open sessions' floor, and for
    /// `EMIT ON UPDATE` the rows emitted and not final yet, with a `__spate_count` column.
    pub(crate) fn snapshot(&self) -> Result<ViewSnapshot> {
        let state = self.lock();
        let open = match (&state.converter, state.open.is_empty()) {
            (Some(converter), false) => {
                let (rows, counts): (Vec<_>, Vec<i64>) =
                    state.open.iter().map(|(r, &n)| (r.row(), n)).unzip();
                let mut columns = converter.convert_rows(rows)?;
                columns.push(Arc::new(Int64Array::from(counts)));
                Some(RecordBatch::try_new(self.open_schema(), columns)?)
            }
            _ => None,
        };
        let panes = self.panes.as_ref().map(Panes::snapshot).transpose()?;
        Ok(ViewSnapshot {
            closed: state.closed,
            session_floor: state.session_floor,
            rows: state.rows,
            open,
            panes,
        })
    }

    /// Encodes the view's output rows to compare them whole (`EMIT ON UPDATE`).
    fn row_converter(&self) -> Result<RowConverter> {
        let fields = self
            .output
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(RowConverter::new(fields)?)
    }

    /// Puts a checkpoint's state back into a view that has emitted nothing yet.
    pub(crate) fn restore(&self, snapshot: ViewSnapshot) -> Result<()> {
        match (&self.panes, snapshot.panes) {
            (Some(panes), Some((_, batches))) => panes.restore(batches)?,
            (None, None) => {}
            _ => {
                return Err(SpateError::Config {
                    message: format!(
                        "the checkpoint of view '{}' does not match how it keeps its window \
                         state",
                        self.name
                    ),
                });
            }
        }
        let mut state = self.lock();
        state.closed = snapshot.closed;
        state.session_floor = snapshot.session_floor;
        state.rows = snapshot.rows;
        state.open.clear();
        if let Some(open) = snapshot.open {
            let converter = self.row_converter()?;
            let width = self.output.fields().len();
            if open.num_columns() != width + 1 {
                return Err(SpateError::Config {
                    message: format!(
                        "the checkpoint of view '{}' does not match its columns",
                        self.name
                    ),
                });
            }
            let rows = converter.convert_columns(&open.columns()[..width])?;
            let counts = open
                .column(width)
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| SpateError::Config {
                    message: format!("the checkpoint of view '{}' has no row counts", self.name),
                })?;
            for (i, row) in rows.iter().enumerate() {
                state.open.insert(row.owned(), counts.value(i));
            }
            state.converter = Some(converter);
        }
        Ok(())
    }
}

/// About how many of its latest emitted rows a view keeps for `SELECT * FROM view` (whole
/// emissions, so the last one may take it past).
const HISTORY_ROWS: usize = 1_000_000;

/// Emissions a subscriber may leave unread before the view's micro-batches wait for it.
pub const SUBSCRIPTION_QUEUE: usize = 256;

/// The column of a view checkpoint's open rows that counts each.
const OPEN_COUNT: &str = "__spate_count";

/// A view's state in a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct ViewSnapshot {
    pub(crate) closed: Option<i64>,
    pub(crate) session_floor: Option<i64>,
    pub(crate) rows: u64,
    pub(crate) open: Option<RecordBatch>,
    /// The window state as panes, for a view that keeps them.
    pub(crate) panes: Option<(SchemaRef, Vec<RecordBatch>)>,
}

/// Which rows of `rows` are final at `closed`.
fn is_final(rows: &RecordBatch, column: usize, closed: i64) -> Result<arrow::array::BooleanArray> {
    let values = cast(rows.column(column), &DataType::Int64)?;
    let values = values
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| SpateError::Internal {
            message: "a final column that did not cast to Int64".into(),
        })?;
    Ok(values
        .iter()
        .map(|v| Some(v.is_some_and(|v| v <= closed)))
        .collect())
}
