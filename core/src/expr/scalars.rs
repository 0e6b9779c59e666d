//! Values a kernel reads at launch rather than from its source: today the results of
//! uncorrelated scalar subqueries.

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::physical_planning_context::{ScalarSubqueryResults, SubqueryIndex};

/// A value known only when the query runs, passed to the kernel at each launch: today the
/// result of an uncorrelated scalar subquery (`ScalarSubqueryExpr`), which DataFusion's
/// `ScalarSubqueryExec` computes before the operators that read it start. Passing it as a
/// parameter keeps the generated source, and so the compiled kernel, the same whatever the
/// subquery returns.
#[derive(Debug, Clone)]
pub struct RuntimeScalar {
    pub(super) results: ScalarSubqueryResults,
    pub(super) index: SubqueryIndex,
    pub(super) data_type: DataType,
}

impl RuntimeScalar {
    /// The value's `(low, high, null)` kernel parameters: the bits of the value (a Decimal128
    /// uses both words), and 1 for NULL.
    pub(crate) fn launch_args(&self) -> crate::error::Result<[spate_kernels::KernelArg; 3]> {
        use spate_kernels::KernelArg;
        let internal = |message: String| crate::error::SpateError::Internal { message };
        let value = self.results.get(self.index).ok_or_else(|| {
            internal("a GPU kernel ran before the scalar subquery it reads".into())
        })?;
        if value.data_type() != self.data_type {
            return Err(internal(format!(
                "scalar subquery returned {}, planned as {}",
                value.data_type(),
                self.data_type
            )));
        }
        if value.is_null() {
            return Ok([KernelArg::U64(0), KernelArg::U64(0), KernelArg::U32(1)]);
        }
        let (lo, hi) = scalar_bits(&value)
            .ok_or_else(|| internal(format!("scalar subquery value {value} on the GPU")))?;
        Ok([KernelArg::U64(lo), KernelArg::U64(hi), KernelArg::U32(0)])
    }
}

/// The bits of a non-null fixed-width scalar as two 64-bit words (low, high); `None` for
/// types the generated code does not take as a parameter (strings).
pub(crate) fn scalar_bits(value: &ScalarValue) -> Option<(u64, u64)> {
    use ScalarValue::*;
    let signed = |v: i64| Some((v as u64, if v < 0 { u64::MAX } else { 0 }));
    match value {
        Boolean(Some(b)) => Some((u64::from(*b), 0)),
        Int8(Some(v)) => signed(i64::from(*v)),
        Int16(Some(v)) => signed(i64::from(*v)),
        Int32(Some(v)) | Date32(Some(v)) | Time32Second(Some(v)) | Time32Millisecond(Some(v)) => {
            signed(i64::from(*v))
        }
        Int64(Some(v))
        | Date64(Some(v))
        | Time64Microsecond(Some(v))
        | Time64Nanosecond(Some(v))
        | TimestampSecond(Some(v), _)
        | TimestampMillisecond(Some(v), _)
        | TimestampMicrosecond(Some(v), _)
        | TimestampNanosecond(Some(v), _)
        | DurationSecond(Some(v))
        | DurationMillisecond(Some(v))
        | DurationMicrosecond(Some(v))
        | DurationNanosecond(Some(v)) => signed(*v),
        UInt8(Some(v)) => Some((u64::from(*v), 0)),
        UInt16(Some(v)) => Some((u64::from(*v), 0)),
        UInt32(Some(v)) => Some((u64::from(*v), 0)),
        UInt64(Some(v)) => Some((*v, 0)),
        Float32(Some(v)) => Some((u64::from(v.to_bits()), 0)),
        Float64(Some(v)) => Some((v.to_bits(), 0)),
        Decimal128(Some(v), _, _) => Some((*v as u64, (*v >> 64) as u64)),
        _ => None,
    }
}
