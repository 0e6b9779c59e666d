//! Embedding columns (`FixedSizeList<Float32 | Float16, d>`) through the GPU operators on the
//! emulated backend, against the CPU engine: carried by filters, projections, sorts, limits,
//! joins, unions and window functions; kept on the CPU, with the same results, where an
//! embedding is a key or in an expression.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int64Array, StringArray,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use half::f16;
use spate::kernels::reference::Rng;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// `rows` rows: `id`, a category, a 4-float embedding and a 3-half one, a fifth of the
/// embeddings null.
fn table(rows: usize, seed: u64) -> RecordBatch {
    let mut r = Rng::new(seed);
    let set: Vec<bool> = (0..rows).map(|_| !r.chance(0.2)).collect();
    let floats = Float32Array::from_iter_values((0..rows * 4).map(|_| r.below(1000) as f32 / 4.0));
    let halves =
        Float16Array::from_iter_values((0..rows * 3).map(|_| f16::from_f32(r.below(64) as f32)));
    let emb = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        4,
        Arc::new(floats),
        Some(NullBuffer::from(set.clone())),
    )
    .unwrap();
    let small = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float16, true)),
        3,
        Arc::new(halves),
        Some(NullBuffer::from(set.iter().map(|s| !s).collect::<Vec<_>>())),
    )
    .unwrap();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows as i64)),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| ["a", "b", "c"][i % 3]),
        )),
        Arc::new(emb),
        Arc::new(small),
    ];
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("cat", DataType::Utf8, false),
        Field::new("emb", columns[2].data_type().clone(), true),
        Field::new("small", columns[3].data_type().clone(), true),
    ]);
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

fn engine(backend: Backend, batch_bytes: &str) -> Engine {
    let engine = Engine::builder()
        .backend(backend)
        .batch_size(64)
        .target_partitions(2)
        .option("spate.gpu.batch_bytes", batch_bytes)
        .build()
        .unwrap();
    let data = table(300, 7);
    engine
        .register_batches("t", vec![data.slice(0, 150), data.slice(150, 150)])
        .unwrap();
    engine
}

async fn explain(engine: &Engine, sql: &str) -> String {
    ordered(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_ride_through_gpu_operators_as_on_the_cpu() {
    let cpu = engine(Backend::Cpu, "134217728");
    // (query, whether its order is fixed, the GPU operator EXPLAIN must show)
    let queries = [
        (
            "SELECT id, emb, small FROM t WHERE id % 3 = 0 AND cat <> 'b'",
            false,
            "GpuFilterExec",
        ),
        (
            "SELECT id, cat, emb FROM t ORDER BY id DESC LIMIT 17",
            true,
            "GpuSortExec",
        ),
        (
            "SELECT id, small, emb FROM t WHERE id > 20 ORDER BY cat, id",
            true,
            "GpuSortExec",
        ),
        (
            "SELECT a.id, b.emb, b.small FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.cat = 'c'",
            false,
            "GpuHashJoinExec",
        ),
        (
            "SELECT a.id, b.emb FROM t a LEFT JOIN t b ON a.id = b.id + 500",
            false,
            "GpuHashJoinExec",
        ),
        (
            "SELECT id, emb FROM t WHERE id < 10 UNION ALL SELECT id, emb FROM t WHERE id > 290",
            false,
            "GpuUnionExec",
        ),
        (
            "SELECT id, lag(emb) OVER (ORDER BY id) AS before FROM t",
            false,
            "GpuBoundedWindowAggExec",
        ),
    ];
    // A device batch of one row (1 KiB), of a few, and of the whole table.
    for bytes in ["1024", "65536", "134217728"] {
        let gpu = engine(Backend::Emulated, bytes);
        for (sql, ordered_rows, operator) in queries {
            let want = ordered(&cpu.collect(sql).await.unwrap());
            let mut got = ordered(&gpu.collect(sql).await.unwrap());
            let mut want = want;
            if !ordered_rows {
                got.sort();
                want.sort();
            }
            assert!(!want.is_empty(), "{sql}");
            assert_eq!(got, want, "{sql} ({bytes}-byte batches)");
            let plan = explain(&gpu, sql).await;
            assert!(plan.contains(operator), "{sql}: {plan}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_as_a_key_or_in_an_expression_stays_on_the_cpu() {
    let cpu = engine(Backend::Cpu, "134217728");
    let gpu = engine(Backend::Emulated, "65536");
    for sql in [
        "SELECT id FROM t WHERE emb IS NOT NULL AND small IS NULL",
        "SELECT count(*) AS n FROM t GROUP BY emb",
        "SELECT id FROM t ORDER BY emb, id",
        "SELECT a.id FROM t a JOIN t b ON a.emb = b.emb",
    ] {
        let mut want = ordered(&cpu.collect(sql).await.unwrap());
        let mut got = ordered(&gpu.collect(sql).await.unwrap());
        if !sql.contains("ORDER BY") {
            want.sort();
            got.sort();
        }
        assert_eq!(got, want, "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_round_trip_through_parquet_on_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.parquet");
    let data = table(200, 11);
    let mut writer = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        data.schema(),
        None,
    )
    .unwrap();
    writer.write(&data).unwrap();
    writer.close().unwrap();
    let sql = "SELECT id, emb, small FROM items WHERE cat <> 'a' ORDER BY id";
    let mut results = Vec::new();
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = Engine::builder().backend(backend).build().unwrap();
        engine.register("items", &path).await.unwrap();
        let batches = engine.collect(sql).await.unwrap();
        // The columns come back as they were written, element fields included.
        assert_eq!(
            batches[0].schema().field(1).data_type(),
            data.schema().field(2).data_type(),
            "{backend:?}"
        );
        if backend == Backend::Emulated {
            let plan = ordered(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap());
            assert!(plan.join("\n").contains("GpuSortExec"), "{plan:?}");
        }
        results.push(ordered(&batches));
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0].len(), 133);
}
