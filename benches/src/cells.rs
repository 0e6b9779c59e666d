//! Result cells in an engine-neutral form, and the tolerant comparison of results across engines.
//!
//! Spate's results arrive as Arrow [`RecordBatch`]es ([`cells_from_batches`]); DuckDB's as
//! tagged JSON cells written by `scripts/duckdb_queries.py` and `scripts/duckdb_bench.py`
//! ([`cell_from_json`], [`rows_from_json`]). Both reduce to rows of [`Cell`].
//!
//! [`compare_cells`] checks two results row by row, in order (every multi-row benchmark query
//! fixes its order with ORDER BY). Two engines do not agree on result types (DataFusion's AVG
//! over a decimal is a decimal, DuckDB's a double), so unlike [`crate::compare`] this comparison
//! crosses types:
//! - integers, strings, dates and booleans compare exactly; NULL equals only NULL;
//! - two decimals compare exactly at the smaller of their scales (the finer one rounded half
//!   away from zero); a decimal equals an integer only when it has no fraction;
//! - floats, and a float against a decimal or an integer, compare to [`FLOAT_TOLERANCE`]
//!   relative; a float against a decimal also matches within one unit of the decimal's last
//!   place. NaN equals NaN and infinities are equal by sign.

use std::fmt;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Decimal128Type, Float16Type, Float32Type, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use serde_json::Value;

/// Relative tolerance for a float compared with any number. Looser than
/// [`crate::compare::FLOAT_TOLERANCE`]: two engines sum in different orders and may compute
/// through different types (decimal against double).
pub const FLOAT_TOLERANCE: f64 = 1e-6;

/// One result cell in a form both engines can be reduced to.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    /// Any integer type, signed or not.
    Int(i128),
    /// Unscaled value and scale: `Decimal(150, 2)` is 1.50.
    Decimal(i128, u32),
    Float(f64),
    /// Strings, and dates and times as their ISO text (`1995-01-01`), which Arrow's display
    /// and Python's `isoformat` agree on.
    Text(String),
    Bool(bool),
}

impl fmt::Display for Cell {
    /// The value with its kind, so that a mismatch between a decimal and a float reads as such.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => write!(f, "NULL"),
            Cell::Int(v) => write!(f, "int {v}"),
            Cell::Decimal(v, scale) => write!(f, "decimal {}", decimal_text(*v, *scale)),
            Cell::Float(v) => write!(f, "float {v:?}"),
            Cell::Text(s) => write!(f, "text {s:?}"),
            Cell::Bool(b) => write!(f, "bool {b}"),
        }
    }
}

fn decimal_text(value: i128, scale: u32) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// All rows of `batches`, in order, as cells. Batch boundaries do not matter.
pub fn cells_from_batches(batches: &[RecordBatch]) -> Result<Vec<Vec<Cell>>, String> {
    rows_of(batches, column_cells)
}

/// All rows of `batches`, in order, with each column turned into values by `column`.
pub(crate) fn rows_of<C: Clone>(
    batches: &[RecordBatch],
    column: impl Fn(&dyn Array) -> Result<Vec<C>, String>,
) -> Result<Vec<Vec<C>>, String> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<Vec<C>> = batch
            .columns()
            .iter()
            .map(|c| column(c.as_ref()))
            .collect::<Result<_, _>>()?;
        for r in 0..batch.num_rows() {
            rows.push(columns.iter().map(|c| c[r].clone()).collect());
        }
    }
    Ok(rows)
}

fn column_cells(array: &dyn Array) -> Result<Vec<Cell>, String> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array, &options)
        .map_err(|e| format!("cannot format {}: {e}", array.data_type()))?;
    (0..array.len())
        .map(|i| {
            if array.is_null(i) {
                return Ok(Cell::Null);
            }
            Ok(match array.data_type() {
                DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64 => {
                    let text = formatter.value(i).to_string();
                    Cell::Int(
                        text.parse()
                            .map_err(|e| format!("integer cell {text:?}: {e}"))?,
                    )
                }
                DataType::Decimal128(_, scale) => Cell::Decimal(
                    array.as_primitive::<Decimal128Type>().value(i),
                    u32::try_from(*scale)
                        .map_err(|_| format!("negative decimal scale {scale} is not supported"))?,
                ),
                DataType::Float16 => {
                    Cell::Float(f64::from(array.as_primitive::<Float16Type>().value(i)))
                }
                DataType::Float32 => {
                    Cell::Float(f64::from(array.as_primitive::<Float32Type>().value(i)))
                }
                DataType::Float64 => Cell::Float(array.as_primitive::<Float64Type>().value(i)),
                DataType::Boolean => Cell::Bool(array.as_boolean().value(i)),
                _ => Cell::Text(formatter.value(i).to_string()),
            })
        })
        .collect()
}

