//! The device type system of generated kernels: the value types their code computes with, and
//! how Arrow types map onto them.

use arrow::datatypes::DataType;

/// Value types the generated code computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevType {
    Bool,
    Int {
        bits: u8,
        signed: bool,
    },
    F32,
    F64,
    /// A Decimal128, held as its scaled value in an i128.
    Dec {
        precision: u8,
        scale: i8,
    },
    /// A string: a byte pointer, with its length in a companion `<name>_n` variable.
    Str,
}

impl DevType {
    pub(crate) fn of(data_type: &DataType) -> Option<DevType> {
        use DataType::*;
        Some(match data_type {
            Boolean => DevType::Bool,
            Int8 => DevType::Int {
                bits: 8,
                signed: true,
            },
            Int16 => DevType::Int {
                bits: 16,
                signed: true,
            },
            Int32 | Date32 | Time32(_) => DevType::Int {
                bits: 32,
                signed: true,
            },
            Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => DevType::Int {
                bits: 64,
                signed: true,
            },
            UInt8 => DevType::Int {
                bits: 8,
                signed: false,
            },
            UInt16 => DevType::Int {
                bits: 16,
                signed: false,
            },
            UInt32 => DevType::Int {
                bits: 32,
                signed: false,
            },
            UInt64 => DevType::Int {
                bits: 64,
                signed: false,
            },
            Float32 => DevType::F32,
            Float64 => DevType::F64,
            Decimal128(p, s) => DevType::Dec {
                precision: *p,
                scale: *s,
            },
            Utf8 | LargeUtf8 | Utf8View => DevType::Str,
            _ => return None,
        })
    }

    pub(crate) fn c_type(self) -> &'static str {
        match self {
            DevType::Bool => "bool",
            DevType::Int { bits, signed } => match (bits, signed) {
                (8, true) => "i8",
                (16, true) => "i16",
                (32, true) => "i32",
                (64, true) => "i64",
                (8, false) => "u8",
                (16, false) => "u16",
                (32, false) => "u32",
                _ => "u64",
            },
            DevType::F32 => "f32",
            DevType::F64 => "f64",
            DevType::Dec { .. } => "i128",
            DevType::Str => "const u8*",
        }
    }

    /// Whether two operand types can be compared directly.
    pub(crate) fn comparable(self, other: DevType) -> bool {
        match (self, other) {
            (DevType::Dec { scale: a, .. }, DevType::Dec { scale: b, .. }) => a == b,
            (a, b) => a == b,
        }
    }

    /// Decimal digits an integer type can hold.
    pub(crate) fn int_digits(self) -> Option<u8> {
        match self {
            DevType::Int { bits: 8, .. } => Some(3),
            DevType::Int { bits: 16, .. } => Some(5),
            DevType::Int { bits: 32, .. } => Some(10),
            DevType::Int {
                bits: 64,
                signed: true,
            } => Some(19),
            DevType::Int {
                bits: 64,
                signed: false,
            } => Some(20),
            _ => None,
        }
    }
}
