//! `spate._spate.Expr`: a DataFusion logical expression, built from Python.
//!
//! The Python package (`spate/frame.py`) gives these pandas-like operators and names; this
//! class only offers the building blocks: columns, literals (imported from a one-element
//! pyarrow array, so every Arrow type pyarrow infers is a literal), operators, casts and the
//! scalar and aggregate functions DataFusion ships, looked up by name.

use std::sync::{Arc, OnceLock};

use arrow_pyarrow::PyArrowType;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use spate::arrow::array::{ArrayData, make_array};
use spate::arrow::datatypes::DataType;
use spate::datafusion::common::tree_node::TreeNode;
use spate::datafusion::common::{Column, ScalarValue};
use spate::datafusion::logical_expr::expr::AggregateFunction;
use spate::datafusion::logical_expr::{
    AggregateUDF, BinaryExpr, Case, Expr, ExprFunctionExt, Operator, ScalarUDF, SortExpr, cast,
};

use spate::datafusion::functions::all_default_functions;
use spate::datafusion::functions_aggregate::all_default_aggregate_functions;
use spate::datafusion::functions_nested::all_default_nested_functions;

use crate::errors::{self, IntoPyResult, Origin};

/// A column expression. Immutable: every method returns a new expression.
#[pyclass(name = "Expr", module = "spate._spate", frozen, from_py_object)]
#[derive(Debug, Clone)]
pub struct PyExpr {
    pub(crate) expr: Expr,
}

impl From<Expr> for PyExpr {
    fn from(expr: Expr) -> Self {
        PyExpr { expr }
    }
}

fn scalar_functions() -> &'static [Arc<ScalarUDF>] {
    static FUNCTIONS: OnceLock<Vec<Arc<ScalarUDF>>> = OnceLock::new();
    // Spate's vector distances come first, so a lookup by name finds them.
    FUNCTIONS.get_or_init(|| {
        let mut functions = spate::vector::functions();
        functions.extend(all_default_functions());
        functions.extend(all_default_nested_functions());
        functions
    })
}

/// DataFusion's aggregates, and `product` (for `prod` and `cumprod`).
pub(crate) fn aggregate_functions() -> &'static [Arc<AggregateUDF>] {
    static FUNCTIONS: OnceLock<Vec<Arc<AggregateUDF>>> = OnceLock::new();
    FUNCTIONS.get_or_init(|| {
        let mut functions = all_default_aggregate_functions();
        functions.push(crate::window::product());
        functions
    })
}

/// The value of a one-element pyarrow array (`what` names it in the error), with its type.
pub(crate) fn one_value(value: PyArrowType<ArrayData>, what: &str) -> PyResult<ScalarValue> {
    let array = make_array(value.0);
    if array.len() != 1 {
        return Err(errors::invalid(format!(
            "{what} is a one-element array, got {} elements",
            array.len()
        )));
    }
    ScalarValue::try_from_array(&array, 0).py(Origin::Frame)
}

fn exprs(args: Vec<PyExpr>) -> Vec<Expr> {
    args.into_iter().map(|a| a.expr).collect()
}

#[pymethods]
impl PyExpr {
    /// The column `name`, taken verbatim (no case folding, dots are part of the name).
    #[staticmethod]
    fn col(name: &str) -> Self {
        Expr::Column(Column::from_name(name)).into()
    }

    /// The column `name` of the input aliased `relation` (used after joins).
    #[staticmethod]
    fn qualified(relation: &str, name: &str) -> Self {
        Expr::Column(Column::new(Some(relation), name)).into()
    }

    /// A literal: the first value of a one-element pyarrow array (so its type is exactly the
    /// array's).
    #[staticmethod]
    fn lit(value: PyArrowType<ArrayData>) -> PyResult<Self> {
        Ok(Expr::Literal(one_value(value, "a literal")?, None).into())
    }

    /// `self <op> other` for op in + - * / % == != < <= > >= & | and `||` (string
    /// concatenation).
    fn binary(&self, op: &str, other: &PyExpr) -> PyResult<Self> {
        let op = match op {
            "+" => Operator::Plus,
            "-" => Operator::Minus,
            "*" => Operator::Multiply,
            "/" => Operator::Divide,
            "%" => Operator::Modulo,
            "==" => Operator::Eq,
            "!=" => Operator::NotEq,
            "<" => Operator::Lt,
            "<=" => Operator::LtEq,
            ">" => Operator::Gt,
            ">=" => Operator::GtEq,
            "&" => Operator::And,
            "|" => Operator::Or,
            "||" => Operator::StringConcat,
            other => {
                return Err(errors::invalid(format!(
                    "unknown operator '{other}': expected one of + - * / % == != < <= > >= & | \
                     ||"
                )));
            }
        };
        Ok(Expr::BinaryExpr(BinaryExpr::new(
            Box::new(self.expr.clone()),
            op,
            Box::new(other.expr.clone()),
        ))
        .into())
    }

    /// `-self`.
    fn negate(&self) -> Self {
        Expr::Negative(Box::new(self.expr.clone())).into()
    }

    /// `NOT self`.
    fn invert(&self) -> Self {
        Expr::Not(Box::new(self.expr.clone())).into()
    }

    /// `self IS NULL`.
    fn is_null(&self) -> Self {
        self.expr.clone().is_null().into()
    }

    /// `self IS NOT NULL`.
    fn is_not_null(&self) -> Self {
        self.expr.clone().is_not_null().into()
    }

