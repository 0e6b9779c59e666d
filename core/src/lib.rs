//! Spate: an embeddable SQL engine on Apache DataFusion that runs operators on GPUs.
//!
//! ```text
//!            ┌──────────── spate (this crate) ─────────────┐
//!  SQL ───▶  │ Engine ─▶ DataFusion planner ─▶ offload slot │ ─▶ record batches
//!            │            (parse, optimize)    (crate::plan)│
//!            └───────────────┬─────────────────────────────┘
//!                            │ GPU operators (later) use
//!                            ▼
//!                     spate-kernels (CUDA / emulated)
//! ```
//!
//! Today every plan runs on DataFusion's CPU operators; the backend selection, the offload slot
//! and device discovery are in place for the GPU operators. See `docs/ARCHITECTURE.md`.
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

pub mod column;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod exec;
pub mod expr;
pub mod plan;
pub mod source;
pub mod tpch;

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
