//! The metrics of batches whose row count stayed on the device.
//!
//! An operator counts the rows it outputs (`output_rows`) and the bytes of the batches it
//! makes and takes (`dev_write_bytes`, `dev_read_bytes`, the roofline's). A batch whose count
//! is on the device (`RowCount::Device`) cannot be counted as it passes: the host does not
//! know how many of its `bound` rows are rows, and the kernels touch only those. Counting the
//! bound would charge the roofline for rows nobody wrote. So the metric waits on the count
//! word ([`DeviceCount::when_counted`]) and is paid when the count is first read back, by
//! whichever operator needs it (a sort, a build, a download).
//!
//! Some counts may never be read back during the query: a consumer that stops at the count
//! needs no number (the fused projection's kernel, and a join probe once batches reach it
//! with their counts on the device). Each operator keeps the words its metrics wait on in a
//! [`Settlement`], and reads the ones still unread when its metrics are read
//! (`ExecutionPlan::metrics`, which `EXPLAIN ANALYZE` and `spate bench` call once the query
//! has run): one readback of all of them, after the query and outside every operator's
//! counts, so the data path pays nothing for its own accounting. (Nothing in Spate reads a
//! GPU operator's metrics while it runs; a caller that did would wait for its stream.)

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use datafusion::physical_plan::metrics::{
    Count, CustomMetricValue, ExecutionPlanMetricsSet, MetricBuilder, MetricValue,
};
use spate_kernels::Stream as DeviceStream;

use crate::column::{DeviceBatch, DeviceCount, RowBytes, RowCount, WeakCount};

/// The custom metric holding an operator partition's settlement.
const NAME: &str = "counted_on_device";

/// Registers settlements: two handles of one partition must find the same one.
static REGISTER: Mutex<()> = Mutex::new(());

/// The count words an operator's metrics wait on, in one partition. Registered in the
/// operator's metrics (as `counted_on_device`, the batches counted on the device) when the
/// first device count comes, so that operators that never see one show nothing.
#[derive(Debug, Clone)]
pub(crate) struct Settlement {
    home: ExecutionPlanMetricsSet,
    partition: usize,
    registered: OnceLock<Registered>,
}

/// A registered settlement: the metric's value.
#[derive(Debug, Clone, Default)]
struct Registered(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// The words not read yet, with the stream that wrote each.
    waiting: Mutex<Vec<(DeviceCount, Arc<DeviceStream>)>>,
    /// Batches whose count was on the device when they were counted (made or taken).
    batches: Mutex<usize>,
    /// The word counted last, not kept alive: a device buffer keeps its stream's resources.
    last: Mutex<Option<WeakCount>>,
}

impl Settlement {
    /// The settlement of `metrics`' `partition`.
    pub(crate) fn of(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Settlement {
        Settlement {
            home: metrics.clone(),
            partition,
            registered: OnceLock::new(),
        }
    }

    fn registered(&self) -> &Registered {
        self.registered.get_or_init(|| {
            let _once = lock(&REGISTER);
            let existing = self.home.clone_inner().iter().find_map(|m| {
                if m.partition() != Some(self.partition) {
                    return None;
                }
                match m.value() {
                    MetricValue::Custom { name, value } if name == NAME => {
                        value.as_any().downcast_ref::<Registered>().cloned()
                    }
                    _ => None,
                }
            });
            existing.unwrap_or_else(|| {
                let registered = Registered::default();
                MetricBuilder::new(&self.home)
                    .with_partition(self.partition)
                    .build(MetricValue::Custom {
                        name: NAME.into(),
                        value: Arc::new(registered.clone()),
                    });
                registered
            })
        })
    }

    /// Adds `batch`'s device bytes to `metric`: now, or once its count is read back.
    pub(crate) fn count_bytes(
        &self,
        batch: &DeviceBatch,
        metric: &Count,
        stream: &Arc<DeviceStream>,
    ) {
        match batch.row_count() {
            RowCount::Host(_) => metric.add(batch.device_bytes()),
            RowCount::Device { word, .. } => self.wait_on(word, metric, batch.row_bytes(), stream),
        }
    }

    /// Adds the count of `word` to `metric` once it is read back.
    pub(crate) fn count_rows(
        &self,
        word: &DeviceCount,
        metric: &Count,
        stream: &Arc<DeviceStream>,
    ) {
        self.wait_on(word, metric, RowBytes::ROWS, stream);
    }

    fn wait_on(
        &self,
        word: &DeviceCount,
        metric: &Count,
        amount: RowBytes,
        stream: &Arc<DeviceStream>,
    ) {
        word.when_counted(metric.clone(), amount);
        let inner = &self.registered().0;
        // A batch's metrics (its rows, its bytes) wait on one word, one after the other: one
        // batch.
        let mut last = lock(&inner.last);
        if last.as_ref().is_some_and(|w| w.is(word)) {
            return;
        }
        *last = Some(word.weak());
        *lock(&inner.batches) += 1;
        let mut waiting = lock(&inner.waiting);
        // Words read back since need no settling: the list holds only unread ones.
        waiting.retain(|(w, _)| w.known().is_none());
        if word.known().is_none() {
            waiting.push((word.clone(), Arc::clone(stream)));
        }
    }
}

impl Registered {
    /// Reads the words nothing read back yet, so that the metrics waiting on them are paid.
    fn settle(&self) {
        let waiting = std::mem::take(&mut *lock(&self.0.waiting));
        for (word, stream) in waiting {
            if word.known().is_some() {
                continue;
            }
            // A stream that failed leaves the metric unpaid: metrics do not fail a query.
            if word.read(&stream).is_err() {
                lock(&self.0.waiting).push((word, stream));
            }
        }
    }
}

/// Pays every metric of `metrics` that waits on a device count (see the module docs).
pub(crate) fn settle(metrics: &ExecutionPlanMetricsSet) {
    for metric in metrics.clone_inner().iter() {
        if let MetricValue::Custom { name, value } = metric.value()
            && name == NAME
            && let Some(settlement) = value.as_any().downcast_ref::<Registered>()
        {
            settlement.settle();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Display for Registered {
    /// The batches counted on the device.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", *lock(&self.0.batches))
    }
}

impl CustomMetricValue for Registered {
    fn new_empty(&self) -> Arc<dyn CustomMetricValue> {
        Arc::new(Registered::default())
    }

    /// For display: the batches of every partition (the words stay with their partition).
    fn aggregate(&self, other: Arc<dyn CustomMetricValue + 'static>) {
        if let Some(other) = other.as_any().downcast_ref::<Registered>()
            && !Arc::ptr_eq(&self.0, &other.0)
        {
            let more = *lock(&other.0.batches);
            *lock(&self.0.batches) += more;
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_usize(&self) -> usize {
        *lock(&self.0.batches)
    }

    fn is_eq(&self, other: &Arc<dyn CustomMetricValue>) -> bool {
        other
            .as_any()
            .downcast_ref::<Registered>()
            .is_some_and(|o| Arc::ptr_eq(&self.0, &o.0))
    }
}
