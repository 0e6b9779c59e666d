//! `CHECKPOINT 'folder'` and `RESTORE 'folder'` ([`crate::Engine::checkpoint`],
//! [`crate::Engine::restore`]): the streams' and views' state in a folder, and back.
//!
//! A checkpoint first cuts a micro-batch of whatever waits in each stream and advances its
//! views, then writes, as Arrow IPC files:
//! - `statement-NNN.sql`: the statements that declared the streams and views, in order;
//! - `stream-NNN.arrow`: the rows a stream keeps for its views, with its counts, watermark and
//!   latest event time in the schema's metadata; `stream-NNN-late.arrow` its late rows;
//! - `view-NNN.arrow`: a view's final bound and, for `EMIT ON UPDATE`, the rows it emitted that
//!   were not final yet.
//!
//! It writes a new folder beside the target and renames it into place (the old checkpoint
//! aside first, deleted last), so a folder holds one whole checkpoint or none. A folder that
//! holds anything but a checkpoint is refused. `RESTORE` runs the statements in a new session and puts the state
//! back. Each stream reports how many rows it had taken (its source offset): a writer resumes
//! from the next row, and the first writer carries on from the latest event time the old ones
//! had sent, so the output from then on is what a run without the restart gives.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use arrow::record_batch::RecordBatch;

use super::Catalog;
use super::state::StreamSnapshot;
use super::view::ViewSnapshot;
use crate::error::{Result, SpateError};

/// A stream in a checkpoint: where its writers resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStream {
    /// The stream's name.
    pub name: String,
    /// Rows it had taken, late ones included: a writer resumes from the next.
    pub events: u64,
    /// Its watermark, in the time column's ticks.
    pub watermark: Option<i64>,
}

fn source_error(path: &Path, e: impl std::fmt::Display) -> SpateError {
    super::source_error(path, format!("checkpoint: {e}"))
}

fn write_ipc(
    path: &Path,
    schema: &SchemaRef,
    metadata: HashMap<String, String>,
    batches: &[RecordBatch],
) -> Result<()> {
    let schema = Arc::new(Schema::new_with_metadata(schema.fields().clone(), metadata));
    let file = File::create(path).map_err(|e| source_error(path, e))?;
    let mut writer = FileWriter::try_new(file, &schema)?;
    for b in batches {
        writer.write(&RecordBatch::try_new(
            Arc::clone(&schema),
            b.columns().to_vec(),
        )?)?;
    }
    writer.finish()?;
    Ok(())
}

fn read_ipc(path: &Path) -> Result<(HashMap<String, String>, Vec<RecordBatch>)> {
    let file = File::open(path).map_err(|e| source_error(path, e))?;
    let reader = FileReader::try_new(file, None)?;
    let metadata = reader.schema().metadata().clone();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((metadata, batches))
}

fn number(value: Option<i64>) -> String {
    value.map_or_else(String::new, |v| v.to_string())
}

fn parse_number(metadata: &HashMap<String, String>, key: &str, path: &Path) -> Result<Option<i64>> {
    match metadata.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| source_error(path, format!("'{key}' is not a number"))),
    }
}

