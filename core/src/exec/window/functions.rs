//! The standard window functions that are not aggregates: planning `lag`/`lead`, `ntile` and
//! `first_value`/`last_value` from DataFusion's expressions, and computing each function's
//! column over a partitioned, sorted batch from the partition and peer-run starts
//! (`codegen.rs`'s `numbers`, `shift`, `ratios`, `ntile` and `edges`).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::logical_expr::{WindowFrameBound, WindowFrameUnits};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::window::{StandardWindowExpr, WindowExpr};
use datafusion::physical_plan::windows::WindowUDFExpr;
use spate_kernels::{DeviceBuffer, KernelArg, Stream as DeviceStream};

use super::Function;
use crate::column::{DeviceBatch, DeviceBytes, DeviceColumn, DeviceValues, Gather, gather_columns};
use crate::error::Result;
use crate::exec::hash_table::{Kernels, launch};
use crate::expr::Unsupported;

/// Per row of a window batch, its partition and peer run (`pid`, `qid`), and the rows they
/// start at (`pstart`, `qstart`): the `starts` kernel's output.
pub(super) struct Starts<'a> {
    pub(super) pid: &'a DeviceBuffer<u32>,
    pub(super) qid: &'a DeviceBuffer<u32>,
    pub(super) pstart: &'a DeviceBuffer<u32>,
    pub(super) qstart: &'a DeviceBuffer<u32>,
    pub(super) partitions: usize,
}

/// `lag(column[, offset[, NULL]])` or `lead(…)`: the value `offset` rows before (after) in the
/// partition, NULL past its edges. A default other than NULL, IGNORE NULLS, and a plan that
/// evaluates the function in reverse stay on the CPU.
pub(super) fn shift(
    e: &dyn WindowExpr,
    standard: &StandardWindowExpr,
    name: &str,
) -> std::result::Result<Function, Unsupported> {
    let unsupported =
        |why: &str| Unsupported(format!("`{}`: {why} does not run on the GPU yet", e.name()));
    let args = udf_args(e, standard)?;
    let column = args
        .first()
        .and_then(|a| a.downcast_ref::<Column>())
        .ok_or_else(|| unsupported("a shift of an expression"))?
        .index();
    let offset = match args
        .get(1)
        .map(|a| a.downcast_ref::<Literal>().map(Literal::value))
    {
        None => 1,
        // DataFusion takes integers only ("Expected an integer value").
        Some(Some(v)) if !v.data_type().is_integer() => {
            return Err(unsupported("this offset"));
        }
        Some(Some(v)) => match v.cast_to(&DataType::Int64) {
            Ok(datafusion::common::ScalarValue::Int64(Some(k))) => k,
            _ => return Err(unsupported("this offset")),
        },
        Some(None) => return Err(unsupported("an offset that is not a literal")),
    };
    match args
        .get(2)
        .map(|a| a.downcast_ref::<Literal>().map(Literal::value))
    {
        None => {}
        Some(Some(v)) if v.is_null() => {}
        Some(_) => return Err(unsupported("a default value")),
    }
    let offset = if name == "lag" {
        offset
    } else {
        offset
            .checked_neg()
            .ok_or_else(|| unsupported("this offset"))?
    };
    Ok(Function::Shift { column, offset })
}

/// The arguments of a standard window function; IGNORE NULLS and evaluation in reverse stay
/// on the CPU (DataFusion 55 keeps those two flags private; their Debug form tells).
fn udf_args<'a>(
    e: &dyn WindowExpr,
    standard: &'a StandardWindowExpr,
) -> std::result::Result<&'a [Arc<dyn PhysicalExpr>], Unsupported> {
    let unsupported =
        |why: &str| Unsupported(format!("`{}`: {why} does not run on the GPU yet", e.name()));
    let udf = standard
        .get_standard_func_expr()
        .as_any()
        .downcast_ref::<WindowUDFExpr>()
        .ok_or_else(|| unsupported("this window function"))?;
    let debug = format!("{udf:?}");
    if debug.contains("ignore_nulls: true") {
        return Err(unsupported("IGNORE NULLS"));
    }
    if !debug.contains("is_reversed: false") {
        return Err(unsupported("a window function evaluated in reverse"));
    }
    Ok(udf.args())
}

/// `ntile(n)` for a literal positive `n`; any other `n` fails on the CPU.
pub(super) fn ntile(
    e: &dyn WindowExpr,
    standard: &StandardWindowExpr,
) -> std::result::Result<Function, Unsupported> {
    let args = udf_args(e, standard)?;
    let buckets = args
        .first()
        .and_then(|a| a.downcast_ref::<Literal>())
        .and_then(|l| l.value().cast_to(&DataType::UInt64).ok())
        .and_then(|v| match v {
            datafusion::common::ScalarValue::UInt64(Some(n)) if n > 0 => Some(n),
            _ => None,
        })
        .ok_or_else(|| {
            Unsupported(format!(
                "`{}`: ntile of anything but a positive literal does not run on the GPU",
                e.name()
            ))
        })?;
    Ok(Function::Ntile(buckets))
}

