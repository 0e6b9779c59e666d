//! Spate: an embeddable SQL engine on Apache DataFusion that runs operators on GPUs.
//!
//! ```text
//!            ┌──────────────────── spate (this crate) ─────────────────────┐
//!  SQL ───▶  │ Engine ─▶ DataFusion planner ─▶ GpuOffloadRule (crate::plan) │ ─▶ record batches
//!            │            (parse, optimize)      swaps in GPU operators    │
//!            │ GPU operators (crate::exec) ◀─ expression JIT (crate::expr) │
//!            │   device batches (crate::column) ◀─▶ Arrow at the edges     │
//!            └──────────────────────────────┬──────────────────────────────┘
//!                                           ▼
//!                           spate-kernels (CUDA / emulated)
//! ```
//!
//! With the `cpu` backend every plan runs on DataFusion's operators. With `cuda` (or `emulated`,
//! the same kernels run by a host emulator) supported operators run on the GPU (filters,
//! projections, sorts, aggregations, joins, limits, unions and window functions) and the rest
//! stay on the CPU; `EXPLAIN` shows which. See `docs/ARCHITECTURE.md`.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use spate::{Backend, Engine};
//! let engine = Engine::builder().backend(Backend::Cpu).build()?;
//! let df = engine
//!     .sql("SELECT count(*) AS n FROM (VALUES (1), (2), (3)) AS t(x) WHERE x > 1")
//!     .await?;
//! let batches = df.collect().await?;
//! assert_eq!(batches[0].num_rows(), 1);
//! # Ok::<(), spate::SpateError>(())
//! # }).unwrap();
//! ```
//!
//! The crate exposes the embedding API: the [`Engine`] and its settings, errors, cached tables,
//! [`placement`] (where each operator of a plan runs, and why), the [`GpuOffloadRule`] for
//! applications that assemble their own DataFusion session, and the kernel runtime
//! ([`kernels`]). The operators, the expression JIT and the device columns are internal. With
//! the `tpch` feature, [`tpch`] generates TPC-H data.

mod cache;
mod column;
mod config;
mod device;
mod engine;
mod error;
mod exec;
mod expr;
mod model;
mod plan;
mod rewrite;
mod source;
mod stream;
#[cfg(feature = "tpch")]
pub mod tpch;
pub mod vector;

pub use cache::{CacheLocation, CachedTable, Shard};
pub use config::{Backend, Devices, SpateOptions, parse_byte_size};
pub use device::{BackendSelection, CompileStats, GpuInventory};
pub use engine::{Engine, EngineBuilder, scheduler_address};
pub use error::{Location, Result, SpateError};
pub use model::ModelInputs;
pub use plan::GpuOffloadRule;
pub use source::FileFormat;
pub use stream::view::SUBSCRIPTION_QUEUE;
pub use stream::{
    CheckpointStream, Emit, Feed, FolderTail, StreamInfo, StreamWriter, Subscription,
    WindowFunctionKind, WindowTableFunction,
};

/// Where each operator of a physical plan runs: on the GPU, or on the CPU with the reason.
pub mod placement {
    pub use crate::plan::offload::{Placement, annotate, placement};
}

/// The names of the metrics GPU operators report, beyond DataFusion's.
pub mod metrics {
    pub use crate::exec::exchange::{EXCHANGE_BYTES, EXCHANGE_LOCAL_BYTES};
    pub use crate::exec::{
        CACHE_RELOADS, CPU_FALLBACKS, DEV_READ_BYTES, DEV_WRITE_BYTES, DISK_SPILLED_BYTES,
        EVICTED_BYTES, OOM_SPLITS, UPLOAD_COPY_TIME, UPLOAD_WAIT_TIME,
    };
}

/// Re-exported so that embedders use exactly the DataFusion and Arrow versions Spate is built on.
pub use datafusion;
pub use datafusion::arrow;
/// The kernel runtime: devices, streams, device memory and the primitive kernels.
pub use spate_kernels as kernels;
