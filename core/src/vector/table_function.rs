//! The table function `vector_topk(items, emb, queries, query_emb, k, metric)`: for each row
//! of table `queries`, the `k` rows of table `items` whose embedding `emb` is nearest to its
//! `query_emb`, as rows `(query_row, item_row, rank, distance)`.
//!
//! `items` and `queries` name tables or views; `emb` and `query_emb` name embedding columns of
//! the same dimension (their element types may differ). The names may be written bare or
//! quoted as strings. `k` is 1 to 4,096. `metric` is `cosine` (`cosine_distance`), `ip`
//! (`inner_product`, `dot_product`: larger is nearer) or `l2` (`array_distance`, Euclidean).
//! The distances are the distance functions' own, bit for bit (see [`super::score`]).
//!
//! The function plans a [`VectorTopKExec`] over a scan of each table's embedding column; on a
//! GPU backend the offload rule swaps it for `GpuVectorTopKExec`.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::{DataFusionError, ScalarValue, TableReference};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::execution::SessionState;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use super::distance::Metric;
use super::nearest::{VectorTopKExec, nearest_schema};

/// The most rows `vector_topk` keeps per query: the GPU kernels' largest `k`, on every
/// backend alike.
pub const MAX_K: usize = spate_kernels::vector_topk::MAX_K;

/// The SQL name.
pub const NAME: &str = "vector_topk";

const USAGE: &str = "vector_topk(items, emb, queries, query_emb, k, metric): items and queries \
                     name tables, emb and query_emb their embedding columns, k is 1 to 4096, \
                     metric is cosine, ip or l2";

fn plan_error(message: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(message.into())
}

/// `vector_topk`, registered in every session.
#[derive(Debug, Default)]
pub struct VectorTopKFunction;

/// A table argument: an identifier as written (`"MyTable"` keeps its case), or a string
/// parsed as SQL would (`'sales.items'`).
fn table_arg(e: &Expr) -> Option<TableReference> {
    match e {
        Expr::Column(c) => Some(match &c.relation {
            Some(relation) => {
                let mut parts: Vec<String> = relation
                    .to_vec()
                    .into_iter()
                    .map(|p| p.to_string())
                    .collect();
                parts.push(c.name.clone());
                match parts.as_slice() {
                    [schema, table] => TableReference::partial(schema.as_str(), table.as_str()),
                    [catalog, schema, table] => {
                        TableReference::full(catalog.as_str(), schema.as_str(), table.as_str())
                    }
                    _ => return None,
                }
            }
            None => TableReference::bare(c.name.as_str()),
        }),
        Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)), _) => {
            Some(TableReference::from(s.as_str()))
        }
        _ => None,
    }
}

/// A column or metric argument: an identifier as written, or a string.
fn name_arg(e: &Expr) -> Option<String> {
    match e {
        Expr::Column(c) if c.relation.is_none() => Some(c.name.clone()),
        Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)), _) => {
            Some(s.clone())
        }
        _ => None,
    }
}

/// The metric a `vector_topk` argument names.
pub fn metric_named(name: &str) -> Option<Metric> {
    match name.to_ascii_lowercase().as_str() {
        "cosine" | "cosine_distance" => Some(Metric::Cosine),
        "ip" | "inner_product" | "dot_product" | "dot" => Some(Metric::Inner),
        "l2" | "euclidean" | "array_distance" => Some(Metric::L2),
        _ => None,
    }
}

/// `k` from its argument: an integer literal from 1 to [`MAX_K`].
fn k_arg(e: &Expr) -> DFResult<usize> {
    let value = match e {
        Expr::Literal(v, _) => v.clone(),
        _ => {
            return Err(plan_error(format!(
                "vector_topk: k must be a number; {USAGE}"
            )));
        }
    };
    let k = match (
        value.data_type().is_integer(),
        value.cast_to(&DataType::Int64),
    ) {
        (true, Ok(ScalarValue::Int64(Some(k)))) => k,
        _ => {
            return Err(plan_error(format!(
                "vector_topk: k is {value}, not a whole number"
            )));
        }
    };
    usize::try_from(k)
        .ok()
        .filter(|k| (1..=MAX_K).contains(k))
        .ok_or_else(|| plan_error(format!("vector_topk: k is {k}; it must be 1 to {MAX_K}")))
}