/// `first_value(column)` and `last_value(column)` over a frame from UNBOUNDED PRECEDING: the
/// partition's first row, and its last row (a frame to UNBOUNDED FOLLOWING), the current row's
/// last peer (RANGE or GROUPS to CURRENT ROW) or the current row (ROWS). Frames that end
/// elsewhere stay on the CPU.
pub(super) fn edge(
    e: &dyn WindowExpr,
    standard: &StandardWindowExpr,
    name: &str,
) -> std::result::Result<Function, Unsupported> {
    let unsupported =
        |why: &str| Unsupported(format!("`{}`: {why} does not run on the GPU yet", e.name()));
    let args = udf_args(e, standard)?;
    let [arg] = args else {
        return Err(unsupported("this form"));
    };
    let column = arg
        .downcast_ref::<Column>()
        .ok_or_else(|| unsupported("a value that is an expression"))?
        .index();
    let frame = e.get_window_frame();
    if !frame.start_bound.is_unbounded() {
        return Err(unsupported(&format!("a sliding frame ({frame})")));
    }
    // Without ORDER BY the first and last rows are the input's, which nothing fixes.
    if e.order_by().is_empty() {
        return Err(unsupported("a first or last value without ORDER BY"));
    }
    // A frame that ends before the current row (`n PRECEDING`) is empty for the first rows,
    // whose value DataFusion makes NULL.
    let to_end = frame.end_bound.is_unbounded();
    if !to_end && !matches!(frame.end_bound, WindowFrameBound::CurrentRow) {
        return Err(unsupported(&format!("this frame ({frame})")));
    }
    let which = match (name, to_end) {
        ("first_value", _) => 0,
        (_, true) => 2,
        _ if frame.units == WindowFrameUnits::Rows => 3,
        _ => 1,
    };
    Ok(Function::Edge { column, which })
}

/// The column of a ranking, distribution, shift or first/last-value function over `batch`
/// (`n > 0` rows); `None` for the aggregates, which the caller computes.
pub(super) fn column(
    stream: &DeviceStream,
    kernels: &Kernels,
    function: Function,
    batch: &DeviceBatch,
    starts: &Starts<'_>,
) -> Result<Option<DeviceColumn>> {
    let n = batch.bound();
    // One of the row kernels (`codegen.rs`), which all take the starts and one parameter.
    let rows = |name: &str, param: i64| -> Result<DeviceBuffer<u32>> {
        row_kernel(stream, kernels, name, starts, n, param)
    };
    let values = |name: &str, param: i64, data_type: DataType| -> Result<DeviceColumn> {
        let out = row_kernel::<u64>(stream, kernels, name, starts, n, param)?;
        Ok(DeviceColumn::new(
            data_type,
            n,
            0,
            None,
            DeviceValues::Fixed {
                bytes: DeviceBytes::new(out.into_bytes()),
                width: 8,
            },
        ))
    };
    let column = |k: usize| &batch.columns()[k];
    Ok(match function {
        Function::Aggregate(_) | Function::Running(_) => None,
        Function::Shift { column: k, offset } => {
            let rows = rows("shift", offset)?;
            gather_columns(stream, &[Gather::rows_or_null(column(k), rows.as_slice())])?.pop()
        }
        Function::Edge { column: k, which } => {
            let rows = rows("edges", i64::from(which))?;
            gather_columns(stream, &[Gather::rows(column(k), rows.as_slice())])?.pop()
        }
        // f64 values, in 8-byte words.
        Function::Ratio { cume } => Some(values("ratios", i64::from(cume), DataType::Float64)?),
        // The bucket count's bits: the kernel reads them back as a u64.
        Function::Ntile(buckets) => Some(values("ntile", buckets as i64, DataType::UInt64)?),
        Function::RowNumber => Some(values("numbers", 0, DataType::UInt64)?),
        Function::Rank => Some(values("numbers", 1, DataType::UInt64)?),
        Function::DenseRank => Some(values("numbers", 2, DataType::UInt64)?),
    })
}

/// Launches row kernel `name` over `n` rows with `param`, into a fresh buffer of `n` values.
fn row_kernel<T: spate_kernels::DeviceCopy>(
    stream: &DeviceStream,
    kernels: &Kernels,
    name: &str,
    starts: &Starts<'_>,
    n: usize,
    param: i64,
) -> Result<DeviceBuffer<T>> {
    let out = stream.alloc::<T>(n)?;
    launch(
        stream,
        kernels.get(name)?,
        n,
        &[
            starts.pid.into(),
            starts.qid.into(),
            starts.pstart.into(),
            starts.qstart.into(),
            KernelArg::U64(starts.partitions as u64),
            KernelArg::U64(n as u64),
            KernelArg::I64(param),
            (&out).into(),
        ],
    )?;
    Ok(out)
}
