//! `spate._spate.Frame`: a lazy DataFusion DataFrame. Every method but the ones that run the
//! plan (`collect`, `count`, `explain`) only builds a bigger plan.
//!
//! The pandas semantics (index columns, true division, `sum` of nothing being 0, null keys
//! matching in `merge`) are decided in `spate/frame.py`; this class offers plan building blocks
//! with those semantics expressible, and runs plans with the GIL released.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use spate::Engine;
use spate::arrow::array::{Array, StringArray, UInt64Array};
use spate::arrow::datatypes::{FieldRef, SchemaRef};
use spate::arrow::record_batch::RecordBatch;
use spate::datafusion::common::{Column, JoinType, NullHandling, TableReference, UnnestOptions};
use spate::datafusion::dataframe::DataFrame;
use spate::datafusion::dataframe::DataFrameWriteOptions;
use spate::datafusion::error::DataFusionError;
use spate::datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use spate::datafusion::prelude::coalesce;

use arrow_pyarrow::ToPyArrow;

use crate::errors::{self, IntoPyResult, Origin};
use crate::expr::{PyExpr, sort_expr};
use crate::interchange;
use crate::runtime::wait;

const LEFT: &str = "__spate_left";
const RIGHT: &str = "__spate_right";

/// A lazy query over a session's tables.
#[pyclass(name = "Frame", module = "spate._spate", frozen, skip_from_py_object)]
#[derive(Debug, Clone)]
pub struct PyFrame {
    pub(crate) engine: Arc<Engine>,
    pub(crate) df: DataFrame,
}

impl PyFrame {
    pub(crate) fn new(engine: Arc<Engine>, df: DataFrame) -> Self {
        PyFrame { engine, df }
    }

    fn with(&self, df: DataFrame) -> Self {
        PyFrame::new(Arc::clone(&self.engine), df)
    }

    /// The columns with their qualifiers, as expressions that resolve unambiguously.
    fn qualified_columns(&self) -> Vec<(Option<TableReference>, FieldRef)> {
        self.df
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), Arc::clone(f)))
            .collect()
    }

    /// Runs the plan, GIL released, and returns its schema and batches.
    fn run(&self, py: Python<'_>) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
        let df = self.df.clone();
        let result = wait(py, async move {
            let stream = df.execute_stream().await?;
            let schema = stream.schema();
            let batches = futures::TryStreamExt::try_collect::<Vec<_>>(stream).await?;
            Ok::<_, DataFusionError>((schema, batches))
        })?;
        result.py(Origin::Frame)
    }
}

fn column_expr(qualifier: Option<&TableReference>, field: &FieldRef) -> Expr {
    Expr::Column(Column::from((qualifier, field)))
}

fn join_type(how: &str) -> PyResult<JoinType> {
    Ok(match how {
        "inner" => JoinType::Inner,
        "left" => JoinType::Left,
        "right" => JoinType::Right,
        "outer" | "full" => JoinType::Full,
        "leftsemi" | "semi" => JoinType::LeftSemi,
        "leftanti" | "anti" => JoinType::LeftAnti,
        other => {
            return Err(errors::invalid(format!(
                "unknown merge type how='{other}': expected inner, left, right, outer, \
                 leftsemi or leftanti"
            )));
        }
    })
}