/// The rows of a JSON array of arrays of tagged cells (the `rows` of DuckDB's output).
pub fn rows_from_json(rows: &Value) -> Result<Vec<Vec<Cell>>, String> {
    let rows = rows
        .as_array()
        .ok_or_else(|| format!("rows must be a JSON array, not {}", brief(rows)))?;
    rows.iter()
        .map(|row| {
            row.as_array()
                .ok_or_else(|| format!("a row must be a JSON array, not {}", brief(row)))?
                .iter()
                .map(cell_from_json)
                .collect()
        })
        .collect()
}

/// One tagged cell: `null`, `["i", "123"]`, `["d", "1.50"]`, `["f", 1.5]` (or `"NaN"`, `"inf"`,
/// `"-inf"`), `["s", "text"]`, `["t", "1995-01-01"]`, `["b", true]`.
pub fn cell_from_json(value: &Value) -> Result<Cell, String> {
    if value.is_null() {
        return Ok(Cell::Null);
    }
    let bad = || format!("bad cell {}", brief(value));
    let tag = value[0].as_str().ok_or_else(bad)?;
    let body = &value[1];
    Ok(match tag {
        "i" => Cell::Int(body.as_str().ok_or_else(bad)?.parse().map_err(|_| bad())?),
        "d" => parse_decimal(body.as_str().ok_or_else(bad)?).ok_or_else(bad)?,
        "f" => Cell::Float(match body.as_str() {
            // JSON has no NaN or infinity: the scripts write them as strings.
            Some("NaN") => f64::NAN,
            Some("inf") => f64::INFINITY,
            Some("-inf") => f64::NEG_INFINITY,
            Some(_) => return Err(bad()),
            None => body.as_f64().ok_or_else(bad)?,
        }),
        "b" => Cell::Bool(body.as_bool().ok_or_else(bad)?),
        "s" | "t" => Cell::Text(body.as_str().ok_or_else(bad)?.to_string()),
        _ => return Err(bad()),
    })
}

/// A JSON value for an error message, cut short so that a huge value cannot flood it.
fn brief(value: &Value) -> String {
    const MAX_CHARS: usize = 80;
    let text = value.to_string();
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

fn parse_decimal(text: &str) -> Option<Cell> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    Some(Cell::Decimal(
        digits.parse().ok()?,
        u32::try_from(frac.len()).ok()?,
    ))
}

/// Checks `got` against `expected` (see the module docs). The error describes the first
/// difference: a row count, a column count, or a row, a column and both values.
pub fn compare_cells(expected: &[Vec<Cell>], got: &[Vec<Cell>]) -> Result<(), String> {
    if expected.len() != got.len() {
        return Err(format!("{} rows, expected {}", got.len(), expected.len()));
    }
    for (row, (want, have)) in expected.iter().zip(got).enumerate() {
        if want.len() != have.len() {
            return Err(format!(
                "row {row}: {} columns, expected {}",
                have.len(),
                want.len()
            ));
        }
        for (column, (x, y)) in want.iter().zip(have).enumerate() {
            if !cells_match(x, y) {
                return Err(format!("row {row}, column {column}: {y}, expected {x}"));
            }
        }
    }
    Ok(())
}

/// [`compare_cells`], where rows that tie on `order.keys` may come in any order (see
/// [`crate::compare::compare_ordered`]).
pub fn compare_cells_ordered(
    expected: &[Vec<Cell>],
    got: &[Vec<Cell>],
    order: &crate::compare::Ordering,
) -> Result<(), String> {
    if expected.len() != got.len() {
        return Err(format!("{} rows, expected {}", got.len(), expected.len()));
    }
    match crate::compare::ordered_difference(expected, got, order) {
        Some(difference) => Err(difference),
        None => Ok(()),
    }
}

