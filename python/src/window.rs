//! Window expressions for the pandas window methods (`cumsum`, `rolling`, `shift`, `rank`,
//! groupby `transform`, ...): `name(args) OVER (PARTITION BY .. ORDER BY .. frame)`.
//!
//! The functions are DataFusion's window functions (`row_number`, `rank`, `lag`,
//! `last_value`, ...), its aggregates, and [`product`] (for `cumprod`), looked up by name.
//! DataFusion plans them as `WindowAggExec` / `BoundedWindowAggExec`, which Spate runs on the
//! GPU where its window operator covers the function and frame (see core/src/exec/window).

use std::sync::{Arc, OnceLock};

use arrow_pyarrow::PyArrowType;
use pyo3::prelude::*;
use spate::arrow::array::{ArrayData, ArrayRef, AsArray};
use spate::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use spate::datafusion::common::ScalarValue;
use spate::datafusion::error::{DataFusionError, Result as DFResult};
use spate::datafusion::functions_window::all_default_window_functions;
use spate::datafusion::logical_expr::expr::{NullTreatment, WindowFunction};
use spate::datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use spate::datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Expr, Signature, TypeSignature, Volatility,
    WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition, WindowUDF,
};

use crate::errors;
use crate::expr::{PyExpr, aggregate_functions, one_value, sort_expr};

/// One end of a window frame, as Python passes it: `("preceding" | "following", value)` with
/// None for UNBOUNDED, or `("current", None)`.
pub(crate) type PyBound = (String, Option<PyArrowType<ArrayData>>);

fn window_functions() -> &'static [Arc<WindowUDF>] {
    static FUNCTIONS: OnceLock<Vec<Arc<WindowUDF>>> = OnceLock::new();
    FUNCTIONS.get_or_init(all_default_window_functions)
}

/// The aggregate `product`, for `cumprod`: DataFusion ships none.
pub(crate) fn product() -> Arc<AggregateUDF> {
    static PRODUCT: OnceLock<Arc<AggregateUDF>> = OnceLock::new();
    Arc::clone(PRODUCT.get_or_init(|| Arc::new(AggregateUDF::from(Product::new()))))
}

fn bound(end: PyBound) -> PyResult<WindowFrameBound> {
    let (kind, value) = end;
    let value = match value {
        Some(v) => one_value(v, "a window frame bound")?,
        None => ScalarValue::Null,
    };
    Ok(match kind.as_str() {
        "preceding" => WindowFrameBound::Preceding(value),
        "following" => WindowFrameBound::Following(value),
        "current" => WindowFrameBound::CurrentRow,
        other => {
            return Err(errors::invalid(format!(
                "unknown window frame bound '{other}': expected preceding, following or current"
            )));
        }
    })
}

/// `name(args) OVER (PARTITION BY partition_by ORDER BY order_by frame)`; `frame` is
/// `(units, start, end)` with units `rows`, `range` or `groups`, and None gives SQL's
/// default frame. `ignore_nulls` is `IGNORE NULLS` (for `first_value` / `last_value`).
pub(crate) fn window(
    name: &str,
    args: Vec<Expr>,
    partition_by: Vec<Expr>,
    order_by: Vec<(PyExpr, bool, bool)>,
    frame: Option<(String, PyBound, PyBound)>,
    ignore_nulls: bool,
) -> PyResult<Expr> {
    let fun = if name == "product" {
        WindowFunctionDefinition::AggregateUDF(product())
    } else if let Some(udwf) = window_functions()
        .iter()
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
    {
        WindowFunctionDefinition::WindowUDF(Arc::clone(udwf))
    } else if let Some(udaf) = aggregate_functions()
        .iter()
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
    {
        WindowFunctionDefinition::AggregateUDF(Arc::clone(udaf))
    } else {
        return Err(errors::invalid(format!("unknown window function '{name}'")));
    };
    let mut call = WindowFunction::new(fun, args);
    let ordered = !order_by.is_empty();
    call.params.partition_by = partition_by;
    call.params.order_by = order_by
        .iter()
        .map(|(e, asc, nulls_first)| sort_expr(e, *asc, *nulls_first))
        .collect();
    call.params.window_frame = match frame {
        None => WindowFrame::new(ordered.then_some(false)),
        Some((units, start, end)) => {
            let units = match units.as_str() {
                "rows" => WindowFrameUnits::Rows,
                "range" => WindowFrameUnits::Range,
                "groups" => WindowFrameUnits::Groups,
                other => {
                    return Err(errors::invalid(format!(
                        "unknown window frame units '{other}': expected rows, range or groups"
                    )));
                }
            };
            WindowFrame::new_bounds(units, bound(start)?, bound(end)?)
        }
    };
    if ignore_nulls {
        call.params.null_treatment = Some(NullTreatment::IgnoreNulls);
    }
    Ok(Expr::WindowFunction(Box::new(call)))
}

/// `product(x)` of Int64 (wrapping, as NumPy's int64 does) or Float64 values; nulls are
/// skipped and the product of no values is 1, as pandas' `prod` gives.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Product {
    signature: Signature,
}

impl Product {
    fn new() -> Self {
        Product {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Exact(vec![DataType::Int64]),
                    TypeSignature::Exact(vec![DataType::Float64]),
                ],
                Volatility::Immutable,
            ),
        }
    }
}

impl AggregateUDFImpl for Product {
    fn name(&self) -> &str {
        "product"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DFResult<DataType> {
        match arg_types.first() {
            Some(DataType::Int64) => Ok(DataType::Int64),
            _ => Ok(DataType::Float64),
        }
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DFResult<Vec<FieldRef>> {
        let kind = args.return_field.data_type().clone();
        Ok(vec![Arc::new(Field::new("product", kind, true))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DFResult<Box<dyn Accumulator>> {
        Ok(match args.return_field.data_type() {
            DataType::Int64 => Box::new(ProductAccumulator::Int(1)),
            _ => Box::new(ProductAccumulator::Float(1.0)),
        })
    }
}

#[derive(Debug)]
enum ProductAccumulator {
    Int(i64),
    Float(f64),
}

impl ProductAccumulator {
    fn multiply(&mut self, values: &ArrayRef) -> DFResult<()> {
        match self {
            ProductAccumulator::Int(p) => {
                let values = values.as_primitive_opt::<Int64Type>().ok_or_else(|| {
                    DataFusionError::Internal("product: expected Int64 values".into())
                })?;
                for v in values.iter().flatten() {
                    *p = p.wrapping_mul(v);
                }
            }
            ProductAccumulator::Float(p) => {
                let values = values.as_primitive_opt::<Float64Type>().ok_or_else(|| {
                    DataFusionError::Internal("product: expected Float64 values".into())
                })?;
                for v in values.iter().flatten() {
                    *p *= v;
                }
            }
        }
        Ok(())
    }

    fn value(&self) -> ScalarValue {
        match self {
            ProductAccumulator::Int(p) => ScalarValue::Int64(Some(*p)),
            ProductAccumulator::Float(p) => ScalarValue::Float64(Some(*p)),
        }
    }
}

impl Accumulator for ProductAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DFResult<()> {
        match values.first() {
            Some(v) => self.multiply(v),
            None => Ok(()),
        }
    }

    fn evaluate(&mut self) -> DFResult<ScalarValue> {
        Ok(self.value())
    }

    fn size(&self) -> usize {
        size_of_val(self)
    }

    fn state(&mut self) -> DFResult<Vec<ScalarValue>> {
        Ok(vec![self.value()])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DFResult<()> {
        self.update_batch(states)
    }
}
