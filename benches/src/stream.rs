//! `spate bench stream --scenario fraud`: the fraud pipeline over seeded events
//! ([`crate::fraud`]), pushed through a stream into continuous views on one backend, with
//! throughput, latency, watermark lag and late rows, and, with `--verify`, every emitted row
//! checked against the batch query over the replayed events.
//!
//! The pipeline (SQL in [`VIEWS`]):
//! - `features`: per event, its card's count, sum, average and largest amount over the last
//!   minute, how far it is from the card's previous payment (degrees of latitude and longitude)
//!   and how long since (`LAG`, which keeps each card's latest payment however old), and a
//!   rule-based flag (five or more payments and this one over four times the minute's
//!   average, or far from the previous payment);
//! - `card_minute`: per card and tumbling minute, count, sum, largest amount and distinct
//!   merchants;
//! - `merchant_hop`: per merchant, a one-minute window every ten seconds: count and sum.
//!
//! Events are pushed `batch` rows at a time, each push one micro-batch. The replay keeps the
//! rows the stream accepted by its rule (see [`accepted`]) and runs each view's query over them
//! as a table on the CPU backend: every column is an integer, decimal or timestamp there, so
//! the rows must be equal.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Field, Int64Type, Schema, TimeUnit, TimestampMicrosecondType, TimestampNanosecondType,
};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use spate::{Backend, Engine, SpateError};

use crate::fraud::{self, FraudOptions, LATE_AFTER};

/// The stream's declaration: the events' columns, a five-second watermark.
pub const STREAM: &str = "CREATE STREAM tx (card BIGINT NOT NULL, merchant BIGINT NOT NULL, \
     amount DECIMAL(12,2) NOT NULL, lat DOUBLE NOT NULL, lon DOUBLE NOT NULL, ts TIMESTAMP, \
     fraud BOOLEAN NOT NULL, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)";

/// The pipeline's continuous views: (name, query). Each emits on window close.
pub const VIEWS: [(&str, &str); 3] = [
    (
        "features",
        "SELECT card, ts, amount, count(*) OVER m AS n_1m, sum(amount) OVER m AS sum_1m, \
         avg(amount) OVER m AS avg_1m, max(amount) OVER m AS max_1m, \
         abs(lat - LAG(lat) OVER p) + abs(lon - LAG(lon) OVER p) AS moved, \
         CAST(ts AS BIGINT) - CAST(LAG(ts) OVER p AS BIGINT) AS since_last, \
         (count(*) OVER m >= 5 AND amount > 4 * avg(amount) OVER m) \
         OR abs(lat - LAG(lat) OVER p) + abs(lon - LAG(lon) OVER p) > 20 AS flag \
         FROM tx WINDOW m AS (PARTITION BY card ORDER BY ts \
         RANGE BETWEEN INTERVAL '1' MINUTE PRECEDING AND CURRENT ROW), \
         p AS (PARTITION BY card ORDER BY ts, merchant, amount)",
    ),
    (
        "card_minute",
        "SELECT card, window_start, window_end, count(*) AS n, sum(amount) AS total, \
         max(amount) AS top, count(DISTINCT merchant) AS merchants \
         FROM TUMBLE(tx, ts, INTERVAL '1' MINUTE) GROUP BY card, window_start, window_end",
    ),
    (
        "merchant_hop",
        "SELECT merchant, window_start, window_end, count(*) AS n, sum(amount) AS total \
         FROM HOP(tx, ts, INTERVAL '10' SECOND, INTERVAL '1' MINUTE) \
         GROUP BY merchant, window_start, window_end",
    ),
];

