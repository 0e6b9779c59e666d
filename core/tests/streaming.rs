//! Streams and continuous views, on the `cpu` and `emulated` backends, against the batch query
//! over the same events replayed as a table: TUMBLE, HOP and SESSION windows, both emit modes,
//! per-event RANGE windows, a stream joined with a table, watermarks and late rows.
//!
//! Events arrive out of order, a few past the watermark. A replay keeps the rows the stream
//! accepted by its rule, computed here independently: a row is late when its time is below the
//! latest time accepted before it, less the delay and the allowed lateness.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Decimal128Array, Int64Array, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use spate::{Backend, Engine};

const BASE_MICROS: i64 = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
const DELAY_MICROS: i64 = 2_000_000;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("card", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(12, 2), false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
    ]))
}

/// `n` events in arrival order, in batches of `batch` rows: times 10 ms apart with up to 1.5 s
/// of disorder, and one in 80 ten seconds behind (late).
fn events(n: usize, batch: usize) -> Vec<RecordBatch> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut cards = Vec::new();
    let mut amounts = Vec::new();
    let mut times = Vec::new();
    for i in 0..n {
        let r = next();
        cards.push((r % 12) as i64);
        amounts.push(i128::from((r >> 8) % 50_000 + 100));
        let jitter = ((r >> 24) % 2_000_000) as i64 - 1_500_000;
        let late = if (r >> 48) % 80 == 0 { -10_000_000 } else { 0 };
        times.push(BASE_MICROS + i as i64 * 10_000 + jitter + late);
    }
    (0..n)
        .step_by(batch)
        .map(|start| {
            let end = (start + batch).min(n);
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(cards[start..end].to_vec())),
                Arc::new(
                    Decimal128Array::from(amounts[start..end].to_vec())
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ),
                Arc::new(TimestampMicrosecondArray::from(times[start..end].to_vec())),
            ];
            RecordBatch::try_new(schema(), columns).unwrap()
        })
        .collect()
}

/// The rows a stream with `delay` and `lateness` accepts, and how many it sends to `$late`.
fn accepted(batches: &[RecordBatch], lateness: i64) -> (Vec<RecordBatch>, usize) {
    let mut latest: Option<i64> = None;
    let mut late = 0;
    let kept = batches
        .iter()
        .map(|b| {
            let times = b
                .column(2)
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap();
            let mask: Vec<bool> = times
                .values()
                .iter()
                .map(|&t| {
                    let ok = latest.is_none_or(|l| t >= l - DELAY_MICROS - lateness);
                    if ok {
                        latest = Some(latest.map_or(t, |l| l.max(t)));
                    } else {
                        late += 1;
                    }
                    ok
                })
                .collect();
            arrow::compute::filter_record_batch(b, &mask.into()).unwrap()
        })
        .collect();
    (kept, late)
}

/// Each row as its cells' text (NULL as `NULL`).
fn cells(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    rows
}

/// Each row as text, counted.
fn multiset(batches: &[RecordBatch]) -> BTreeMap<String, i64> {
    let mut rows = BTreeMap::new();
    for line in cells(batches) {
        *rows.entry(line.join("|")).or_default() += 1;
    }
    rows
}

/// A changelog (`op` first) added up.
fn applied(changes: &[RecordBatch]) -> BTreeMap<String, i64> {
    let mut rows: BTreeMap<String, i64> = BTreeMap::new();
    for (line, n) in multiset(changes) {
        let (op, row) = line.split_once('|').unwrap();
        let sign = if op == "+" { 1 } else { -1 };
        *rows.entry(row.to_string()).or_default() += sign * n;
    }
    rows.retain(|_, n| *n != 0);
    rows
}

const PROFILES: &str = "profiles";

fn profiles() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("card", DataType::Int64, false),
        Field::new("risk", DataType::Int64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from((0..10).collect::<Vec<i64>>())),
            Arc::new(Int64Array::from(
                (0..10).map(|c| c % 3).collect::<Vec<i64>>(),
            )),
        ],
    )
    .unwrap()
}

struct Run {
    emitted: Vec<RecordBatch>,
    late_rows: usize,
    /// Before the writer finished: the rows of window state `v` held as panes (`None`: it
    /// keeps none), and the rows the stream kept.
    pane_rows: Option<usize>,
    kept_rows: usize,
    replay: BTreeMap<String, i64>,
    expected_late: usize,
}

/// Streams the events through `view` (its query and `EMIT …` clause) on `backend`, and runs
/// the query as a batch over the accepted rows on the CPU.
/// A session with stream `tx` (its `options` added) and view `v` (`query` and `emit`).
async fn declare(backend: Backend, query: &str, emit: &str, options: &str) -> Engine {
    let engine = Engine::builder().backend(backend).build().unwrap();
    engine.register_batches(PROFILES, vec![profiles()]).unwrap();
    engine
        .sql(&format!(
            "CREATE STREAM tx (card BIGINT NOT NULL, amount DECIMAL(12,2) NOT NULL, \
             ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) \
             WITH (flush_rows = 100000000, flush_interval = '1 hour'{options})"
        ))
        .await
        .unwrap();
    engine
        .sql(&format!("CREATE CONTINUOUS VIEW v AS {query} {emit}"))
        .await
        .unwrap();
    engine
}

