//! Comparing a query's result with a reference result of the same engine on another backend.
//!
//! Both results come from Spate, so their schemas must be identical (names and types). Then,
//! row by row and in order (every multi-row benchmark query fixes its order with ORDER BY):
//! - integers, strings, dates, times, booleans and decimals compare exactly (a decimal's type
//!   fixes its scale, so its unscaled values must be equal);
//! - floats compare to [`FLOAT_TOLERANCE`] relative (summation order differs between a parallel
//!   GPU reduction and the CPU's), with NaN equal to NaN and infinities equal by sign;
//! - NULL equals only NULL.
//!
//! [`compare_ordered`] is the same check for a query whose ORDER BY leaves ties (TPC-DS has
//! many): the ORDER BY columns must match row by row, and the rows within each run of equal
//! keys match as a set; after a LIMIT, the last run may hold different rows of those keys.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};

/// Relative tolerance for floating-point cells.
pub const FLOAT_TOLERANCE: f64 = 1e-9;

/// Checks `got` against `reference` (see the module docs). Returns the row count, or the first
/// difference in words.
pub fn compare_results(reference: &[RecordBatch], got: &[RecordBatch]) -> Result<usize, String> {
    let rows = same_shape(reference, got)?;
    match first_difference(&cells(reference)?, &cells(got)?) {
        Some(difference) => Err(difference),
        None => Ok(rows),
    }
}

/// Checks the two results have the same columns (names and types) and row count; returns it.
fn same_shape(reference: &[RecordBatch], got: &[RecordBatch]) -> Result<usize, String> {
    let want_rows: usize = reference.iter().map(RecordBatch::num_rows).sum();
    let got_rows: usize = got.iter().map(RecordBatch::num_rows).sum();
    if let (Some(a), Some(b)) = (reference.first(), got.first()) {
        let (sa, sb) = (a.schema(), b.schema());
        if sa.fields().len() != sb.fields().len() {
            return Err(format!(
                "{} columns, expected {}",
                sb.fields().len(),
                sa.fields().len()
            ));
        }
        for (i, (fa, fb)) in sa.fields().iter().zip(sb.fields()).enumerate() {
            if fa.name() != fb.name() || fa.data_type() != fb.data_type() {
                return Err(format!(
                    "column {i} is {} {}, expected {} {}",
                    fb.name(),
                    fb.data_type(),
                    fa.name(),
                    fa.data_type()
                ));
            }
        }
    }
    if want_rows != got_rows {
        return Err(format!("{got_rows} rows, expected {want_rows}"));
    }
    Ok(want_rows)
}

/// One result cell, reduced to what comparison needs.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Float(f64),
    /// Everything compared exactly: the raw value for decimals, the display text otherwise.
    Exact(String),
}

impl Cell {
    fn show(&self) -> String {
        match self {
            Cell::Null => "NULL".into(),
            Cell::Float(v) => format!("{v:?}"),
            Cell::Exact(s) => s.clone(),
        }
    }
}

/// The order a query's result must have: the output columns of its ORDER BY (empty: none), and
/// whether a LIMIT may cut its last run of ties.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ordering {
    /// Output column indices, most significant first.
    pub keys: Vec<usize>,
    /// Whether the result was cut by a LIMIT.
    pub limited: bool,
}

/// [`compare_results`], where rows that tie on `order.keys` may come in any order (see the
/// module docs).
pub fn compare_ordered(
    reference: &[RecordBatch],
    got: &[RecordBatch],
    order: &Ordering,
) -> Result<usize, String> {
    // Columns and row counts must match as they are; only the order of tied rows may differ.
    let rows = same_shape(reference, got)?;
    match ordered_difference(&cells(reference)?, &cells(got)?, order) {
        Some(difference) => Err(difference),
        None => Ok(rows),
    }
}

/// A cell the comparisons work on: this module's, or [`crate::cells::Cell`] across engines.
pub(crate) trait Value: Clone {
    /// Whether two cells hold the same value (floats within a tolerance).
    fn matches(&self, other: &Self) -> bool;
    /// The value in words, for a difference.
    fn show(&self) -> String;
    /// A sort key under which matching cells sort alike (floats rounded).
    fn canonical(&self) -> String;
}

impl Value for Cell {
    fn matches(&self, other: &Self) -> bool {
        cells_match(self, other)
    }

    fn show(&self) -> String {
        Cell::show(self)
    }

    fn canonical(&self) -> String {
        match self {
            Cell::Float(v) => format!("{v:.6e}"),
            other => other.show(),
        }
    }
}

