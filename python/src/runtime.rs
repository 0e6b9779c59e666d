//! Running engine futures from Python: one shared tokio runtime, the GIL released while a query
//! runs, and Ctrl-C honoured.
//!
//! Contract: [`wait`] never blocks the interpreter for longer than [`SIGNAL_POLL`] without
//! checking for signals. When a signal handler raises (Ctrl-C raises `KeyboardInterrupt`), the
//! query task is aborted and the exception propagates; the task stops at its next yield point
//! (DataFusion's scans yield cooperatively), so an interrupted query does not keep running.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::errors;

/// How often a waiting query checks for Python signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The process-wide runtime all sessions run their queries on, one worker per core.
fn runtime() -> PyResult<&'static Runtime> {
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .thread_name("spate-worker")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("could not start Spate's runtime: {e}")))
}

/// Runs `future` to completion with the GIL released and returns its output. A pending Python
/// signal (Ctrl-C) aborts the future and raises.
pub(crate) fn wait<F, T>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = runtime()?;
    let mut handle = runtime.spawn(future);
    loop {
        let polled = py.detach(|| {
            runtime.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut handle).await })
        });
        match polled {
            Ok(Ok(output)) => return Ok(output),
            Ok(Err(join_error)) => {
                return Err(errors::internal(format!(
                    "the query task failed: {join_error}"
                )));
            }
            Err(_still_running) => {
                if let Err(signal) = py.check_signals() {
                    handle.abort();
                    return Err(signal);
                }
            }
        }
    }
}
