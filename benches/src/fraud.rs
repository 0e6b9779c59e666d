//! The fraud scenario's events (issue 20): card transactions, seeded, as Arrow batches in
//! arrival order.
//!
//! - Cards and merchants are drawn with a skew (a few of each are busy), amounts are
//!   log-normal-ish cents, and each card lives near a home location.
//! - Event time runs behind arrival: most events arrive within a second of happening, a few
//!   take longer, and about one in a thousand arrives more than [`LATE_AFTER`] late, past a
//!   five-second watermark.
//! - A few cards have fraud bursts: many large transactions in a short time, far from home
//!   (`fraud` marks them, for checking a rule-based flag).
//!
//! The same seed and options give the same events on every machine (a fixed generator,
//! `fastrand`'s wyrand).

use std::sync::Arc;

use arrow::array::{BooleanArray, Decimal128Array, Float64Array, Int64Array};
use arrow::array::{RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// How late an event may arrive and still be on time for a five-second watermark.
pub const LATE_AFTER: i64 = 5_000_000;

/// What to generate.
#[derive(Debug, Clone)]
pub struct FraudOptions {
    /// The generator's seed.
    pub seed: u64,
    /// Distinct cards.
    pub cards: u64,
    /// Distinct merchants.
    pub merchants: u64,
    /// Events per second of event time, on average.
    pub events_per_second: u64,
    /// Event time of the first event, microseconds since the epoch.
    pub start_micros: i64,
    /// Share of cards with a fraud burst somewhere in the stream.
    pub fraud_card_share: f64,
}

impl Default for FraudOptions {
    fn default() -> Self {
        FraudOptions {
            seed: 20,
            cards: 100_000,
            merchants: 5_000,
            events_per_second: 10_000,
            // 2026-01-01T00:00:00Z.
            start_micros: 1_767_225_600_000_000,
            fraud_card_share: 0.001,
        }
    }
}

/// The events' schema: `card`, `merchant`, `amount` (DECIMAL(12,2)), `lat`, `lon`, `ts` (event
/// time, microseconds) and `fraud` (ground truth of the bursts).
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("card", DataType::Int64, false),
        Field::new("merchant", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(12, 2), false),
        Field::new("lat", DataType::Float64, false),
        Field::new("lon", DataType::Float64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("fraud", DataType::Boolean, false),
    ]))
}

/// `events` events in arrival order, in batches of at most `batch_rows` rows.
pub fn events(options: &FraudOptions, events: usize, batch_rows: usize) -> Vec<RecordBatch> {
    let mut generator = Generator::new(options);
    let batch_rows = batch_rows.max(1);
    let mut out = Vec::with_capacity(events.div_ceil(batch_rows));
    let mut left = events;
    while left > 0 {
        let rows = left.min(batch_rows);
        out.push(generator.batch(rows));
        left -= rows;
    }
    out
}

/// A burst in progress: a card spending fast, far from home.
#[derive(Debug, Clone, Copy)]
struct Burst {
    card: u64,
    left: u32,
    lat: f64,
    lon: f64,
}

struct Generator {
    rng: fastrand::Rng,
    options: FraudOptions,
    /// Arrival time of the next event, microseconds.
    arrival: i64,
    burst: Option<Burst>,
}

impl Generator {
    fn new(options: &FraudOptions) -> Self {
        Generator {
            rng: fastrand::Rng::with_seed(options.seed),
            options: options.clone(),
            arrival: options.start_micros,
            burst: None,
        }
    }

    /// A number in `0..n` skewed towards small values (a few busy cards and merchants).
    fn skewed(&mut self, n: u64) -> u64 {
        let u = self.rng.f64();
        ((u * u * u) * n as f64) as u64 % n.max(1)
    }

    /// A card's home: a point derived from its number, the same every time.
    fn home(card: u64) -> (f64, f64) {
        let h = card.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let lat = (h >> 40) as f64 / (1u64 << 24) as f64 * 120.0 - 60.0;
        let lon = (h & 0xFF_FFFF) as f64 / (1u64 << 24) as f64 * 360.0 - 180.0;
        (lat, lon)
    }

