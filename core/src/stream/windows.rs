//! The window table functions `TUMBLE`, `HOP` and `SESSION`, in `FROM`, over a stream or a
//! table alike:
//!
//! - `TUMBLE(t, ts, size)`: each row in the window `[start, start + size)` that holds its
//!   `ts`, windows aligned to the Unix epoch;
//! - `HOP(t, ts, slide, size)`: each row once per window of length `size` that holds it, a
//!   window starting every `slide` (`size` a whole multiple of `slide`);
//! - `SESSION(t, ts, gap [, key …])`: rows of the same keys whose times are less than `gap`
//!   apart share a window, from the first time to the last time plus `gap`.
//!
//! Each adds `window_start` and `window_end` (the time column's type) to the table's columns.
//! The function returns a [`WindowedTable`]: a logical plan over the table, planned and placed
//! on the GPU like any other plan when the query's scan of it is, with the query's filters
//! pushed into it. The window bounds are integer arithmetic on the time column's ticks (casts
//! between a timestamp and its Int64 keep the bits), which the GPU runs; HOP is a cross join
//! with the window offsets, and SESSION three window functions (`lag`, a running `sum`, and
//! `min`/`max` per session). A continuous view reads [`WindowedTable::window`] to know how
//! long its stream must keep rows.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::{Column, DataFusionError, ScalarValue, TableReference};
use datafusion::datasource::{TableProvider, TableType, provider_as_source};
use datafusion::error::Result as DFResult;
use datafusion::execution::SessionState;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::functions_window::expr_fn::lag;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    Expr, ExprFunctionExt, LogicalPlan, LogicalPlanBuilder, TableProviderFilterPushDown,
    WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition, cast, lit, when,
};
use datafusion::physical_plan::ExecutionPlan;

use super::interval::interval_expr_micros;

/// Which window a table function assigns, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// `TUMBLE(t, ts, size)`.
    Tumble { size: i64 },
    /// `HOP(t, ts, slide, size)`.
    Hop { slide: i64, size: i64 },
    /// `SESSION(t, ts, gap [, key …])`.
    Session { gap: i64 },
}

/// The kinds of window table function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowFunctionKind {
    Tumble,
    Hop,
    Session,
}

impl WindowFunctionKind {
    /// The SQL name.
    pub fn name(self) -> &'static str {
        match self {
            WindowFunctionKind::Tumble => "tumble",
            WindowFunctionKind::Hop => "hop",
            WindowFunctionKind::Session => "session",
        }
    }
}

/// Most windows one row may fall in with HOP (`size / slide`).
const MAX_HOPS: i64 = 1_024;

/// A window table function (`TUMBLE`, `HOP` or `SESSION`), registered in every session.
#[derive(Debug)]
pub struct WindowTableFunction {
    kind: WindowFunctionKind,
}

impl WindowTableFunction {
    /// The function of `kind`.
    pub fn new(kind: WindowFunctionKind) -> Self {
        WindowTableFunction { kind }
    }
}

fn plan_error(message: String) -> DataFusionError {
    DataFusionError::Plan(message)
}

/// Ticks of `unit` in one microsecond, as (multiply, divide).
fn ticks(unit: TimeUnit, micros: i64, what: &str) -> DFResult<i64> {
    match unit {
        TimeUnit::Second | TimeUnit::Millisecond => {
            let per = if unit == TimeUnit::Second {
                1_000_000
            } else {
                1_000
            };
            if micros % per != 0 {
                return Err(plan_error(format!(
                    "{what} of {micros} µs is finer than the time column's unit ({unit:?})"
                )));
            }
            Ok(micros / per)
        }
        TimeUnit::Microsecond => Ok(micros),
        TimeUnit::Nanosecond => micros
            .checked_mul(1_000)
            .ok_or_else(|| plan_error(format!("{what} is too long"))),
    }
}