/// What a run of the pipeline measured and emitted.
#[derive(Debug)]
pub struct PipelineRun {
    /// The backend it ran on, as resolved.
    pub backend: String,
    /// The backend and why (`BackendSelection`'s line).
    pub selection: String,
    pub events: usize,
    pub late_rows: u64,
    pub micro_batches: u64,
    /// From the first push to the last emission.
    pub wall: Duration,
    /// How long each micro-batch took, push to views advanced.
    pub batch_times: Vec<Duration>,
    /// Per emitted feature row: from its event's push to its emission.
    pub latencies: Vec<Duration>,
    /// The largest gap between the latest event time and the watermark after a micro-batch,
    /// in microseconds of event time.
    pub max_lag_micros: i64,
    /// Each view's emitted rows.
    pub emitted: BTreeMap<String, Vec<RecordBatch>>,
}

fn error(e: SpateError) -> String {
    e.to_string()
}

/// Runs the pipeline over `events` (pushed one batch per micro-batch) on `backend`.
pub async fn run_pipeline(backend: Backend, events: &[RecordBatch]) -> Result<PipelineRun, String> {
    let engine = Engine::builder().backend(backend).build().map_err(error)?;
    let batch = events.first().map_or(1, RecordBatch::num_rows);
    engine
        .sql(&format!(
            "{STREAM} WITH (flush_rows = {batch}, flush_interval = '1 hour')"
        ))
        .await
        .map_err(error)?;
    let mut subscriptions = Vec::new();
    for (name, query) in VIEWS {
        engine
            .sql(&format!(
                "CREATE CONTINUOUS VIEW {name} AS {query} EMIT ON WINDOW CLOSE"
            ))
            .await
            .map_err(error)?;
        subscriptions.push((name, engine.subscribe(name).map_err(error)?));
    }
    // Where each event arrived: (card, time) to the push it came in.
    let mut arrivals: HashMap<(i64, i64), usize> =
        HashMap::with_capacity(events.iter().map(RecordBatch::num_rows).sum());
    let mut pushed_at = Vec::with_capacity(events.len());
    let mut emitted: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
    let mut latencies = Vec::new();
    let mut batch_times = Vec::with_capacity(events.len());
    let mut max_lag = 0i64;
    let writer = engine.stream_writer("tx").map_err(error)?;
    let start = Instant::now();
    let mut collect = |emitted: &mut BTreeMap<String, Vec<RecordBatch>>,
                       latencies: &mut Vec<Duration>,
                       pushed_at: &[Instant],
                       arrivals: &HashMap<(i64, i64), usize>| {
        let now = Instant::now();
        for (name, subscription) in &mut subscriptions {
            while let Some(b) = subscription.try_next_batch() {
                if *name == "features" {
                    let cards = b.column(0).as_primitive::<Int64Type>();
                    let times = b.column(1).as_primitive::<TimestampNanosecondType>();
                    for i in 0..b.num_rows() {
                        let key = (cards.value(i), times.value(i) / 1_000);
                        if let Some(&at) = arrivals.get(&key) {
                            latencies.push(now.duration_since(pushed_at[at]));
                        }
                    }
                }
                emitted.entry((*name).to_string()).or_default().push(b);
            }
        }
    };
    for (i, b) in events.iter().enumerate() {
        let cards = b.column(0).as_primitive::<Int64Type>();
        let times = b.column(5).as_primitive::<TimestampMicrosecondType>();
        for r in 0..b.num_rows() {
            arrivals
                .entry((cards.value(r), times.value(r)))
                .or_insert(i);
        }
        let began = Instant::now();
        pushed_at.push(began);
        writer.push(b.clone()).await.map_err(error)?;
        batch_times.push(began.elapsed());
        if let Some(info) = engine.streams().first()
            && let Some(lag) = info.lag_micros
        {
            max_lag = max_lag.max(lag);
        }
        collect(&mut emitted, &mut latencies, &pushed_at, &arrivals);
    }
    writer.finish().await.map_err(error)?;
    collect(&mut emitted, &mut latencies, &pushed_at, &arrivals);
    let wall = start.elapsed();
    let info = engine
        .streams()
        .into_iter()
        .next()
        .ok_or("the stream is gone")?;
    Ok(PipelineRun {
        backend: engine.backend().resolved.to_string(),
        selection: engine.backend().to_string(),
        events: info.events as usize,
        late_rows: info.late_rows,
        micro_batches: info.micro_batches,
        wall,
        batch_times,
        latencies,
        max_lag_micros: max_lag,
        emitted,
    })
}

