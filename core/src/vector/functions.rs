//! `cosine_distance`, `inner_product` (`dot_product`) and `array_distance` (`list_distance`)
//! as Spate registers them: DataFusion's functions, except that an embedding argument
//! ([`super::Elem`]) is taken as it is, and the distance is computed as [`score`] does, in
//! fp32, as the GPU computes it. DataFusion's own versions would cast an embedding to a
//! `List<Float64>` first (reading a bf16 column as integers).
//!
//! The result type stays DataFusion's, Float64, and so does NULL handling: NULL when either
//! row is NULL or holds a NULL element, and (cosine) when either vector's sum of squares is 0
//! in f32 (all zeros, or elements too small to square).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Builder, GenericListArray, OffsetSizeTrait};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{Result as DFResult, ScalarValue, exec_err};
use datafusion::execution::context::SessionContext;
use datafusion::functions_nested::{cosine_distance, distance, inner_product};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::distance::{Metric, score};
use super::elem::Elem;

/// Registers the three distance functions in `ctx`, in place of DataFusion's.
pub(crate) fn register(ctx: &SessionContext) {
    for udf in functions() {
        ctx.register_udf(udf.as_ref().clone());
    }
}

/// The three distance functions as Spate defines them, for plans built without SQL (the
/// Python DataFrame API looks functions up by name).
pub fn functions() -> Vec<Arc<ScalarUDF>> {
    [Metric::Cosine, Metric::Inner, Metric::L2]
        .into_iter()
        .map(|metric| Arc::new(ScalarUDF::new_from_impl(VectorDistance::new(metric))))
        .collect()
}

/// Whether `udf` is one of Spate's distance functions (a function of the same name registered
/// otherwise, for example DataFusion's own on a Ballista executor, computes something else).
pub(crate) fn is_spate_distance(udf: &ScalarUDF) -> bool {
    let inner: &dyn std::any::Any = udf.inner().as_ref();
    inner.is::<VectorDistance>()
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
        let [left, right] = args.args.as_slice() else {
            return exec_err!("{} takes two arguments", self.name());
        };
        let constants = matches!(
            (left, right),
            (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_))
        );
        let (mut left_one, mut right_one) = (None, None);
        let left = Side::of(left, &mut left_one)?;
        let right = Side::of(right, &mut right_one)?;
        let rows = if constants { 1 } else { args.number_rows };
        let result: ArrayRef = Arc::new(self.distances(&left, &right, rows)?);
        Ok(if constants {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

impl VectorDistance {
    /// The distance of each of `rows` rows of `left` to the same row of `right`. In the order
    /// DataFusion's functions check: a NULL row gives NULL; then, for `cosine_distance` and
    /// `inner_product`, vectors of different lengths fail before a NULL element gives NULL,
    /// and for `array_distance` the other way round (with its own message).
    fn distances(
        &self,
        left: &Side<'_>,
        right: &Side<'_>,
        rows: usize,
    ) -> DFResult<arrow::array::Float64Array> {
        let mut out = Float64Builder::with_capacity(rows);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for row in 0..rows {
            let (Some(x), Some(y)) = (left.read(row, &mut a), right.read(row, &mut b)) else {
                out.append_null();
                continue;
            };
            let holed = matches!(x, Read::Holed(_)) || matches!(y, Read::Holed(_));
            if holed && self.metric == Metric::L2 {
                out.append_null();
                continue;
            }
            if x.len() != y.len() {
                if self.metric == Metric::L2 {
                    return exec_err!("Both arrays must have the same length");
                }
                return exec_err!(
                    "{} requires both list inputs to have the same length, got {} and {}",
                    self.name(),
                    x.len(),
                    y.len()
                );
            }
            match (x, y) {
                (Read::Values(x), Read::Values(y)) => out.append_option(score(self.metric, x, y)),
                _ => out.append_null(),
            }
        }
        Ok(out.finish())
    }
}

/// One argument: an array, or a constant converted once.
enum Side<'a> {
    /// An embedding: `d` elements per row, read as `elem`.
    Embedding {
        list: &'a arrow::array::FixedSizeListArray,
        elem: Elem,
        d: usize,
    },
    List(&'a GenericListArray<i32>),
    LargeList(&'a GenericListArray<i64>),
    /// A scalar argument, the same for every row, read once (`None` when it is NULL).
    Constant(Option<ConstRow>),
}

/// A constant vector that is not NULL.
enum ConstRow {
    Values(Vec<f32>),
    /// This many elements, one of them NULL.
    Holed(usize),
}

/// A row that is not NULL, as read.
enum Read<'a> {
    Values(&'a [f32]),
    /// A vector of this many elements, one of them NULL.
    Holed(usize),
}

impl Read<'_> {
    fn len(&self) -> usize {
        match self {
            Read::Values(v) => v.len(),
            Read::Holed(n) => *n,
        }
    }
}

impl<'a> Side<'a> {
    /// `value` as a side; a scalar is read once, here (`array` holds its one-row array).
    fn of(value: &'a ColumnarValue, array: &'a mut Option<ArrayRef>) -> DFResult<Side<'a>> {
        match value {
            ColumnarValue::Array(a) => Side::of_array(a),
            ColumnarValue::Scalar(scalar) => {
                let one = array.insert(scalar.to_array()?);
                let side = Side::of_array(one)?;
                let mut values = Vec::new();
                let holed = match side.read(0, &mut values) {
                    None => return Ok(Side::Constant(None)),
                    Some(Read::Holed(n)) => Some(n),
                    Some(Read::Values(_)) => None,
                };
                Ok(Side::Constant(Some(match holed {
                    Some(n) => ConstRow::Holed(n),
                    None => ConstRow::Values(values),
                })))
            }
        }
    }

    fn of_array(array: &'a ArrayRef) -> DFResult<Side<'a>> {
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

    /// Row `row`, its values read into `out` (a constant's are its own); `None` when the row
    /// is NULL.
    fn read<'s>(&'s self, row: usize, out: &'s mut Vec<f32>) -> Option<Read<'s>> {
        out.clear();
        match self {
            Side::Constant(row) => Some(match row.as_ref()? {
                ConstRow::Holed(n) => Read::Holed(*n),
                ConstRow::Values(values) => Read::Values(values),
            }),
            Side::Embedding { list, elem, d } => {
                if list.is_null(row) {
                    return None;
                }
                let values = list.values();
                let range = row * d..(row + 1) * d;
                if values.null_count() > 0 && range.clone().any(|j| values.is_null(j)) {
                    return Some(Read::Holed(*d));
                }
                elem.extend_f32(values.as_ref(), range, out);
                Some(Read::Values(out))
            }
            Side::List(l) => read_list(l, row, out),
            Side::LargeList(l) => read_list(l, row, out),
        }
    }
}

/// A `List<Float64>` row as f32s (each rounded to nearest, as the GPU's query vectors are).
fn read_list<'s, O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    row: usize,
    out: &'s mut Vec<f32>,
) -> Option<Read<'s>> {
    if list.is_null(row) {
        return None;
    }
    let values = list.value(row);
    if values.null_count() > 0 {
        return Some(Read::Holed(values.len()));
    }
    out.extend(
        values
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .map(|&v| v as f32),
    );
    Some(Read::Values(out))
}