fn column(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// `x - ((x % m) + m) % m`: `x` rounded down to a multiple of `m`, negatives included.
fn floor_to(x: Expr, m: i64) -> Expr {
    x.clone() - ((x % lit(m)) + lit(m)) % lit(m)
}

impl TableFunctionImpl for WindowTableFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let name = self.kind.name().to_uppercase();
        let exprs = args.exprs();
        let usage = || {
            plan_error(match self.kind {
                WindowFunctionKind::Tumble => {
                    "TUMBLE(table, time_column, INTERVAL 'size')".to_string()
                }
                WindowFunctionKind::Hop => {
                    "HOP(table, time_column, INTERVAL 'slide', INTERVAL 'size')".to_string()
                }
                WindowFunctionKind::Session => {
                    "SESSION(table, time_column, INTERVAL 'gap' [, key_column …])".to_string()
                }
            })
        };
        let identifier = |e: &Expr| match e {
            Expr::Column(c) => Some(c.flat_name()),
            _ => None,
        };
        let (Some(table), Some(time)) = (
            exprs.first().and_then(identifier),
            exprs.get(1).and_then(identifier),
        ) else {
            return Err(usage());
        };
        let state = args
            .session()
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| plan_error(format!("{name} needs a SessionState")))?;
        let reference = TableReference::from(table.as_str());
        let schema_provider = state.schema_for_ref(reference.clone())?;
        let provider = futures::executor::block_on(schema_provider.table(reference.table()))?
            .ok_or_else(|| plan_error(format!("{name}: no table or stream named '{table}'")))?;
        let input_schema = provider.schema();
        let (_, time_field) = input_schema
            .column_with_name(&time)
            .ok_or_else(|| plan_error(format!("{name}: '{table}' has no column '{time}'")))?;
        if !matches!(time_field.data_type(), DataType::Timestamp(..)) {
            return Err(plan_error(format!(
                "{name}: the time column '{time}' is {}, not a timestamp",
                time_field.data_type()
            )));
        }
        for taken in ["window_start", "window_end"] {
            if input_schema.column_with_name(taken).is_some() {
                return Err(plan_error(format!(
                    "{name}: '{table}' already has a column '{taken}'"
                )));
            }
        }
        let interval = |i: usize, what: &str| -> DFResult<i64> {
            let e = exprs.get(i).ok_or_else(usage)?;
            interval_expr_micros(e, &format!("{name}'s {what}"))
                .map_err(|e| plan_error(e.to_string()))
        };
        let window = match self.kind {
            WindowFunctionKind::Tumble => {
                if exprs.len() != 3 {
                    return Err(usage());
                }
                Window::Tumble {
                    size: interval(2, "size")?,
                }
            }
            WindowFunctionKind::Hop => {
                if exprs.len() != 4 {
                    return Err(usage());
                }
                let (slide, size) = (interval(2, "slide")?, interval(3, "size")?);
                if size % slide != 0 || size / slide > MAX_HOPS {
                    return Err(plan_error(format!(
                        "HOP's size ({size} µs) must be a whole multiple of its slide \
                         ({slide} µs), at most {MAX_HOPS} times it"
                    )));
                }
                Window::Hop { slide, size }
            }
            WindowFunctionKind::Session => {
                if exprs.len() < 3 {
                    return Err(usage());
                }
                Window::Session {
                    gap: interval(2, "gap")?,
                }
            }
        };
        let keys = exprs[3.min(exprs.len())..]
            .iter()
            .filter(|_| self.kind == WindowFunctionKind::Session)
            .map(|e| {
                let key = identifier(e).ok_or_else(usage)?;
                input_schema.column_with_name(&key).ok_or_else(|| {
                    plan_error(format!("{name}: '{table}' has no column '{key}'"))
                })?;
                Ok(key)
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Arc::new(WindowedTable::over(
            reference, provider, &time, window, keys,
        )?))
    }
}

impl WindowedTable {
    /// `window` over `provider` (a table named `reference`, time column `time`; `keys` for
    /// SESSION), its arguments checked.
    pub(crate) fn over(
        reference: TableReference,
        provider: Arc<dyn TableProvider>,
        time: &str,
        window: Window,
        keys: Vec<String>,
    ) -> DFResult<Self> {
        let input_schema = provider.schema();
        let (_, time_field) = input_schema
            .column_with_name(time)
            .ok_or_else(|| plan_error(format!("no time column '{time}'")))?;
        let DataType::Timestamp(unit, _) = time_field.data_type().clone() else {
            return Err(plan_error(format!("'{time}' is not a timestamp")));
        };
        let time_type = time_field.data_type().clone();
        let keys: Vec<Expr> = keys.iter().map(|k| column(k)).collect();
        let scan = LogicalPlanBuilder::scan(
            reference.clone(),
            provider_as_source(Arc::clone(&provider)),
            None,
        )?;
        let originals: Vec<Expr> = input_schema
            .fields()
            .iter()
            .map(|f| column(f.name()))
            .collect();
        let t = cast(column(time), DataType::Int64);
        let bounds = |start: Expr, length: i64| {
            vec![
                cast(start.clone(), time_type.clone()).alias("window_start"),
                cast(start + lit(length), time_type.clone()).alias("window_end"),
            ]
        };
        let plan = match window {
            Window::Tumble { size } => {
                let size = ticks(unit, size, "TUMBLE's size")?;
                let mut exprs = originals;
                exprs.extend(bounds(floor_to(t, size), size));
                scan.project(exprs)?.build()?
            }
            Window::Hop { slide, size } => {
                let (slide, size) = (
                    ticks(unit, slide, "HOP's slide")?,
                    ticks(unit, size, "HOP's size")?,
                );
                let hops = (0..size / slide).map(|k| vec![lit(k)]).collect();
                let offsets = LogicalPlanBuilder::values(hops)?
                    .project(vec![column("column1").alias("__spate_hop")])?
                    .build()?;
                let start = floor_to(t, slide) - column("__spate_hop") * lit(slide);
                let mut exprs = originals;
                exprs.extend(bounds(start, size));
                scan.cross_join(offsets)?.project(exprs)?.build()?
            }
            Window::Session { gap } => {
                let gap = ticks(unit, gap, "SESSION's gap")?;
                session_plan(scan, originals, t, keys, gap, &time_type)?
            }
        };
        Ok(WindowedTable {
            schema: Arc::clone(plan.schema().inner()),
            plan,
            window,
            reference,
            time: time.to_string(),
        })
    }
}

