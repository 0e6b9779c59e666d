//! Helpers shared by the integration tests (each test file includes this module).

use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};

/// Rows in output order (not sorted), as `|`-separated text with `NULL` for nulls.
pub fn ordered(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| {
                ArrayFormatter::try_new(c.as_ref(), &options)
                    .unwrap_or_else(|e| panic!("cannot format {}: {e}", c.data_type()))
            })
            .collect();
        for i in 0..b.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(i).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    out
}
