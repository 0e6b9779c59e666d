//! `CACHE TABLE` / `UNCACHE TABLE`: tables held in engine memory between queries.
//!
//! On a GPU backend (`cuda`, `emulated`) a cached table's columns live in device memory
//! ([`crate::exec::cache`]): scans hand them to the GPU operators with no host transfer, which
//! is what "hot" means in `spate bench`. On the `cpu` backend the table is read into host
//! memory once (a `MemTable`), so later queries skip the file reads and decoding.
//!
//! Either way the memory is accounted for: device memory is charged to the GPU memory pool
//! (`--gpu-memory-limit`), and host memory is reserved from DataFusion's memory pool
//! (`--memory-limit`) for as long as the table stays cached. A table that does not fit fails
//! to cache with an out-of-memory error and stays as it was.
//!
//! Caching swaps the table's provider for a cached one and remembers the original;
//! `UNCACHE TABLE` puts the original back and frees the memory once no running query holds it.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session};
use datafusion::common::Statistics;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DFResult;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::cache::CachedTableProvider;

/// Where a cached table is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLocation {
    /// Device memory of the session's GPU backend.
    Gpu,
    /// Host memory (the `cpu` backend).
    Host,
}

impl fmt::Display for CacheLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheLocation::Gpu => "gpu",
            CacheLocation::Host => "host",
        })
    }
}

/// A table held in memory by `CACHE TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedTable {
    /// The table's name.
    pub name: String,
    /// Rows cached.
    pub rows: usize,
    /// Memory the cached columns take (device bytes for `Gpu`, Arrow buffer bytes for `Host`).
    pub bytes: usize,
    /// Where they are held.
    pub location: CacheLocation,
    /// With several devices, each device's shard (one entry per device); otherwise empty.
    pub shards: Vec<Shard>,
    /// The columns rows were sharded by (`CACHE TABLE t SHARDED BY (…)`); empty for round
    /// robin.
    pub sharded_by: Vec<String>,
}

/// One device's part of a table cached over several devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// The device's ordinal.
    pub device: usize,
    /// Rows on it.
    pub rows: usize,
    /// Device bytes they take.
    pub bytes: usize,
}

/// A table cached in host memory: a `MemTable` plus the memory reservation that accounts for
/// it, and the provider it replaced.
#[derive(Debug)]
pub struct HostCachedTableProvider {
    table: MemTable,
    original: Arc<dyn TableProvider>,
    /// Held for as long as the provider lives: the cached bytes count against the memory limit.
    _reservation: MemoryReservation,
}

impl HostCachedTableProvider {
    pub(crate) fn new(
        table: MemTable,
        original: Arc<dyn TableProvider>,
        reservation: MemoryReservation,
    ) -> Self {
        HostCachedTableProvider {
            table,
            original,
            _reservation: reservation,
        }
    }
}

#[async_trait]
impl TableProvider for HostCachedTableProvider {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.table.scan(state, projection, filters, limit).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        self.table.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.table.statistics()
    }
}

/// The provider a cached table replaced, when `provider` is a cached table.
pub(crate) fn original_provider(provider: &dyn TableProvider) -> Option<Arc<dyn TableProvider>> {
    if let Some(gpu) = provider.downcast_ref::<CachedTableProvider>() {
        return Some(Arc::clone(gpu.original()));
    }
    provider
        .downcast_ref::<HostCachedTableProvider>()
        .map(|host| Arc::clone(&host.original))
}