/// Pushes `batches` into `tx`, a micro-batch each, finishing the writer when asked, and
/// returns what `v` emitted meanwhile.
async fn push(engine: &Engine, batches: &[RecordBatch], finish: bool) -> Vec<RecordBatch> {
    let mut subscription = engine.subscribe("v").unwrap();
    let writer = engine.stream_writer("tx").unwrap();
    for b in batches {
        writer.push(b.clone()).await.unwrap();
        writer.flush().await.unwrap();
    }
    if finish {
        writer.finish().await.unwrap();
    }
    let mut emitted = Vec::new();
    while let Some(b) = subscription.try_next_batch() {
        emitted.push(b);
    }
    emitted
}

/// Rows in `tx$late`.
async fn late_rows(engine: &Engine) -> usize {
    let late = engine
        .collect("SELECT count(*) FROM \"tx$late\"")
        .await
        .unwrap();
    late[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0) as usize
}

async fn run(backend: Backend, query: &str, emit: &str, options: &str, lateness: i64) -> Run {
    let engine = declare(backend, query, emit, options).await;
    let batches = events(3_000, 200);
    let mut emitted = push(&engine, &batches, false).await;
    let info = engine.streams().remove(0);
    let pane_rows = info
        .pane_rows
        .iter()
        .find(|(v, _)| v == "v")
        .map(|(_, n)| *n);
    emitted.extend(push(&engine, &[], true).await);
    let late_rows = late_rows(&engine).await;

    let (kept, expected_late) = accepted(&batches, lateness);
    let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
    replay.register_batches(PROFILES, vec![profiles()]).unwrap();
    replay.register_batches("tx", kept).unwrap();
    let want = multiset(&replay.collect(query).await.unwrap());
    Run {
        emitted,
        late_rows,
        pane_rows,
        kept_rows: info.kept_rows,
        replay: want,
        expected_late,
    }
}

/// Whether a view keeps its window state as panes (`stream/panes.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Panes,
    KeptRows,
}

async fn final_rows_equal_replay(query: &str, state: State) {
    for backend in [Backend::Cpu, Backend::Emulated] {
        let r = run(backend, query, "EMIT ON WINDOW CLOSE", "", 0).await;
        match state {
            State::Panes => {
                let panes = r
                    .pane_rows
                    .unwrap_or_else(|| panic!("{backend:?}: no panes"));
                assert!(panes > 0, "{backend:?}: empty panes");
                assert_eq!(r.kept_rows, 0, "{backend:?}: the stream kept rows");
            }
            State::KeptRows => {
                assert_eq!(r.pane_rows, None, "{backend:?}: panes");
                assert!(r.kept_rows > 0, "{backend:?}: the stream kept no rows");
            }
        }
        assert!(r.expected_late > 0, "the events must hold late rows");
        assert_eq!(r.late_rows, r.expected_late, "{backend:?}: late rows");
        let got = multiset(&r.emitted);
        assert!(!got.is_empty(), "{backend:?}: nothing emitted");
        assert_eq!(got, r.replay, "{backend:?}: {query}");
        // Final rows are emitted once each, across micro-batches.
        assert!(
            r.emitted.len() > 1,
            "{backend:?}: emitted in one batch only"
        );
    }
}

