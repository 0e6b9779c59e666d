//! `spate._spate`, the native half of the `spate` Python package.
//!
//! ```text
//!  spate (python/spate)                    spate._spate (this crate)
//!  Session, DataFrame, Column, GroupBy ──▶ Session ─▶ spate::Engine (DataFusion + GPU offload)
//!  pandas semantics, pyarrow conversion    Frame   ─▶ datafusion::DataFrame (lazy plan)
//!  exception classes (spate.errors)  ◀──   Expr    ─▶ datafusion::logical_expr::Expr
//!                                          Arrow C stream / C array capsules in and out
//! ```
//!
//! Contract: no call panics into Python; engine errors become `spate.Error` subclasses; every
//! call that runs a query releases the GIL and can be interrupted with Ctrl-C.

mod errors;
mod expr;
mod frame;
mod interchange;
mod runtime;
mod session;
mod stream;
mod udf;
mod window;

use pyo3::prelude::*;

/// One GPU as `devices()` reports it: (ordinal, name, architecture, total bytes, free bytes).
type DeviceRow = (usize, String, String, usize, Option<usize>);

/// The GPUs on this machine, and why there are none when the list is empty.
#[pyfunction]
fn devices(py: Python<'_>) -> (Vec<DeviceRow>, Option<String>) {
    let inventory = py.detach(spate::GpuInventory::discover);
    let devices = inventory
        .devices
        .iter()
        .map(|d| {
            (
                d.ordinal,
                d.name.clone(),
                d.arch(),
                d.total_memory_bytes,
                d.free_memory_bytes,
            )
        })
        .collect();
    (devices, inventory.absent_reason)
}

#[pymodule]
fn _spate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<session::PySession>()?;
    m.add_class::<frame::PyFrame>()?;
    m.add_class::<expr::PyExpr>()?;
    m.add_class::<stream::PyStreamWriter>()?;
    m.add_class::<stream::PySubscription>()?;
    m.add_class::<stream::PyFolderTail>()?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    Ok(())
}
