//! A folder of files tailed into a stream ([`crate::Engine::tail_folder`]): each new file is
//! read once, in name order, and its rows pushed by a writer of the tail's own, one
//! micro-batch per file.
//!
//! A file is read once its size and modification time have stayed the same between two
//! polls, so a file still being written is left for later (writing a file under another name
//! and renaming it in is safer still). Hidden files (`.` or `_` first) and files of another
//! format are skipped. [`FolderTail::finish`] reads what is left without waiting and finishes
//! the writer; [`FolderTail::stop`] leaves it unfinished. Dropping the handle stops the tail.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arrow::record_batch::RecordBatch;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Catalog, StreamWriter, source_error};
use crate::error::{Result, SpateError};
use crate::source::FileFormat;

/// What ends a tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Running,
    Stop,
    Finish,
}

/// A running tail of a folder into a stream.
#[derive(Debug)]
pub struct FolderTail {
    end: watch::Sender<End>,
    task: Option<JoinHandle<Result<u64>>>,
    files: Arc<AtomicU64>,
}

impl FolderTail {
    /// Files read so far.
    pub fn files_read(&self) -> u64 {
        self.files.load(Ordering::Relaxed)
    }

    async fn end(mut self, how: End) -> Result<u64> {
        let _ = self.end.send(how);
        let Some(task) = self.task.take() else {
            return Ok(self.files_read());
        };
        task.await.map_err(|e| SpateError::Internal {
            message: format!("the folder tail stopped: {e}"),
        })?
    }

    /// Stops tailing (the writer leaves without finishing); returns the files read, or the
    /// error that stopped the tail.
    pub async fn stop(self) -> Result<u64> {
        self.end(End::Stop).await
    }

    /// Reads the files present now without waiting for them to settle, then finishes the
    /// writer (the stream ends once its other writers have finished too).
    pub async fn finish(self) -> Result<u64> {
        self.end(End::Finish).await
    }
}

impl Drop for FolderTail {
    fn drop(&mut self) {
        let _ = self.end.send(End::Stop);
    }
}

/// The data files of `folder` a tail of `format` reads, in name order, with their size and
/// modification time.
fn listing(folder: &Path, format: FileFormat) -> Result<Vec<(PathBuf, (u64, SystemTime))>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).map_err(|e| source_error(folder, e))? {
        let entry = entry.map_err(|e| source_error(folder, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let matches = path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(FileFormat::from_extension)
            == Some(format);
        let Ok(meta) = entry.metadata() else { continue };
        if matches && meta.is_file() {
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            files.push((path, (meta.len(), modified)));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

impl Catalog {
    /// Starts tailing `folder` (files of `format`) into stream `stream`, looking every `poll`.
    pub(crate) fn tail_folder(
        self: &Arc<Self>,
        stream: &str,
        folder: &Path,
        format: FileFormat,
        poll: Duration,
    ) -> Result<FolderTail> {
        let target = self.stream(stream)?;
        if !folder.is_dir() {
            return Err(source_error(folder, "not a folder"));
        }
        let handle = tokio::runtime::Handle::try_current().map_err(|_| SpateError::Config {
            message: "a folder tail runs on a tokio runtime; call it from one".into(),
        })?;
        let writer = StreamWriter::new(Arc::clone(self), target);
        let (end, mut ended) = watch::channel(End::Running);
        let files = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&files);
        let catalog = Arc::clone(self);
        let folder = folder.to_path_buf();
        let poll = poll.max(Duration::from_millis(1));
        let task = handle.spawn(async move {
            let mut seen: HashSet<PathBuf> = HashSet::new();
            let mut last: HashMap<PathBuf, (u64, SystemTime)> = HashMap::new();
            loop {
                let how = *ended.borrow();
                let settled_only = how != End::Finish;
                for (path, stamp) in listing(&folder, format)? {
                    if seen.contains(&path) {
                        continue;
                    }
                    let settled = last.insert(path.clone(), stamp) == Some(stamp);
                    if settled_only && !settled {
                        continue;
                    }
                    for batch in catalog.read_file(&path, format, &writer.schema()).await? {
                        writer.push(batch).await?;
                    }
                    writer.flush().await?;
                    seen.insert(path);
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                match how {
                    End::Finish => {
                        writer.finish().await?;
                        break;
                    }
                    End::Stop => break,
                    End::Running => {}
                }
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    _ = ended.changed() => {}
                }
            }
            Ok(counted.load(Ordering::Relaxed))
        });
        Ok(FolderTail {
            end,
            task: Some(task),
            files,
        })
    }

    /// The rows of one file, read with the stream's columns (CSV and NDJSON parsed as them).
    async fn read_file(
        &self,
        path: &Path,
        format: FileFormat,
        schema: &arrow::datatypes::SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let text = path.to_string_lossy().into_owned();
        let shown = path.display().to_string();
        let extension = path
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        let df = match format {
            FileFormat::Csv => {
                let mut options = CsvReadOptions::new()
                    .schema(schema)
                    .has_header(true)
                    .file_extension(&extension);
                if extension.eq_ignore_ascii_case(".tsv") {
                    options = options.delimiter(b'\t');
                }
                self.ctx.read_csv(text, options).await
            }
            FileFormat::NdJson => {
                self.ctx
                    .read_json(
                        text,
                        JsonReadOptions::default()
                            .schema(schema)
                            .file_extension(&extension),
                    )
                    .await
            }
            FileFormat::Parquet => {
                self.ctx
                    .read_parquet(
                        text,
                        ParquetReadOptions::default().file_extension(&extension),
                    )
                    .await
            }
            FileFormat::ArrowIpc => {
                self.ctx
                    .read_arrow(
                        text,
                        datafusion::datasource::file_format::options::ArrowReadOptions {
                            file_extension: &extension,
                            ..Default::default()
                        },
                    )
                    .await
            }
        }
        .map_err(|e| SpateError::source_read(&shown, e))?;
        df.collect()
            .await
            .map_err(|e| SpateError::source_read(&shown, e))
    }
}