    /// `self IN (values...)`, or `NOT IN` when `negated`.
    #[pyo3(signature = (values, negated = false))]
    fn isin(&self, values: Vec<PyExpr>, negated: bool) -> Self {
        self.expr.clone().in_list(exprs(values), negated).into()
    }

    /// `CAST(self AS type)`.
    fn cast(&self, data_type: PyArrowType<DataType>) -> Self {
        cast(self.expr.clone(), data_type.0).into()
    }

    /// `CASE WHEN when_1 THEN then_1 ... ELSE otherwise END`: the `then` of the first
    /// `(when, then)` pair whose condition is true, else `otherwise` (null when None).
    #[staticmethod]
    #[pyo3(signature = (branches, otherwise = None))]
    fn case(branches: Vec<(PyExpr, PyExpr)>, otherwise: Option<PyExpr>) -> PyResult<Self> {
        if branches.is_empty() {
            return Err(errors::invalid(
                "case needs at least one (condition, value) pair".to_string(),
            ));
        }
        let when_then = branches
            .into_iter()
            .map(|(when, then)| (Box::new(when.expr), Box::new(then.expr)))
            .collect();
        let otherwise = otherwise.map(|e| Box::new(e.expr));
        Ok(Expr::Case(Case::new(None, when_then, otherwise)).into())
    }

    /// The same expression under the output name `name`.
    fn alias(&self, name: &str) -> Self {
        self.expr.clone().alias(name).into()
    }

    /// A call of DataFusion's scalar function `name` (e.g. `upper`, `starts_with`,
    /// `regexp_like`, `coalesce`, `round`).
    #[staticmethod]
    fn function(name: &str, args: Vec<PyExpr>) -> PyResult<Self> {
        let udf = scalar_functions()
            .iter()
            .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
            .ok_or_else(|| errors::invalid(format!("unknown scalar function '{name}'")))?;
        Ok(udf.call(exprs(args)).into())
    }

    /// A call of DataFusion's aggregate function `name` (e.g. `sum`, `avg`, `count`, `min`,
    /// `max`, `median`, `stddev`, `var_samp`), over distinct values when `distinct`.
    #[staticmethod]
    #[pyo3(signature = (name, args, distinct = false))]
    fn aggregate(name: &str, args: Vec<PyExpr>, distinct: bool) -> PyResult<Self> {
        let udaf = aggregate_functions()
            .iter()
            .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
            .ok_or_else(|| errors::invalid(format!("unknown aggregate function '{name}'")))?;
        let call = Expr::AggregateFunction(AggregateFunction::new_udf(
            Arc::clone(udaf),
            exprs(args),
            false,
            None,
            vec![],
            None,
        ));
        if distinct {
            return call.distinct().build().py(Origin::Frame).map(Into::into);
        }
        Ok(call.into())
    }

    /// `name(args) OVER (PARTITION BY partition_by ORDER BY order_by frame)`: a window
    /// function (`row_number`, `rank`, `lag`, `last_value`, ...), an aggregate, or `product`.
    /// `order_by` holds `(expr, ascending, nulls_first)`; `frame` is `(units, start, end)` with
    /// units `rows`, `range` or `groups` and each end `("preceding" | "following", value or
    /// None for UNBOUNDED)` or `("current", None)`; None gives SQL's default frame.
    #[staticmethod]
    #[pyo3(signature = (name, args, partition_by, order_by, frame = None, ignore_nulls = false))]
    fn window(
        name: &str,
        args: Vec<PyExpr>,
        partition_by: Vec<PyExpr>,
        order_by: Vec<(PyExpr, bool, bool)>,
        frame: Option<(String, crate::window::PyBound, crate::window::PyBound)>,
        ignore_nulls: bool,
    ) -> PyResult<Self> {
        crate::window::window(
            name,
            exprs(args),
            exprs(partition_by),
            order_by,
            frame,
            ignore_nulls,
        )
        .map(Into::into)
    }

    /// A call of the Python `callable` on each batch: it gets the arguments as a list of
    /// pyarrow arrays and returns one pyarrow array of `return_type` (see `udf.rs`).
    #[staticmethod]
    fn python_function(
        name: &str,
        callable: Bound<'_, PyAny>,
        args: Vec<PyExpr>,
        return_type: PyArrowType<DataType>,
    ) -> PyResult<Self> {
        if !callable.is_callable() {
            return Err(errors::invalid(format!(
                "{name}: the function is not callable"
            )));
        }
        let function =
            crate::udf::PythonFunction::new(name.to_string(), callable.unbind(), return_type.0);
        Ok(ScalarUDF::from(function).call(exprs(args)).into())
    }

    /// Whether the expression holds a window function (it then cannot sit in a filter or an
    /// aggregate, and a frame computes it in its row order).
    fn has_window(&self) -> bool {
        self.expr
            .exists(|e| Ok(matches!(e, Expr::WindowFunction(_))))
            .unwrap_or(false)
    }

    /// The names of the columns this expression reads, sorted, without duplicates.
    fn column_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .expr
            .column_refs()
            .into_iter()
            .map(|c| c.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The name DataFusion gives this expression's output column.
    fn output_name(&self) -> PyResult<String> {
        Ok(self.expr.schema_name().to_string())
    }

    fn __repr__(&self) -> String {
        format!("Expr({})", self.expr)
    }
}

/// An ordering: an expression, its direction and where nulls go.
pub(crate) fn sort_expr(expr: &PyExpr, ascending: bool, nulls_first: bool) -> SortExpr {
    expr.expr.clone().sort(ascending, nulls_first)
}
