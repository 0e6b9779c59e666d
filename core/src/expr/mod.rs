//! `PhysicalExpr` → CUDA source: the expression JIT behind GPU filters, projections, join
//! filters and aggregate arguments.
//!
//! It runs in steps that can be seen and tested one by one:
//! - [`lower`]: `PhysicalExpr` → the typed kernel IR ([`ir`]); every decision is made here;
//! - [`emit`]: the IR → CUDA C calling helpers in `kernels/cuda/common/*.cuh`;
//! - [`builder`]: the one kernel builder, for predicates and values alike;
//! - [`abi`]: the parameter layout every column-reading kernel shares;
//! - [`launch`]: running a kernel and raising its error word.
//!
//! [`types`] maps Arrow types to the device's, [`scalars`] carries values read at launch.
//!
//! A predicate compiles to one kernel that evaluates it row by row and writes a byte per row:
//! 1 when the predicate is TRUE, 0 when it is FALSE or NULL (SQL's `WHERE` keeps only TRUE).
//! Every sub-expression yields a value and a null flag, so AND, OR and NOT follow SQL's
//! three-valued logic exactly.
//!
//! Semantics match DataFusion's CPU kernels:
//! - comparisons of floats use IEEE total order after normalising -0.0 to +0.0, as DataFusion
//!   does (NaN equals NaN and is greater than +inf; -0.0 equals +0.0);
//! - integer `+ - *` wrap on overflow, as DataFusion's do; integer `/` and `%` fail on a zero
//!   divisor ("Divide by zero error") and `MIN / -1` overflows, as Arrow's checked kernels;
//!   float `/` and `%` follow IEEE;
//! - decimals are scaled 128-bit integers: they compare at equal scales, and `+ - * / %`
//!   produce DataFusion's result precision and scale (division: scale `s1 + 4`, truncated
//!   toward zero, as Arrow's); shapes that may overflow i128 run checked and fail the query with
//!   Arrow's "Arithmetic overflow", a zero divisor with "Divide by zero error";
//! - casts: widening ones directly; narrowing integer casts, floats to integers (truncated),
//!   floats to decimals (rounded half away from zero), decimals to integers (truncated),
//!   decimal rescaling (half away from zero) and casts into a smaller precision are checked,
//!   failing as Arrow's casts do (or yielding NULL for a safe cast).
//!
//! Errors are raised through a kernel's `err` word only for rows the CPU would evaluate: a
//! CASE branch for the rows that take it, a COALESCE argument for the rows still NULL, the
//! right side of AND (OR) for the rows whose left side is not FALSE (not TRUE). DataFusion
//! evaluates the right side of AND/OR for all rows, or where the left is TRUE (FALSE), or for
//! none when the left decides the whole batch: the rows where the left is not FALSE (TRUE) are
//! those it evaluates whatever its batches. So the GPU fails whenever the CPU fails at every
//! batching, and where the CPU's outcome depends on its batches, the GPU's is the CPU's one row
//! at a time.
//!
//! Also: `[NOT] IN (list)`, `CASE WHEN` and `CASE x WHEN`, `coalesce`, `extract`/`date_part`
//! (year to second, ISO week, days of the year and week) of dates and of timestamps without a
//! zone, `date ± interval` (months and days, the day clamped to the month's end as Arrow does)
//! on Date32, and on strings (read as offsets + bytes) comparisons, `IN`, `LIKE` (`%`, `_` and
//! backslash escapes), `character_length`, `octet_length`, `substr` with literal positions,
//! `btrim`/`ltrim`/`rtrim`, `starts_with`/`ends_with`, `strpos`, `upper` (compared, or as an
//! output) and `||` as a value kernel's output; `abs`, `round` with a literal scale, `floor`,
//! `ceil`, the float functions `sqrt` to `trunc` (`math.cuh`), `nullif`, bitwise
//! `& | ^ << >>`, `CASE x WHEN` on floats (Arrow's total-order `eq`), and the vector distances
//! `cosine_distance`, `inner_product` and `array_distance` of an embedding column to a constant
//! vector or another embedding (`vector.cuh`, in fp32 as `crate::vector` computes them). A division that a CASE branch's WHEN proves safe (`WHEN c > 0 THEN x / c`)
//! carries no check.
//!
//! Anything else (other string functions, casts from and to strings) is reported
//! as [`Unsupported`] with the expression named, and the operator stays on the CPU.

mod abi;
mod builder;
mod emit;
mod ir;
mod launch;
mod lower;
mod scalars;
mod types;

#[cfg(test)]
mod tests;

pub(crate) use abi::{column_args, column_params};
pub use builder::{PredicateKernel, ValueKernel, predicate_kernel, value_kernel};
pub(crate) use launch::evaluate_values_at;
pub use launch::{evaluate_predicate, evaluate_values};
pub(crate) use lower::constant_vector;
pub(crate) use types::DevType;

/// Why an expression cannot run on the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A short content hash naming generated entry points.
pub(crate) fn blake3_hex(text: &str) -> String {
    spate_kernels::compile::cache_key(&[text.as_bytes()])[..16].to_string()
}
