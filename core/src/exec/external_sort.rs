//! A sort larger than its share of the device budget: its input sorted in runs on the device,
//! each run moved to host memory, and the runs merged back through the device in rounds. A run
//! that DataFusion's memory pool will not take goes to a temporary file of its `DiskManager`
//! instead (`disk_spill.rs`), and is read back a window at a time as the merge reaches it:
//! the round's rows of the run, and at most one slice of a sixteenth of a batch more.
//!
//! Each round takes a slice from the front of every run, bounded so that no row left behind
//! in any run can sort before a row taken: the round's frontier is the smallest of the last
//! rows taken from the runs that still have rows, and from every run it takes exactly the rows
//! up to that frontier (found on the host by binary search over the run's keys in Arrow's row
//! format, which orders as DataFusion's sort does). The round's rows are uploaded, sorted on
//! the device, and come out as the next batch of the sort's output. A round takes at most the
//! chunk it was sized for from each run, and at least the whole chunk of the run that holds the
//! frontier, so every round makes progress. Rows equal on every key may come out in any order,
//! as with the in-memory sort.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::{SortOptions, concat_batches};
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use spate_kernels::Stream as DeviceStream;

use super::disk_spill::{DiskPart, DiskReader};
use super::sort::SortKey;
use super::spill::SpillOptions;
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::error::{Result, SpateError};

/// A run on disk is written in slices of this fraction of a batch (see [`Runs::push`]).
const DISK_SLICES: usize = 16;

/// A sorted run as it is kept until the merge.
enum Stored {
    /// In host memory, charged to the runs' reservation.
    Memory(RecordBatch),
    /// In a temporary file, in slices of a sixteenth of a batch.
    Disk(Box<DiskPart>),
}

/// Sorted runs in host memory or on disk.
pub(crate) struct Runs {
    runs: Vec<Stored>,
    /// Rows and host bytes of every run.
    rows: usize,
    bytes: usize,
    reservation: MemoryReservation,
    spill: SpillOptions,
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("runs", &self.runs.len())
            .finish()
    }
}

impl Runs {
    pub(crate) fn new(spill: SpillOptions) -> Self {
        Runs {
            runs: Vec::new(),
            rows: 0,
            bytes: 0,
            reservation: MemoryConsumer::new(spill.name.clone())
                .register(spill.context.memory_pool()),
            spill,
        }
    }

    /// True before the first run.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Moves a sorted device batch to the host as a run: to host memory, or to disk when the
    /// memory pool will not take it.
    pub(crate) fn push(&mut self, stream: &DeviceStream, sorted: &DeviceBatch) -> Result<()> {
        let host = download_batch(stream, sorted)?;
        let rows = host.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let size = host.get_array_memory_size();
        self.spill.record(size, rows);
        self.rows += rows;
        self.bytes += size;
        if self.reservation.try_grow(size).is_ok() {
            self.runs.push(Stored::Memory(host));
            return Ok(());
        }
        let mut part = DiskPart::create(&self.spill.context, &host.schema(), &self.spill.name)?;
        // Slices of a sixteenth of a batch: the merge holds a round's rows of each run and at
        // most one slice more, however many runs there are (up to sixteen, about two batches).
        let slice_bytes = (self.spill.batch_bytes / DISK_SLICES).max(1);
        let slice_rows = (slice_bytes / size.div_ceil(rows).max(1)).max(1);
        for at in (0..rows).step_by(slice_rows) {
            part.append(&host.slice(at, slice_rows.min(rows - at)))?;
        }
        self.spill.record_disk(size);
        self.runs.push(Stored::Disk(Box::new(part)));
        Ok(())
    }

    /// The merge of the runs by `keys`, in rounds of about the spill's batch size.
    pub(crate) fn merge(self, keys: &[SortKey]) -> Result<Merge> {
        let Some(schema) = self.runs.first().map(|run| match run {
            Stored::Memory(batch) => batch.schema(),
            Stored::Disk(part) => Arc::clone(part.schema()),
        }) else {
            return Err(SpateError::Internal {
                message: "a merge of no sorted runs".into(),
            });
        };
        let fields = keys
            .iter()
            .map(|k| {
                SortField::new_with_options(
                    schema.field(k.column).data_type().clone(),
                    SortOptions {
                        descending: k.descending,
                        nulls_first: k.nulls_first,
                    },
                )
            })
            .collect();
        let converter = RowConverter::new(fields).map_err(SpateError::from)?;
        let key_columns: Vec<usize> = keys.iter().map(|k| k.column).collect();
        let mut cursors = Vec::with_capacity(self.runs.len());
        for run in self.runs {
            cursors.push(match run {
                Stored::Memory(window) => Cursor {
                    keys: key_rows(&converter, &key_columns, &window)?,
                    window,
                    at: 0,
                    disk: None,
                    charge: None,
                },
                Stored::Disk(part) => {
                    let window = RecordBatch::new_empty(Arc::clone(&schema));
                    Cursor {
                        keys: key_rows(&converter, &key_columns, &window)?,
                        window,
                        at: 0,
                        disk: Some(part.into_reader()?),
                        charge: Some(self.reservation.new_empty()),
                    }
                }
            });
        }
        let row_bytes = self.bytes.div_ceil(self.rows.max(1)).max(1);
        let round_rows = (self.spill.batch_bytes / row_bytes).max(cursors.len());
        Ok(Merge {
            schema,
            chunk: (round_rows / cursors.len()).max(1),
            cursors,
            converter,
            key_columns,
            _reservation: self.reservation,
        })
    }
}

