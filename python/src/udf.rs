//! Python functions as DataFusion scalar functions, for `Column.map` / `apply` and
//! `DataFrame.apply`: the plan calls `callable(list_of_pyarrow_arrays)` once per batch, on the
//! CPU, holding the GIL for the call only, and expects one pyarrow array of `return_type` and
//! of the batch's length back.
//!
//! The GPU offload does not know these functions, so the operator that computes them stays
//! on the CPU, and `EXPLAIN` says why.

use std::hash::{Hash, Hasher};

use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use pyo3::prelude::*;
use pyo3::types::PyList;
use spate::arrow::array::{ArrayData, make_array};
use spate::arrow::datatypes::DataType;
use spate::datafusion::error::{DataFusionError, Result as DFResult};
use spate::datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// A Python callable over Arrow batches.
#[derive(Debug)]
pub(crate) struct PythonFunction {
    name: String,
    callable: Py<PyAny>,
    return_type: DataType,
    signature: Signature,
}

impl PythonFunction {
    pub(crate) fn new(name: String, callable: Py<PyAny>, return_type: DataType) -> Self {
        PythonFunction {
            name,
            callable,
            return_type,
            // Volatile: the optimiser must neither fold nor deduplicate calls of user code.
            signature: Signature::variadic_any(Volatility::Volatile),
        }
    }
}

impl PartialEq for PythonFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.callable.as_ptr() == other.callable.as_ptr()
            && self.return_type == other.return_type
    }
}

impl Eq for PythonFunction {}

impl Hash for PythonFunction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        (self.callable.as_ptr() as usize).hash(state);
        self.return_type.hash(state);
    }
}

fn python_error(name: &str, err: PyErr) -> DataFusionError {
    DataFusionError::Execution(format!("the Python function {name} failed: {err}"))
}

impl ScalarUDFImpl for PythonFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DFResult<DataType> {
        Ok(self.return_type.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let data = Python::attach(|py| -> PyResult<ArrayData> {
            let inputs = arrays
                .iter()
                .map(|a| a.to_data().to_pyarrow(py))
                .collect::<PyResult<Vec<_>>>()?;
            let list = PyList::new(py, inputs)?;
            let result = self.callable.call1(py, (list,))?;
            ArrayData::from_pyarrow_bound(result.bind(py))
        })
        .map_err(|e| python_error(&self.name, e))?;
        let array = make_array(data);
        if array.len() != rows {
            return Err(DataFusionError::Execution(format!(
                "the Python function {} returned {} values for {rows} rows",
                self.name,
                array.len()
            )));
        }
        if array.data_type() != &self.return_type {
            return Err(DataFusionError::Execution(format!(
                "the Python function {} returned {} values, not the declared {}",
                self.name,
                array.data_type(),
                self.return_type
            )));
        }
        Ok(ColumnarValue::Array(array))
    }
}
