//! What `CACHE TABLE` learns about each column while it still holds the rows on the host:
//! facts the GPU operators may rely on later without asking the device.
//!
//! - **Unique**: no two rows hold the same value, and none is NULL. A join whose build keys
//!   include such a column (through filters, projections and the joins that keep rows apart,
//!   see `plan::unique`) knows before its first probe batch that each probe row matches at
//!   most one build row, so its output count can stay on the device from the start.
//! - **Longest string**: the most bytes any one value of a string column holds. A gather that
//!   may take a row many times (the build side of a join) is bounded by its rows times this,
//!   without reading the byte total back.
//!
//! Both are computed once, at load, from the host batches being uploaded; a cached table is
//! never written, so they stay true for as long as it is cached. Uniqueness is proven cheaply
//! where it is cheap: a column whose values strictly increase in table order is unique (keys
//! generated in order usually are), found in one pass that stops at the first step down; other
//! fixed-width columns are checked with a hash set, which stops at the first repeat, up to
//! [`HASH_CHECK_ROWS`] rows. Past that, or for strings that are not in order, the column is
//! simply not known to be unique, which costs a readback later, never a wrong answer.

use std::collections::HashSet;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Int8Type, Int16Type,
    Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;

/// The most rows a hash set checks for uniqueness: past this a column not in order is left
/// unknown (the check's memory is some 16 bytes a row).
pub const HASH_CHECK_ROWS: usize = 64 << 20;

/// What is known about one cached column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColumnFacts {
    /// No two rows hold the same value, and no row is NULL.
    pub unique: bool,
    /// For a string column, the bytes of its longest value.
    pub longest_string: Option<usize>,
}

/// The facts of every column of `batches` (all of a table's rows, in order), by column.
pub fn column_facts(columns: usize, batches: &[&RecordBatch]) -> Vec<ColumnFacts> {
    (0..columns)
        .map(|c| {
            let arrays: Vec<&ArrayRef> = batches.iter().map(|b| b.column(c)).collect();
            ColumnFacts {
                unique: is_unique(&arrays),
                longest_string: longest_string(&arrays),
            }
        })
        .collect()
}

/// The longest value of a string column, in bytes; `None` for other types.
fn longest_string(arrays: &[&ArrayRef]) -> Option<usize> {
    let data_type = arrays.first()?.data_type();
    let longest = |lengths: &mut dyn Iterator<Item = usize>| lengths.max().unwrap_or(0);
    Some(match data_type {
        DataType::Utf8 => arrays
            .iter()
            .map(|a| longest(&mut a.as_string::<i32>().offsets().lengths()))
            .max()
            .unwrap_or(0),
        DataType::LargeUtf8 => arrays
            .iter()
            .map(|a| longest(&mut a.as_string::<i64>().offsets().lengths()))
            .max()
            .unwrap_or(0),
        DataType::Utf8View => arrays
            .iter()
            .map(|a| longest(&mut a.as_string_view().lengths().map(|l| l as usize)))
            .max()
            .unwrap_or(0),
        _ => return None,
    })
}

fn is_unique(arrays: &[&ArrayRef]) -> bool {
    let Some(first) = arrays.first() else {
        return false;
    };
    if arrays.iter().any(|a| a.null_count() > 0) {
        return false;
    }
    match first.data_type() {
        DataType::Int8 => unique_primitive::<Int8Type>(arrays),
        DataType::Int16 => unique_primitive::<Int16Type>(arrays),
        DataType::Int32 => unique_primitive::<Int32Type>(arrays),
        DataType::Int64 => unique_primitive::<Int64Type>(arrays),
        DataType::UInt8 => unique_primitive::<UInt8Type>(arrays),
        DataType::UInt16 => unique_primitive::<UInt16Type>(arrays),
        DataType::UInt32 => unique_primitive::<UInt32Type>(arrays),
        DataType::UInt64 => unique_primitive::<UInt64Type>(arrays),
        DataType::Date32 => unique_primitive::<Date32Type>(arrays),
        DataType::Date64 => unique_primitive::<Date64Type>(arrays),
        DataType::Decimal128(_, _) => unique_primitive::<Decimal128Type>(arrays),
        DataType::Utf8 => strictly_increasing(
            arrays
                .iter()
                .flat_map(|a| a.as_string::<i32>().iter().flatten()),
        ),
        DataType::LargeUtf8 => strictly_increasing(
            arrays
                .iter()
                .flat_map(|a| a.as_string::<i64>().iter().flatten()),
        ),
        DataType::Utf8View => strictly_increasing(
            arrays
                .iter()
                .flat_map(|a| a.as_string_view().iter().flatten()),
        ),
        // Floats compare by bit pattern in joins (with -0.0 folded) and timestamps carry zones:
        // not worth the care until a join on them needs it.
        _ => false,
    }
}