/// SESSION's plan: a new session where a row is `gap` or more after the previous one of its
/// keys (by time), numbered by a running sum, and bounded by its first and last times.
fn session_plan(
    scan: LogicalPlanBuilder,
    originals: Vec<Expr>,
    t: Expr,
    keys: Vec<Expr>,
    gap: i64,
    time_type: &DataType,
) -> DFResult<LogicalPlan> {
    let ordered = || vec![column("__spate_t").sort(true, false)];
    let window = |f: WindowFunctionDefinition, arg: Expr, partition: Vec<Expr>| {
        Expr::from(WindowFunction::new(f, vec![arg])).partition_by(partition)
    };
    let mut with_t = originals.clone();
    with_t.push(t.alias("__spate_t"));
    let previous = lag(column("__spate_t"), Some(1), None)
        .partition_by(keys.clone())
        .order_by(ordered())
        .build()?
        .alias("__spate_prev");
    let starts = when(column("__spate_t").is_null(), lit(1i64))
        .when(column("__spate_prev").is_null(), lit(1i64))
        .when(
            (column("__spate_t") - column("__spate_prev")).gt_eq(lit(gap)),
            lit(1i64),
        )
        .otherwise(lit(0i64))?;
    let mut with_start = originals.clone();
    with_start.push(column("__spate_t"));
    with_start.push(starts.alias("__spate_new"));
    let running = WindowFrame::new_bounds(
        WindowFrameUnits::Rows,
        WindowFrameBound::Preceding(ScalarValue::UInt64(None)),
        WindowFrameBound::CurrentRow,
    );
    let session = window(
        WindowFunctionDefinition::AggregateUDF(sum_udaf()),
        column("__spate_new"),
        keys.clone(),
    )
    .order_by(ordered())
    .window_frame(running)
    .build()?
    .alias("__spate_session");
    let mut by_session = keys;
    by_session.push(column("__spate_session"));
    let first = window(
        WindowFunctionDefinition::AggregateUDF(min_udaf()),
        column("__spate_t"),
        by_session.clone(),
    )
    .build()?
    .alias("__spate_first");
    let last = window(
        WindowFunctionDefinition::AggregateUDF(max_udaf()),
        column("__spate_t"),
        by_session,
    )
    .build()?
    .alias("__spate_last");
    let mut out = originals;
    out.push(cast(column("__spate_first"), time_type.clone()).alias("window_start"));
    out.push(cast(column("__spate_last") + lit(gap), time_type.clone()).alias("window_end"));
    scan.project(with_t)?
        .window(vec![previous])?
        .project(with_start)?
        .window(vec![session])?
        .window(vec![first, last])?
        .project(out)?
        .build()
}

/// What a window table function returns: its plan over the table, planned when the query is
/// (`scan`), and the window it assigns.
#[derive(Debug)]
pub struct WindowedTable {
    plan: LogicalPlan,
    schema: SchemaRef,
    window: Window,
    /// The table it reads, and its time column.
    reference: TableReference,
    time: String,
}

impl WindowedTable {
    /// The window each row is assigned.
    pub fn window(&self) -> Window {
        self.window
    }

    /// The plan over the table.
    pub fn plan(&self) -> &LogicalPlan {
        &self.plan
    }

    /// The name of the table it reads, and that table's time column.
    pub(crate) fn table(&self) -> (&TableReference, &str) {
        (&self.reference, &self.time)
    }
}

#[async_trait]
impl TableProvider for WindowedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    // No `get_logical_plan`: DataFusion would inline the plan when the query is planned, and
    // a continuous view could no longer see which window its rows are in (`view.rs`).
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // Applied again above the scan; pushing them in lets the window plan filter early.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let mut plan = LogicalPlanBuilder::from(self.plan.clone());
        if let Some(filter) = filters.iter().cloned().reduce(|a, b| a.and(b)) {
            plan = plan.filter(filter)?;
        }
        if let Some(projection) = projection {
            let columns = projection
                .iter()
                .map(|&i| column(self.schema.field(i).name()))
                .collect::<Vec<_>>();
            plan = plan.project(columns)?;
        }
        if let Some(limit) = limit {
            plan = plan.limit(0, Some(limit))?;
        }
        state.create_physical_plan(&plan.build()?).await
    }
}
