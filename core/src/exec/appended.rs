//! Columns computed from a batch's own and appended to it: sort keys and window keys that are
//! expressions. The operator works on the widened batch and leaves them out of its output.

use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::physical_expr::PhysicalExpr;
use spate_kernels::{Kernel, Stream as DeviceStream};

use crate::column::DeviceBatch;
use crate::error::Result;
use crate::expr::{Unsupported, ValueKernel, evaluate_values, value_kernel};

/// Expressions computed by one value kernel into columns appended to each input batch.
#[derive(Debug)]
pub(crate) struct Appended {
    values: ValueKernel,
    /// The input's schema with the computed columns after its own.
    wide: SchemaRef,
}

impl Appended {
    /// `exprs` over rows of `input`, appended as columns named `<prefix><k>`; `None` when there
    /// are none.
    pub(crate) fn new(
        exprs: &[&dyn PhysicalExpr],
        input: &Schema,
        prefix: &str,
    ) -> std::result::Result<Option<Self>, Unsupported> {
        if exprs.is_empty() {
            return Ok(None);
        }
        let values = value_kernel(exprs, input)?;
        let mut fields = input.fields().to_vec();
        for (k, data_type) in values.outputs.iter().enumerate() {
            fields.push(Arc::new(Field::new(
                format!("{prefix}{k}"),
                data_type.clone(),
                true,
            )));
        }
        Ok(Some(Appended {
            values,
            wide: Arc::new(Schema::new(fields)),
        }))
    }

    /// The schema of the widened batches.
    pub(crate) fn wide(&self) -> &SchemaRef {
        &self.wide
    }

    /// The value kernel, compiled (once per session).
    pub(crate) fn kernel(&self, gpu: &crate::device::GpuContext) -> Result<Kernel> {
        gpu.generated_kernel(&self.values.source, &self.values.entry)
    }

    /// `batch` with the computed columns appended; `kernel` is [`Appended::kernel`]'s.
    pub(crate) fn append(
        &self,
        stream: &DeviceStream,
        kernel: &Kernel,
        batch: DeviceBatch,
    ) -> Result<DeviceBatch> {
        let mut columns = batch.columns().to_vec();
        columns.extend(evaluate_values(stream, kernel, &self.values, &batch)?);
        DeviceBatch::try_new_counted(Arc::clone(&self.wide), columns, batch.row_count().clone())
    }
}
