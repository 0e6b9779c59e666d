//! Spate's error type: user mistakes kept apart from internal failures.
//!
//! Every DataFusion error that reaches a Spate API is classified here, once, so that the shell,
//! the Python bindings and embedders all show the same message. User errors read like advice;
//! internal errors say they are bugs.

use std::fmt;

use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;

/// A position in SQL text, 1-based, as DataFusion's parser and planner report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// 1-based line number.
    pub line: u64,
    /// 1-based column number.
    pub column: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Errors from the Spate engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpateError {
    /// The SQL could not be parsed or planned: a syntax error, an unknown table or column, a type
    /// mismatch.
    #[error("{message}")]
    Sql {
        /// What was wrong, as DataFusion described it.
        message: String,
        /// Where in the statement, when known.
        location: Option<Location>,
    },
    /// Valid SQL that this engine does not support.
    #[error("unsupported: {message}")]
    Unsupported {
        /// What is unsupported.
        message: String,
    },
    /// A file or folder could not be registered or read: missing, unreadable, corrupt, or of an
    /// unknown format.
    #[error("{path}: {message}")]
    Source {
        /// The path as the user gave it.
        path: String,
        /// What went wrong and what to do about it.
        message: String,
    },
    /// A setting had an invalid value.
    #[error("invalid setting: {message}")]
    Config {
        /// What was wrong with which setting.
        message: String,
    },
    /// The requested execution backend cannot run on this machine or build.
    #[error("backend '{backend}' is not available: {reason}")]
    BackendUnavailable {
        /// The backend that was asked for.
        backend: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The query needed more memory than its limit allows.
    #[error(
        "out of memory: {message}\nhint: raise the memory limit (in the shell `--memory-limit` \
         for host memory, `--gpu-memory-limit` for GPU memory)"
    )]
    ResourcesExhausted {
        /// DataFusion's description, including which operator ran out.
        message: String,
    },
    /// The query failed while running, e.g. on bad data or an overflow.
    #[error("{message}")]
    Execution {
        /// What failed.
        message: String,
    },
    /// A failure that should never happen. It is a bug in Spate or DataFusion.
    #[error("internal error (this is a bug, please report it): {message}")]
    Internal {
        /// Enough context to reproduce.
        message: String,
    },
}

/// Result alias for Spate APIs.
pub type Result<T, E = SpateError> = std::result::Result<T, E>;

impl SpateError {
    /// True for errors caused by the user's input or environment (bad SQL, missing files, bad
    /// settings), false for internal failures.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, SpateError::Internal { .. })
    }

    /// The location in the SQL text the error refers to, when known.
    pub fn location(&self) -> Option<Location> {
        match self {
            SpateError::Sql { location, .. } => *location,
            _ => None,
        }
    }

    /// Wraps a DataFusion error raised while reading `path`, naming the file.
    pub(crate) fn source_read(path: &str, err: DataFusionError) -> Self {
        match SpateError::from(err) {
            SpateError::Internal { message } => SpateError::Internal { message },
            other => SpateError::Source {
                path: path.to_string(),
                message: format!("could not be read: {other}"),
            },
        }
    }
}

impl From<DataFusionError> for SpateError {
    fn from(err: DataFusionError) -> Self {
        classify(err, None)
    }
}

