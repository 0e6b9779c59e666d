//! `cosine_distance`, `inner_product` (`dot_product`) and `array_distance` (`list_distance`)
//! as Spate registers them: DataFusion's functions, except that an embedding argument
//! ([`super::Elem`]) is taken as it is, and the distance is computed as [`score`] does, in
//! fp32, as the GPU computes it. DataFusion's own versions would cast an embedding to a
//! `List<Float64>` first (reading a bf16 column as integers).
//!
//! The result type stays DataFusion's, Float64, and so does NULL handling: NULL when either
//! row is NULL or holds a NULL element, and (cosine) when either vector is all zeros.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Builder, GenericListArray, OffsetSizeTrait};
use arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type, UInt16Type};
use datafusion::common::{Result as DFResult, exec_err};
use datafusion::execution::context::SessionContext;
use datafusion::functions_nested::{cosine_distance, distance, inner_product};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::distance::{Metric, score};
use super::elem::Elem;

/// Registers the three distance functions in `ctx`, in place of DataFusion's.
pub fn register(ctx: &SessionContext) {
    for metric in [Metric::Cosine, Metric::Inner, Metric::L2] {
        ctx.register_udf(ScalarUDF::new_from_impl(VectorDistance::new(metric)));
    }
}

/// DataFusion's version of a metric's function.
fn datafusion_udf(metric: Metric) -> Arc<ScalarUDF> {
    match metric {
        Metric::Cosine => cosine_distance::cosine_distance_udf(),
        Metric::Inner => inner_product::inner_product_udf(),
        Metric::L2 => distance::array_distance_udf(),
    }
}

/// One distance function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct VectorDistance {
    metric: Metric,
    signature: Signature,
    aliases: Vec<String>,
}

impl VectorDistance {
    fn new(metric: Metric) -> Self {
        VectorDistance {
            metric,
            signature: Signature::user_defined(Volatility::Immutable),
            aliases: datafusion_udf(metric).aliases().to_vec(),
        }
    }
}

impl ScalarUDFImpl for VectorDistance {
    fn name(&self) -> &str {
        self.metric.function()
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DFResult<DataType> {
        Ok(DataType::Float64)
    }

    /// DataFusion's coercion, but an embedding argument keeps its type.
    fn coerce_types(&self, arg_types: &[DataType]) -> DFResult<Vec<DataType>> {
        let mut coerced = datafusion_udf(self.metric).coerce_types(arg_types)?;
        for (out, given) in coerced.iter_mut().zip(arg_types) {
            if Elem::of(given).is_some() {
                *out = given.clone();
            }
        }
        Ok(coerced)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let embeddings = args.args.iter().any(|a| Elem::of(&a.data_type()).is_some());
        if !embeddings {
            return datafusion_udf(self.metric).invoke_with_args(args);
        }
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [left, right] = arrays.as_slice() else {
            return exec_err!("{} takes two arguments", self.name());
        };
        let result: ArrayRef = Arc::new(self.distances(left, right)?);
        Ok(if scalar {
            ColumnarValue::Scalar(datafusion::common::ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

impl VectorDistance {
    /// The distance of each row of `left` to the same row of `right`.
    fn distances(&self, left: &ArrayRef, right: &ArrayRef) -> DFResult<arrow::array::Float64Array> {
        let (left, right) = (Side::of(left)?, Side::of(right)?);
        let rows = left.len().min(right.len());
        let mut out = Float64Builder::with_capacity(rows);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for row in 0..rows {
            let (Some(()), Some(())) = (left.read(row, &mut a), right.read(row, &mut b)) else {
                out.append_null();
                continue;
            };
            if a.len() != b.len() {
                return exec_err!(
                    "{} requires both list inputs to have the same length, got {} and {}",
                    self.name(),
                    a.len(),
                    b.len()
                );
            }
            out.append_option(score(self.metric, &a, &b));
        }
        Ok(out.finish())
    }
}

/// One argument, as rows of f32 vectors.
enum Side<'a> {
    /// An embedding: `d` elements per row, read as `elem`.
    Embedding {
        list: &'a arrow::array::FixedSizeListArray,
        elem: Elem,
        d: usize,
    },
    List(&'a GenericListArray<i32>),
    LargeList(&'a GenericListArray<i64>),
}

impl<'a> Side<'a> {
    fn of(array: &'a ArrayRef) -> DFResult<Side<'a>> {
        if let Some((elem, d)) = Elem::of(array.data_type()) {
            return Ok(Side::Embedding {
                list: array.as_fixed_size_list(),
                elem,
                d,
            });
        }
        match array.data_type() {
            DataType::List(f) if f.data_type() == &DataType::Float64 => {
                Ok(Side::List(array.as_list::<i32>()))
            }
            DataType::LargeList(f) if f.data_type() == &DataType::Float64 => {
                Ok(Side::LargeList(array.as_list::<i64>()))
            }
            other => exec_err!("a vector distance cannot read {other}"),
        }
    }

    fn len(&self) -> usize {
        match self {
            Side::Embedding { list, .. } => list.len(),
            Side::List(l) => l.len(),
            Side::LargeList(l) => l.len(),
        }
    }

    /// Row `row` as f32s into `out`; `None` when the row is NULL or holds a NULL element.
    fn read(&self, row: usize, out: &mut Vec<f32>) -> Option<()> {
        out.clear();
        match self {
            Side::Embedding { list, elem, d } => {
                if list.is_null(row) {
                    return None;
                }
                let values = list.values();
                let start = list.value_offset(row) as usize;
                if values.logical_null_count() > 0 && (start..start + d).any(|j| values.is_null(j))
                {
                    return None;
                }
                let range = start..start + d;
                match elem {
                    Elem::F32 => {
                        out.extend_from_slice(&values.as_primitive::<Float32Type>().values()[range])
                    }
                    Elem::F16 => out.extend(
                        values.as_primitive::<Float16Type>().values()[range]
                            .iter()
                            .map(|v| v.to_f32()),
                    ),
                    Elem::Bf16 => out.extend(
                        values.as_primitive::<UInt16Type>().values()[range]
                            .iter()
                            .map(|&v| Elem::Bf16.to_f32(u32::from(v))),
                    ),
                }
                Some(())
            }
            Side::List(l) => read_list(l, row, out),
            Side::LargeList(l) => read_list(l, row, out),
        }
    }
}

/// A `List<Float64>` row as f32s (each rounded to nearest, as the GPU's query vectors are).
fn read_list<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    row: usize,
    out: &mut Vec<f32>,
) -> Option<()> {
    if list.is_null(row) {
        return None;
    }
    let values = list.value(row);
    if values.null_count() > 0 {
        return None;
    }
    out.extend(
        values
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .map(|&v| v as f32),
    );
    Some(())
}