/// The first difference between two results of the same row count, where rows that tie on
/// `order.keys` may come in any order: the ORDER BY columns match row by row, and each run of
/// equal keys holds the same rows as a set (after a LIMIT, the last run may hold other rows of
/// those keys). `None` when they match.
pub(crate) fn ordered_difference<V: Value>(
    want: &[Vec<V>],
    have: &[Vec<V>],
    order: &Ordering,
) -> Option<String> {
    let strict = first_difference(want, have)?;
    let width = want.first().map_or(0, Vec::len);
    if order.keys.iter().any(|k| *k >= width) || have.iter().any(|row| row.len() != width) {
        return Some(strict);
    }
    for (row, (a, b)) in want.iter().zip(have).enumerate() {
        for k in &order.keys {
            if !a[*k].matches(&b[*k]) {
                return Some(format!(
                    "row {row}, ORDER BY column {k}: {}, expected {}",
                    b[*k].show(),
                    a[*k].show()
                ));
            }
        }
    }
    let ties = |x: &[V], y: &[V]| order.keys.iter().all(|k| x[*k].matches(&y[*k]));
    let mut start = 0;
    while start < want.len() {
        let end = (start..want.len())
            .find(|r| !ties(&want[*r], &want[start]))
            .unwrap_or(want.len());
        let cut_by_limit = order.limited && end == want.len();
        if !cut_by_limit && !same_rows(&want[start..end], &have[start..end]) {
            return Some(format!(
                "{strict} (rows {start}..{end} tie on the ORDER BY, and differ as a set too)"
            ));
        }
        start = end;
    }
    None
}

/// The first cell, row by row in order, where `have` differs from `want`, in words.
fn first_difference<V: Value>(want: &[Vec<V>], have: &[Vec<V>]) -> Option<String> {
    for (row, (a, b)) in want.iter().zip(have).enumerate() {
        if a.len() != b.len() {
            return Some(format!(
                "row {row}: {} columns, expected {}",
                b.len(),
                a.len()
            ));
        }
        for (column, (x, y)) in a.iter().zip(b).enumerate() {
            if !x.matches(y) {
                return Some(format!(
                    "row {row}, column {column}: {}, expected {}",
                    y.show(),
                    x.show()
                ));
            }
        }
    }
    None
}

/// Whether two runs hold the same rows in some order.
fn same_rows<V: Value>(a: &[Vec<V>], b: &[Vec<V>]) -> bool {
    let sorted = |rows: &[Vec<V>]| {
        let mut rows = rows.to_vec();
        rows.sort_by_cached_key(|row| row.iter().map(V::canonical).collect::<Vec<_>>());
        rows
    };
    sorted(a)
        .iter()
        .zip(&sorted(b))
        .all(|(x, y)| x.iter().zip(y).all(|(p, q)| p.matches(q)))
}

fn cells(batches: &[RecordBatch]) -> Result<Vec<Vec<Cell>>, String> {
    crate::cells::rows_of(batches, column_cells)
}

fn column_cells(array: &dyn Array) -> Result<Vec<Cell>, String> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array, &options)
        .map_err(|e| format!("cannot format {}: {e}", array.data_type()))?;
    Ok((0..array.len())
        .map(|i| {
            if array.is_null(i) {
                return Cell::Null;
            }
            match array.data_type() {
                DataType::Float16 => {
                    Cell::Float(f64::from(array.as_primitive::<Float16Type>().value(i)))
                }
                DataType::Float32 => {
                    Cell::Float(f64::from(array.as_primitive::<Float32Type>().value(i)))
                }
                DataType::Float64 => Cell::Float(array.as_primitive::<Float64Type>().value(i)),
                _ => Cell::Exact(formatter.value(i).to_string()),
            }
        })
        .collect())
}

fn cells_match(want: &Cell, got: &Cell) -> bool {
    match (want, got) {
        (Cell::Float(a), Cell::Float(b)) => floats_match(*a, *b),
        (a, b) => a == b,
    }
}

