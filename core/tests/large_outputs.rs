//! Joins whose output is far larger than a device batch: the shape of TPC-DS q72, where
//! inventory joins catalog sales on the item, a residual filter compares quantities, and the
//! item's description is carried through (at SF 1 that was 2.4 GB of strings in one batch,
//! more than 32-bit offsets address). The GPU cuts each probe batch's output into chunks of
//! about `spate.gpu.batch_bytes`; here the bound is lowered so that a small table shows it.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// 400 items over 8 hot keys, each with a 120-byte description.
fn items() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("i_key", DataType::Int32, false),
        Field::new("i_quantity", DataType::Int32, false),
        Field::new("i_desc", DataType::Utf8, true),
    ]));
    let n = 400;
    let key: Vec<i32> = (0..n).map(|i| i % 8).collect();
    let quantity: Vec<i32> = (0..n).map(|i| (i * 37) % 100).collect();
    let desc: Vec<Option<String>> = (0..n)
        .map(|i| (i % 17 != 0).then(|| format!("{i:04}-{}", "description ".repeat(10))))
        .collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int32Array::from(key)) as ArrayRef,
            Arc::new(Int32Array::from(quantity)),
            Arc::new(StringArray::from(desc)),
        ],
    )
    .unwrap()
}

/// 3000 sales over the same keys.
fn sales() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("s_key", DataType::Int32, false),
        Field::new("s_quantity", DataType::Int32, false),
        Field::new("s_store", DataType::Utf8, false),
    ]));
    let n = 3000;
    let key: Vec<i32> = (0..n).map(|i| (i * 7) % 9).collect();
    let quantity: Vec<i32> = (0..n).map(|i| (i * 53) % 100).collect();
    let store: Vec<String> = (0..n).map(|i| format!("store {}", i % 5)).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int32Array::from(key)) as ArrayRef,
            Arc::new(Int32Array::from(quantity)),
            Arc::new(StringArray::from(store)),
        ],
    )
    .unwrap()
}

fn engine(backend: Backend) -> Engine {
    let e = Engine::builder()
        .backend(backend)
        .target_partitions(2)
        .build()
        .unwrap();
    e.register_batches("items", vec![items()]).unwrap();
    e.register_batches("sales", vec![sales()]).unwrap();
    e
}

const BOUND: usize = 64 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_strings_outgrow_a_batch_comes_out_in_bounded_chunks() {
    let gpu = engine(Backend::Emulated);
    let cpu = engine(Backend::Cpu);
    gpu.collect(&format!("SET spate.gpu.batch_bytes = {BOUND}"))
        .await
        .unwrap();
    gpu.collect("SET spate.gpu.fallback = 'error'")
        .await
        .unwrap();
    // About 150 000 pairs of 120-byte descriptions: 18 MB of strings, 280 times the bound.
    let queries = [
        "SELECT i_desc, s_store, count(*) AS n, sum(s_quantity) AS q FROM items \
         JOIN sales ON i_key = s_key AND i_quantity < s_quantity GROUP BY i_desc, s_store \
         ORDER BY i_desc, s_store",
        "SELECT i_desc, count(s_key) AS n FROM items LEFT JOIN sales ON i_key = s_key \
         AND i_quantity > s_quantity + 90 GROUP BY i_desc ORDER BY i_desc",
        "SELECT s_store, count(i_desc) AS n, sum(length(i_desc)) AS l FROM items RIGHT JOIN sales \
         ON i_key = s_key AND i_quantity * 2 < s_quantity GROUP BY s_store ORDER BY s_store",
        "SELECT count(*), sum(length(i_desc)) FROM items FULL JOIN sales ON i_key = s_key",
    ];
    for sql in queries {
        assert_eq!(
            ordered(&gpu.collect(sql).await.unwrap()),
            ordered(&cpu.collect(sql).await.unwrap()),
            "{sql}"
        );
    }
    let plan = ordered(
        &gpu.collect(&format!("EXPLAIN ANALYZE {}", queries[0]))
            .await
            .unwrap(),
    )
    .join("\n");
    let join = plan
        .lines()
        .find(|l| l.contains("GpuHashJoinExec"))
        .unwrap_or_else(|| panic!("the join runs on the GPU: {plan}"));
    let metric = |name: &str| -> usize {
        let at = join
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {join}"));
        let digits: String = join[at + name.len() + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    assert!(metric("output_batches") > 50, "{join}");
    // Each chunk holds about the bound (the estimate is per row on average).
    assert!(metric("largest_output_bytes") <= 4 * BOUND, "{join}");
}