/// The events a stream with a `delay` watermark (and no allowed lateness) accepts from one
/// writer: those not below the latest accepted time less the delay.
pub fn accepted(events: &[RecordBatch], delay_micros: i64) -> Vec<RecordBatch> {
    let mut latest: Option<i64> = None;
    events
        .iter()
        .map(|b| {
            let times = b.column(5).as_primitive::<TimestampMicrosecondType>();
            let mask: Vec<bool> = times
                .values()
                .iter()
                .map(|&t| {
                    let ok = latest.is_none_or(|l| t >= l - delay_micros);
                    if ok {
                        latest = Some(latest.map_or(t, |l| l.max(t)));
                    }
                    ok
                })
                .collect();
            arrow::compute::filter_record_batch(b, &mask.into())
                .unwrap_or_else(|e| unreachable!("a mask as long as the batch: {e}"))
        })
        .collect()
}

/// Each row as text, counted.
fn multiset(batches: &[RecordBatch]) -> Result<BTreeMap<String, i64>, String> {
    let mut rows = BTreeMap::new();
    let options = FormatOptions::default().with_null("NULL");
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        for r in 0..b.num_rows() {
            let line: Vec<String> = formatters.iter().map(|f| f.value(r).to_string()).collect();
            *rows.entry(line.join("|")).or_default() += 1;
        }
    }
    Ok(rows)
}

/// One view's check: rows emitted that the replay also gives, rows the replay gives, and
/// rows emitted in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewCheck {
    pub view: String,
    pub matched: u64,
    pub expected: u64,
    pub emitted: u64,
}

impl ViewCheck {
    /// Equal: every row matched, nothing missing, nothing extra.
    pub fn equal(&self) -> bool {
        self.matched == self.expected && self.matched == self.emitted
    }
}

/// Checks every view's emitted rows against its query over the accepted events, on the CPU.
pub async fn verify(events: &[RecordBatch], run: &PipelineRun) -> Result<Vec<ViewCheck>, String> {
    let replay = Engine::builder()
        .backend(Backend::Cpu)
        .build()
        .map_err(error)?;
    // The stream's time column is TIMESTAMP (nanoseconds); the events carry microseconds.
    let nanos = accepted(events, LATE_AFTER)
        .iter()
        .map(|b| {
            let mut columns = b.columns().to_vec();
            columns[5] = arrow::compute::cast(
                &columns[5],
                &DataType::Timestamp(TimeUnit::Nanosecond, None),
            )?;
            let mut fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields[5] = Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true);
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    replay.register_batches("tx", nanos).map_err(error)?;
    let mut checks = Vec::new();
    for (name, query) in VIEWS {
        let want = multiset(&replay.collect(query).await.map_err(error)?)?;
        let got = multiset(run.emitted.get(name).map_or(&[][..], Vec::as_slice))?;
        let matched = got
            .iter()
            .map(|(row, &n)| n.min(want.get(row).copied().unwrap_or(0)))
            .sum::<i64>();
        checks.push(ViewCheck {
            view: name.to_string(),
            matched: matched as u64,
            expected: want.values().sum::<i64>() as u64,
            emitted: got.values().sum::<i64>() as u64,
        });
    }
    Ok(checks)
}

/// The `q`-quantile of `values` (sorted in place).
pub fn quantile(values: &mut [Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let at = ((values.len() - 1) as f64 * q).round() as usize;
    Some(values[at])
}

/// The seeded events for `events` rows in batches of `batch`.
pub fn fraud_events(events: usize, batch: usize) -> Vec<RecordBatch> {
    fraud::events(&FraudOptions::default(), events, batch)
}
