//! Engine errors as Python exceptions.
//!
//! The exception classes live in `spate/errors.py` (so they carry docstrings and can also
//! derive from the matching built-ins, e.g. `OutOfMemoryError` is a `MemoryError`); this module
//! maps each [`SpateError`] to one of them. The same `SpateError::Sql` reads as a
//! `spate.SqlError` when it came from SQL text and as a `spate.PlanError` when it came from a
//! DataFrame operation, because that is where the user has to look for the mistake.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use spate::SpateError;
use spate::datafusion::error::DataFusionError;

/// Where an error was raised, which decides how a planning error reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `Session.sql(...)`: planning errors are `SqlError`s.
    Sql,
    /// A DataFrame operation: planning errors are `PlanError`s.
    Frame,
}

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Raises the exception class `name` from `spate.errors` with `message`. Falls back to
/// `RuntimeError` only if the package itself is broken.
fn raise(py: Python<'_>, name: &str, message: String) -> PyErr {
    let class = ERRORS_MODULE
        .get_or_try_init(py, || py.import("spate.errors").map(Bound::unbind))
        .and_then(|module| module.bind(py).getattr(name));
    match class {
        Ok(class) => match class.call1((message.clone(),)) {
            Ok(exception) => PyErr::from_value(exception),
            Err(e) => e,
        },
        Err(e) => PyRuntimeError::new_err(format!("{message} (and spate.errors failed: {e})")),
    }
}

/// Maps an engine error to its Python exception.
pub(crate) fn to_py(err: SpateError, origin: Origin) -> PyErr {
    Python::attach(|py| {
        let (class, message) = match &err {
            SpateError::Sql { location, .. } => {
                let class = match origin {
                    Origin::Sql => "SqlError",
                    Origin::Frame => "PlanError",
                };
                // The parser already names the position in its message; planning errors don't.
                let text = err.to_string();
                let message = match location {
                    Some(at) if !text.contains("Line:") => format!("{text} (at {at})"),
                    _ => text,
                };
                (class, message)
            }
            SpateError::Unsupported { .. } => ("UnsupportedError", err.to_string()),
            SpateError::ResourcesExhausted { .. } => ("OutOfMemoryError", err.to_string()),
            SpateError::Source { .. } => ("SourceError", err.to_string()),
            SpateError::Config { .. } => ("ConfigError", err.to_string()),
            SpateError::BackendUnavailable { .. } => ("BackendError", err.to_string()),
            SpateError::Internal { .. } => ("InternalError", err.to_string()),
            _ => ("ExecutionError", err.to_string()),
        };
        let exception = raise(py, class, message);
        if let SpateError::Sql {
            location: Some(at), ..
        } = &err
        {
            let value = exception.value(py);
            // Best effort: the location is also in the message.
            let _ = value.setattr("line", at.line);
            let _ = value.setattr("column", at.column);
        }
        exception
    })
}

/// Maps a DataFusion error (from building a DataFrame) to its Python exception.
pub(crate) fn from_datafusion(err: DataFusionError, origin: Origin) -> PyErr {
    to_py(SpateError::from(err), origin)
}

/// A failure that is a bug in Spate: `spate.InternalError`.
pub(crate) fn internal(message: String) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "InternalError",
            format!("internal error (this is a bug, please report it): {message}"),
        )
    })
}

/// Invalid arguments from Python that the engine never saw: `spate.ConfigError` (a
/// `ValueError`).
pub(crate) fn invalid(message: String) -> PyErr {
    Python::attach(|py| raise(py, "ConfigError", message))
}

/// Extension for results carrying engine errors.
pub(crate) trait IntoPyResult<T> {
    /// Converts the error with the given origin.
    fn py(self, origin: Origin) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, SpateError> {
    fn py(self, origin: Origin) -> PyResult<T> {
        self.map_err(|e| to_py(e, origin))
    }
}

impl<T> IntoPyResult<T> for Result<T, DataFusionError> {
    fn py(self, origin: Origin) -> PyResult<T> {
        self.map_err(|e| from_datafusion(e, origin))
    }
}
