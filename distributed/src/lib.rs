//! Spate on many machines, on Apache Ballista 55 (the Ballista line of Spate's DataFusion).
//!
//! - [`start_scheduler`]: a Ballista scheduler (`spate scheduler`). It plans each query with
//!   DataFusion's rules, splits the plan into stages at its exchanges, and hands the stages'
//!   tasks to the executors that poll it. Its plans are plain DataFusion plans.
//! - [`start_executor`]: an executor (`spate executor`) whose tasks run on a Spate engine: each
//!   stage plan it receives is placed on the engine's GPU by the same offload rule a local query
//!   gets (`GpuStages`), keeping the stage's partitions, since each task runs one of them. Its
//!   operators then run as GPU operators, each task on one of the executor's devices in turn.
//! - The clients connect with `spate::EngineBuilder::remote` (`spate --remote df://host:port`).
//!
//! Why the executor applies the rule rather than a codec carrying `Gpu*Exec` nodes: the
//! scheduler (and its adaptive planner) then handles only DataFusion's own nodes, the wire
//! format is Ballista's unchanged, and an executor decides on its own GPU, so executors with
//! different backends, devices or memory serve one scheduler.
//!
//! The shuffle between stages is Ballista's own: each task writes its output partitions as
//! Arrow IPC files in the executor's work folder, and the next stage's tasks read them locally
//! or over Arrow Flight. Within a task the data stays on the executor's devices.

mod engine;
mod executor;
mod scheduler;

pub use executor::{Executor, ExecutorOptions, start_executor};
pub use scheduler::{Scheduler, SchedulerOptions, start_scheduler};

/// A failure starting or talking to a scheduler or executor, as a Spate error.
pub(crate) fn failed(what: &str, error: impl std::fmt::Display) -> spate::SpateError {
    spate::SpateError::Execution {
        message: format!("{what}: {error}"),
    }
}