const TUMBLE: &str = "SELECT card, window_start, window_end, count(*) AS n, sum(amount) AS total, \
                      max(amount) AS top FROM TUMBLE(tx, ts, INTERVAL '10' SECOND) \
                      GROUP BY card, window_start, window_end";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tumbling_windows_equal_the_batch_replay() {
    final_rows_equal_replay(TUMBLE, State::Panes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hopping_windows_equal_the_batch_replay() {
    final_rows_equal_replay(
        "SELECT card, window_start, window_end, count(*) AS n, min(amount) AS low \
         FROM HOP(tx, ts, INTERVAL '5' SECOND, INTERVAL '20' SECOND) \
         GROUP BY card, window_start, window_end",
        State::Panes,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_windows_equal_the_batch_replay() {
    final_rows_equal_replay(SESSIONS, State::KeptRows).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_event_range_windows_equal_the_batch_replay() {
    final_rows_equal_replay(
        "SELECT card, ts, amount, count(*) OVER w AS n, sum(amount) OVER w AS s, \
         max(amount) OVER w AS top, min(amount) OVER w AS low FROM tx \
         WINDOW w AS (PARTITION BY card ORDER BY ts \
         RANGE BETWEEN INTERVAL '5' SECOND PRECEDING AND CURRENT ROW)",
        State::KeptRows,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_joined_with_a_table_equals_the_batch_replay() {
    final_rows_equal_replay(
        "SELECT t.card, t.ts, t.amount, p.risk FROM tx t JOIN profiles p ON t.card = p.card \
         WHERE p.risk > 0",
        State::KeptRows,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_on_update_is_a_changelog_that_adds_up_to_the_replay() {
    for backend in [Backend::Cpu, Backend::Emulated] {
        let r = run(backend, TUMBLE, "EMIT ON UPDATE", "", 0).await;
        assert_eq!(applied(&r.emitted), r.replay, "{backend:?}");
        // Windows updated while open were retracted and emitted again.
        let retractions = multiset(&r.emitted)
            .keys()
            .filter(|k| k.starts_with("-|"))
            .count();
        assert!(retractions > 0, "{backend:?}: no retraction");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_lateness_accepts_rows_behind_the_watermark() {
    for backend in [Backend::Cpu, Backend::Emulated] {
        let strict = run(backend, TUMBLE, "EMIT ON WINDOW CLOSE", "", 0).await;
        let lenient = run(
            backend,
            TUMBLE,
            "EMIT ON WINDOW CLOSE",
            ", lateness = INTERVAL '20' SECOND",
            20_000_000,
        )
        .await;
        assert_eq!(lenient.late_rows, lenient.expected_late, "{backend:?}");
        assert!(lenient.late_rows < strict.late_rows, "{backend:?}");
        assert_eq!(multiset(&lenient.emitted), lenient.replay, "{backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_report_their_watermark_and_refuse_bad_declarations() {
    let engine = Engine::builder().backend(Backend::Cpu).build().unwrap();
    engine
        .sql(
            "CREATE STREAM s (k BIGINT, ts TIMESTAMP, \
             WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)",
        )
        .await
        .unwrap();
    let info = &engine.streams()[0];
    assert_eq!((info.name.as_str(), info.watermark_micros), ("s", None));
    let e = engine
        .sql("CREATE STREAM bad (k BIGINT, WATERMARK FOR k AS k)")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a timestamp"), "{e}");
    let e = engine
        .sql("CREATE CONTINUOUS VIEW w AS SELECT k, count(*) FROM s GROUP BY k")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("must output window_end"), "{e}");
    let e = engine
        .sql("CREATE STREAM t (ts TIMESTAMP, WATERMARK FOR ts AS ts) WITH (flush_rowz = 1)")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown option 'flush_rowz'"), "{e}");
    assert!(engine.stream_writer("nope").is_err());
    assert!(engine.subscribe("nope").is_err());
}

const SESSIONS: &str = "SELECT card, window_start, window_end, count(*) AS n, sum(amount) AS total \
                        FROM SESSION(tx, ts, INTERVAL '300' MILLISECOND, card) \
                        GROUP BY card, window_start, window_end";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_checkpoint_gives_the_output_of_a_run_without_one() {
    let batches = events(3_000, 200);
    for backend in [Backend::Cpu, Backend::Emulated] {
        for (query, emit) in [
            (TUMBLE, "EMIT ON WINDOW CLOSE"),
            (TUMBLE, "EMIT ON UPDATE"),
            (SESSIONS, "EMIT ON WINDOW CLOSE"),
        ] {
            let whole = run(backend, query, emit, "", 0).await;
            let folder = tempfile::tempdir().unwrap();
            let path = folder.path().join("checkpoint");
            let before = {
                let engine = declare(backend, query, emit, "").await;
                let emitted = push(&engine, &batches[..7], false).await;
                let report = engine
                    .collect(&format!("CHECKPOINT '{}'", path.display()))
                    .await
                    .unwrap();
                assert_eq!(report[0].num_rows(), 1, "one stream");
                emitted
            };
            // A new session, as after a crash: the statements come from the checkpoint.
            let engine = Engine::builder().backend(backend).build().unwrap();
            let offsets = engine.restore(&path).await.unwrap();
            assert_eq!(offsets.len(), 1);
            let offset = offsets[0].events as usize;
            assert_eq!(offset, 1_400, "the rows taken before the checkpoint");
            let after = push(&engine, &batches[offset / 200..], true).await;
            let all: Vec<RecordBatch> = before.into_iter().chain(after).collect();
            if emit == "EMIT ON UPDATE" {
                assert_eq!(applied(&all), applied(&whole.emitted), "{backend:?} {emit}");
            } else {
                assert_eq!(
                    multiset(&all),
                    multiset(&whole.emitted),
                    "{backend:?} {query}"
                );
            }
            // Late rows survive the restart.
            assert_eq!(late_rows(&engine).await, whole.late_rows, "{backend:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_a_session_that_has_the_stream_is_refused() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("c");
    let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
    engine.checkpoint(&path).await.unwrap();
    let e = engine.restore(&path).await.unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    let e = Engine::new()
        .unwrap()
        .restore(folder.path().join("missing"))
        .await
        .unwrap_err();
    assert!(matches!(e, spate::SpateError::Source { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_into_a_stream_pushes_rows_that_views_emit() {
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = Engine::builder().backend(backend).build().unwrap();
        engine
            .sql("CREATE STREAM s (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)")
            .await
            .unwrap();
        engine
            .sql(
                "CREATE CONTINUOUS VIEW w AS SELECT k, window_start, count(*) AS n \
                 FROM TUMBLE(s, ts, INTERVAL '1' MINUTE) GROUP BY k, window_start, window_end",
            )
            .await
            .unwrap_err();
        engine
            .sql(
                "CREATE CONTINUOUS VIEW w AS SELECT k, window_end, count(*) AS n \
                 FROM TUMBLE(s, ts, INTERVAL '1' MINUTE) GROUP BY k, window_start, window_end",
            )
            .await
            .unwrap();
        let rows = |sql: &'static str| {
            let engine = engine.clone();
            async move { multiset(&engine.collect(sql).await.unwrap()) }
        };
        rows(
            "INSERT INTO s VALUES (1, TIMESTAMP '2026-01-01 00:00:10'), \
             (1, TIMESTAMP '2026-01-01 00:00:20'), (2, TIMESTAMP '2026-01-01 00:00:30')",
        )
        .await;
        assert!(rows("SELECT * FROM w").await.is_empty(), "{backend:?}");
        rows("INSERT INTO s VALUES (1, TIMESTAMP '2026-01-01 00:01:00')").await;
        let got = rows("SELECT * FROM w ORDER BY k").await;
        let want: BTreeMap<String, i64> = [
            ("1|2026-01-01T00:01:00|2".to_string(), 1),
            ("2|2026-01-01T00:01:00|1".to_string(), 1),
        ]
        .into();
        assert_eq!(got, want, "{backend:?}");
        rows("INSERT INTO s VALUES (3, TIMESTAMP '2026-01-01 00:00:05')").await;
        let info = &engine.streams()[0];
        assert_eq!((info.events, info.late_rows), (5, 1), "{backend:?}");
        assert_eq!(info.views, ["w"]);
        assert_eq!(rows("SELECT k FROM \"s$late\"").await.len(), 1);
    }
}

const LAGS: &str = "SELECT card, ts, amount, \
                    LAG(amount) OVER (PARTITION BY card ORDER BY ts) AS previous, \
                    LAG(ts, 2) OVER (PARTITION BY card ORDER BY ts) AS before_last FROM tx";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_equals_the_batch_replay() {
    final_rows_equal_replay(LAGS, State::KeptRows).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_keeps_each_keys_latest_rows_not_the_whole_stream() {
    let batches = events(3_000, 200);
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = declare(backend, LAGS, "", "").await;
        push(&engine, &batches, false).await;
        let info = &engine.streams()[0];
        // Each card's two latest rows, and the micro-batches still open: far from all 3,000.
        assert!(info.kept_rows < 800, "{backend:?}: kept {}", info.kept_rows);
        // A LAG over filtered rows needs every row: the stream keeps them all.
        let engine = declare(
            backend,
            "SELECT card, ts, LAG(amount) OVER (PARTITION BY card ORDER BY ts) AS previous \
             FROM tx WHERE amount > 10",
            "",
            "",
        )
        .await;
        push(&engine, &batches, false).await;
        let info = &engine.streams()[0];
        assert!(
            info.kept_rows > 2_900,
            "{backend:?}: kept {}",
            info.kept_rows
        );
    }
}

/// Rows keyed by their first `keys` columns, the others as floats.
fn keyed_floats(batches: &[RecordBatch], keys: usize) -> BTreeMap<String, Vec<Option<f64>>> {
    let mut out = BTreeMap::new();
    for row in cells(batches) {
        let values = row[keys..].iter().map(|v| v.parse::<f64>().ok()).collect();
        assert!(
            out.insert(row[..keys].join("|"), values).is_none(),
            "a repeated key"
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_event_float_features_equal_the_replay_within_1e9() {
    // A z-score against the card's last five seconds: floats summed in another order over
    // the rows the stream keeps than over the whole replay. (DataFusion has no sliding
    // approx_distinct, in a batch either.)
    let query = "SELECT card, ts, amount, stddev(CAST(amount AS DOUBLE)) OVER w AS sd, \
                 (CAST(amount AS DOUBLE) - avg(CAST(amount AS DOUBLE)) OVER w) \
                 / stddev(CAST(amount AS DOUBLE)) OVER w AS z FROM tx \
                 WINDOW w AS (PARTITION BY card ORDER BY ts \
                 RANGE BETWEEN INTERVAL '5' SECOND PRECEDING AND CURRENT ROW)";
    for backend in [Backend::Cpu, Backend::Emulated] {
        let r = run(backend, query, "EMIT ON WINDOW CLOSE", "", 0).await;
        let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
        let (kept, _) = accepted(&events(3_000, 200), 0);
        replay.register_batches("tx", kept).unwrap();
        let want = keyed_floats(&replay.collect(query).await.unwrap(), 3);
        floats_close(&keyed_floats(&r.emitted, 3), &want, backend);
    }
}

/// `got` equals `want` row for row, each float to 1e-9 relative.
fn floats_close(
    got: &BTreeMap<String, Vec<Option<f64>>>,
    want: &BTreeMap<String, Vec<Option<f64>>>,
    backend: Backend,
) {
    assert!(!want.is_empty(), "{backend:?}: the replay gave no rows");
    assert_eq!(got.len(), want.len(), "{backend:?}");
    for (key, w) in want {
        let g = got
            .get(key)
            .unwrap_or_else(|| panic!("{backend:?}: no row {key}"));
        for (a, b) in g.iter().zip(w) {
            match (a, b) {
                (Some(a), Some(b)) => assert!(
                    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
                    "{backend:?} {key}: {a} against {b}"
                ),
                _ => assert_eq!(a.is_some(), b.is_some(), "{backend:?} {key}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_panes_with_averages_filters_and_having_equal_the_replay() {
    // Panes of a HOP: an average (a sum and a count per pane), a count of a column, a filter
    // below the aggregation, HAVING on an aggregate not shown, and ORDER BY above it.
    let query = "SELECT card, window_start, window_end, avg(CAST(amount AS DOUBLE)) AS mean, \
                 count(amount) AS n, sum(amount) AS total, max(ts) AS last \
                 FROM HOP(tx, ts, INTERVAL '2' SECOND, INTERVAL '6' SECOND) \
                 WHERE amount > 10 GROUP BY card, window_start, window_end \
                 HAVING count(*) > 1 ORDER BY card";
    for backend in [Backend::Cpu, Backend::Emulated] {
        let r = run(backend, query, "EMIT ON WINDOW CLOSE", "", 0).await;
        assert!(r.pane_rows.is_some_and(|n| n > 0), "{backend:?}: no panes");
        assert_eq!(r.kept_rows, 0, "{backend:?}: the stream kept rows");
        // `last` compares as text.
        let strip = |rows: BTreeMap<String, Vec<Option<f64>>>| -> BTreeMap<_, _> {
            rows.into_iter()
                .map(|(k, mut v)| {
                    v.pop();
                    (k, v)
                })
                .collect()
        };
        let want = r.replay.keys().cloned().collect::<Vec<_>>();
        let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
        let (kept, _) = accepted(&events(3_000, 200), 0);
        replay.register_batches("tx", kept).unwrap();
        let want_rows = replay.collect(query).await.unwrap();
        floats_close(
            &strip(keyed_floats(&r.emitted, 3)),
            &strip(keyed_floats(&want_rows, 3)),
            backend,
        );
        let lasts = |batches: &[RecordBatch]| -> BTreeMap<String, String> {
            cells(batches)
                .into_iter()
                .map(|row| (row[..3].join("|"), row[row.len() - 1].clone()))
                .collect()
        };
        assert_eq!(lasts(&r.emitted), lasts(&want_rows), "{backend:?}");
        assert_eq!(
            want.len(),
            want_rows.iter().map(RecordBatch::num_rows).sum::<usize>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_aggregates_keep_their_values_in_the_panes() {
    for window in [
        "TUMBLE(tx, ts, INTERVAL '10' SECOND)",
        "HOP(tx, ts, INTERVAL '2' SECOND, INTERVAL '6' SECOND)",
    ] {
        final_rows_equal_replay(
            &format!(
                "SELECT card % 3 AS c, window_end, count(DISTINCT card) AS cards, \
                 sum(DISTINCT card) AS card_sum, count(*) AS n, sum(amount) AS total \
                 FROM {window} GROUP BY card % 3, window_end"
            ),
            State::Panes,
        )
        .await;
        final_rows_equal_replay(
            &format!(
                "SELECT k, window_end, count(DISTINCT card) AS cards, \
                 sum(DISTINCT card) AS card_sum, min(DISTINCT card) AS low, count(*) AS n, \
                 sum(amount) AS total FROM (SELECT card % 3 AS k, card, amount, window_end \
                 FROM {window}) GROUP BY k, window_end"
            ),
            State::Panes,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_with_other_aggregates_run_over_the_kept_rows() {
    final_rows_equal_replay(
        "SELECT card, window_start, window_end, bool_or(amount > 400) AS big, \
         count(*) AS n FROM TUMBLE(tx, ts, INTERVAL '10' SECOND) \
         GROUP BY card, window_start, window_end",
        State::KeptRows,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_in_streaming_sql_are_clear_errors() {
    let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
    for (sql, wanted) in [
        (
            "SELECT * FROM HOP(tx, ts, INTERVAL '0' SECOND, INTERVAL '1' MINUTE)",
            "positive",
        ),
        ("SELECT * FROM TUMBLE(tx, ts, '0 s')", "positive"),
        (
            "CREATE CONTINUOUS VIEW a AS SELECT card, max(ts) AS ts FROM tx GROUP BY card",
            "group by window_end",
        ),
        (
            "CREATE CONTINUOUS VIEW b AS SELECT card, ts, \
             cume_dist() OVER (PARTITION BY card ORDER BY ts) AS c FROM tx",
            "whole partition",
        ),
        (
            "CREATE CONTINUOUS VIEW c AS SELECT card, ts, \
             sum(amount) OVER (PARTITION BY card ORDER BY ts DESC \
             RANGE BETWEEN INTERVAL '1' SECOND PRECEDING AND CURRENT ROW) AS s FROM tx",
            "newest first",
        ),
    ] {
        let e = engine.collect(sql).await.unwrap_err();
        assert!(e.to_string().contains(wanted), "{sql}: {e}");
    }
    // A view on a stream that has taken rows would miss the rows retention let go of.
    push(&engine, &events(400, 200), false).await;
    let e = engine
        .sql("CREATE CONTINUOUS VIEW late_view AS SELECT card, ts FROM tx")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has taken rows already"), "{e}");
    // Names are case-insensitive unless quoted, as for tables.
    assert!(engine.subscribe("V").is_ok());
    // A checkpoint never replaces a folder that is not one.
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("precious.txt"), "keep me").unwrap();
    let e = engine.checkpoint(folder.path()).await.unwrap_err();
    assert!(
        e.to_string().contains("something other than a checkpoint"),
        "{e}"
    );
    assert!(folder.path().join("precious.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_its_writers_finish_whatever_inserts_came_before() {
    let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
    let mut subscription = engine.subscribe("v").unwrap();
    engine
        .collect("INSERT INTO tx VALUES (1, 2.50, TIMESTAMP '2026-01-01 00:00:01')")
        .await
        .unwrap();
    let writer = engine.stream_writer("tx").unwrap();
    writer.push(events(200, 200).remove(0)).await.unwrap();
    writer.finish().await.unwrap();
    let mut rows = 0;
    while let Some(b) = subscription.next_batch().await {
        rows += b.num_rows();
    }
    assert!(rows > 0, "every window closed and the subscription ended");
    assert_eq!(engine.streams()[0].watermark_micros, Some(i64::MAX));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailed_folder_feeds_a_stream_file_by_file() {
    let folder = tempfile::tempdir().unwrap();
    let batches = events(1_000, 250);
    for backend in [Backend::Cpu, Backend::Emulated] {
        let dir = folder.path().join(format!("{backend:?}"));
        std::fs::create_dir(&dir).unwrap();
        let engine = declare(backend, TUMBLE, "", "").await;
        let mut subscription = engine.subscribe("v").unwrap();
        let tail = engine
            .tail_folder(
                "tx",
                &dir,
                Some(spate::FileFormat::Csv),
                std::time::Duration::from_millis(10),
            )
            .unwrap();
        for (i, b) in batches.iter().enumerate() {
            // Written under a hidden name, then renamed in whole.
            let hidden = dir.join(format!(".part-{i}.csv"));
            let mut writer = arrow::csv::Writer::new(std::fs::File::create(&hidden).unwrap());
            writer.write(b).unwrap();
            drop(writer);
            std::fs::rename(&hidden, dir.join(format!("part-{i:03}.csv"))).unwrap();
        }
        std::fs::write(dir.join("notes.txt"), "not a CSV file").unwrap();
        assert_eq!(tail.finish().await.unwrap(), 4, "{backend:?}");
        let mut emitted = Vec::new();
        while let Some(b) = subscription.next_batch().await {
            emitted.push(b);
        }
        let (kept, _) = accepted(&batches, 0);
        let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
        replay.register_batches("tx", kept).unwrap();
        assert_eq!(
            multiset(&emitted),
            multiset(&replay.collect(TUMBLE).await.unwrap()),
            "{backend:?}"
        );
    }
    let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
    let e = engine
        .tail_folder(
            "tx",
            folder.path().join("missing"),
            None,
            Default::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no such file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_of_a_timed_flush_reaches_the_next_push() {
    let engine = Engine::builder().backend(Backend::Cpu).build().unwrap();
    engine
        .sql(
            "CREATE STREAM tx (card BIGINT NOT NULL, amount DECIMAL(12,2) NOT NULL, \
             ts TIMESTAMP, WATERMARK FOR ts AS ts) WITH (flush_interval = '5 ms')",
        )
        .await
        .unwrap();
    engine
        .sql("CREATE CONTINUOUS VIEW v AS SELECT card, ts, card / (card - card) AS boom FROM tx")
        .await
        .unwrap();
    let writer = engine.stream_writer("tx").unwrap();
    let batches = events(400, 200);
    writer.push(batches[0].clone()).await.unwrap();
    // The timer cuts the micro-batch; the view divides by zero.
    let mut waited = 0;
    while engine.streams()[0].timed_failure.is_none() && waited < 1_000 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        waited += 1;
    }
    let failure = engine.streams()[0]
        .timed_failure
        .clone()
        .unwrap_or_default();
    assert!(failure.contains("continuous view 'v'"), "{failure}");
    let e = writer.push(batches[1].clone()).await.unwrap_err();
    assert!(
        e.to_string().contains("cut by its flush interval failed"),
        "{e}"
    );
    assert!(e.to_string().contains("continuous view 'v'"), "{e}");
    // Reported once.
    assert!(engine.streams()[0].timed_failure.is_none());
}

/// A session with stream `tx` cutting a micro-batch for every row, and the TUMBLE view `v`.
async fn declare_eager(backend: Backend) -> Engine {
    let engine = Engine::builder().backend(backend).build().unwrap();
    engine
        .sql(
            "CREATE STREAM tx (card BIGINT NOT NULL, amount DECIMAL(12,2) NOT NULL, \
             ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) \
             WITH (flush_rows = 1)",
        )
        .await
        .unwrap();
    engine
        .sql(&format!("CREATE CONTINUOUS VIEW v AS {TUMBLE}"))
        .await
        .unwrap();
    engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_fed_from_a_reader_equal_the_batch_replay() {
    let batches = events(1_000, 250);
    let (kept, _) = accepted(&batches, 0);
    let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
    replay.register_batches("tx", kept).unwrap();
    let want = multiset(&replay.collect(TUMBLE).await.unwrap());
    let mut csv = Vec::new();
    {
        let mut writer = arrow::csv::Writer::new(&mut csv);
        for b in &batches {
            writer.write(b).unwrap();
        }
    }
    let mut ndjson = Vec::new();
    {
        let mut writer = arrow::json::LineDelimitedWriter::new(&mut ndjson);
        for b in &batches {
            writer.write(b).unwrap();
        }
        writer.finish().unwrap();
    }
    for backend in [Backend::Cpu, Backend::Emulated] {
        for (format, text) in [
            (spate::FileFormat::Csv, csv.clone()),
            (spate::FileFormat::NdJson, ndjson.clone()),
        ] {
            let engine = declare(backend, TUMBLE, "", "").await;
            let mut subscription = engine.subscribe("v").unwrap();
            let feed = engine
                .feed("tx", std::io::Cursor::new(text), format, "events")
                .unwrap();
            assert_eq!(feed.wait().await.unwrap(), 1_000, "{backend:?} {format:?}");
            let mut emitted = Vec::new();
            while let Some(b) = subscription.next_batch().await {
                emitted.push(b);
            }
            assert_eq!(multiset(&emitted), want, "{backend:?} {format:?}");
        }
    }
    // A line that does not parse stops the feed, saying where; the rows before it go in.
    for (text, line, rows) in [
        (
            "card,amount,ts\n1,2.50,2026-01-01T00:00:00\n\n2,3.50,2026-01-01T00:00:01\n1,abc,x\n\
             1,2.50,2026-01-01T00:00:02\n",
            "line 5",
            2,
        ),
        ("card,amount\n1,2.50\n", "line 1", 0),
        // Too few fields, while the line before waits to be handed over.
        (
            "card,amount,ts\n1,2.50,2026-01-01T00:00:00\n2,3.5\n3,1.00,2026-01-01T00:00:01\n",
            "line 3: Csv error: incorrect number of fields",
            1,
        ),
        (
            "card,amount,ts\n1,2.50,2026-01-01T00:00:00\n2,3.5",
            "line 3",
            1,
        ),
    ] {
        let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
        let feed = engine
            .feed(
                "tx",
                std::io::Cursor::new(text.as_bytes().to_vec()),
                spate::FileFormat::Csv,
                "events.csv",
            )
            .unwrap();
        let e = feed.wait().await.unwrap_err();
        assert!(
            e.to_string().contains("events.csv") && e.to_string().contains(line),
            "{text:?}: {e}"
        );
        assert_eq!(engine.streams()[0].events, rows, "{text:?}");
    }
    // A last line without a line break is read; so are Windows line ends after a byte-order
    // mark.
    for (text, rows) in [
        ("card,amount,ts\n1,2.50,2026-01-01T00:00:00", 1),
        (
            "\u{feff}card,amount,ts\r\n1,2.50,2026-01-01T00:00:00\r\n\
             2,3.50,2026-01-01T00:00:01\r\n",
            2,
        ),
    ] {
        let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
        let feed = engine
            .feed(
                "tx",
                std::io::Cursor::new(text.as_bytes().to_vec()),
                spate::FileFormat::Csv,
                "events.csv",
            )
            .unwrap();
        assert_eq!(feed.wait().await.unwrap(), rows, "{text:?}");
    }
    let engine = declare(Backend::Cpu, TUMBLE, "", "").await;
    let e = engine
        .feed("tx", std::io::empty(), spate::FileFormat::Parquet, "x")
        .unwrap_err();
    assert!(e.to_string().contains("CSV or NDJSON"), "{e}");
}

/// A source whose bytes come when the test sends them, as from a pipe.
struct Pipe(std::sync::mpsc::Receiver<Vec<u8>>, Vec<u8>);

impl std::io::Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.1.is_empty() {
            match self.0.recv() {
                Ok(bytes) => self.1 = bytes,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.1.len());
        buf[..n].copy_from_slice(&self.1[..n]);
        self.1.drain(..n);
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_hands_over_rows_as_they_come() {
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = declare_eager(backend).await;
        let mut subscription = engine.subscribe("v").unwrap();
        let (send, receive) = std::sync::mpsc::channel();
        let feed = engine
            .feed(
                "tx",
                Pipe(receive, Vec::new()),
                spate::FileFormat::Csv,
                "pipe",
            )
            .unwrap();
        send.send(b"card,amount,ts\n3,2.50,2026-01-01T00:00:01\n".to_vec())
            .unwrap();
        // Past the window's end and the watermark's delay: the window closes while the
        // source stays open.
        send.send(b"3,1.00,2026-01-01T00:00:15\n".to_vec()).unwrap();
        let first = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            subscription.next_batch(),
        )
        .await
        .unwrap_or_else(|_| panic!("{backend:?}: rows were held back"))
        .unwrap();
        assert_eq!(first.num_rows(), 1, "{backend:?}");
        drop(send);
        assert_eq!(feed.wait().await.unwrap(), 2, "{backend:?}");
    }
}

/// `batches` with every time moved by `micros`.
fn shifted(batches: &[RecordBatch], micros: i64) -> Vec<RecordBatch> {
    batches
        .iter()
        .map(|b| {
            let times = b
                .column(2)
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap();
            let moved: TimestampMicrosecondArray =
                times.iter().map(|t| t.map(|t| t + micros)).collect();
            let mut columns = b.columns().to_vec();
            columns[2] = Arc::new(moved);
            RecordBatch::try_new(b.schema(), columns).unwrap()
        })
        .collect()
}

const INTERVAL_JOIN: &str = "SELECT c.card, c.ts, p.amount, p.ts AS paid FROM clicks c \
                             JOIN pays p ON p.card = c.card \
                             AND p.ts BETWEEN c.ts - INTERVAL '1' SECOND \
                             AND c.ts + INTERVAL '2' SECOND";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_join_of_two_streams_equals_the_replay_and_keeps_rows_bounded() {
    let pays = events(1_500, 150);
    let clicks = shifted(&pays, 700_000);
    let replay = Engine::builder().backend(Backend::Cpu).build().unwrap();
    replay
        .register_batches("pays", accepted(&pays, 0).0)
        .unwrap();
    replay
        .register_batches("clicks", accepted(&clicks, 0).0)
        .unwrap();
    let want = multiset(&replay.collect(INTERVAL_JOIN).await.unwrap());
    assert!(!want.is_empty());
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = Engine::builder().backend(backend).build().unwrap();
        for name in ["clicks", "pays"] {
            engine
                .sql(&format!(
                    "CREATE STREAM {name} (card BIGINT NOT NULL, amount DECIMAL(12,2) NOT NULL, \
                     ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) \
                     WITH (flush_rows = 100000000, flush_interval = '1 hour')"
                ))
                .await
                .unwrap();
        }
        engine
            .sql(&format!("CREATE CONTINUOUS VIEW v AS {INTERVAL_JOIN}"))
            .await
            .unwrap();
        let mut subscription = engine.subscribe("v").unwrap();
        let (to_clicks, to_pays) = (
            engine.stream_writer("clicks").unwrap(),
            engine.stream_writer("pays").unwrap(),
        );
        let mut most_kept = 0;
        for (c, p) in clicks.iter().zip(&pays) {
            to_pays.push(p.clone()).await.unwrap();
            to_pays.flush().await.unwrap();
            to_clicks.push(c.clone()).await.unwrap();
            to_clicks.flush().await.unwrap();
            most_kept = engine
                .streams()
                .iter()
                .map(|s| s.kept_rows)
                .max()
                .unwrap()
                .max(most_kept);
        }
        to_pays.finish().await.unwrap();
        to_clicks.finish().await.unwrap();
        let mut emitted = Vec::new();
        while let Some(b) = subscription.next_batch().await {
            emitted.push(b);
        }
        assert_eq!(multiset(&emitted), want, "{backend:?}");
        assert!(emitted.len() > 2, "{backend:?}: emitted at the end only");
        // About the bound and two micro-batches of each stream, not all 1,500 rows.
        assert!(most_kept < 900, "{backend:?}: kept {most_kept} rows");
    }
    // Without a bound on the times, the view is refused.
    let engine = Engine::new().unwrap();
    for name in ["clicks", "pays"] {
        engine
            .sql(&format!(
                "CREATE STREAM {name} (card BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)"
            ))
            .await
            .unwrap();
    }
    for unbounded in [
        "SELECT c.card, c.ts FROM clicks c JOIN pays p ON p.card = c.card AND p.ts >= c.ts",
        // A time computed under the time column's name is not the stream's time.
        "SELECT c.card, c.ts FROM clicks c JOIN \
         (SELECT card, ts + INTERVAL '1' HOUR AS ts FROM pays) p ON p.card = c.card \
         AND p.ts BETWEEN c.ts - INTERVAL '1' SECOND AND c.ts + INTERVAL '1' SECOND",
    ] {
        let e = engine
            .sql(&format!("CREATE CONTINUOUS VIEW w AS {unbounded}"))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("must bound their times"),
            "{unbounded}: {e}"
        );
    }
    // Through a subquery that passes the time on, the bound is seen.
    engine
        .sql(
            "CREATE CONTINUOUS VIEW w AS SELECT c.card, c.ts FROM clicks c JOIN \
             (SELECT card, ts FROM pays WHERE card > 0) p ON p.card = c.card \
             AND p.ts BETWEEN c.ts - INTERVAL '1' SECOND AND c.ts + INTERVAL '1' SECOND",
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_does_not_read_holds_the_stream_back_and_loses_nothing() {
    let engine = Engine::new().unwrap();
    engine
        .sql(
            "CREATE STREAM s (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts) \
             WITH (flush_rows = 1)",
        )
        .await
        .unwrap();
    engine
        .sql(
            "CREATE CONTINUOUS VIEW w AS SELECT k, window_end, count(*) AS n \
             FROM TUMBLE(s, ts, INTERVAL '1' SECOND) GROUP BY k, window_end",
        )
        .await
        .unwrap();
    let mut subscription = engine.subscribe("w").unwrap();
    let pushes = spate::SUBSCRIPTION_QUEUE + 40;
    let writer = engine.stream_writer("s").unwrap();
    let schema = writer.schema();
    let pusher = tokio::spawn(async move {
        for i in 0..pushes {
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(vec![i as i64])),
                    Arc::new(arrow::array::TimestampNanosecondArray::from(vec![
                        (BASE_MICROS + i as i64 * 10_000_000) * 1_000,
                    ])),
                ],
            )
            .unwrap();
            writer.push(batch).await.unwrap();
        }
        writer.finish().await.unwrap();
    });
    // The micro-batches stop once the queue is full.
    let cut = || engine.streams()[0].micro_batches;
    let mut seen = cut();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = cut();
        if now == seen {
            break;
        }
        seen = now;
    }
    assert!(
        (seen as usize) < pushes,
        "{seen} micro-batches ran with nobody reading"
    );
    // Reading lets it go on; every window arrives.
    let mut windows = 0;
    while let Some(b) = subscription.next_batch().await {
        windows += b.num_rows();
    }
    pusher.await.unwrap();
    assert_eq!(windows, pushes);
}
