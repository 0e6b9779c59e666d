//! The element types of embedding columns, their conversions to f32, and the bits that stand
//! for a NULL element on the device.

use arrow::datatypes::{DataType, Field};

/// The element-field metadata key that marks a `FixedSizeList<UInt16, d>` as bf16.
pub const BFLOAT16_KEY: &str = "spate.bfloat16";

/// An embedding's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F16,
    /// bfloat16: the high half of an f32.
    Bf16,
}

impl Elem {
    /// The element type of embedding type `data_type` and its dimension, or `None` when it is
    /// not an embedding.
    pub fn of(data_type: &DataType) -> Option<(Elem, usize)> {
        match data_type {
            DataType::FixedSizeList(field, d) if *d > 0 => {
                Elem::of_field(field).map(|e| (e, *d as usize))
            }
            _ => None,
        }
    }

    /// The element type of an embedding's element field.
    pub fn of_field(field: &Field) -> Option<Elem> {
        match field.data_type() {
            DataType::Float32 => Some(Elem::F32),
            DataType::Float16 => Some(Elem::F16),
            DataType::UInt16 if is_bfloat16(field) => Some(Elem::Bf16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }

    /// The bits a NULL element is stored as on the device: a quiet NaN with a payload of its
    /// own. An upload refuses a set element with these bits, so on the device they always mean
    /// NULL.
    pub fn null_bits(self) -> u32 {
        match self {
            Elem::F32 => 0x7FC5_A11E,
            Elem::F16 => 0x7E5B,
            Elem::Bf16 => 0x7FDB,
        }
    }

    /// Whether one element's little-endian bytes are this type's [`Elem::null_bits`].
    pub(crate) fn is_null_element(self, element: &[u8]) -> bool {
        element == &self.null_bits().to_le_bytes()[..self.width()]
    }

    /// The element's value as an f32 (exact: every f16 and bf16 is an f32).
    pub fn to_f32(self, bits: u32) -> f32 {
        match self {
            Elem::F32 => f32::from_bits(bits),
            Elem::F16 => half::f16::from_bits(bits as u16).to_f32(),
            Elem::Bf16 => f32::from_bits(bits << 16),
        }
    }

    /// Appends elements `range` of `values` (an embedding's elements, of this type) to `out`
    /// as f32s.
    pub(crate) fn extend_f32(
        self,
        values: &dyn arrow::array::Array,
        range: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) {
        use arrow::array::AsArray;
        use arrow::datatypes::{Float16Type, Float32Type, UInt16Type};
        match self {
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
    }

    /// The number the device's `vector.cuh` helpers know this element type by.
    pub fn code(self) -> u32 {
        match self {
            Elem::F32 => 0,
            Elem::F16 => 1,
            Elem::Bf16 => 2,
        }
    }
}

/// Whether an element field is marked bf16.
pub fn is_bfloat16(field: &Field) -> bool {
    field
        .metadata()
        .get(BFLOAT16_KEY)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_bits_are_nans_that_convert_exactly() {
        for elem in [Elem::F32, Elem::F16, Elem::Bf16] {
            assert!(elem.to_f32(elem.null_bits()).is_nan(), "{elem:?}");
        }
        assert_eq!(Elem::F16.to_f32(0x3C00), 1.0);
        assert_eq!(Elem::F16.to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(Elem::Bf16.to_f32(0x3F80), 1.0);
        assert_eq!(Elem::Bf16.to_f32(0xC040), -3.0);
    }

    #[test]
    fn only_marked_uint16_is_bf16() {
        let plain = Field::new("item", DataType::UInt16, true);
        assert_eq!(Elem::of_field(&plain), None);
        let marked = plain
            .clone()
            .with_metadata([(BFLOAT16_KEY.to_string(), "true".to_string())].into());
        assert_eq!(Elem::of_field(&marked), Some(Elem::Bf16));
        let list = DataType::FixedSizeList(marked.into(), 8);
        assert_eq!(Elem::of(&list), Some((Elem::Bf16, 8)));
        let empty = DataType::FixedSizeList(Field::new("item", DataType::Float32, true).into(), 0);
        assert_eq!(Elem::of(&empty), None);
    }
}
