//! The CPU half of split-and-retry for a join's probe (`exec/retry.rs`): a probe piece that
//! still runs out of device memory after three splits is joined by DataFusion's own hash join,
//! against the build side downloaded (once per build side and probe partition; DataFusion
//! builds its hash table again for each piece). The output goes up a batch of about the batch
//! size at a time, as the GPU probe's chunks do, each when it is emitted.
//!
//! Only for joins that decide on probe rows alone (inner, right outer, right semi, anti and
//! mark): a piece's output needs nothing from the other pieces. Left, full, left semi, anti
//! and mark joins record on the device which build rows matched, which a CPU join cannot add
//! to, so their piece fails with its out-of-memory error; so does a null-aware anti join's.
//! The CPU join is built afresh each time (`reset_state`): it shares no build side and no
//! dynamic filter with the plan's.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};

use super::probe::ProbeState;
use crate::column::{DeviceBatch, download_batch, upload_batches};
use crate::error::{Result, SpateError};
use crate::exec::cpu_twin;

/// What a probe needs to join a piece on the CPU: the join's CPU twin and the query's context.
pub(super) struct CpuProbe {
    pub(super) twin: Arc<dyn ExecutionPlan>,
    pub(super) context: Arc<datafusion::execution::TaskContext>,
    /// The current build side's rows on the host, once a piece needed them.
    pub(super) build: Option<arrow::array::RecordBatch>,
    /// The rest of a piece's output, still on the host, in batches of about the batch size.
    pub(super) out: std::collections::VecDeque<arrow::array::RecordBatch>,
}

/// Whether a join of `join_type` may probe a piece on the CPU (see the module docs).
pub(super) fn decides_on_probe_rows(join_type: JoinType, null_aware: bool) -> bool {
    !null_aware
        && matches!(
            join_type,
            JoinType::Inner
                | JoinType::Right
                | JoinType::RightSemi
                | JoinType::RightAnti
                | JoinType::RightMark
        )
}

impl ProbeState {
    /// `piece` joined on the CPU, its first output batch uploaded (the rest waits in
    /// [`ProbeState::next_cpu_chunk`]); `None` where the join does not allow it.
    pub(super) fn probe_on_cpu(&mut self, piece: &DeviceBatch) -> Result<Option<DeviceBatch>> {
        if !decides_on_probe_rows(self.join_type, self.null_aware) {
            return Ok(None);
        }
        let build = match &self.cpu.build {
            Some(rows) => rows.clone(),
            None => {
                let rows = download_batch(&self.stream, &self.build()?.batch)?;
                self.cpu.build = Some(rows.clone());
                rows
            }
        };
        let exec = self
            .cpu
            .twin
            .downcast_ref::<HashJoinExec>()
            .ok_or_else(|| SpateError::Internal {
                message: "a GPU hash join whose CPU twin is not a hash join".into(),
            })?;
        let probe = download_batch(&self.stream, piece)?;
        let join = exec
            .builder()
            .with_new_children(vec![
                cpu_twin::rows_input(build, exec.left().schema())?,
                cpu_twin::rows_input(probe, exec.right().schema())?,
            ])?
            .with_partition_mode(PartitionMode::CollectLeft)
            .with_fetch(None)
            .reset_state()
            .recompute_properties()
            .build_exec()?;
        let batches = cpu_twin::run_batches(&join, &self.cpu.context)?;
        self.retry.fell_back();
        let batch_bytes = self.batch_bytes.max(1);
        for batch in batches {
            let rows = batch.num_rows();
            let row_bytes = crate::exec::upload::sliced_bytes(&batch).div_ceil(rows.max(1));
            let step = (batch_bytes / row_bytes.max(1)).max(1);
            for at in (0..rows).step_by(step) {
                self.cpu.out.push_back(batch.slice(at, step.min(rows - at)));
            }
        }
        self.next_cpu_chunk()
    }

    /// The next batch of a piece's output joined on the CPU, uploaded; `None` when none is left.
    pub(super) fn next_cpu_chunk(&mut self) -> Result<Option<DeviceBatch>> {
        let Some(rows) = self.cpu.out.pop_front() else {
            return Ok(None);
        };
        Ok(Some(upload_batches(&self.stream, &self.schema, &[rows])?))
    }

    /// Whether a piece joined on the CPU has output left.
    pub(super) fn has_cpu_chunks(&self) -> bool {
        !self.cpu.out.is_empty()
    }
}
