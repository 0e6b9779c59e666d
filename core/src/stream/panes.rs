//! Window state as panes: a continuous view that aggregates a TUMBLE or HOP window keeps
//! partial aggregates per key and pane, merged with each micro-batch, instead of running its
//! query again over the rows its stream keeps.
//!
//! **Panes.** A pane is a tumbling window of the HOP's slide (of the TUMBLE's size): each row
//! falls in one pane, and each window is the union of `size / slide` consecutive panes (the
//! idea of Li et al., "No pane, no gain", SIGMOD Record 2005). The state is a table of
//! `(keys…, __pane, states…)`, one row per key and pane:
//! - `count(x)` keeps its count, `sum`, `min` and `max` their own value, `avg(x)` a sum in
//!   `Float64` and a count;
//! - merging adds the counts and sums (cast back to their type) and takes the least and
//!   greatest;
//! - the DISTINCT aggregates' argument (one for all of them) is one more key, so the state
//!   holds each key's distinct values per pane; `count`, `sum`, `min` and `max` of them are
//!   taken when the panes are combined.
//!
//! **Each micro-batch** (see [`Panes::merge`]) runs one query on the session's backend: the
//! view's aggregation over the new rows only, in pane-sized tumbling windows, unioned with the
//! state and aggregated again by key and pane. Panes that no open window holds any more are
//! dropped on the way. On a GPU backend the query's output stays in device memory
//! ([`exec::collect_on_device`](crate::exec)): the state is a device table, charged to the
//! device's memory like a cached table, which the spill coordinator may move to the host under
//! pressure (and the next scan brings back). The stream keeps no rows for the view.
//!
//! **Emitting** reads the view's query with its aggregation replaced by the panes combined
//! into windows ([`Panes::final_plan`]): a HOP's panes are crossed with their `size / slide`
//! window offsets and aggregated again by key and window, then each aggregate is finished
//! (an average divides its sum by its count; with DISTINCT aggregates, a second aggregation by
//! key and window counts the distinct values). Everything above the aggregation (HAVING,
//! projections, ORDER BY) runs as written.
//!
//! **Which views.** One aggregation by `window_end` (and maybe `window_start`) and keys that
//! do not read the window's columns, of `count`, `sum`, `min` and `max` (also DISTINCT, of one
//! argument for all) and `avg` (not DISTINCT, over numbers that are not decimals, whose
//! average has its own rounding), whose arguments do not read the window's columns either,
//! without FILTER or ORDER BY, over projections and filters of one TUMBLE or HOP over one
//! stream that pass the window's columns through untouched; above it, projections, filters and
//! sorts. Any other view runs its query over the kept rows each micro-batch (`view.rs`). Both
//! give the batch query's results; float sums and averages may differ in their last bits, as
//! they are added up in another order.

use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchemaRef, TableReference};
use datafusion::datasource::{TableProvider, TableType, provider_as_source, source_as_provider};
use datafusion::error::Result as DFResult;
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    AggregateUDF, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, TableScan, cast, lit,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::state::{Kept, Stream, StreamTable};
use super::windows::{Window, WindowedTable};
use crate::error::{Result, SpateError};
use crate::exec::{GpuCachedScanExec, as_gpu_exec, cache::DeviceTable};

/// What an aggregate of the view keeps per pane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Count,
    Sum,
    Min,
    Max,
    /// A sum in `Float64` and a count.
    Avg,
}

impl Kind {
    fn of(name: &str) -> Option<Kind> {
        Some(match name {
            "count" => Kind::Count,
            "sum" => Kind::Sum,
            "min" => Kind::Min,
            "max" => Kind::Max,
            "avg" | "mean" => Kind::Avg,
            _ => return None,
        })
    }