impl From<SpateError> for DataFusionError {
    fn from(err: SpateError) -> Self {
        match err {
            SpateError::Internal { message } => DataFusionError::Internal(message),
            SpateError::Unsupported { message } => DataFusionError::NotImplemented(message),
            SpateError::ResourcesExhausted { message } => {
                DataFusionError::ResourcesExhausted(message)
            }
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

impl From<arrow::error::ArrowError> for SpateError {
    fn from(err: arrow::error::ArrowError) -> Self {
        SpateError::from(DataFusionError::ArrowError(Box::new(err), None))
    }
}

impl From<spate_kernels::KernelError> for SpateError {
    fn from(err: spate_kernels::KernelError) -> Self {
        match err {
            spate_kernels::KernelError::NoDevice { reason } => SpateError::BackendUnavailable {
                backend: "cuda".to_string(),
                reason,
            },
            e @ spate_kernels::KernelError::OutOfMemory { .. } => SpateError::ResourcesExhausted {
                message: e.to_string(),
            },
            e @ spate_kernels::KernelError::OutputTooLarge { .. } => SpateError::Unsupported {
                message: format!("{OUTPUT_TOO_LARGE}: {e}; lower spate.gpu.batch_bytes"),
            },
            // A launcher refusing its arguments, or a broken runtime invariant, is our bug.
            e @ (spate_kernels::KernelError::Internal { .. }
            | spate_kernels::KernelError::InvalidArgument { .. }) => SpateError::Internal {
                message: e.to_string(),
            },
            other => SpateError::Execution {
                message: other.to_string(),
            },
        }
    }
}

/// How an `Unsupported` error from a result too large for one batch begins: operators that can
/// split their output catch it ([`SpateError::is_output_too_large`]) and cut the batch again.
const OUTPUT_TOO_LARGE: &str = "a GPU batch too large for its string offsets";

impl SpateError {
    /// True for a device batch whose strings outgrew 32-bit offsets; smaller pieces may fit.
    pub fn is_output_too_large(&self) -> bool {
        matches!(self, SpateError::Unsupported { message } if message.starts_with(OUTPUT_TOO_LARGE))
    }
}

/// Maps a DataFusion error to a Spate error, unwrapping the wrappers DataFusion adds (context,
/// diagnostics, shared errors) and keeping the most precise location found on the way.
/// What a remote session's scheduler cannot be sent (Ballista's logical plan codec has no way
/// to encode an in-memory table), said so.
const REMOTE_IN_MEMORY: &str = "LogicalExtensionCodec is not provided";

/// How a remote session's transport (tonic) describes a connection that failed.
const REMOTE_UNREACHABLE: &str = "tonic::transport::Error";

fn classify(err: DataFusionError, location: Option<Location>) -> SpateError {
    let text = err.to_string();
    if text.contains(REMOTE_UNREACHABLE) {
        return SpateError::Execution {
            message: format!(
                "cannot reach the Ballista scheduler or one of its executors (is `spate \
                 scheduler` running at the --remote address?): {}",
                strip_trailing_backtrace(&text)
            ),
        };
    }
    if text.contains(REMOTE_IN_MEMORY) {
        return SpateError::Unsupported {
            message: "a remote session sends its queries to a Ballista scheduler, whose \
                      executors read the tables' files: a table held in this process's \
                      memory (CREATE TABLE AS, a table from Python or Arrow objects) cannot \
                      be sent; register files (--table, register_parquet) instead"
                .into(),
        };
    }
    match err {
        DataFusionError::Diagnostic(diagnostic, inner) => {
            let location = location.or_else(|| {
                // sqlparser uses line 0 for empty spans.
                diagnostic
                    .span
                    .filter(|span| span.start.line > 0)
                    .map(|span| Location {
                        line: span.start.line,
                        column: span.start.column,
                    })
            });
            classify(*inner, location)
        }
        DataFusionError::Context(context, inner) => match classify(*inner, location) {
            SpateError::Sql { message, location } => SpateError::Sql {
                message: format!("{context}: {message}"),
                location,
            },
            SpateError::Execution { message } => SpateError::Execution {
                message: format!("{context}: {message}"),
            },
            other => other,
        },
        DataFusionError::Shared(shared) => match std::sync::Arc::try_unwrap(shared) {
            Ok(inner) => classify(inner, location),
            Err(shared) => classify_ref(&shared, location),
        },
        DataFusionError::Collection(errors) => match errors.into_iter().next() {
            Some(first) => classify(first, location),
            None => SpateError::Internal {
                message: "empty error collection".to_string(),
            },
        },
        DataFusionError::External(ext) => match ext.downcast::<SpateError>() {
            Ok(spate) => *spate,
            Err(ext) => match ext.downcast::<DataFusionError>() {
                Ok(df) => classify(*df, location),
                Err(ext) => SpateError::Execution {
                    message: ext.to_string(),
                },
            },
        },
        DataFusionError::SQL(parser, _) => parser_error(&parser, location),
        other => classify_ref(&other, location),
    }
}

/// Classification for the variants that carry no wrapped error.
fn classify_ref(err: &DataFusionError, location: Option<Location>) -> SpateError {
    match err {
        DataFusionError::SQL(parser, _) => parser_error(parser, location),
        DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => SpateError::Sql {
            message: err.strip_backtrace(),
            location,
        },
        DataFusionError::NotImplemented(msg) => SpateError::Unsupported {
            message: strip_trailing_backtrace(msg),
        },
        DataFusionError::Configuration(msg) => SpateError::Config {
            message: strip_trailing_backtrace(msg),
        },
        DataFusionError::ResourcesExhausted(msg) => SpateError::ResourcesExhausted {
            message: strip_trailing_backtrace(msg),
        },
        DataFusionError::Internal(msg) => SpateError::Internal {
            message: strip_trailing_backtrace(msg),
        },
        DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => {
            classify_ref(inner, location)
        }
        DataFusionError::Shared(inner) => classify_ref(inner, location),
        _ => SpateError::Execution {
            message: err.strip_backtrace(),
        },
    }
}

fn parser_error(err: &ParserError, location: Option<Location>) -> SpateError {
    let text = match err {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s.clone(),
        ParserError::RecursionLimitExceeded => "the statement is nested too deeply".to_string(),
    };
    let location = location.or_else(|| location_in_message(&text));
    SpateError::Sql {
        message: format!("syntax error: {text}"),
        location,
    }
}

/// sqlparser appends "at Line: L, Column: C" to its messages; recover the position from there.
fn location_in_message(text: &str) -> Option<Location> {
    let at = text.rfind("Line: ")?;
    let rest = &text[at + "Line: ".len()..];
    let (line, rest) = rest.split_once(", Column: ")?;
    let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some(Location {
        line: line.trim().parse().ok()?,
        column: column.parse().ok()?,
    })
}

fn strip_trailing_backtrace(msg: &str) -> String {
    match msg.split_once("\n\nbacktrace:") {
        Some((head, _)) => head.to_string(),
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_errors_are_user_errors_with_a_location() {
        let err = DataFusionError::SQL(
            Box::new(ParserError::ParserError(
                "Expected: an SQL statement, found: SELEC at Line: 2, Column: 7".into(),
            )),
            None,
        );
        let err = SpateError::from(err);
        assert!(err.is_user_error());
        assert_eq!(err.location(), Some(Location { line: 2, column: 7 }));
        assert!(err.to_string().starts_with("syntax error: Expected"));
    }

    #[test]
    fn internal_errors_say_they_are_bugs() {
        let err = SpateError::from(DataFusionError::Internal("bad state".into()));
        assert!(!err.is_user_error());
        assert!(err.to_string().contains("this is a bug"));
    }

    #[test]
    fn context_is_kept_and_wrappers_are_removed() {
        let inner = DataFusionError::Plan("table 'x' not found".into());
        let err = SpateError::from(inner.context("while planning"));
        match err {
            SpateError::Sql { message, .. } => {
                assert!(message.starts_with("while planning: "), "{message}");
                assert!(message.contains("table 'x' not found"));
            }
            other => panic!("expected a SQL error, got {other:?}"),
        }
    }

    #[test]
    fn spate_errors_survive_a_round_trip_through_datafusion() {
        let err = SpateError::Source {
            path: "x.parquet".into(),
            message: "missing".into(),
        };
        let back = SpateError::from(DataFusionError::from(err));
        assert!(matches!(back, SpateError::Source { .. }));
    }

    #[test]
    fn resource_errors_are_classified() {
        let err = SpateError::from(DataFusionError::ResourcesExhausted("sort".into()));
        assert!(matches!(err, SpateError::ResourcesExhausted { .. }));
    }

    #[test]
    fn location_parsing_tolerates_missing_parts() {
        assert_eq!(location_in_message("no location here"), None);
        assert_eq!(location_in_message("at Line: x, Column: 3"), None);
        assert_eq!(
            location_in_message("found: ) at Line: 1, Column: 15"),
            Some(Location {
                line: 1,
                column: 15
            })
        );
    }
}