/// One input: a table and its embedding column.
#[derive(Debug, Clone)]
struct Input {
    provider: Arc<dyn TableProvider>,
    column: usize,
}

impl Input {
    fn resolve(
        state: &SessionState,
        table: &TableReference,
        column: &str,
        what: &str,
    ) -> DFResult<Self> {
        let schema = state.schema_for_ref(table.clone())?;
        // DataFusion calls table functions synchronously (`TableFunctionImpl`); an in-memory
        // or listing catalog answers at once.
        let provider = futures::executor::block_on(schema.table(table.table()))?
            .ok_or_else(|| plan_error(format!("vector_topk: no table named '{table}' ({what})")))?;
        let (column, _) = provider.schema().column_with_name(column).ok_or_else(|| {
            plan_error(format!("vector_topk: '{table}' has no column '{column}'"))
        })?;
        Ok(Input { provider, column })
    }

    async fn scan(&self, state: &dyn Session) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.provider
            .scan(state, Some(&vec![self.column]), &[], None)
            .await
    }
}

impl TableFunctionImpl for VectorTopKFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if exprs.len() != 6 {
            return Err(plan_error(format!(
                "vector_topk takes 6 arguments, not {}; {USAGE}",
                exprs.len()
            )));
        }
        let not_a_name = |e: &Expr| plan_error(format!("vector_topk: {e} is not a name; {USAGE}"));
        let [items_table, queries_table] =
            [&exprs[0], &exprs[2]].map(|e| table_arg(e).ok_or_else(|| not_a_name(e)));
        let [items_column, queries_column] =
            [&exprs[1], &exprs[3]].map(|e| name_arg(e).ok_or_else(|| not_a_name(e)));
        let k = k_arg(&exprs[4])?;
        let metric = name_arg(&exprs[5])
            .and_then(|m| metric_named(&m))
            .ok_or_else(|| {
                plan_error(format!(
                    "vector_topk: unknown metric {}; it is cosine, ip or l2",
                    exprs[5]
                ))
            })?;
        let state = args
            .session()
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| plan_error("vector_topk needs a SessionState"))?;
        let items = Input::resolve(state, &items_table?, &items_column?, "the items")?;
        let queries = Input::resolve(state, &queries_table?, &queries_column?, "the queries")?;
        // The column types are checked now, so that a bad call fails when it is planned.
        let field = |input: &Input| input.provider.schema().field(input.column).clone();
        let probe = |input: &Input| -> Arc<dyn ExecutionPlan> {
            Arc::new(datafusion::physical_plan::empty::EmptyExec::new(Arc::new(
                arrow::datatypes::Schema::new(vec![field(input)]),
            )))
        };
        VectorTopKExec::try_new(probe(&items), probe(&queries), k, metric)?;
        Ok(Arc::new(VectorTopKTable {
            items,
            queries,
            k,
            metric,
        }))
    }
}

/// The result of one `vector_topk` call.
#[derive(Debug)]
struct VectorTopKTable {
    items: Input,
    queries: Input,
    k: usize,
    metric: Metric,
}

#[async_trait]
impl TableProvider for VectorTopKTable {
    fn schema(&self) -> SchemaRef {
        nearest_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let top: Arc<dyn ExecutionPlan> = Arc::new(VectorTopKExec::try_new(
            self.items.scan(state).await?,
            self.queries.scan(state).await?,
            self.k,
            self.metric,
        )?);
        let Some(projection) = projection else {
            return Ok(top);
        };
        let schema = top.schema();
        let columns = projection
            .iter()
            .map(|&i| {
                let name = schema.field(i).name();
                ProjectionExpr::new(Arc::new(Column::new(name, i)), name.clone())
            })
            .collect::<Vec<_>>();
        Ok(Arc::new(ProjectionExec::try_new(columns, top)?))
    }
}
