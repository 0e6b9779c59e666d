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
//! the same kernels run by a host emulator) supported operators run on the GPU (filters, projections, sorts, aggregations and
//! hash joins) and the rest stay on the CPU; `EXPLAIN` shows which. See `docs/ARCHITECTURE.md`.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use spate::{Backend, Engine};
//! let engine = Engine::builder().backend(Backend::Cpu).build()?;
//! spate::tpch::register_tpch(&engine, 0.001)?;
//! let df = engine.sql("SELECT count(*) AS n FROM nation").await?;
//! let batches = df.collect().await?;
//! assert_eq!(batches[0].num_rows(), 1);
//! # Ok::<(), spate::SpateError>(())
//! # }).unwrap();
//! ```

pub mod cache;
pub mod column;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod exec;
pub mod expr;
pub mod model;
pub mod plan;
pub mod source;
pub mod tpch;

pub use cache::{CacheLocation, CachedTable};
pub use config::Backend;
pub use device::{BackendSelection, GpuInventory};
pub use engine::{Engine, EngineBuilder};
pub use error::{Location, Result, SpateError};
pub use source::FileFormat;

/// Re-exported so that embedders use exactly the DataFusion and Arrow versions Spate is built on.
pub use datafusion;
pub use datafusion::arrow;
/// The kernel runtime: devices, streams, device memory and the primitive kernels.
pub use spate_kernels as kernels;
