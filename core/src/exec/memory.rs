//! How GPU operators fit a device memory budget: the budget of a query, the batch size and the
//! state an operator may hold derived from it.
//!
//! A query's budget is the device pool's (`--gpu-memory-limit`, `EngineBuilder::gpu_memory_limit`),
//! lowered by `SET spate.gpu.memory_limit` when that is set. Operators size what they hold as
//! shares of it:
//! - device batches are coalesced or merged to at most [`BATCH_SHARE`]th of it;
//! - an operator that accumulates state (an aggregation's groups) keeps at most a
//!   [`STATE_SHARE`]th of it on the device before it spills to the host.

use datafusion::common::config::ConfigOptions;

use crate::config::SpateOptions;
use crate::device::GpuContext;

/// Device batches are at most this fraction of the query's budget.
pub(crate) const BATCH_SHARE: usize = 32;

/// The smallest batch target, whatever the budget: smaller batches cost launches, not memory.
pub(crate) const MIN_BATCH_BYTES: usize = 16 << 10;

/// An operator's accumulated state is at most this fraction of the query's budget before it
/// spills to the host.
pub(crate) const STATE_SHARE: usize = 4;

/// Device bytes a hash table over `n` rows takes beside the rows themselves, per row: the row
/// hashes, the open-addressing table and its scan (two to four slots per row), and the group
/// numbering (`exec::hash_table::build_table`). Operators that build one over what they hold
/// (a join's build side, an aggregation's collected input) count it against their share.
pub(crate) const TABLE_BYTES_PER_ROW: usize = 64;

/// The device bytes an operator holding `batch` will need once it builds a hash table over it.
pub(crate) fn with_table(batch: &crate::column::DeviceBatch) -> usize {
    batch.device_bytes() + batch.bound() * TABLE_BYTES_PER_ROW
}

/// The device bytes one query may use: the device's budget, or `spate.gpu.memory_limit` when
/// that is set and smaller.
pub(crate) fn query_budget(gpu: &GpuContext, options: &ConfigOptions) -> usize {
    let device = gpu.device().memory_stats().budget_bytes;
    match SpateOptions::gpu_memory_limit(options) {
        Some(limit) => limit.min(device),
        None => device,
    }
}

/// The device bytes an operator's accumulated state may take before it spills.
pub(crate) fn state_limit(gpu: &GpuContext, options: &ConfigOptions) -> usize {
    (query_budget(gpu, options) / STATE_SHARE).max(MIN_BATCH_BYTES)
}

/// Whether an operator holding state that will take `needed` device bytes (with the tables it
/// builds over it) should spill: past its share of the budget (`limit`), or past what the
/// device has free now, which other operators' state may have taken.
pub(crate) fn should_spill(needed: usize, limit: usize, device: &spate_kernels::Device) -> bool {
    needed > limit || needed > device.memory_stats().free_bytes()
}