impl crate::compare::Value for Cell {
    fn matches(&self, other: &Self) -> bool {
        cells_match(self, other)
    }

    fn show(&self) -> String {
        self.to_string()
    }

    fn canonical(&self) -> String {
        match as_float(self) {
            Some(v) => format!("{v:.6e}"),
            None => self.to_string(),
        }
    }
}

/// Whether two cells hold the same value (see the module docs); symmetric.
pub fn cells_match(a: &Cell, b: &Cell) -> bool {
    match (a, b) {
        (Cell::Decimal(x, sx), Cell::Decimal(y, sy)) => {
            let scale = (*sx).min(*sy);
            rescale(*x, *sx, scale) == rescale(*y, *sy, scale)
        }
        (Cell::Decimal(d, s), Cell::Int(i)) | (Cell::Int(i), Cell::Decimal(d, s)) => {
            let whole = match 10i128.checked_pow(*s) {
                Some(unit) => d % unit == 0,
                // Past i128's range every non-zero unscaled value is a pure fraction.
                None => *d == 0,
            };
            whole && rescale(*d, *s, 0) == *i
        }
        (Cell::Float(_), _) | (_, Cell::Float(_)) => match (as_float(a), as_float(b)) {
            (Some(x), Some(y)) => floats_match(x, y, decimal_unit(a).max(decimal_unit(b))),
            _ => false,
        },
        (x, y) => x == y,
    }
}

/// Rounds a scaled value to a smaller scale, half away from zero.
fn rescale(value: i128, from: u32, to: u32) -> i128 {
    let Some(divisor) = 10i128.checked_pow(from.saturating_sub(to)) else {
        // 10^39 and up exceed any i128, so the value rounds to zero.
        return 0;
    };
    let (q, r) = (value / divisor, value % divisor);
    // `r.abs() * 2` could overflow for a divisor near i128::MAX; compare against the rest.
    if r.abs() >= divisor - r.abs() {
        q + value.signum()
    } else {
        q
    }
}

fn as_float(cell: &Cell) -> Option<f64> {
    match cell {
        Cell::Int(v) => Some(*v as f64),
        Cell::Decimal(v, s) => Some(*v as f64 / 10f64.powi(scale_exponent(*s))),
        Cell::Float(v) => Some(*v),
        _ => None,
    }
}

/// One unit of a decimal's last place, 0 for anything else: a decimal is only as precise as its
/// scale (DataFusion's AVG over decimals truncates to scale 6, DuckDB's returns a double).
fn decimal_unit(cell: &Cell) -> f64 {
    match cell {
        Cell::Decimal(_, s) => 10f64.powi(-scale_exponent(*s)),
        _ => 0.0,
    }
}

fn scale_exponent(scale: u32) -> i32 {
    i32::try_from(scale).unwrap_or(i32::MAX)
}