#[pymethods]
impl PyFrame {
    /// The output schema, as a `pyarrow.Schema`.
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.df.schema().as_arrow().to_pyarrow(py)
    }

    /// The output column names, in order.
    fn columns(&self) -> Vec<String> {
        self.df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// `SELECT exprs`.
    fn select(&self, exprs: Vec<PyExpr>) -> PyResult<Self> {
        let exprs: Vec<Expr> = exprs.into_iter().map(|e| e.expr).collect();
        Ok(self.with(self.df.clone().select(exprs).py(Origin::Frame)?))
    }

    /// `WHERE predicate`.
    fn filter(&self, predicate: &PyExpr) -> PyResult<Self> {
        Ok(self.with(
            self.df
                .clone()
                .filter(predicate.expr.clone())
                .py(Origin::Frame)?,
        ))
    }

    /// `SELECT group..., aggregates... GROUP BY group...`.
    fn aggregate(&self, group: Vec<PyExpr>, aggregates: Vec<PyExpr>) -> PyResult<Self> {
        let group = group.into_iter().map(|e| e.expr).collect();
        let aggregates = aggregates.into_iter().map(|e| e.expr).collect();
        Ok(self.with(
            self.df
                .clone()
                .aggregate(group, aggregates)
                .py(Origin::Frame)?,
        ))
    }

    /// `ORDER BY`, one direction and null placement per key.
    fn sort(
        &self,
        keys: Vec<PyExpr>,
        ascending: Vec<bool>,
        nulls_first: Vec<bool>,
    ) -> PyResult<Self> {
        if keys.len() != ascending.len() || keys.len() != nulls_first.len() {
            return Err(errors::invalid(format!(
                "sort: {} keys but {} directions and {} null placements",
                keys.len(),
                ascending.len(),
                nulls_first.len()
            )));
        }
        let order = keys
            .iter()
            .zip(ascending)
            .zip(nulls_first)
            .map(|((k, asc), nf)| sort_expr(k, asc, nf))
            .collect();
        Ok(self.with(self.df.clone().sort(order).py(Origin::Frame)?))
    }

    /// `LIMIT n OFFSET offset`.
    #[pyo3(signature = (n, offset = 0))]
    fn limit(&self, n: Option<usize>, offset: usize) -> PyResult<Self> {
        Ok(self.with(self.df.clone().limit(offset, n).py(Origin::Frame)?))
    }

    /// `self UNION ALL other` (the columns matched by position).
    fn union(&self, other: &PyFrame) -> PyResult<Self> {
        Ok(self.with(self.df.clone().union(other.df.clone()).py(Origin::Frame)?))
    }

    /// `SELECT DISTINCT *`.
    fn distinct(&self) -> PyResult<Self> {
        Ok(self.with(self.df.clone().distinct().py(Origin::Frame)?))
    }

    /// One row per distinct value of `on` (which row is unspecified unless `order` fixes it:
    /// the first row in that order is kept).
    fn distinct_on(
        &self,
        on: Vec<PyExpr>,
        order: Vec<PyExpr>,
        ascending: Vec<bool>,
    ) -> PyResult<Self> {
        let select = self
            .qualified_columns()
            .iter()
            .map(|(q, f)| column_expr(q.as_ref(), f))
            .collect();
        let on = on.into_iter().map(|e| e.expr).collect();
        let order = if order.is_empty() {
            None
        } else {
            Some(
                order
                    .iter()
                    .zip(ascending)
                    .map(|(k, asc)| sort_expr(k, asc, false))
                    .collect(),
            )
        };
        Ok(self.with(
            self.df
                .clone()
                .distinct_on(on, select, order)
                .py(Origin::Frame)?,
        ))
    }

    /// All columns, with `expr` as column `name` (replacing a column of that name in place, or
    /// appended).
    fn with_column(&self, name: &str, expr: &PyExpr) -> PyResult<Self> {
        Ok(self.with(
            self.df
                .clone()
                .with_column(name, expr.expr.clone())
                .py(Origin::Frame)?,
        ))
    }

    /// All columns, renamed by `mapping` (old name to new name; names not present are
    /// ignored, as pandas does).
    fn rename(&self, mapping: HashMap<String, String>) -> PyResult<Self> {
        let exprs: Vec<Expr> = self
            .qualified_columns()
            .iter()
            .map(|(q, f)| match mapping.get(f.name()) {
                Some(new) => column_expr(q.as_ref(), f).alias(new),
                None => column_expr(q.as_ref(), f),
            })
            .collect();
        Ok(self.with(self.df.clone().select(exprs).py(Origin::Frame)?))
    }

    /// A pandas-style merge: `left_on[i]` matches `right_on[i]`, with nulls matching nulls
    /// when `nulls_equal` (pandas' behaviour). A key named the same on both sides appears
    /// once (for `outer`, the non-null of the two); other columns that appear on both sides get
    /// `suffixes`. Semi and anti joins keep the left columns only.
    #[pyo3(signature = (right, how, left_on, right_on, suffixes, nulls_equal = true))]
    fn merge(
        &self,
        right: &PyFrame,
        how: &str,
        left_on: Vec<String>,
        right_on: Vec<String>,
        suffixes: (String, String),
        nulls_equal: bool,
    ) -> PyResult<Self> {
        let kind = join_type(how)?;
        if left_on.len() != right_on.len() {
            return Err(errors::invalid(format!(
                "merge: {} left keys but {} right keys",
                left_on.len(),
                right_on.len()
            )));
        }
        if left_on.is_empty() && !matches!(kind, JoinType::Inner) {
            return Err(errors::invalid(format!(
                "merge how='{how}' needs join keys (on=, or left_on= and right_on=)"
            )));
        }
        let left_names = self.columns();
        let right_names = right.columns();
        for (side, keys, names) in [
            ("left", &left_on, &left_names),
            ("right", &right_on, &right_names),
        ] {
            if let Some(missing) = keys.iter().find(|k| !names.contains(k)) {
                return Err(errors::to_py(
                    spate::SpateError::Sql {
                        message: format!(
                            "merge: the {side} frame has no column '{missing}' (its columns: {})",
                            names.join(", ")
                        ),
                        location: None,
                    },
                    Origin::Frame,
                ));
            }
        }
        let lhs = self.df.clone().alias(LEFT).py(Origin::Frame)?;
        let rhs = right.df.clone().alias(RIGHT).py(Origin::Frame)?;
        let on: Vec<Expr> = left_on
            .iter()
            .zip(&right_on)
            .map(|(l, r)| {
                let l = Expr::Column(Column::new(Some(LEFT), l));
                let r = Expr::Column(Column::new(Some(RIGHT), r));
                if nulls_equal {
                    Expr::BinaryExpr(BinaryExpr::new(
                        Box::new(l),
                        Operator::IsNotDistinctFrom,
                        Box::new(r),
                    ))
                } else {
                    l.eq(r)
                }
            })
            .collect();
        let joined = if on.is_empty() {
            lhs.join_on(rhs, JoinType::Inner, [])
        } else {
            lhs.join_on(rhs, kind, on)
        }
        .py(Origin::Frame)?;

        // A key with the same name on both sides becomes one column.
        let shared_keys: Vec<&String> = left_on
            .iter()
            .zip(&right_on)
            .filter(|(l, r)| l == r)
            .map(|(l, _)| l)
            .collect();
        let keeps_right = !matches!(kind, JoinType::LeftSemi | JoinType::LeftAnti);
        let left_col = |name: &str| Expr::Column(Column::new(Some(LEFT), name));
        let right_col = |name: &str| Expr::Column(Column::new(Some(RIGHT), name));
        let mut output = Vec::new();
        for name in &left_names {
            let expr = if shared_keys.contains(&name) && keeps_right {
                match kind {
                    JoinType::Right => right_col(name),
                    JoinType::Full => coalesce(vec![left_col(name), right_col(name)]),
                    _ => left_col(name),
                }
                .alias(name)
            } else if keeps_right && right_names.contains(name) {
                left_col(name).alias(format!("{name}{}", suffixes.0))
            } else {
                left_col(name).alias(name)
            };
            output.push(expr);
        }
        if keeps_right {
            for name in &right_names {
                if shared_keys.contains(&name) {
                    continue;
                }
                let alias = if left_names.contains(name) {
                    format!("{name}{}", suffixes.1)
                } else {
                    name.clone()
                };
                output.push(right_col(name).alias(alias));
            }
        }
        Ok(self.with(joined.select(output).py(Origin::Frame)?))
    }

    /// One row per element of the list column `column`, the other columns repeated
    /// (pandas' `explode`): a null or empty list gives one row with a null element.
    fn explode(&self, column: &str) -> PyResult<Self> {
        let options = UnnestOptions::new().with_null_handling(NullHandling::PreserveAndExpandEmpty);
        Ok(self.with(
            self.df
                .clone()
                .unnest_columns_with_options(&[column], options)
                .py(Origin::Frame)?,
        ))
    }

    /// Runs the plan and writes its result to `path` as one `parquet`, `csv` (with a header)
    /// or `json` (newline-delimited) file, by the engine; returns the rows written.
    fn write(&self, py: Python<'_>, path: String, format: &str) -> PyResult<u64> {
        let df = self.df.clone();
        let options = DataFrameWriteOptions::new().with_single_file_output(true);
        let format = format.to_string();
        let written = wait(py, async move {
            match format.as_str() {
                "parquet" => df.write_parquet(&path, options, None).await,
                "csv" => df.write_csv(&path, options, None).await,
                "json" => df.write_json(&path, options, None).await,
                other => Err(DataFusionError::Configuration(format!(
                    "unknown output format '{other}': expected parquet, csv or json"
                ))),
            }
        })?
        .py(Origin::Frame)?;
        let mut rows = 0u64;
        for batch in &written {
            if let Some(counts) = batch.column(0).as_any().downcast_ref::<UInt64Array>() {
                rows += counts.iter().flatten().sum::<u64>();
            }
        }
        Ok(rows)
    }

    /// A SQL expression (e.g. `"a > 2 AND b IS NOT NULL"`) over this frame's columns.
    fn parse_expr(&self, sql: &str) -> PyResult<PyExpr> {
        Ok(self.df.parse_sql_expr(sql).py(Origin::Sql)?.into())
    }

    /// Runs the plan and returns its number of rows.
    fn count(&self, py: Python<'_>) -> PyResult<usize> {
        let df = self.df.clone();
        wait(py, async move { df.count().await })?.py(Origin::Frame)
    }

    /// The plan as `EXPLAIN` prints it (with GPU placement on GPU backends); `analyze` runs
    /// it and adds each operator's metrics.
    #[pyo3(signature = (verbose = false, analyze = false))]
    fn explain(&self, py: Python<'_>, verbose: bool, analyze: bool) -> PyResult<String> {
        let engine = Arc::clone(&self.engine);
        let df = self.df.clone();
        let batches = wait(py, async move {
            let explained = engine.explain(df, verbose, analyze).await?;
            Ok::<_, spate::SpateError>(explained.collect().await?)
        })?
        .py(Origin::Frame)?;
        let mut text = String::new();
        for batch in &batches {
            let (Some(kinds), Some(plans)) = (
                batch.column(0).as_any().downcast_ref::<StringArray>(),
                batch.column(1).as_any().downcast_ref::<StringArray>(),
            ) else {
                return Err(errors::internal(
                    "EXPLAIN returned columns that are not strings".to_string(),
                ));
            };
            for row in 0..batch.num_rows() {
                if kinds.is_valid(row) && plans.is_valid(row) {
                    text.push_str(kinds.value(row));
                    text.push('\n');
                    text.push_str(plans.value(row).trim_end());
                    text.push_str("\n\n");
                }
            }
        }
        Ok(text.trim_end().to_string())
    }

    /// Runs the plan and returns its result as an Arrow C stream capsule (the PyCapsule
    /// protocol's `__arrow_c_stream__`). `requested_schema` is accepted and ignored, as the
    /// protocol allows: the result already has its own types.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let (schema, batches) = self.run(py)?;
        interchange::export(py, schema, batches)
    }

    /// The logical plan, indented, before optimisation.
    fn logical_plan(&self) -> String {
        self.df.logical_plan().display_indent().to_string()
    }

    fn __repr__(&self) -> String {
        format!("Frame[{}]", self.columns().join(", "))
    }
}
