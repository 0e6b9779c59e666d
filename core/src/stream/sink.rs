//! `INSERT INTO stream …`: the rows pushed by a writer of their own, which leaves when the
//! statement ends (it no longer holds the watermark back, see `state.rs`), and a micro-batch
//! cut of what they left waiting.

use std::fmt;
use std::sync::{Arc, Weak};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt;

use super::Catalog;
use super::state::Stream;

/// Pushes an INSERT's rows into a stream.
pub(crate) struct StreamSink {
    pub(crate) stream: Arc<Stream>,
    pub(crate) catalog: Weak<Catalog>,
}

impl fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSink")
            .field("stream", &self.stream.config.name)
            .finish()
    }
}

impl DisplayAs for StreamSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamSink: stream={}", self.stream.config.name)
    }
}

fn gone() -> DataFusionError {
    DataFusionError::Execution("the session of this stream has ended".into())
}

#[async_trait]
impl DataSink for StreamSink {
    fn schema(&self) -> &SchemaRef {
        &self.stream.config.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> DFResult<u64> {
        let catalog = self.catalog.upgrade().ok_or_else(gone)?;
        let writer = self.stream.add_writer();
        let mut rows = 0u64;
        let result = async {
            while let Some(batch) = data.next().await {
                let batch = batch?;
                rows += batch.num_rows() as u64;
                if self.stream.accept(writer, batch)? {
                    catalog.flush(&self.stream).await?;
                }
            }
            catalog.flush(&self.stream).await?;
            Ok::<_, crate::error::SpateError>(())
        }
        .await;
        self.stream.detach_writer(writer);
        result.map_err(DataFusionError::from)?;
        Ok(rows)
    }
}
