//! Result output: an aligned table for people, CSV / JSON / NDJSON for programs.
//!
//! Contract: machine formats print every row and nothing else on stdout; the table format may
//! cap the rows it shows (and says so), but always reports the full row count.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::display::FormatOptions;
use arrow::util::pretty::pretty_format_batches_with_options;
use clap::ValueEnum;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    /// An aligned table with a row count (the default).
    #[default]
    Table,
    /// Comma-separated values with a header row.
    Csv,
    /// One JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

/// Writes one statement's result incrementally, batch by batch.
pub struct ResultWriter<'a> {
    format: OutputFormat,
    out: &'a mut dyn Write,
    schema: SchemaRef,
    /// Table format: at most this many rows are shown; `None` shows all.
    max_rows: Option<usize>,
    shown: Vec<RecordBatch>,
    shown_rows: usize,
    total_rows: usize,
    csv_header_written: bool,
    json_rows: usize,
}

impl<'a> ResultWriter<'a> {
    /// A writer for a result with `schema`.
    pub fn new(
        format: OutputFormat,
        out: &'a mut dyn Write,
        schema: SchemaRef,
        max_rows: Option<usize>,
    ) -> Self {
        ResultWriter {
            format,
            out,
            schema,
            max_rows,
            shown: Vec::new(),
            shown_rows: 0,
            total_rows: 0,
            csv_header_written: false,
            json_rows: 0,
        }
    }

    /// Rows written so far.
    pub fn total_rows(&self) -> usize {
        self.total_rows
    }

    /// Adds one batch of the result.
    pub fn write(&mut self, batch: &RecordBatch) -> std::io::Result<()> {
        self.total_rows += batch.num_rows();
        match self.format {
            OutputFormat::Table => {
                let room = self
                    .max_rows
                    .map_or(usize::MAX, |m| m.saturating_sub(self.shown_rows));
                let take = room.min(batch.num_rows());
                if take > 0 {
                    self.shown.push(batch.slice(0, take));
                    self.shown_rows += take;
                }
                Ok(())
            }
            OutputFormat::Csv => {
                // A writer per batch, borrowing the output; only the first writes the header.
                let mut csv = arrow::csv::WriterBuilder::new()
                    .with_header(!self.csv_header_written)
                    .build(&mut *self.out);
                csv.write(batch).map_err(std::io::Error::other)?;
                self.csv_header_written = true;
                Ok(())
            }
            OutputFormat::Json | OutputFormat::Ndjson => {
                if batch.num_rows() == 0 {
                    return Ok(());
                }
                let mut buffer = Vec::new();
                {
                    let mut writer = arrow::json::LineDelimitedWriter::new(&mut buffer);
                    writer.write(batch).map_err(std::io::Error::other)?;
                    writer.finish().map_err(std::io::Error::other)?;
                }
                if self.format == OutputFormat::Ndjson {
                    return self.out.write_all(&buffer);
                }
                // JSON array: the same objects, comma-separated, streamed.
                for line in buffer.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                    let lead: &[u8] = if self.json_rows == 0 { b"[" } else { b",\n" };
                    self.out.write_all(lead)?;
                    self.out.write_all(line)?;
                    self.json_rows += 1;
                }
                Ok(())
            }
        }
    }

    /// Completes the output: prints the table and its row count, or closes the JSON array.
    pub fn finish(mut self) -> std::io::Result<()> {
        let result_has_columns = !self.schema.fields().is_empty();
        match self.format {
            OutputFormat::Table => {
                if result_has_columns {
                    let batches = if self.shown.is_empty() {
                        vec![RecordBatch::new_empty(std::sync::Arc::clone(&self.schema))]
                    } else {
                        std::mem::take(&mut self.shown)
                    };
                    let options = FormatOptions::default().with_null("NULL");
                    let table = pretty_format_batches_with_options(&batches, &options)
                        .map_err(std::io::Error::other)?;
                    writeln!(self.out, "{table}")?;
                }
                let rows = self.total_rows;
                let noun = if rows == 1 { "row" } else { "rows" };
                if self.shown_rows < rows {
                    writeln!(
                        self.out,
                        "{rows} {noun} (showing the first {}; use --max-rows 0 to show all)",
                        self.shown_rows
                    )
                } else {
                    writeln!(self.out, "{rows} {noun}")
                }
            }
            OutputFormat::Csv => {
                if !self.csv_header_written && result_has_columns {
                    // No batch arrived: still print the header.
                    let empty = RecordBatch::new_empty(std::sync::Arc::clone(&self.schema));
                    self.write(&empty)?;
                }
                Ok(())
            }
            OutputFormat::Json => {
                let text: &[u8] = if self.json_rows == 0 { b"[]\n" } else { b"]\n" };
                self.out.write_all(text)
            }
            OutputFormat::Ndjson => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![Some("x,y"), Some("z")])),
            ],
        )
        .unwrap()
    }

    fn render(format: OutputFormat, batches: &[RecordBatch], max_rows: Option<usize>) -> String {
        let mut out = Vec::new();
        let mut w = ResultWriter::new(format, &mut out, batch().schema(), max_rows);
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_and_keeps_header_once() {
        let text = render(OutputFormat::Csv, &[batch(), batch()], None);
        assert_eq!(text, "a,b\n1,\"x,y\"\n,z\n1,\"x,y\"\n,z\n");
        assert_eq!(render(OutputFormat::Csv, &[], None), "a,b\n");
    }

    #[test]
    fn json_is_one_array_and_ndjson_one_object_per_line() {
        let json = render(OutputFormat::Json, &[batch(), batch()], None);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value.as_array().unwrap().len(), 4);
        assert_eq!(render(OutputFormat::Json, &[], None), "[]\n");
        let ndjson = render(OutputFormat::Ndjson, &[batch()], None);
        assert_eq!(ndjson.lines().count(), 2);
        for line in ndjson.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }

    #[test]
    fn tables_show_nulls_and_cap_rows() {
        let text = render(OutputFormat::Table, &[batch(), batch()], Some(3));
        assert!(text.contains("NULL"), "{text}");
        assert!(text.contains("4 rows (showing the first 3"), "{text}");
        let empty = render(OutputFormat::Table, &[], None);
        assert!(
            empty.contains("| a | b |") && empty.ends_with("0 rows\n"),
            "{empty}"
        );
    }
}