    /// The aggregates of its states over a pane's rows: (function, argument).
    fn states(self, arg: &Expr) -> Vec<(Arc<AggregateUDF>, Expr)> {
        match self {
            Kind::Count => vec![(count_udaf(), arg.clone())],
            Kind::Sum => vec![(sum_udaf(), arg.clone())],
            Kind::Min => vec![(min_udaf(), arg.clone())],
            Kind::Max => vec![(max_udaf(), arg.clone())],
            Kind::Avg => vec![
                (sum_udaf(), cast(arg.clone(), DataType::Float64)),
                (count_udaf(), arg.clone()),
            ],
        }
    }

    /// How its states merge, in order.
    fn merges(self) -> Vec<Arc<AggregateUDF>> {
        match self {
            Kind::Count | Kind::Sum => vec![sum_udaf()],
            Kind::Min => vec![min_udaf()],
            Kind::Max => vec![max_udaf()],
            Kind::Avg => vec![sum_udaf(), sum_udaf()],
        }
    }
}

fn aggregate(f: Arc<AggregateUDF>, arg: Expr) -> Expr {
    Expr::AggregateFunction(AggregateFunction::new_udf(
        f,
        vec![arg],
        false,
        None,
        vec![],
        None,
    ))
}

fn column(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

fn state_name(i: usize) -> String {
    format!("__spate_s{i}")
}

fn distinct_name(i: usize) -> String {
    format!("__spate_dv{i}")
}

fn key_name(i: usize) -> String {
    format!("__spate_k{i}")
}

const PANE: &str = "__spate_pane";
const DISTINCT: &str = "__spate_d";
const WINDOW: &str = "__spate_window";
const HOP: &str = "__spate_hop";
const PANE_TABLE: &str = "__spate_panes";

/// An aggregate of the view.
#[derive(Debug, Clone)]
enum Aggregate {
    /// Over every row: its argument, and its first state column.
    Plain { kind: Kind, arg: Expr, first: usize },
    /// Over the distinct values of the view's DISTINCT argument.
    Distinct { kind: Kind },
}

/// A group column of the view's aggregation.
#[derive(Debug, Clone, Copy)]
enum Group {
    /// The `i`th key.
    Key(usize),
    WindowStart,
    WindowEnd,
}

/// The pane state's rows: in device memory on a GPU backend (host rows after a restore, or
/// where the merge did not run on the GPU).
#[derive(Debug, Clone)]
enum PaneRows {
    Device(Arc<DeviceTable>),
    Host(SchemaRef, Vec<RecordBatch>),
}

impl PaneRows {
    fn schema(&self) -> SchemaRef {
        match self {
            PaneRows::Device(t) => Arc::clone(t.schema()),
            PaneRows::Host(s, _) => Arc::clone(s),
        }
    }

    fn num_rows(&self) -> usize {
        match self {
            PaneRows::Device(t) => t.num_rows(),
            PaneRows::Host(_, b) => b.iter().map(RecordBatch::num_rows).sum(),
        }
    }
}

/// The pane state read by a query.
#[derive(Debug)]
struct PaneTable(PaneRows);

#[async_trait]
impl TableProvider for PaneTable {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
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
        match &self.0 {
            PaneRows::Device(table) => Ok(Arc::new(GpuCachedScanExec::new(
                Arc::clone(table),
                projection.cloned(),
            )?)),
            PaneRows::Host(schema, batches) => {
                MemTable::try_new(Arc::clone(schema), vec![batches.clone()])?
                    .scan(state, projection, filters, limit)
                    .await
            }
        }
    }
}

/// A continuous view's window state as panes (see the module docs).
#[derive(Debug)]
pub(crate) struct Panes {
    stream: Arc<Stream>,
    /// The view's query, and its aggregation's input, output and columns.
    view: LogicalPlan,
    input: LogicalPlan,
    output: DFSchemaRef,
    keys: Vec<Expr>,
    groups: Vec<Group>,
    /// Each aggregate of the view, in order.
    aggregates: Vec<Aggregate>,
    /// The argument of its DISTINCT aggregates (one for all), kept as one more key.
    distinct: Option<Expr>,
    /// The window table function's table and time column.
    reference: TableReference,
    time: String,
    /// The pane's length in microseconds, and the pane and the window in ticks.
    pane_micros: i64,
    pane: i64,
    size: i64,
    /// The pane that holds a row, over the aggregation's input (in ticks).
    pane_of: Expr,
    /// The state's schema before any row.
    empty: SchemaRef,
    rows: Mutex<Option<PaneRows>>,
    /// Micro-batches taken and not merged yet (a merge failed): the next merge takes them
    /// too, so none is lost while its stream no longer keeps it.
    unmerged: Mutex<Vec<Kept>>,
}