    fn batch(&mut self, rows: usize) -> RecordBatch {
        let mut card = Vec::with_capacity(rows);
        let mut merchant = Vec::with_capacity(rows);
        let mut amount = Vec::with_capacity(rows);
        let mut lat = Vec::with_capacity(rows);
        let mut lon = Vec::with_capacity(rows);
        let mut ts = Vec::with_capacity(rows);
        let mut fraud = Vec::with_capacity(rows);
        let gap = 1_000_000 / self.options.events_per_second.max(1) as i64;
        for _ in 0..rows {
            self.arrival += self.rng.i64(0..=2 * gap);
            // Event time behind arrival: mostly under a second, sometimes seconds, rarely late.
            let delay = match self.rng.u32(0..1000) {
                0 => self.rng.i64(LATE_AFTER + 1..=4 * LATE_AFTER),
                1..=50 => self.rng.i64(1_000_000..=LATE_AFTER),
                _ => self.rng.i64(0..1_000_000),
            };
            if self.burst.is_none() && self.rng.f64() < self.options.fraud_card_share / 10.0 {
                let victim = self.rng.u64(0..self.options.cards.max(1));
                let (home_lat, home_lon) = Self::home(victim);
                self.burst = Some(Burst {
                    card: victim,
                    left: self.rng.u32(5..=20),
                    lat: -home_lat,
                    lon: (home_lon + 180.0) % 360.0 - 180.0,
                });
            }
            let (c, la, lo, cents, is_fraud) = match self.burst.as_mut() {
                Some(b) if self.rng.bool() => {
                    b.left -= 1;
                    let row = (b.card, b.lat, b.lon, self.rng.i64(50_000..=500_000), true);
                    if b.left == 0 {
                        self.burst = None;
                    }
                    row
                }
                _ => {
                    let c = self.skewed(self.options.cards);
                    let (home_lat, home_lon) = Self::home(c);
                    let cents = (self.rng.f64().powi(3) * 30_000.0) as i64 + 100;
                    (
                        c,
                        home_lat + self.rng.f64() - 0.5,
                        home_lon + self.rng.f64() - 0.5,
                        cents,
                        false,
                    )
                }
            };
            card.push(c as i64);
            merchant.push(self.skewed(self.options.merchants) as i64);
            amount.push(i128::from(cents));
            lat.push(la);
            lon.push(lo);
            ts.push(self.arrival - delay);
            fraud.push(is_fraud);
        }
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from(card)),
            Arc::new(Int64Array::from(merchant)),
            Arc::new(
                Decimal128Array::from(amount)
                    .with_precision_and_scale(12, 2)
                    .unwrap_or_else(|_| unreachable!("12, 2 is a valid decimal type")),
            ),
            Arc::new(Float64Array::from(lat)),
            Arc::new(Float64Array::from(lon)),
            Arc::new(TimestampMicrosecondArray::from(ts)),
            Arc::new(BooleanArray::from(fraud)),
        ];
        RecordBatch::try_new(schema(), columns)
            .unwrap_or_else(|e| unreachable!("the columns follow the schema: {e}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        reason = "test helpers: a failed unwrap is a failed test"
    )]

    use arrow::array::AsArray;
    use arrow::datatypes::TimestampMicrosecondType;

    use super::*;

    fn timestamps(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                b.column(5)
                    .as_primitive::<TimestampMicrosecondType>()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_events_in_batches_of_the_size_asked() {
        let options = FraudOptions::default();
        let a = events(&options, 10_000, 4096);
        let b = events(&options, 10_000, 4096);
        assert_eq!(a, b);
        assert_eq!(
            a.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            [4096, 4096, 1808]
        );
        let other = events(
            &FraudOptions {
                seed: 21,
                ..options
            },
            10_000,
            4096,
        );
        assert_ne!(a, other);
    }

    #[test]
    fn events_arrive_out_of_order_a_few_late_and_some_cards_in_bursts() {
        let options = FraudOptions::default();
        let batches = events(&options, 200_000, 8192);
        let ts = timestamps(&batches);
        // Out of order: many events are older than one before them.
        let behind = ts.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(behind > ts.len() / 10, "{behind}");
        // Late: older than the newest event seen so far by more than the watermark's delay.
        let mut newest = i64::MIN;
        let mut late = 0;
        for &t in &ts {
            if t < newest.saturating_sub(LATE_AFTER) {
                late += 1;
            }
            newest = newest.max(t);
        }
        assert!(late > 0 && late < ts.len() / 100, "{late}");
        let fraud: usize = batches
            .iter()
            .map(|b| b.column(6).as_boolean().true_count())
            .sum();
        assert!(fraud > 0 && fraud < ts.len() / 100, "{fraud}");
    }
}
