//! Vector distances (`cosine_distance`, `inner_product`/`dot_product`, `array_distance`) of an
//! embedding column to a constant vector, or to another embedding column → [`Op::Distance`].
//! The constant goes to the kernel as a query vector in device memory, so every query vector
//! runs the same compiled kernel.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use super::super::Unsupported;
use super::super::ir::{Node, Op, VecSide};
use super::super::types::DevType;
use super::Lowerer;
use crate::vector::{Elem, Metric};

impl Lowerer<'_> {
    /// A distance function of two vectors.
    pub(super) fn distance(
        &mut self,
        f: &ScalarFunctionExpr,
        metric: Metric,
    ) -> Result<Node, Unsupported> {
        if !crate::vector::is_spate_distance(f.fun()) {
            return Err(Unsupported(format!(
                "`{f}` is not Spate's distance function (registered in its place)"
            )));
        }
        let [a, b] = f.args() else {
            return Err(Unsupported(format!("`{f}` does not take two vectors")));
        };
        let (left, left_dim) = self.vector_side(a.as_ref(), f)?;
        let (right, right_dim) = self.vector_side(b.as_ref(), f)?;
        if matches!(
            (&left, &right),
            (VecSide::Query { .. }, VecSide::Query { .. })
        ) {
            return Err(Unsupported(format!(
                "`{f}` of two constants is not computed on the GPU"
            )));
        }
        if left_dim != right_dim {
            // The CPU fails the query with DataFusion's message.
            return Err(Unsupported(format!(
                "`{f}` compares vectors of {left_dim} and {right_dim} elements"
            )));
        }
        Ok(Node::new(
            DevType::F64,
            Op::Distance {
                metric,
                left,
                right,
                dim: left_dim,
            },
        ))
    }

    /// One argument of a distance, with its number of elements: an embedding column or a
    /// constant list of numbers without NULLs.
    fn vector_side(
        &mut self,
        expr: &dyn PhysicalExpr,
        f: &ScalarFunctionExpr,
    ) -> Result<(VecSide, usize), Unsupported> {
        if let Some(c) = expr.downcast_ref::<Column>() {
            let data_type = self.data_type(expr)?;
            let Some((elem, dim)) = Elem::of(&data_type) else {
                return Err(Unsupported(format!(
                    "`{f}` reads `{}` of type {data_type}, which is not an embedding \
                     (FixedSizeList of Float16, Float32 or bf16)",
                    c.name()
                )));
            };
            let slot = self.input_slot(c.index(), &data_type);
            return Ok((VecSide::Column { slot, elem }, dim));
        }
        if let Some(l) = expr.downcast_ref::<Literal>()
            && let Some(values) = constant_vector(l.value())
        {
            let dim = values.len();
            self.vectors.push(values.into());
            return Ok((
                VecSide::Query {
                    slot: self.vectors.len() - 1,
                },
                dim,
            ));
        }
        Err(Unsupported(format!(
            "`{f}`: the GPU takes an embedding column or a constant vector of numbers without \
             NULLs, not `{expr}`"
        )))
    }
}

/// A constant list of numbers as f32s (each rounded to nearest, as the CPU functions do; an
/// embedding's elements as their element type reads), or `None` when it is NULL, holds a
/// NULL, is empty or is not a list of numbers.
pub(crate) fn constant_vector(value: &ScalarValue) -> Option<Vec<f32>> {
    if value.is_null() {
        return None;
    }
    if let Some((elem, _)) = Elem::of(&value.data_type()) {
        let ScalarValue::FixedSizeList(list) = value else {
            return None;
        };
        let values = list.value(0);
        if values.null_count() > 0 {
            return None;
        }
        let mut out = Vec::with_capacity(values.len());
        elem.extend_f32(values.as_ref(), 0..values.len(), &mut out);
        return Some(out);
    }
    let values: ArrayRef = match value {
        ScalarValue::List(a) => a.value(0),
        ScalarValue::LargeList(a) => a.value(0),
        ScalarValue::FixedSizeList(a) => a.value(0),
        _ => return None,
    };
    if values.is_empty() || values.null_count() > 0 || !values.data_type().is_numeric() {
        return None;
    }
    let values = arrow::compute::cast(&values, &DataType::Float64).ok()?;
    Some(
        values
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .map(|&v| v as f32)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{FixedSizeListArray, UInt16Array};
    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn a_bf16_constant_is_read_as_bf16() {
        let field = Field::new("item", DataType::UInt16, true)
            .with_metadata([(crate::vector::BFLOAT16_KEY.to_string(), "true".to_string())].into());
        let list = FixedSizeListArray::try_new(
            Arc::new(field),
            2,
            Arc::new(UInt16Array::from(vec![0x3F80, 0xC040])),
            None,
        )
        .unwrap();
        let value = ScalarValue::FixedSizeList(Arc::new(list));
        assert_eq!(constant_vector(&value), Some(vec![1.0, -3.0]));
        let floats = ScalarValue::List(ScalarValue::new_list_nullable(
            &[
                ScalarValue::Float64(Some(2.0)),
                ScalarValue::Float64(Some(0.5)),
            ],
            &DataType::Float64,
        ));
        assert_eq!(constant_vector(&floats), Some(vec![2.0, 0.5]));
    }
}
