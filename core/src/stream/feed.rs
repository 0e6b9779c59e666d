//! Lines of CSV or NDJSON read into a stream from a byte source, such as standard input
//! ([`crate::Engine::feed`]; `spate --stdin-into STREAM`).
//!
//! A thread reads the source line by line and parses the lines with the stream's columns
//! (arrow's CSV and JSON decoders; a CSV source starts with a header row, checked against the
//! columns). It hands the rows over whenever it has [`FEED_BATCH_ROWS`] of them, or has taken
//! every byte the source had ready, so rows that come slowly are not held back waiting for
//! more. A writer of the feed's own pushes them; the stream's `flush_rows` and
//! `flush_interval` cut the micro-batches as for any writer. At the end of the source the
//! writer finishes, and so it does after a line that does not parse or a push that fails (the
//! rows before are pushed, and subscriptions do not wait for more); [`Feed::wait`] then returns
//! the error, with the line's number.
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
    Csv(Box<arrow::csv::reader::Decoder>),
    Json(arrow::json::reader::Decoder),
}

impl Decoder {
    /// A decoder of `format` lines; a CSV one first takes a header row when `header`, checked
    /// against the columns. Its batches hold more than the feed hands over at once, so a line
    /// is always taken whole.
    fn new(format: FileFormat, schema: SchemaRef, header: bool) -> Result<Self> {
        match format {
            FileFormat::Csv => Ok(Decoder::Csv(Box::new(
                arrow::csv::ReaderBuilder::new(schema)
                    .with_header(header)
                    .with_header_validation(header)
                    .with_batch_size(FEED_BATCH_ROWS + 1)
                    .build_decoder(),
            ))),
            FileFormat::NdJson => Ok(Decoder::Json(
                arrow::json::ReaderBuilder::new(schema)
                    .with_batch_size(FEED_BATCH_ROWS + 1)
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

    /// Parses `bytes`; returns the bytes taken. Empty `bytes` end the input (a last line
    /// without a line break is complete).
    fn decode(&mut self, bytes: &[u8]) -> std::result::Result<usize, ArrowError> {
        match self {
            Decoder::Csv(d) => d.decode(bytes),
            Decoder::Json(d) => d.decode(bytes),
        }
    }

    fn flush(&mut self) -> std::result::Result<Option<RecordBatch>, ArrowError> {
        match self {
            Decoder::Csv(d) => d.flush(),
            Decoder::Json(d) => d.flush(),
        }
    }
}

/// Reads a source line by line and hands its rows over.
struct LineReader<'a> {
    format: FileFormat,
    schema: SchemaRef,
    decoder: Decoder,
    /// The lines parsed and not handed over yet, with their numbers: the rows of the next
    /// batch, and where to look when it does not convert.
    pending: Vec<(u64, Vec<u8>)>,
    rows: &'a mpsc::Sender<RecordBatch>,
    what: &'a std::path::Path,
}

impl LineReader<'_> {
    fn failed(&self, number: u64, e: impl std::fmt::Display) -> SpateError {
        source_error(self.what, format!("line {number}: {e}"))
    }

    /// Sends `batch`; false once the feed was dropped.
    fn send(&self, batch: RecordBatch) -> bool {
        batch.num_rows() == 0 || self.rows.blocking_send(batch).is_ok()
    }

    /// Hands the pending rows over (`at_end`: the source has ended, so a last line without a
    /// line break is complete). When they do not convert, the lines before the first that
    /// fails are handed over, and the error names that line.
    fn hand_over(&mut self, at_end: bool) -> Result<bool> {
        // At the end, even with nothing pending: a header without a line break is checked.
        let ended = if at_end {
            self.decoder.decode(&[]).map(|_| ())
        } else {
            Ok(())
        };
        if self.pending.is_empty() {
            return ended.map(|()| true).map_err(|e| self.failed(0, e));
        }
        let converted = ended.and_then(|()| self.decoder.flush());
        let error = match converted {
            Ok(Some(batch)) => {
                self.pending.clear();
                return Ok(self.send(batch));
            }
            Ok(None) => {
                self.pending.clear();
                return Ok(true);
            }
            Err(e) => e,
        };
        let last = self.pending.last().map_or(0, |(n, _)| *n);
        if !self.probe()? {
            return Ok(false);
        }
        Err(self.failed(last, error))
    }

    /// Converts the pending lines one by one, each on a decoder of its own, to find the one at
    /// fault: hands over the rows before it and returns its error. Returns whether the feed is
    /// still wanted when every line converts. The main decoder starts afresh (what it held is
    /// in the pending lines).
    fn probe(&mut self) -> Result<bool> {
        self.decoder = Decoder::new(self.format, Arc::clone(&self.schema), false)?;
        let lines = std::mem::take(&mut self.pending);
        let mut good = Vec::new();
        let mut failure = None;
        for (number, line) in &lines {
            let mut probe = Decoder::new(self.format, Arc::clone(&self.schema), false)?;
            let one = probe
                .decode(line)
                .and_then(|_| probe.decode(&[]))
                .and_then(|_| probe.flush());
            match one {
                Ok(Some(batch)) => good.push(batch),
                Ok(None) => {}
                Err(e) => {
                    failure = Some(self.failed(*number, e));
                    break;
                }
            }
        }
        if !good.is_empty() {
            let batch = arrow::compute::concat_batches(&self.schema, &good)?;
            if !self.send(batch) {
                return Ok(false);
            }
        }
        failure.map_or(Ok(true), Err)
    }

    /// Reads `source` to its end, or until the feed is dropped.
    fn read(&mut self, source: impl Read) -> Result<()> {
        let mut reader = BufReader::with_capacity(1 << 16, source);
        let mut number = 0_u64;
        let mut header = self.format == FileFormat::Csv;
        loop {
            let mut line = Vec::new();
            let read = reader
                .read_until(b'\n', &mut line)
                .map_err(|e| source_error(self.what, e))?;
            if read == 0 {
                self.hand_over(true)?;
                return Ok(());
            }
            number += 1;
            // Windows line ends, and a byte-order mark before the first line.
            if line.ends_with(b"\r\n") {
                line.remove(line.len() - 2);
            }
            if number == 1 && line.starts_with(&[0xEF, 0xBB, 0xBF]) {
                line.drain(..3);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.decoder.decode(&line) {
                Ok(n) if n == line.len() => {}
                Ok(_) => {
                    return Err(self.failed(
                        number,
                        "more records than a line holds (one record per line)",
                    ));
                }
                Err(e) => {
                    // The decoder holds part of this line: the lines before it go in on their
                    // own, then its error.
                    if !self.probe()? {
                        return Ok(());
                    }
                    return Err(self.failed(number, e));
                }
            }
            if std::mem::take(&mut header) {
                continue;
            }
            // A line without a line break is the last: the end hands it over.
            let whole = line.last() == Some(&b'\n');
            self.pending.push((number, line));
            // Every byte ready is parsed, or the batch is full: hand the rows over.
            if whole
                && (reader.buffer().is_empty() || self.pending.len() >= FEED_BATCH_ROWS)
                && !self.hand_over(false)?
            {
                return Ok(());
            }
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
        let schema = writer.schema();
        let decoder = Decoder::new(format, Arc::clone(&schema), true)?;
        let (tx, mut rx) = mpsc::channel::<RecordBatch>(4);
        let what = what.to_string();
        let reading = std::thread::Builder::new()
            .name("spate-feed".into())
            .spawn(move || {
                LineReader {
                    format,
                    schema,
                    decoder,
                    pending: Vec::new(),
                    rows: &tx,
                    what: std::path::Path::new(&what),
                }
                .read(source)
            })
            .map_err(|e| SpateError::Internal {
                message: format!("cannot start the feed's reader: {e}"),
            })?;
        let task = handle.spawn(async move {
            let mut rows = 0_u64;
            while let Some(batch) = rx.recv().await {
                rows += batch.num_rows() as u64;
                if let Err(e) = writer.push(batch).await {
                    // Nothing more comes from this feed: its writer finishes, so
                    // subscriptions do not wait for it.
                    drop(rx);
                    let _ = writer.finish().await;
                    return Err(e);
                }
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