fn floats_match(a: f64, b: f64, decimal_unit: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    let diff = (a - b).abs();
    diff <= FLOAT_TOLERANCE * a.abs().max(b.abs()) || diff < 1e-12 || diff < decimal_unit
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
        Int32Array, StringArray, UInt64Array,
    };
    use serde_json::json;

    use super::*;

    fn one(cell: Cell) -> Vec<Vec<Cell>> {
        vec![vec![cell]]
    }

    #[test]
    fn integers_compare_exactly() {
        assert_eq!(
            compare_cells(&one(Cell::Int(7)), &one(Cell::Int(7))),
            Ok(())
        );
        assert_eq!(
            compare_cells(&one(Cell::Int(7)), &one(Cell::Int(8))),
            Err("row 0, column 0: int 8, expected int 7".into())
        );
        let big = i128::from(u64::MAX) + 1;
        assert!(!cells_match(&Cell::Int(big), &Cell::Int(big - 1)));
    }

    #[test]
    fn decimals_compare_at_the_smaller_scale() {
        // 1.235 at scale 3 rounds half away from zero to 1.24 at scale 2.
        assert!(cells_match(&Cell::Decimal(1235, 3), &Cell::Decimal(124, 2)));
        assert!(cells_match(
            &Cell::Decimal(-1235, 3),
            &Cell::Decimal(-124, 2)
        ));
        assert!(cells_match(&Cell::Decimal(150, 2), &Cell::Decimal(15, 1)));
        assert!(!cells_match(
            &Cell::Decimal(1234, 3),
            &Cell::Decimal(124, 2)
        ));
        assert_eq!(
            compare_cells(&one(Cell::Decimal(-5, 2)), &one(Cell::Decimal(-6, 2))),
            Err("row 0, column 0: decimal -0.06, expected decimal -0.05".into())
        );
        // A decimal equals an integer only without a fraction.
        assert!(cells_match(&Cell::Decimal(300, 2), &Cell::Int(3)));
        assert!(!cells_match(&Cell::Int(3), &Cell::Decimal(301, 2)));
        // Scales past i128's range do not overflow.
        assert!(cells_match(&Cell::Decimal(1, 60), &Cell::Decimal(0, 0)));
        assert!(!cells_match(&Cell::Decimal(1, 60), &Cell::Int(0)));
    }

    #[test]
    fn decimal_against_float_matches_within_one_unit_of_the_last_place() {
        // DataFusion's AVG truncates to scale 6; DuckDB's is a double.
        let avg = Cell::Decimal(25_522_005, 6); // 25.522005
        assert!(cells_match(&avg, &Cell::Float(25.522_005_853_257_337)));
        assert!(cells_match(&Cell::Float(25.522_005_853_257_337), &avg));
        // Far more than a unit and than the relative tolerance apart.
        assert!(!cells_match(&avg, &Cell::Float(25.5221)));
        // Within a unit but far outside the relative tolerance: the decimal's scale decides.
        assert!(cells_match(&Cell::Decimal(1, 2), &Cell::Float(0.0149)));
        assert!(cells_match(&Cell::Float(0.0051), &Cell::Decimal(1, 2)));
        assert!(!cells_match(&Cell::Decimal(1, 2), &Cell::Float(0.0201)));
        assert!(cells_match(&Cell::Decimal(15, 1), &Cell::Float(1.5)));
    }

    #[test]
    fn floats_compare_to_a_relative_tolerance() {
        assert!(cells_match(&Cell::Float(1e6), &Cell::Float(1e6 + 0.5)));
        assert!(!cells_match(&Cell::Float(1.0), &Cell::Float(1.00001)));
        assert!(cells_match(&Cell::Float(0.0), &Cell::Float(1e-13)));
        assert!(cells_match(&Cell::Int(3), &Cell::Float(3.0)));
        assert!(cells_match(&Cell::Float(f64::NAN), &Cell::Float(f64::NAN)));
        assert!(!cells_match(&Cell::Float(f64::NAN), &Cell::Float(1.0)));
        assert!(cells_match(
            &Cell::Float(f64::INFINITY),
            &Cell::Float(f64::INFINITY)
        ));
        assert!(!cells_match(
            &Cell::Float(f64::INFINITY),
            &Cell::Float(f64::NEG_INFINITY)
        ));
        assert!(!cells_match(&Cell::Float(1.0), &Cell::Text("1".into())));
        assert_eq!(
            compare_cells(&one(Cell::Float(1.0)), &one(Cell::Float(1.1))),
            Err("row 0, column 0: float 1.1, expected float 1.0".into())
        );
    }

    #[test]
    fn null_equals_only_null() {
        assert!(cells_match(&Cell::Null, &Cell::Null));
        for value in [
            Cell::Int(0),
            Cell::Decimal(0, 2),
            Cell::Float(0.0),
            Cell::Text(String::new()),
            Cell::Bool(false),
        ] {
            assert!(!cells_match(&Cell::Null, &value), "{value}");
            assert!(!cells_match(&value, &Cell::Null), "{value}");
        }
        assert_eq!(
            compare_cells(&one(Cell::Null), &one(Cell::Text("x".into()))),
            Err("row 0, column 0: text \"x\", expected NULL".into())
        );
    }

    #[test]
    fn row_and_column_counts_are_checked() {
        let two = vec![vec![Cell::Int(1)], vec![Cell::Int(2)]];
        assert_eq!(
            compare_cells(&two, &two[..1]),
            Err("1 rows, expected 2".into())
        );
        let wide = vec![vec![Cell::Int(1), Cell::Int(1)], vec![Cell::Int(2)]];
        assert_eq!(
            compare_cells(&two, &wide),
            Err("row 0: 2 columns, expected 1".into())
        );
        let swapped = vec![vec![Cell::Int(2)], vec![Cell::Int(1)]];
        assert!(compare_cells(&two, &swapped).is_err());
        assert_eq!(compare_cells(&[], &[]), Ok(()));
    }

    #[test]
    fn every_tag_parses() {
        let rows = json!([
            [
                ["i", "-170141183460469231731687303715884105728"],
                ["d", "-0.05"],
                ["f", 1.5]
            ],
            [["s", "x"], ["t", "1995-01-01"], ["b", true]],
            [null, ["f", "NaN"], ["f", "-inf"]],
            [["d", "12"], ["f", "inf"], ["f", 2]],
        ]);
        let cells = rows_from_json(&rows).unwrap();
        assert_eq!(cells[0][0], Cell::Int(i128::MIN));
        assert_eq!(cells[0][1], Cell::Decimal(-5, 2));
        assert_eq!(cells[0][2], Cell::Float(1.5));
        assert_eq!(cells[1][0], Cell::Text("x".into()));
        assert_eq!(cells[1][1], Cell::Text("1995-01-01".into()));
        assert_eq!(cells[1][2], Cell::Bool(true));
        assert_eq!(cells[2][0], Cell::Null);
        assert!(matches!(cells[2][1], Cell::Float(v) if v.is_nan()));
        assert_eq!(cells[2][2], Cell::Float(f64::NEG_INFINITY));
        assert_eq!(cells[3][0], Cell::Decimal(12, 0));
        assert_eq!(cells[3][1], Cell::Float(f64::INFINITY));
        assert_eq!(cells[3][2], Cell::Float(2.0));
    }

    #[test]
    fn malformed_cells_are_errors() {
        for bad in [
            json!(["x", "1"]),
            json!(["i", 1]),
            json!(["i", "1.5"]),
            json!(["d", "1.x"]),
            json!(["f", "many"]),
            json!(["b", "true"]),
            json!(7),
            json!([]),
        ] {
            assert!(cell_from_json(&bad).is_err(), "{bad}");
        }
        assert!(rows_from_json(&json!({"a": 1})).is_err());
        assert!(rows_from_json(&json!([1])).is_err());
        let long = json!(["x", "y".repeat(500)]);
        assert!(cell_from_json(&long).unwrap_err().len() < 120);
    }

    #[test]
    fn batches_reduce_to_cells() {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "i",
                Arc::new(Int32Array::from(vec![Some(-1), None])) as ArrayRef,
            ),
            ("u", Arc::new(UInt64Array::from(vec![u64::MAX, 0]))),
            (
                "d",
                Arc::new(
                    Decimal128Array::from(vec![150, -5])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ),
            ("f", Arc::new(Float64Array::from(vec![0.5, 2.0]))),
            ("g", Arc::new(Float32Array::from(vec![0.25, 1.0]))),
            ("s", Arc::new(StringArray::from(vec![Some("a"), None]))),
            ("t", Arc::new(Date32Array::from(vec![9131, 0]))),
            ("b", Arc::new(BooleanArray::from(vec![true, false]))),
        ])
        .unwrap();
        let rows = cells_from_batches(&[batch.slice(0, 1), batch.slice(1, 1)]).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![
                    Cell::Int(-1),
                    Cell::Int(i128::from(u64::MAX)),
                    Cell::Decimal(150, 2),
                    Cell::Float(0.5),
                    Cell::Float(0.25),
                    Cell::Text("a".into()),
                    Cell::Text("1995-01-01".into()),
                    Cell::Bool(true),
                ],
                vec![
                    Cell::Null,
                    Cell::Int(0),
                    Cell::Decimal(-5, 2),
                    Cell::Float(2.0),
                    Cell::Float(1.0),
                    Cell::Null,
                    Cell::Text("1970-01-01".into()),
                    Cell::Bool(false),
                ],
            ]
        );
        // Arrow's dates and DuckDB's tagged dates agree.
        let duckdb = rows_from_json(&json!([[["t", "1995-01-01"]]])).unwrap();
        assert_eq!(compare_cells(&duckdb, &[vec![rows[0][6].clone()]]), Ok(()));
    }
}