impl Catalog {
    /// Writes a checkpoint of every stream and view to `folder` (see the module docs).
    pub(crate) async fn checkpoint(&self, folder: &Path) -> Result<Vec<CheckpointStream>> {
        // Only a checkpoint, or nothing, is replaced: never some other folder.
        if folder.exists() {
            let empty = std::fs::read_dir(folder)
                .map_err(|e| source_error(folder, e))?
                .next()
                .is_none();
            if !empty && !folder.join("statement-000.sql").is_file() {
                return Err(source_error(
                    folder,
                    "the folder holds something other than a checkpoint; name a new or empty \
                     folder",
                ));
            }
        }
        let streams = self.sorted_streams();
        let mut guards = Vec::new();
        for stream in &streams {
            let guard = stream.flushing.lock().await;
            self.flush_locked(stream).await?;
            guards.push(guard);
        }
        let staging = staging_folder(folder);
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| source_error(&staging, e))?;
        }
        std::fs::create_dir_all(&staging).map_err(|e| source_error(&staging, e))?;
        for (i, statement) in self.statements().iter().enumerate() {
            let path = staging.join(format!("statement-{i:03}.sql"));
            std::fs::write(&path, statement).map_err(|e| source_error(&path, e))?;
        }
        let mut report = Vec::new();
        for (i, stream) in streams.iter().enumerate() {
            let snapshot = stream.snapshot()?;
            let mut metadata = HashMap::from([
                ("spate.stream".to_string(), stream.config.name.clone()),
                ("spate.events".to_string(), snapshot.events.to_string()),
                (
                    "spate.micro_batches".to_string(),
                    snapshot.micro_batches.to_string(),
                ),
                ("spate.watermark".to_string(), number(snapshot.watermark)),
                ("spate.latest".to_string(), number(snapshot.latest)),
            ]);
            let schema = Arc::clone(&stream.config.schema);
            write_ipc(
                &staging.join(format!("stream-{i:03}.arrow")),
                &schema,
                metadata.clone(),
                &snapshot.kept,
            )?;
            metadata.insert("spate.late".into(), "true".into());
            write_ipc(
                &staging.join(format!("stream-{i:03}-late.arrow")),
                &schema,
                metadata,
                &snapshot.late,
            )?;
            report.push(CheckpointStream {
                name: stream.config.name.clone(),
                events: snapshot.events,
                watermark: snapshot.watermark,
            });
        }
        for (i, view) in self.sorted_views().iter().enumerate() {
            let snapshot = view.snapshot()?;
            let metadata = HashMap::from([
                ("spate.view".to_string(), view.name.clone()),
                ("spate.closed".to_string(), number(snapshot.closed)),
                (
                    "spate.session_floor".to_string(),
                    number(snapshot.session_floor),
                ),
                ("spate.rows".to_string(), snapshot.rows.to_string()),
            ]);
            if let Some((schema, panes)) = &snapshot.panes {
                write_ipc(
                    &staging.join(format!("view-{i:03}-panes.arrow")),
                    schema,
                    metadata.clone(),
                    panes,
                )?;
            }
            let open = snapshot
                .open
                .unwrap_or_else(|| RecordBatch::new_empty(view.open_schema()));
            write_ipc(
                &staging.join(format!("view-{i:03}.arrow")),
                &open.schema(),
                metadata,
                &[open],
            )?;
        }
        drop(guards);
        // The old checkpoint goes aside until the new one is in place.
        let old = folder.with_file_name(format!(
            ".{}.old-{}",
            folder
                .file_name()
                .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned()),
            std::process::id()
        ));
        let replaced = folder.exists();
        if replaced {
            std::fs::rename(folder, &old).map_err(|e| source_error(folder, e))?;
        }
        std::fs::rename(&staging, folder).map_err(|e| source_error(folder, e))?;
        if replaced {
            std::fs::remove_dir_all(&old).map_err(|e| source_error(&old, e))?;
        }
        Ok(report)
    }

    /// Declares the streams and views of the checkpoint in `folder` and puts their state back.
    pub(crate) async fn restore(self: &Arc<Self>, folder: &Path) -> Result<Vec<CheckpointStream>> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(folder)
            .map_err(|e| source_error(folder, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        let named = |prefix: &str, suffix: &str| -> Vec<PathBuf> {
            entries
                .iter()
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with(prefix)
                            && n.ends_with(suffix)
                            && !n.ends_with("-late.arrow")
                            && !n.ends_with("-panes.arrow")
                    })
                })
                .cloned()
                .collect()
        };
        let statements = named("statement-", ".sql");
        if statements.is_empty() {
            return Err(source_error(
                folder,
                "no statements: not a checkpoint folder",
            ));
        }
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        for path in &statements {
            let text = std::fs::read_to_string(path).map_err(|e| source_error(path, e))?;
            let statement = state.sql_to_statement(&text, &dialect)?;
            let datafusion::sql::parser::Statement::Statement(sql) = &statement else {
                return Err(source_error(path, "not a stream or view declaration"));
            };
            if self.execute(sql).await?.is_none() {
                return Err(source_error(path, "not a stream or view declaration"));
            }
        }
        let mut report = Vec::new();
        for path in named("stream-", ".arrow") {
            let (metadata, kept) = read_ipc(&path)?;
            let late_path = PathBuf::from(
                path.to_string_lossy()
                    .trim_end_matches(".arrow")
                    .to_string()
                    + "-late.arrow",
            );
            let (_, late) = read_ipc(&late_path)?;
            let name = metadata
                .get("spate.stream")
                .ok_or_else(|| source_error(&path, "no stream name"))?;
            let stream = self.stream(name)?;
            let events = parse_number(&metadata, "spate.events", &path)?.unwrap_or(0) as u64;
            let watermark = parse_number(&metadata, "spate.watermark", &path)?;
            let schema = Arc::clone(&stream.config.schema);
            let conform =
                |b: RecordBatch| RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec());
            stream
                .restore(StreamSnapshot {
                    events,
                    micro_batches: parse_number(&metadata, "spate.micro_batches", &path)?
                        .unwrap_or(0) as u64,
                    watermark,
                    latest: parse_number(&metadata, "spate.latest", &path)?,
                    kept: kept
                        .into_iter()
                        .map(conform)
                        .collect::<std::result::Result<_, _>>()?,
                    late: late
                        .into_iter()
                        .map(conform)
                        .collect::<std::result::Result<_, _>>()?,
                })
                .await?;
            report.push(CheckpointStream {
                name: name.clone(),
                events,
                watermark,
            });
        }
        for path in named("view-", ".arrow") {
            let (metadata, open) = read_ipc(&path)?;
            let name = metadata
                .get("spate.view")
                .ok_or_else(|| source_error(&path, "no view name"))?;
            let view = self.view(name)?;
            let open = open.into_iter().find(|b| b.num_rows() > 0);
            let panes_path = PathBuf::from(
                path.to_string_lossy()
                    .trim_end_matches(".arrow")
                    .to_string()
                    + "-panes.arrow",
            );
            let panes = if panes_path.exists() {
                let (_, batches) = read_ipc(&panes_path)?;
                let schema = batches
                    .first()
                    .map_or_else(|| Arc::new(Schema::empty()), |b| b.schema());
                Some((schema, batches))
            } else {
                None
            };
            view.restore(ViewSnapshot {
                closed: parse_number(&metadata, "spate.closed", &path)?,
                session_floor: parse_number(&metadata, "spate.session_floor", &path)?,
                rows: parse_number(&metadata, "spate.rows", &path)?.unwrap_or(0) as u64,
                open,
                panes,
            })?;
        }
        Ok(report)
    }
}

/// Where a checkpoint is written before it is renamed into `folder`.
fn staging_folder(folder: &Path) -> PathBuf {
    let name = folder
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    folder.with_file_name(format!(".{name}.writing-{}", std::process::id()))
}