/// Whether `e` reads a window column other than by passing it through as it is.
fn touches_window(e: &Expr, pass_through: bool) -> bool {
    if pass_through && let Expr::Column(_) = e {
        return false;
    }
    e.exists(|x| {
        Ok(matches!(x, Expr::Column(c) if c.name == "window_start" || c.name == "window_end"))
    })
    .unwrap_or(true)
}

fn has_subquery(e: &Expr) -> bool {
    e.exists(|x| {
        Ok(matches!(
            x,
            Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
        ))
    })
    .unwrap_or(true)
}

/// The aggregation under `plan`'s projections, filters, sorts and aliases.
fn find_aggregate(plan: &LogicalPlan) -> Option<&datafusion::logical_expr::Aggregate> {
    match plan {
        LogicalPlan::Aggregate(a) => Some(a),
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::SubqueryAlias(_) => {
            if plan.expressions().iter().any(has_subquery) {
                return None;
            }
            find_aggregate(plan.inputs().first()?)
        }
        _ => None,
    }
}

/// The window table function's scan under `plan`'s projections, filters and aliases, when
/// they pass its window columns through untouched.
fn find_window_scan(plan: &LogicalPlan) -> Option<&TableScan> {
    match plan {
        LogicalPlan::TableScan(scan) => Some(scan),
        LogicalPlan::Projection(p) => {
            // A column renamed to a window column's name would stand for the window.
            let renames_to_window = |e: &Expr| {
                matches!(e, Expr::Alias(a) if a.name == "window_start"
                    || a.name == "window_end")
            };
            if p.expr
                .iter()
                .any(|e| touches_window(e, true) || renames_to_window(e) || has_subquery(e))
            {
                return None;
            }
            find_window_scan(&p.input)
        }
        LogicalPlan::Filter(f) => {
            if touches_window(&f.predicate, false) || has_subquery(&f.predicate) {
                return None;
            }
            find_window_scan(&f.input)
        }
        LogicalPlan::SubqueryAlias(a) => find_window_scan(&a.input),
        _ => None,
    }
}