/// `batch`'s sort keys in Arrow's row format.
fn key_rows(converter: &RowConverter, keys: &[usize], batch: &RecordBatch) -> Result<Rows> {
    let columns: Vec<_> = keys.iter().map(|&k| Arc::clone(batch.column(k))).collect();
    converter
        .convert_columns(&columns)
        .map_err(SpateError::from)
}

/// Where the merge is in one run.
struct Cursor {
    /// The run's rows in host memory: all of a run kept in memory, a window of one on disk.
    window: RecordBatch,
    /// `window`'s sort keys in Arrow's row format.
    keys: Rows,
    /// The window's first row not yet taken.
    at: usize,
    /// The rows of a run on disk not yet read into the window.
    disk: Option<DiskReader>,
    /// What the window read back from disk is charged: the pool may go over its limit by it,
    /// as the merge cannot go on without it.
    charge: Option<MemoryReservation>,
}

impl Cursor {
    /// Whether the run has rows after the window's row `end`.
    fn more_after(&self, end: usize) -> bool {
        end < self.window.num_rows() || self.disk.is_some()
    }

    /// Reads from disk until the window holds `want` rows not yet taken, or the run is read.
    fn fill(&mut self, want: usize, converter: &RowConverter, keys: &[usize]) -> Result<()> {
        let left = self.window.num_rows() - self.at;
        let Some(disk) = self.disk.as_mut().filter(|_| left < want) else {
            return Ok(());
        };
        let mut parts = vec![self.window.slice(self.at, left)];
        let mut rows = left;
        let mut ended = false;
        while rows < want {
            match disk.next_batch()? {
                Some(batch) => {
                    rows += batch.num_rows();
                    parts.push(batch);
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
        if ended {
            self.disk = None;
        }
        self.window = concat_batches(&self.window.schema(), &parts)?;
        self.keys = key_rows(converter, keys, &self.window)?;
        self.at = 0;
        if let Some(charge) = self.charge.as_mut() {
            charge.resize(self.window.get_array_memory_size());
        }
        Ok(())
    }
}

/// Sorted runs being merged, round by round.
pub(crate) struct Merge {
    schema: SchemaRef,
    cursors: Vec<Cursor>,
    converter: RowConverter,
    /// The sort key columns.
    key_columns: Vec<usize>,
    /// Rows taken from a run per round, at most.
    chunk: usize,
    _reservation: MemoryReservation,
}

impl Merge {
    /// The next round's rows, uploaded as one device batch (not yet sorted); `None` once every
    /// run is taken.
    pub(crate) fn next_round(&mut self, stream: &DeviceStream) -> Result<Option<DeviceBatch>> {
        for cursor in &mut self.cursors {
            cursor.fill(self.chunk, &self.converter, &self.key_columns)?;
        }
        let ends: Vec<usize> = self
            .cursors
            .iter()
            .map(|c| (c.at + self.chunk).min(c.window.num_rows()))
            .collect();
        // The frontier: the smallest last row taken among the runs with rows left after it.
        let frontier: Option<OwnedRow> = self
            .cursors
            .iter()
            .zip(&ends)
            .filter(|(c, end)| **end > c.at && c.more_after(**end))
            .map(|(c, &end)| c.keys.row(end - 1))
            .min()
            .map(|row| row.owned());
        let mut slices = Vec::new();
        for (cursor, &chunk_end) in self.cursors.iter_mut().zip(&ends) {
            let at = cursor.at;
            let end = match &frontier {
                None => chunk_end,
                Some(bound) => {
                    // Rows of this run up to the frontier (it is sorted): at most its chunk.
                    let (mut lo, mut hi) = (at, chunk_end);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if cursor.keys.row(mid) <= bound.row() {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    lo
                }
            };
            if end > at {
                slices.push(cursor.window.slice(at, end - at));
                cursor.at = end;
            }
        }
        if slices.is_empty() {
            return Ok(None);
        }
        Ok(Some(upload_batches(stream, &self.schema, &slices)?))
    }
}
