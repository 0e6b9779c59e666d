//! Lines of CSV or NDJSON read into a stream from a byte source, such as standard input
//! ([`crate::Engine::feed`]; `spate --stdin-into STREAM`).
//!
//! A thread reads the source line by line and parses the lines with the stream's columns
//! (arrow's CSV and JSON decoders; a CSV source starts with a header row, checked against the
//! columns). It hands the rows over whenever it has [`FEED_BATCH_ROWS`] of them, or has taken
//! every byte the source had ready, so rows that come slowly are not held back waiting for
//! more. A writer of the feed's own pushes them; the stream's `flush_rows` and
//! `flush_interval` cut the micro-batches as for any writer. At the end of the source the
//! writer finishes, and so it does after a line that does not parse (the rows before it are
//! pushed, and subscriptions do not wait for more); [`Feed::wait`] then returns the error.
//! One record per line: a CSV field that holds a line break is not read.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Catalog, StreamWriter, source_error};
use crate::error::{Result, SpateError};
use crate::source::FileFormat;

/// Most rows parsed before they are handed to the stream.
pub const FEED_BATCH_ROWS: usize = 8_192;

/// A running feed of a byte source into a stream.
#[derive(Debug)]
pub struct Feed {
    task: Option<JoinHandle<Result<u64>>>,
}

impl Feed {
    /// Waits for the end of the source; returns the rows pushed, or what stopped the feed
    /// (a line that does not parse says where it is).
    pub async fn wait(mut self) -> Result<u64> {
        let Some(task) = self.task.take() else {
            return Ok(0);
        };
        task.await.map_err(|e| SpateError::Internal {
            message: format!("the feed stopped: {e}"),
        })?
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Parses lines of one format with a stream's columns.
enum Decoder {
    Csv(arrow::csv::reader::Decoder),
    Json(arrow::json::reader::Decoder),
}

impl Decoder {
    fn new(format: FileFormat, schema: SchemaRef) -> Result<Self> {
        match format {
            FileFormat::Csv => Ok(Decoder::Csv(
                arrow::csv::ReaderBuilder::new(schema)
                    .with_header(true)
                    .with_batch_size(FEED_BATCH_ROWS)
                    .build_decoder(),
            )),
            FileFormat::NdJson => Ok(Decoder::Json(
                arrow::json::ReaderBuilder::new(schema)
                    .with_batch_size(FEED_BATCH_ROWS)
                    .build_decoder()?,
            )),
            other => Err(SpateError::Config {
                message: format!(
                    "a feed reads CSV or NDJSON lines, not {other:?}: tail a folder of such \
                     files instead"
                ),
            }),
        }
    }

    /// Parses `line`, a whole line; returns the bytes taken (fewer once the batch is full).
    fn decode(&mut self, line: &[u8]) -> std::result::Result<usize, ArrowError> {
        match self {
            Decoder::Csv(d) => d.decode(line),
            Decoder::Json(d) => d.decode(line),
        }
    }

    fn flush(&mut self) -> std::result::Result<Option<RecordBatch>, ArrowError> {
        match self {
            Decoder::Csv(d) => d.flush(),
            Decoder::Json(d) => d.flush(),
        }
    }
}

/// Reads `source` to its end, sending parsed rows to `rows`; `what` names it in errors.
fn read_lines(
    source: impl Read,
    mut decoder: Decoder,
    rows: &mpsc::Sender<RecordBatch>,
    what: &str,
) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, source);
    let mut line = Vec::new();
    let mut number = 0_u64;
    let mut pending = 0_usize;
    let what = std::path::Path::new(what);
    let failed = |number: u64, e: ArrowError| source_error(what, format!("line {number}: {e}"));
    let send = |decoder: &mut Decoder, number: u64| -> Result<bool> {
        if let Some(batch) = decoder.flush().map_err(|e| failed(number, e))?
            && batch.num_rows() > 0
        {
            // The receiver went: the feed was dropped.
            return Ok(rows.blocking_send(batch).is_ok());
        }
        Ok(true)
    };
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| source_error(what, e))?;
        if read == 0 {
            send(&mut decoder, number)?;
            return Ok(());
        }
        number += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut taken = 0;
        while taken < line.len() {
            let n = decoder
                .decode(&line[taken..])
                .map_err(|e| failed(number, e))?;
            taken += n;
            if n == 0 || taken < line.len() {
                // The batch is full: hand it over and go on with the line.
                if !send(&mut decoder, number)? {
                    return Ok(());
                }
                pending = 0;
            }
        }
        pending += 1;
        // Every byte ready is parsed, or the batch is full: hand the rows over.
        if (reader.buffer().is_empty() || pending >= FEED_BATCH_ROWS) && pending > 0 {
            if !send(&mut decoder, number)? {
                return Ok(());
            }
            pending = 0;
        }
    }
}

impl Catalog {
    /// Starts reading lines of `format` from `source` into stream `stream` (see the module
    /// docs); `what` names the source in errors.
    pub(crate) fn feed(
        self: &Arc<Self>,
        stream: &str,
        source: impl Read + Send + 'static,
        format: FileFormat,
        what: &str,
    ) -> Result<Feed> {
        let target = self.stream(stream)?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| SpateError::Config {
            message: "a feed runs on a tokio runtime; call it from one".into(),
        })?;
        let writer = StreamWriter::new(Arc::clone(self), target);
        let decoder = Decoder::new(format, writer.schema())?;
        let (tx, mut rx) = mpsc::channel::<RecordBatch>(4);
        let what = what.to_string();
        let reading = std::thread::Builder::new()
            .name("spate-feed".into())
            .spawn(move || read_lines(source, decoder, &tx, &what))
            .map_err(|e| SpateError::Internal {
                message: format!("cannot start the feed's reader: {e}"),
            })?;
        let task = handle.spawn(async move {
            let mut rows = 0_u64;
            while let Some(batch) = rx.recv().await {
                rows += batch.num_rows() as u64;
                writer.push(batch).await?;
            }
            let read = tokio::task::spawn_blocking(move || reading.join())
                .await
                .map_err(|e| SpateError::Internal {
                    message: format!("the feed's reader stopped: {e}"),
                })?
                .map_err(|_| SpateError::Internal {
                    message: "the feed's reader panicked".into(),
                })?;
            // The source ended, or failed: nothing more comes from it either way.
            writer.finish().await?;
            read?;
            Ok(rows)
        });
        Ok(Feed { task: Some(task) })
    }
}