/// True when every value is greater than the one before it.
fn strictly_increasing<T: PartialOrd>(mut values: impl Iterator<Item = T>) -> bool {
    let Some(mut last) = values.next() else {
        return true;
    };
    for v in values {
        if v <= last {
            return false;
        }
        last = v;
    }
    true
}

fn unique_primitive<T: ArrowPrimitiveType>(arrays: &[&ArrayRef]) -> bool
where
    T::Native: std::hash::Hash + Eq + PartialOrd,
{
    let values = || {
        arrays
            .iter()
            .flat_map(|a| a.as_primitive::<T>().values().iter().copied())
    };
    if strictly_increasing(values()) {
        return true;
    }
    let rows: usize = arrays.iter().map(|a| a.len()).sum();
    if rows > HASH_CHECK_ROWS {
        return false;
    }
    let mut seen = HashSet::with_capacity(rows);
    values().all(|v| seen.insert(v))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, Int64Array, StringArray, StringViewArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn keys_in_order_or_not_are_unique_and_repeats_or_nulls_are_not() {
        let a = batch(vec![
            Arc::new(Int64Array::from(vec![1, 2, 5])),
            Arc::new(Int64Array::from(vec![9, 3, 7])),
            Arc::new(Int64Array::from(vec![1, 2, 2])),
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])),
        ]);
        // Across batches: the second starts below the first's end but repeats nothing.
        let b = batch(vec![
            Arc::new(Int64Array::from(vec![6, 8])),
            Arc::new(Int64Array::from(vec![1, 2])),
            Arc::new(Int64Array::from(vec![4, 5])),
            Arc::new(Int32Array::from(vec![Some(4), Some(5)])),
        ]);
        let facts = column_facts(4, &[&a, &b]);
        let unique: Vec<bool> = facts.iter().map(|f| f.unique).collect();
        assert_eq!(unique, vec![true, true, false, false]);
        // A value of the second batch repeats one of the first.
        let c = batch(vec![
            Arc::new(Int64Array::from(vec![5])),
            Arc::new(Int64Array::from(vec![3])),
            Arc::new(Int64Array::from(vec![0])),
            Arc::new(Int32Array::from(vec![Some(9)])),
        ]);
        let facts = column_facts(4, &[&a, &b, &c]);
        assert!(!facts[0].unique && !facts[1].unique);
        assert!(facts.iter().all(|f| f.longest_string.is_none()));
    }

    #[test]
    fn strings_know_their_longest_value_and_are_unique_only_in_order() {
        let a = batch(vec![
            Arc::new(StringArray::from(vec!["a", "bcd", "c"])),
            Arc::new(StringArray::from(vec!["b", "a", "c"])),
            Arc::new(StringViewArray::from(vec![
                "x",
                "a string longer than twelve bytes",
                "y",
            ])),
        ]);
        let facts = column_facts(3, &[&a]);
        assert_eq!(
            facts,
            vec![
                ColumnFacts {
                    unique: true,
                    longest_string: Some(3)
                },
                // Unique, but not in order: not proven, so not known.
                ColumnFacts {
                    unique: false,
                    longest_string: Some(1)
                },
                ColumnFacts {
                    unique: false,
                    longest_string: Some(33)
                },
            ]
        );
    }

    #[test]
    fn an_empty_table_has_unique_columns_and_no_long_strings() {
        let a = batch(vec![Arc::new(StringArray::from(Vec::<&str>::new()))]);
        assert_eq!(
            column_facts(1, &[&a]),
            vec![ColumnFacts {
                unique: true,
                longest_string: Some(0)
            }]
        );
        assert_eq!(column_facts(1, &[]), vec![ColumnFacts::default()]);
    }
}