fn floats_match(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    let diff = (a - b).abs();
    diff <= FLOAT_TOLERANCE * a.abs().max(b.abs()) || diff < f64::MIN_POSITIVE
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Decimal128Array, Float64Array, Int32Array, StringArray};

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    /// Two rows: an integer key (the second as given), a string, a Decimal(10, 2) and a float.
    fn sample(second_key: Option<i32>, second_decimal: i128, first_float: f64) -> RecordBatch {
        batch(vec![
            (
                "k",
                Arc::new(Int32Array::from(vec![Some(1), second_key])) as ArrayRef,
            ),
            ("s", Arc::new(StringArray::from(vec!["a", "b"]))),
            (
                "d",
                Arc::new(
                    Decimal128Array::from(vec![1234, second_decimal])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ),
            (
                "f",
                Arc::new(Float64Array::from(vec![first_float, f64::NAN])),
            ),
        ])
    }

    #[test]
    fn exact_types_must_be_equal_and_floats_within_tolerance() {
        let reference = [sample(None, -5, 1.0)];
        assert_eq!(compare_results(&reference, &reference), Ok(2));
        let close = sample(None, -5, 1.0 + 1e-12);
        assert_eq!(compare_results(&reference, &[close]), Ok(2));
        let off_by_a_cent = sample(None, -6, 1.0);
        let err = compare_results(&reference, &[off_by_a_cent]).unwrap_err();
        assert_eq!(err, "row 1, column 2: -0.06, expected -0.05");
        let far = sample(Some(0), -5, 1.0 + 1e-6);
        let err = compare_results(&reference, &[far]).unwrap_err();
        assert_eq!(err, "row 0, column 3: 1.000001, expected 1.0");
    }

    #[test]
    fn schemas_row_counts_and_order_are_checked() {
        let a = batch(vec![(
            "k",
            Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef,
        )]);
        let swapped = batch(vec![(
            "k",
            Arc::new(Int32Array::from(vec![2, 1])) as ArrayRef,
        )]);
        let renamed = batch(vec![(
            "j",
            Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef,
        )]);
        let short = batch(vec![("k", Arc::new(Int32Array::from(vec![1])) as ArrayRef)]);
        assert!(compare_results(std::slice::from_ref(&a), &[swapped]).is_err());
        assert!(
            compare_results(std::slice::from_ref(&a), &[renamed])
                .unwrap_err()
                .starts_with("column 0 is j")
        );
        assert_eq!(
            compare_results(std::slice::from_ref(&a), &[short]).unwrap_err(),
            "1 rows, expected 2"
        );
        // Batch boundaries do not matter.
        assert_eq!(
            compare_results(std::slice::from_ref(&a), &[a.slice(0, 1), a.slice(1, 1)]),
            Ok(2)
        );
        assert_eq!(compare_results(&[], &[]), Ok(0));
    }

    fn rows(keys: &[i32], values: &[&str]) -> RecordBatch {
        batch(vec![
            ("k", Arc::new(Int32Array::from(keys.to_vec())) as ArrayRef),
            ("v", Arc::new(StringArray::from(values.to_vec()))),
        ])
    }

    #[test]
    fn rows_that_tie_on_the_order_by_may_come_in_any_order() {
        let order = Ordering {
            keys: vec![0],
            limited: false,
        };
        let want = [rows(&[1, 2, 2, 3], &["a", "b", "c", "d"])];
        let ties_swapped = [rows(&[1, 2, 2, 3], &["a", "c", "b", "d"])];
        assert_eq!(compare_ordered(&want, &ties_swapped, &order), Ok(4));
        // Without the ORDER BY key, the strict check stands.
        assert!(compare_results(&want, &ties_swapped).is_err());
        // Rows that do not tie must keep their places, and tied rows must be the same rows.
        let keys_swapped = [rows(&[2, 1, 2, 3], &["b", "a", "c", "d"])];
        let err = compare_ordered(&want, &keys_swapped, &order).unwrap_err();
        assert!(
            err.starts_with("row 0, ORDER BY column 0: 2, expected 1"),
            "{err}"
        );
        let other_row = [rows(&[1, 2, 2, 3], &["a", "c", "x", "d"])];
        let err = compare_ordered(&want, &other_row, &order).unwrap_err();
        assert!(err.contains("rows 1..3 tie"), "{err}");
        // After a LIMIT, the last run may be other rows of the same key.
        let cut = [rows(&[1, 2, 2], &["a", "b", "c"])];
        let cut_other = [rows(&[1, 2, 2], &["a", "c", "z"])];
        let limited = Ordering {
            keys: vec![0],
            limited: true,
        };
        assert_eq!(compare_ordered(&cut, &cut_other, &limited), Ok(3));
        assert!(compare_ordered(&cut, &cut_other, &order).is_err());
        // Columns must still be the same, named and typed alike.
        let renamed = [batch(vec![
            (
                "j",
                Arc::new(Int32Array::from(vec![1, 2, 2, 3])) as ArrayRef,
            ),
            ("v", Arc::new(StringArray::from(vec!["a", "c", "b", "d"]))),
        ])];
        let err = compare_ordered(&want, &renamed, &order).unwrap_err();
        assert!(err.starts_with("column 0 is j"), "{err}");
        // No ORDER BY: the whole result is one run.
        let none = Ordering::default();
        let shuffled = [rows(&[3, 1, 2, 2], &["d", "a", "c", "b"])];
        assert_eq!(compare_ordered(&want, &shuffled, &none), Ok(4));
    }
}
