//! Arrow data across the Python boundary without copies: the Arrow C stream and C array
//! interfaces (PyCapsules) in, and an Arrow C stream capsule out.
//!
//! Imported buffers stay owned by their producer (pyarrow, Polars, pandas) through the release
//! callbacks of the C interface; Spate slices them, never copies them. Exported batches are
//! moved to the consumer the same way.

use std::collections::HashMap;

use arrow_pyarrow::FromPyArrow;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use spate::arrow::datatypes::{Schema, SchemaRef};
use spate::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use spate::arrow::record_batch::RecordBatchReader;
use spate::arrow::record_batch::{RecordBatch, RecordBatchIterator, RecordBatchOptions};

use crate::errors::{IntoPyResult, Origin};

/// Schema metadata that describes the producer's own representation (pandas' index and dtypes)
/// and would be wrong for anything computed from the data, so it is dropped on import.
const PRODUCER_METADATA: &[&str] = &["pandas"];

/// Reads every batch of an object exporting the Arrow C stream interface (`pyarrow.Table`,
/// `pyarrow.RecordBatchReader`, a Polars or pandas DataFrame) or the C array interface (a
/// `pyarrow.RecordBatch`).
pub(crate) fn import(object: &Bound<'_, PyAny>) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    let (schema, batches) = if object.hasattr("__arrow_c_stream__")? {
        let reader = ArrowArrayStreamReader::from_pyarrow_bound(object)?;
        let schema = reader.schema();
        let batches = reader
            .collect::<Result<Vec<_>, _>>()
            .map_err(spate::SpateError::from)
            .py(Origin::Frame)?;
        (schema, batches)
    } else if object.hasattr("__arrow_c_array__")? {
        let batch = RecordBatch::from_pyarrow_bound(object)?;
        (batch.schema(), vec![batch])
    } else {
        let type_name = object.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "expected Arrow data (an object with __arrow_c_stream__ or __arrow_c_array__, such \
             as a pyarrow.Table, a Polars DataFrame or a pandas DataFrame), got {type_name}"
        )));
    };
    strip_producer_metadata(schema, batches)
}

fn strip_producer_metadata(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    if !PRODUCER_METADATA
        .iter()
        .any(|key| schema.metadata().contains_key(*key))
    {
        return Ok((schema, batches));
    }
    let metadata: HashMap<String, String> = schema
        .metadata()
        .iter()
        .filter(|(key, _)| !PRODUCER_METADATA.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let schema = SchemaRef::new(Schema::new_with_metadata(schema.fields().clone(), metadata));
    let batches = batches
        .into_iter()
        .map(|b| {
            let options = RecordBatchOptions::new().with_row_count(Some(b.num_rows()));
            RecordBatch::try_new_with_options(
                SchemaRef::clone(&schema),
                b.columns().to_vec(),
                &options,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(spate::SpateError::from)
        .py(Origin::Frame)?;
    Ok((schema, batches))
}

/// Wraps batches in an `arrow_array_stream` PyCapsule, the value of `__arrow_c_stream__`.
/// The consumer moves the stream out; the capsule's destructor releases it otherwise.
pub(crate) fn export<'py>(
    py: Python<'py>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    let stream = FFI_ArrowArrayStream::new(Box::new(reader));
    PyCapsule::new_with_value_and_destructor(py, stream, c"arrow_array_stream", |stream, _| {
        drop(stream)
    })
}
