//! A sort larger than its share of the device budget: its input sorted in runs on the device,
//! each run moved to host memory, and the runs merged back through the device in rounds.
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
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use spate_kernels::Stream as DeviceStream;

use super::sort::SortKey;
use super::spill::SpillOptions;
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::error::{Result, SpateError};

/// Sorted runs in host memory.
pub(crate) struct Runs {
    runs: Vec<RecordBatch>,
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
            reservation: MemoryConsumer::new(spill.name.clone())
                .register(spill.context.memory_pool()),
            spill,
        }
    }

    /// True before the first run.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Moves a sorted device batch to the host as a run.
    pub(crate) fn push(&mut self, stream: &DeviceStream, sorted: &DeviceBatch) -> Result<()> {
        let host = download_batch(stream, sorted)?;
        if host.num_rows() == 0 {
            return Ok(());
        }
        let size = host.get_array_memory_size();
        self.reservation.try_grow(size).map_err(SpateError::from)?;
        self.spill.record(size, host.num_rows());
        self.runs.push(host);
        Ok(())
    }

    /// The merge of the runs by `keys`, in rounds of about the spill's batch size.
    pub(crate) fn merge(self, keys: &[SortKey]) -> Result<Merge> {
        let Some(first) = self.runs.first() else {
            return Err(SpateError::Internal {
                message: "a merge of no sorted runs".into(),
            });
        };
        let schema = first.schema();
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
        let mut rows = Vec::with_capacity(self.runs.len());
        for run in &self.runs {
            let columns: Vec<_> = keys
                .iter()
                .map(|k| Arc::clone(run.column(k.column)))
                .collect();
            rows.push(
                converter
                    .convert_columns(&columns)
                    .map_err(SpateError::from)?,
            );
        }
        let total_rows: usize = self.runs.iter().map(RecordBatch::num_rows).sum();
        let total_bytes: usize = self
            .runs
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum();
        let row_bytes = total_bytes.div_ceil(total_rows.max(1)).max(1);
        let round_rows = (self.spill.batch_bytes / row_bytes).max(self.runs.len());
        Ok(Merge {
            schema,
            chunk: (round_rows / self.runs.len()).max(1),
            positions: vec![0; self.runs.len()],
            runs: self.runs,
            rows,
            _reservation: self.reservation,
        })
    }
}

/// Sorted runs being merged, round by round.
pub(crate) struct Merge {
    schema: SchemaRef,
    runs: Vec<RecordBatch>,
    /// Each run's sort keys in Arrow's row format.
    rows: Vec<Rows>,
    /// Each run's first row not yet taken.
    positions: Vec<usize>,
    /// Rows taken from a run per round, at most.
    chunk: usize,
    _reservation: MemoryReservation,
}

impl Merge {
    /// The next round's rows, uploaded as one device batch (not yet sorted); `None` once every
    /// run is taken.
    pub(crate) fn next_round(&mut self, stream: &DeviceStream) -> Result<Option<DeviceBatch>> {
        let ends: Vec<usize> = self
            .runs
            .iter()
            .zip(&self.positions)
            .map(|(run, &at)| (at + self.chunk).min(run.num_rows()))
            .collect();
        // The frontier: the smallest last row taken among the runs with rows left after it.
        let frontier = (0..self.runs.len())
            .filter(|&r| ends[r] < self.runs[r].num_rows())
            .map(|r| self.rows[r].row(ends[r] - 1))
            .min();
        let mut slices = Vec::new();
        for (r, &chunk_end) in ends.iter().enumerate() {
            let at = self.positions[r];
            let end = match &frontier {
                None => chunk_end,
                Some(bound) => {
                    // Rows of this run up to the frontier (it is sorted): at most its chunk.
                    let (mut lo, mut hi) = (at, chunk_end);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if self.rows[r].row(mid) <= *bound {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    lo
                }
            };
            if end > at {
                slices.push(self.runs[r].slice(at, end - at));
                self.positions[r] = end;
            }
        }
        if slices.is_empty() {
            return Ok(None);
        }
        Ok(Some(upload_batches(stream, &self.schema, &slices)?))
    }
}