/// The stream a window table function's plan reads, when it reads one stream and nothing
/// else.
fn only_stream(plan: &LogicalPlan) -> Option<Arc<Stream>> {
    let mut found: Option<Arc<Stream>> = None;
    let mut other = false;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            match source_as_provider(&scan.source).ok().and_then(|p| {
                p.downcast_ref::<StreamTable>()
                    .map(|t| Arc::clone(&t.stream))
            }) {
                Some(s) if found.is_none() => found = Some(s),
                _ => other = true,
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if other { None } else { found }
}

impl Panes {
    /// The panes of the view `plan` (its query, not yet optimised), or `None` when its window
    /// state cannot be kept as panes (see the module docs).
    pub(crate) fn of(plan: &LogicalPlan) -> Result<Option<Panes>> {
        let Some(agg) = find_aggregate(plan) else {
            return Ok(None);
        };
        let Some(scan) = find_window_scan(&agg.input) else {
            return Ok(None);
        };
        if !scan.filters.is_empty() {
            return Ok(None);
        }
        let Some(windowed) = source_as_provider(&scan.source).ok().and_then(|p| {
            p.downcast_ref::<WindowedTable>().map(|w| {
                let (reference, time) = w.table();
                (
                    w.window(),
                    (reference.clone(), time.to_string()),
                    w.plan().clone(),
                )
            })
        }) else {
            return Ok(None);
        };
        let (window, (reference, time), inner) = windowed;
        let (pane_micros, size_micros) = match window {
            Window::Tumble { size } => (size, size),
            Window::Hop { slide, size } => (slide, size),
            Window::Session { .. } => return Ok(None),
        };
        let Some(stream) = only_stream(&inner) else {
            return Ok(None);
        };
        let unit = stream.config.unit;
        let to_ticks = |micros| super::state::micros_to_ticks(unit, micros);
        let (pane, size) = (to_ticks(pane_micros), to_ticks(size_micros));
        if pane <= 0 || size <= 0 {
            return Ok(None);
        }
        // The groups: the window's columns, and keys that do not read them.
        let mut keys = Vec::new();
        let mut groups = Vec::new();
        let mut start = None;
        let mut end = None;
        for e in &agg.group_expr {
            match e {
                Expr::Column(c) if c.name == "window_start" => {
                    groups.push(Group::WindowStart);
                    start = Some(c.clone());
                }
                Expr::Column(c) if c.name == "window_end" => {
                    groups.push(Group::WindowEnd);
                    end = Some(c.clone());
                }
                e if touches_window(e, false) || has_subquery(e) => return Ok(None),
                // Grouping sets have no single key.
                Expr::GroupingSet(_) => return Ok(None),
                e => {
                    groups.push(Group::Key(keys.len()));
                    keys.push(e.clone());
                }
            }
        }
        let pane_of = match (start, end) {
            (Some(s), _) => cast(Expr::Column(s), DataType::Int64),
            (None, Some(e)) => cast(Expr::Column(e), DataType::Int64) - lit(pane),
            (None, None) => return Ok(None),
        };
        // The aggregates: decomposable ones, plainly applied.
        let output = Arc::clone(&agg.schema);
        let mut aggregates = Vec::new();
        let mut distinct: Option<Expr> = None;
        let mut states = 0;
        for (i, e) in agg.aggr_expr.iter().enumerate() {
            let e = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                e => e,
            };
            let Expr::AggregateFunction(f) = e else {
                return Ok(None);
            };
            let p = &f.params;
            // In a pane, the window's columns are the pane's: an argument must not read them.
            if p.filter.is_some()
                || !p.order_by.is_empty()
                || p.null_treatment.is_some()
                || p.args.len() != 1
                || touches_window(&p.args[0], false)
                || has_subquery(&p.args[0])
            {
                return Ok(None);
            }
            let Some(kind) = Kind::of(&f.func.name().to_ascii_lowercase()) else {
                return Ok(None);
            };
            if p.distinct {
                // Its values are kept as one more key: one argument for all, not averaged.
                if kind == Kind::Avg || distinct.as_ref().is_some_and(|d| *d != p.args[0]) {
                    return Ok(None);
                }
                distinct = Some(p.args[0].clone());
                aggregates.push(Aggregate::Distinct { kind });
                continue;
            }
            if kind == Kind::Avg {
                let out = output.field(agg.group_expr.len() + i).data_type();
                let Ok(arg) = p.args[0].get_type(agg.input.schema().as_ref()) else {
                    return Ok(None);
                };
                if *out != DataType::Float64
                    || matches!(arg, DataType::Decimal128(..) | DataType::Decimal256(..))
                {
                    return Ok(None);
                }
            }
            aggregates.push(Aggregate::Plain {
                kind,
                arg: p.args[0].clone(),
                first: states,
            });
            states += kind.merges().len();
        }
        let mut panes = Panes {
            stream,
            view: plan.clone(),
            input: agg.input.as_ref().clone(),
            output,
            keys,
            groups,
            aggregates,
            distinct,
            reference,
            time,
            pane_micros,
            pane,
            size,
            pane_of,
            empty: Arc::new(Schema::empty()),
            rows: Mutex::new(None),
            unmerged: Mutex::new(Vec::new()),
        };
        // The state's schema: the partial aggregation's over the window function's own scan.
        let Ok(partial) = panes.partial(panes.input.clone()) else {
            return Ok(None);
        };
        panes.empty = Arc::new(Schema::new(
            partial
                .schema()
                .fields()
                .iter()
                .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
                .collect::<Vec<_>>(),
        ));
        // The final plan must build: a view it does not fit runs its query as written.
        if panes.final_plan().is_err() {
            return Ok(None);
        }
        Ok(Some(panes))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<PaneRows>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rows of state held now.
    pub(crate) fn state_rows(&self) -> usize {
        self.lock().as_ref().map_or(0, PaneRows::num_rows)
    }

    /// The aggregation of `input` (the view's aggregation input, its window scan replaced) by
    /// key and pane, into the states.
    fn partial(&self, input: LogicalPlan) -> Result<LogicalPlan> {
        let mut group: Vec<Expr> = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| k.clone().alias(key_name(i)))
            .collect();
        if let Some(d) = &self.distinct {
            group.push(d.clone().alias(DISTINCT));
        }
        group.push(self.pane_of.clone().alias(PANE));
        let mut states = Vec::new();
        for a in &self.aggregates {
            if let Aggregate::Plain { kind, arg, first } = a {
                for (j, (f, a)) in kind.states(arg).into_iter().enumerate() {
                    states.push(aggregate(f, a).alias(state_name(first + j)));
                }
            }
        }
        Ok(LogicalPlanBuilder::from(input)
            .aggregate(group, states)?
            .build()?)
    }

    /// The state columns' names and merge functions, in order.
    fn merge_exprs(&self) -> Vec<(String, Arc<AggregateUDF>)> {
        self.aggregates
            .iter()
            .filter_map(|a| match a {
                Aggregate::Plain { kind, first, .. } => Some((*kind, *first)),
                Aggregate::Distinct { .. } => None,
            })
            .flat_map(|(kind, first)| {
                kind.merges()
                    .into_iter()
                    .enumerate()
                    .map(move |(j, f)| (state_name(first + j), f))
            })
            .collect()
    }

    /// The state's key columns: the view's keys, and its DISTINCT argument.
    fn state_keys(&self, distinct: bool) -> Vec<Expr> {
        let mut keys: Vec<Expr> = (0..self.keys.len()).map(|i| column(&key_name(i))).collect();
        if distinct && self.distinct.is_some() {
            keys.push(column(DISTINCT));
        }
        keys
    }

    /// A scan of the state (empty before any row).
    fn scan_state(&self) -> Result<LogicalPlanBuilder> {
        let rows = self
            .lock()
            .clone()
            .unwrap_or_else(|| PaneRows::Host(Arc::clone(&self.empty), Vec::new()));
        Ok(LogicalPlanBuilder::scan(
            PANE_TABLE,
            provider_as_source(Arc::new(PaneTable(rows))),
            None,
        )?)
    }

    /// Groups `plan` (state keys, `by`, states) by the keys (the DISTINCT argument among them
    /// when `distinct`) and `by`, merging the states, cast back to the state's types. Without
    /// the DISTINCT argument, its aggregates are computed too, from the distinct values.
    fn merged(
        &self,
        plan: LogicalPlanBuilder,
        by: &str,
        distinct: bool,
    ) -> Result<LogicalPlanBuilder> {
        let mut group = self.state_keys(distinct);
        group.push(column(by));
        let merges = self.merge_exprs();
        let mut aggs = merges
            .iter()
            .map(|(name, f)| aggregate(Arc::clone(f), column(name)).alias(name))
            .collect::<Vec<_>>();
        let mut out = group.clone();
        for (name, _) in &merges {
            let ty = self.empty.field_with_name(name)?.data_type().clone();
            out.push(cast(column(name), ty).alias(name));
        }
        if !distinct {
            for (i, a) in self.aggregates.iter().enumerate() {
                if let Aggregate::Distinct { kind } = a {
                    let f = match kind {
                        Kind::Count => count_udaf(),
                        Kind::Sum => sum_udaf(),
                        Kind::Min => min_udaf(),
                        // An average is never DISTINCT here (`Panes::of`).
                        Kind::Max | Kind::Avg => max_udaf(),
                    };
                    aggs.push(aggregate(f, column(DISTINCT)).alias(distinct_name(i)));
                    out.push(column(&distinct_name(i)));
                }
            }
        }
        Ok(plan.aggregate(group, aggs)?.project(out)?)
    }

    /// Merges the micro-batch `fresh` (and any a failed merge left) into the state, dropping
    /// the panes of windows that ended at or before `closed`: one query, whose output stays on
    /// the device on a GPU backend. The view's advances take turns, so merges never overlap.
    pub(crate) async fn merge(
        &self,
        ctx: &SessionContext,
        fresh: Option<&Kept>,
        closed: Option<i64>,
    ) -> Result<()> {
        let parts = {
            let mut unmerged = self.unmerged.lock().unwrap_or_else(|p| p.into_inner());
            unmerged.extend(fresh.cloned());
            unmerged.clone()
        };
        if parts.iter().all(|k| k.count == 0) {
            self.taken(parts.len());
            return Ok(());
        }
        let new_rows = Arc::new(self.stream.table_of(parts.clone()));
        let windowed = Arc::new(WindowedTable::over(
            self.reference.clone(),
            new_rows,
            &self.time,
            Window::Tumble {
                size: self.pane_micros,
            },
            Vec::new(),
        )?);
        let input = self
            .input
            .clone()
            .transform_up(|node| match node {
                LogicalPlan::TableScan(mut scan) => {
                    scan.source = provider_as_source(Arc::clone(&windowed) as _);
                    Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
                }
                other => Ok(Transformed::no(other)),
            })?
            .data;
        let partial = self.partial(input)?;
        let plan = if self.lock().is_none() {
            partial
        } else {
            let mut state = self.scan_state()?;
            if let Some(closed) = closed {
                // A pane is needed while the last window holding it, `[pane, pane + size)`,
                // is open.
                state = state.filter(column(PANE).gt(lit(closed.saturating_sub(self.size))))?;
            }
            self.merged(state.union(partial)?, PANE, true)?.build()?
        };
        let rows = self.materialize(ctx, plan).await?;
        *self.lock() = Some(rows);
        self.taken(parts.len());
        Ok(())
    }

    /// The first `n` unmerged micro-batches are in the state now.
    fn taken(&self, n: usize) {
        let mut unmerged = self.unmerged.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.min(unmerged.len());
        unmerged.drain(..n);
    }

    /// Runs `plan` and keeps its rows: in device memory when its top runs on the GPU.
    async fn materialize(&self, ctx: &SessionContext, plan: LogicalPlan) -> Result<PaneRows> {
        let df = ctx.execute_logical_plan(plan).await?;
        let task = Arc::new(df.task_ctx());
        let physical = df.create_physical_plan().await?;
        let schema = physical.schema();
        // One device: a plan spread over several would leave the state in pieces.
        if let Some(gpu) = &self.stream.gpu
            && gpu.devices().len() == 1
            && as_gpu_exec(physical.as_ref()).is_some()
        {
            let device = gpu.devices()[0].clone();
            let batches = crate::exec::collect_on_device(&physical, task, &device).await?;
            let table = Arc::new(DeviceTable::from_device_batches(schema, device, batches));
            let spillable: std::sync::Weak<dyn crate::exec::coordinator::Spillable> =
                Arc::downgrade(&table) as _;
            gpu.register_spillable(spillable);
            return Ok(PaneRows::Device(table));
        }
        let batches = datafusion::physical_plan::collect(physical, task).await?;
        Ok(PaneRows::Host(schema, batches))
    }

    /// The view's query over the state: the panes combined into windows, each aggregate
    /// finished, then the rest of the query.
    pub(crate) fn final_plan(&self) -> Result<LogicalPlan> {
        let hops = self.size / self.pane;
        let keys = self.state_keys(true);
        let states: Vec<Expr> = self
            .merge_exprs()
            .iter()
            .map(|(name, _)| column(name))
            .collect();
        let windows = if hops == 1 {
            let mut exprs = keys;
            exprs.push(column(PANE).alias(WINDOW));
            exprs.extend(states);
            self.scan_state()?.project(exprs)?
        } else {
            let offsets = LogicalPlanBuilder::values((0..hops).map(|k| vec![lit(k)]).collect())?
                .project(vec![column("column1").alias(HOP)])?
                .build()?;
            let mut exprs = keys;
            exprs.push((column(PANE) - column(HOP) * lit(self.pane)).alias(WINDOW));
            exprs.extend(states);
            self.merged(
                self.scan_state()?.cross_join(offsets)?.project(exprs)?,
                WINDOW,
                true,
            )?
        };
        // The DISTINCT argument's values, one row each per key and window, counted.
        let windows = if self.distinct.is_some() {
            self.merged(windows, WINDOW, false)?
        } else {
            windows
        };
        // The aggregation's output, column for column.
        let out_field = |i: usize| {
            let (q, f) = self.output.qualified_field(i);
            (q.cloned(), f.name().clone(), f.data_type().clone())
        };
        let mut exprs = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            let (q, name, ty) = out_field(i);
            let e = match g {
                Group::Key(k) => column(&key_name(*k)),
                Group::WindowStart => column(WINDOW),
                Group::WindowEnd => column(WINDOW) + lit(self.size),
            };
            exprs.push(cast(e, ty).alias_qualified(q, name));
        }
        for (i, a) in self.aggregates.iter().enumerate() {
            let (q, name, ty) = out_field(self.groups.len() + i);
            let e = match a {
                Aggregate::Plain {
                    kind: Kind::Avg,
                    first,
                    ..
                } => {
                    column(&state_name(*first))
                        / cast(column(&state_name(first + 1)), DataType::Float64)
                }
                Aggregate::Plain { first, .. } => column(&state_name(*first)),
                Aggregate::Distinct { .. } => column(&distinct_name(i)),
            };
            exprs.push(cast(e, ty).alias_qualified(q, name));
        }
        let finished = windows.project(exprs)?.build()?;
        replace_aggregate(&self.view, finished)
    }

    /// The state for a checkpoint, on the host.
    pub(crate) fn snapshot(&self) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        match self.lock().clone() {
            None => Ok((Arc::clone(&self.empty), Vec::new())),
            Some(PaneRows::Host(schema, batches)) => Ok((schema, batches)),
            Some(PaneRows::Device(table)) => Ok((Arc::clone(table.schema()), table.to_host()?)),
        }
    }

    /// Puts a checkpoint's state back.
    pub(crate) fn restore(&self, batches: Vec<RecordBatch>) -> Result<()> {
        let schema = batches
            .first()
            .map_or_else(|| Arc::clone(&self.empty), RecordBatch::schema);
        let columns = |s: &Schema| {
            s.fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect::<Vec<_>>()
        };
        if columns(&schema) != columns(&self.empty) {
            return Err(SpateError::Config {
                message: "a checkpoint's window state does not match its view's columns".into(),
            });
        }
        *self.lock() = Some(PaneRows::Host(schema, batches));
        Ok(())
    }
}

/// `plan` with its aggregation (under projections, filters, sorts and aliases) replaced by
/// `by`, which has the aggregation's columns.
fn replace_aggregate(plan: &LogicalPlan, by: LogicalPlan) -> Result<LogicalPlan> {
    if let LogicalPlan::Aggregate(_) = plan {
        return Ok(by);
    }
    let Some(input) = plan.inputs().first().copied() else {
        return Err(SpateError::Internal {
            message: "a pane view's plan has no aggregation".into(),
        });
    };
    let input = replace_aggregate(input, by)?;
    Ok(plan.with_new_exprs(plan.expressions(), vec![input])?)
}
