//! Spilled rows on disk, for when host memory is short too: a partition's host batches that
//! DataFusion's memory pool will not take are appended to a temporary file of DataFusion's
//! `DiskManager` (Arrow IPC stream format), and read back when the partition is processed.
//!
//! The file is deleted once dropped, and its bytes count against the disk manager's limit
//! (`datafusion.runtime.max_temp_directory_size`). Reading back takes a hash partition into host
//! memory whole, one partition at a time, and a sorted run a window at a time
//! (`external_sort.rs`), with plain blocking file reads: spilled rows are read on the task that
//! processes them, as the device work around them blocks it too.

use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringViewArray};
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::execution::{SpillFile, SpillWriter};

use crate::error::{Result, SpateError};

/// Rows read back from a temporary file, batch by batch.
pub(crate) struct DiskReader {
    reader: StreamReader<BufReader<File>>,
    /// Deleted when the reader is dropped.
    _file: Arc<dyn SpillFile>,
}

impl DiskReader {
    /// The next batch written, or `None` after the last.
    pub(crate) fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        Ok(self.reader.next().transpose()?)
    }
}

/// One partition's rows in a temporary file.
pub(crate) struct DiskPart {
    file: Arc<dyn SpillFile>,
    schema: SchemaRef,
    /// Open until the rows are read back.
    writer: Option<StreamWriter<Box<dyn SpillWriter>>>,
}

fn io_error(e: std::io::Error) -> SpateError {
    SpateError::from(DataFusionError::IoError(e))
}

impl DiskPart {
    /// A new temporary file for rows of `schema`, named after `name` in errors.
    pub(crate) fn create(context: &TaskContext, schema: &SchemaRef, name: &str) -> Result<Self> {
        let file = context
            .runtime_env()
            .disk_manager
            .create_tmp_file(name)
            .map_err(SpateError::from)?;
        let writer = StreamWriter::try_new(file.open_writer().map_err(SpateError::from)?, schema)?;
        Ok(DiskPart {
            file,
            schema: Arc::clone(schema),
            writer: Some(writer),
        })
    }

    /// The schema of the rows.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Appends `batch` (of the file's schema). A slice's string views are compacted first:
    /// Arrow IPC writes a view column's data buffers whole, which for a partition's slice of a
    /// download would be every partition's strings.
    pub(crate) fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        let writer = self.writer.as_mut().ok_or_else(|| SpateError::Internal {
            message: "rows appended to a spill file already read back".into(),
        })?;
        let columns = batch
            .columns()
            .iter()
            .map(|c| match c.as_any().downcast_ref::<StringViewArray>() {
                Some(views) => Arc::new(views.gc()) as ArrayRef,
                None => Arc::clone(c),
            })
            .collect();
        let compacted = RecordBatch::try_new(batch.schema(), columns)?;
        Ok(writer.write(&compacted)?)
    }

    /// The rows written, in order; the file is deleted when `self` is dropped.
    pub(crate) fn read_all(self) -> Result<Vec<RecordBatch>> {
        let mut reader = self.into_reader()?;
        let mut batches = Vec::new();
        while let Some(batch) = reader.next_batch()? {
            batches.push(batch);
        }
        Ok(batches)
    }

    /// A reader of the rows written, batch by batch in the order they were appended; the file
    /// is deleted when the reader is dropped.
    pub(crate) fn into_reader(mut self) -> Result<DiskReader> {
        if let Some(mut writer) = self.writer.take() {
            writer.finish()?;
            writer.into_inner()?.finish().map_err(SpateError::from)?;
        }
        let path = self.file.path().ok_or_else(|| SpateError::Unsupported {
            message: "GPU operators read spilled rows back from local files only; this \
                      session's DiskManager makes files elsewhere"
                .into(),
        })?;
        let reader =
            StreamReader::try_new(BufReader::new(File::open(path).map_err(io_error)?), None)?;
        Ok(DiskReader {
            reader,
            _file: self.file,
        })
    }
}
