//! Vector distances and nearest-neighbour queries over embedding columns: `cosine_distance`,
//! `inner_product`/`dot_product` and `array_distance` on fp16, bf16 and fp32 embeddings, on the
//! emulated GPU backend against the CPU engine and against a plain Rust fp32 loop written here
//! (element by element in order, each operation rounded, finished in f64).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array, Int64Array,
    UInt16Array,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, UInt64Type};
use arrow::record_batch::RecordBatch;
use half::f16;
use spate::kernels::reference::Rng;
use spate::{Backend, Engine};

mod common;
use common::ordered;

/// Element types of the test's embedding columns.
#[derive(Clone, Copy, Debug)]
enum Kind {
    F16,
    Bf16,
    F32,
}

/// The rows' vectors as f32, `None` for a NULL row or one holding a NULL element.
struct Column {
    name: &'static str,
    dim: usize,
    rows: Vec<Option<Vec<f32>>>,
}

/// `id`, then `h` (fp16 × 16), `b` (bf16 × 8) and `f` (fp32 × 8) and `g` (fp32 × 8): values
/// are multiples of 1/8, about 10% NULL rows, a few NULL elements, and an all-zero row.
fn table(rows: usize, seed: u64) -> (RecordBatch, Vec<Column>) {
    let mut r = Rng::new(seed);
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(0..rows as i64))];
    let mut columns = Vec::new();
    for (name, kind, dim) in [
        ("h", Kind::F16, 16),
        ("b", Kind::Bf16, 8),
        ("f", Kind::F32, 8),
        ("g", Kind::F32, 8),
    ] {
        let set: Vec<bool> = (0..rows).map(|_| !r.chance(0.1)).collect();
        let mut values: Vec<Option<f32>> = (0..rows * dim)
            .map(|_| (!r.chance(0.005)).then(|| (r.below(128) as f32 - 64.0) / 8.0))
            .collect();
        // Row 7: all zeros (no cosine distance).
        for v in &mut values[7 * dim..8 * dim] {
            *v = Some(0.0);
        }
        let field = match kind {
            Kind::F16 => Field::new("item", DataType::Float16, true),
            Kind::F32 => Field::new("item", DataType::Float32, true),
            Kind::Bf16 => Field::new("item", DataType::UInt16, true)
                .with_metadata([(spate::vector::BFLOAT16_KEY.into(), "true".into())].into()),
        };
        let elements: ArrayRef = match kind {
            Kind::F16 => Arc::new(Float16Array::from_iter(
                values.iter().map(|v| v.map(f16::from_f32)),
            )),
            Kind::F32 => Arc::new(Float32Array::from_iter(values.iter().copied())),
            // Multiples of 1/8 below 8 in magnitude are exact in bf16: its top 16 bits.
            Kind::Bf16 => Arc::new(UInt16Array::from_iter(
                values.iter().map(|v| v.map(|x| (x.to_bits() >> 16) as u16)),
            )),
        };
        let list = FixedSizeListArray::try_new(
            Arc::new(field),
            dim as i32,
            elements,
            Some(NullBuffer::from(set.clone())),
        )
        .unwrap();
        fields.push(Field::new(name, list.data_type().clone(), true));
        arrays.push(Arc::new(list));
        let rows = (0..rows)
            .map(|i| {
                let row = &values[i * dim..(i + 1) * dim];
                (set[i] && row.iter().all(Option::is_some))
                    .then(|| row.iter().map(|v| v.unwrap()).collect())
            })
            .collect();
        columns.push(Column { name, dim, rows });
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
    (batch, columns)
}

/// The reference: the distance in f32 steps, finished in f64.
fn reference(metric: &str, a: &[f32], b: &[f32]) -> Option<f64> {
    let (mut dot, mut sa, mut sb, mut sum) = (0f32, 0f32, 0f32, 0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        sa += x * x;
        sb += y * y;
        let diff = x - y;
        sum += diff * diff;
    }
    match metric {
        "cosine_distance" => (sa != 0.0 && sb != 0.0)
            .then(|| 1.0 - f64::from(dot) / (f64::from(sa).sqrt() * f64::from(sb).sqrt())),
        "inner_product" | "dot_product" => Some(f64::from(dot)),
        _ => Some(f64::from(sum).sqrt()),
    }
}

/// A query vector of `dim` multiples of 1/8, and its SQL literal.
fn query(dim: usize, seed: u64) -> (Vec<f32>, String) {
    let mut r = Rng::new(seed);
    let q: Vec<f32> = (0..dim)
        .map(|_| (r.below(96) as f32 - 40.0) / 8.0)
        .collect();
    let sql = q.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>();
    (q, format!("[{}]", sql.join(", ")))
}

fn engine(backend: Backend, batch_bytes: &str, data: &RecordBatch) -> Engine {
    let engine = Engine::builder()
        .backend(backend)
        .batch_size(128)
        .target_partitions(2)
        .option("spate.gpu.batch_bytes", batch_bytes)
        .build()
        .unwrap();
    let half = data.num_rows() / 2;
    engine
        .register_batches(
            "items",
            vec![
                data.slice(0, half),
                data.slice(half, data.num_rows() - half),
            ],
        )
        .unwrap();
    engine
}

/// `(id, distance)` of each row of a result's first two columns.
fn pairs(batches: &[RecordBatch]) -> Vec<(i64, Option<f64>)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let d = b.column(1).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), d.is_valid(i).then(|| d.value(i))));
        }
    }
    out
}

const METRICS: [&str; 4] = [
    "cosine_distance",
    "inner_product",
    "dot_product",
    "array_distance",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distances_equal_the_cpu_and_an_fp32_loop_bit_for_bit() {
    let (data, columns) = table(500, 3);
    let cpu = engine(Backend::Cpu, "134217728", &data);
    for bytes in ["4096", "134217728"] {
        let gpu = engine(Backend::Emulated, bytes, &data);
        for column in &columns {
            let (q, literal) = query(column.dim, column.dim as u64);
            for metric in METRICS {
                let sql = format!(
                    "SELECT id, {metric}({}, {literal}) AS d FROM items WHERE id >= 0",
                    column.name
                );
                let mut want: Vec<(i64, Option<f64>)> = column
                    .rows
                    .iter()
                    .enumerate()
                    .map(|(i, row)| {
                        (
                            i as i64,
                            row.as_ref().and_then(|v| reference(metric, v, &q)),
                        )
                    })
                    .collect();
                for engine in [&cpu, &gpu] {
                    let mut got = pairs(&engine.collect(&sql).await.unwrap());
                    got.sort_by_key(|p| p.0);
                    want.sort_by_key(|p| p.0);
                    let bits = |v: &[(i64, Option<f64>)]| -> Vec<(i64, Option<u64>)> {
                        v.iter().map(|(i, d)| (*i, d.map(f64::to_bits))).collect()
                    };
                    assert_eq!(bits(&got), bits(&want), "{sql} ({bytes}-byte batches)");
                }
                let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
                assert!(
                    plan.join("\n").contains("GpuProjectionExec"),
                    "{sql}: {plan:?}"
                );
            }
        }
    }
}

/// The `k` nearest rows by `metric` of `column` to `q` (larger is nearer for the inner
/// product), ties by id, among the rows `keep` admits.
fn nearest(
    column: &Column,
    metric: &str,
    q: &[f32],
    k: usize,
    keep: impl Fn(usize) -> bool,
) -> Vec<(i64, Option<f64>)> {
    let mut scored: Vec<(i64, f64)> = column
        .rows
        .iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .filter_map(|(i, row)| Some((i as i64, reference(metric, row.as_ref()?, q)?)))
        .collect();
    let descending = metric == "inner_product";
    scored.sort_by(|a, b| {
        let by = if descending {
            b.1.total_cmp(&a.1)
        } else {
            a.1.total_cmp(&b.1)
        };
        by.then(a.0.cmp(&b.0))
    });
    scored
        .into_iter()
        .take(k)
        .map(|(i, d)| (i, Some(d)))
        .collect()
}

/// Fails unless every operator EXPLAIN places on the CPU is plumbing: the scan, a merge of
/// sorted partitions, or a projection that only selects columns.
fn assert_gpu_top_k(plan: &str, sql: &str) {
    assert!(plan.contains("GpuSortExec: TopK"), "{sql}: {plan}");
    for line in plan.lines().filter(|l| l.contains("[CPU")) {
        let plumbing = ["DataSourceExec", "SortPreservingMergeExec", "only selects"]
            .iter()
            .any(|p| line.contains(p));
        assert!(plumbing, "{sql}: a CPU compute node: {line}\n{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_by_distance_limit_k_is_a_gpu_top_k_equal_to_the_exact_one() {
    let (data, columns) = table(600, 5);
    let cpu = engine(Backend::Cpu, "134217728", &data);
    let gpu = engine(Backend::Emulated, "16384", &data);
    for column in &columns {
        let (q, literal) = query(column.dim, 100 + column.dim as u64);
        for metric in ["cosine_distance", "inner_product", "array_distance"] {
            let order = if metric == "inner_product" {
                "DESC"
            } else {
                "ASC"
            };
            for (k, filter) in [(1, false), (10, true), (100, false), (700, true)] {
                let (filter_sql, keep): (&str, fn(usize) -> bool) = if filter {
                    ("WHERE id % 3 <> 0", |i| i % 3 != 0)
                } else {
                    ("", |_| true)
                };
                let distance = format!("{metric}({}, {literal})", column.name);
                let sql = format!(
                    "SELECT id, {distance} AS d FROM items {filter_sql} \
                     ORDER BY {distance} {order} NULLS LAST, id LIMIT {k}"
                );
                let mut want = nearest(column, metric, &q, k, keep);
                // LIMIT k past the rows with a distance: the NULLs follow, by id.
                let nulls = (0..column.rows.len())
                    .filter(|&i| keep(i))
                    .filter(|&i| {
                        column.rows[i]
                            .as_ref()
                            .and_then(|r| reference(metric, r, &q))
                            .is_none()
                    })
                    .map(|i| (i as i64, None));
                let room = k - want.len();
                want.extend(nulls.take(room));
                for (name, engine) in [("cpu", &cpu), ("emulated", &gpu)] {
                    let got = pairs(&engine.collect(&sql).await.unwrap());
                    assert_eq!(got, want, "{name}: {sql}");
                }
                let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
                assert_gpu_top_k(&plan.join("\n"), &sql);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_k_over_many_rows_narrows_on_the_device_and_stays_exact() {
    // Past the top-k's narrowing threshold (65,536 held rows), in one device batch.
    let (data, columns) = table(80_000, 9);
    let gpu = engine(Backend::Emulated, "134217728", &data);
    let column = &columns[2];
    let (q, literal) = query(column.dim, 77);
    for metric in ["cosine_distance", "array_distance"] {
        let sql =
            format!("SELECT id, {metric}(f, {literal}) AS d FROM items ORDER BY d, id LIMIT 25");
        let want = nearest(column, metric, &q, 25, |_| true);
        assert_eq!(pairs(&gpu.collect(&sql).await.unwrap()), want, "{sql}");
        let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
        assert_gpu_top_k(&plan.join("\n"), &sql);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_embedding_columns_and_vectors_of_different_lengths() {
    let (data, columns) = table(400, 13);
    let cpu = engine(Backend::Cpu, "134217728", &data);
    let gpu = engine(Backend::Emulated, "8192", &data);
    let (f, g) = (&columns[2], &columns[3]);
    for metric in ["cosine_distance", "inner_product", "array_distance"] {
        let sql = format!("SELECT id, {metric}(f, g) AS d FROM items WHERE id >= 0");
        let want: Vec<(i64, Option<u64>)> = (0..400)
            .map(|i| {
                let d = match (&f.rows[i], &g.rows[i]) {
                    (Some(a), Some(b)) => reference(metric, a, b),
                    _ => None,
                };
                (i as i64, d.map(f64::to_bits))
            })
            .collect();
        for engine in [&cpu, &gpu] {
            let mut got = pairs(&engine.collect(&sql).await.unwrap());
            got.sort_by_key(|p| p.0);
            let got: Vec<(i64, Option<u64>)> = got
                .into_iter()
                .map(|(i, d)| (i, d.map(f64::to_bits)))
                .collect();
            assert_eq!(got, want, "{sql}");
        }
        let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap());
        assert!(plan.join("\n").contains("GpuProjectionExec"), "{plan:?}");
    }
    // A query vector of another length fails on both backends, with DataFusion's message.
    for (sql, message) in [
        (
            "SELECT id FROM items WHERE cosine_distance(f, [1.0, 2.0]) < 0.5",
            "same length, got 8 and 2",
        ),
        (
            "SELECT id FROM items WHERE array_distance(f, [1.0, 2.0]) < 0.5",
            "Both arrays must have the same length",
        ),
    ] {
        for engine in [&cpu, &gpu] {
            let err = engine.collect(sql).await.unwrap_err().to_string();
            assert!(err.contains(message), "{sql}: {err}");
        }
    }
    // A query vector holding a NULL: every distance is NULL (array_distance even at another
    // length, as DataFusion's).
    for sql in [
        "SELECT id, inner_product(f, [1.0, NULL, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) AS d FROM items \
         WHERE id >= 0",
        "SELECT id, array_distance(f, [1.0, NULL]) AS d FROM items WHERE id >= 0",
    ] {
        for engine in [&cpu, &gpu] {
            let got = pairs(&engine.collect(sql).await.unwrap());
            assert_eq!(got.len(), 400, "{sql}");
            assert!(got.iter().all(|(_, d)| d.is_none()), "{sql}: {got:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgresql_distance_operator_is_array_distance() {
    let (data, columns) = table(300, 17);
    let (q, literal) = query(8, 4);
    let want = nearest(&columns[2], "array_distance", &q, 5, |_| true);
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = engine(backend, "134217728", &data);
        let text = literal.replace(' ', "");
        for sql in [
            format!("SELECT id, f <-> {literal} AS d FROM items ORDER BY d, id LIMIT 5"),
            format!("SELECT id, items.f<->'{text}' AS d FROM items ORDER BY d, id LIMIT 5"),
            format!("SELECT id, f <-> ARRAY{literal} AS d FROM items ORDER BY d, id LIMIT 5"),
        ] {
            assert_eq!(pairs(&engine.collect(&sql).await.unwrap()), want, "{sql}");
            if backend == Backend::Emulated {
                let plan = ordered(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap());
                assert_gpu_top_k(&plan.join("\n"), &sql);
            }
        }
    }
}

/// `query_row|item_row|rank|distance` of each row of a `vector_topk` result, the distance in
/// Rust's shortest round-trip form (equal text, equal bits).
fn topk_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let [q, i, r] = [0, 1, 2].map(|c| b.column(c).as_primitive::<UInt64Type>());
        let d = b.column(3).as_primitive::<Float64Type>();
        for row in 0..b.num_rows() {
            out.push(format!(
                "{}|{}|{}|{:?}",
                q.value(row),
                i.value(row),
                r.value(row),
                d.value(row)
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_topk_equals_an_exact_loop_on_both_backends() {
    let (data, columns) = table(3000, 21);
    let (queries, query_columns) = table(25, 22);
    let cpu = engine(Backend::Cpu, "134217728", &data);
    // Small device batches: the items arrive in many batches, each merged into the running
    // nearest of every query.
    let gpu = engine(Backend::Emulated, "16384", &data);
    for engine in [&cpu, &gpu] {
        engine
            .register_batches("queries", vec![queries.slice(0, 10), queries.slice(10, 15)])
            .unwrap();
    }
    // fp16 × fp16, bf16 × bf16, two fp32 columns, and bf16 items against fp32 queries.
    for (item, query) in [(0, 0), (1, 1), (2, 3), (1, 2)] {
        let (items, asked) = (&columns[item], &query_columns[query]);
        for (metric, function) in [
            ("cosine", "cosine_distance"),
            ("ip", "inner_product"),
            ("l2", "array_distance"),
        ] {
            for k in [1, 10, 700] {
                let mut want = Vec::new();
                for (q, vector) in asked.rows.iter().enumerate() {
                    let Some(vector) = vector else { continue };
                    let near = nearest(items, function, vector, k, |_| true);
                    for (rank, (id, d)) in near.into_iter().enumerate() {
                        want.push(format!("{q}|{id}|{}|{:?}", rank + 1, d.unwrap()));
                    }
                }
                let sql = format!(
                    "SELECT * FROM vector_topk(items, {}, queries, {}, {k}, {metric}) \
                     ORDER BY query_row, rank",
                    items.name, asked.name
                );
                for (name, engine) in [("cpu", &cpu), ("emulated", &gpu)] {
                    let got = topk_rows(&engine.collect(&sql).await.unwrap());
                    assert_eq!(got.len(), want.len(), "{name}: {sql}");
                    assert_eq!(got, want, "{name}: {sql}");
                }
            }
        }
    }
    let sql = "SELECT * FROM vector_topk('items', 'h', 'queries', 'h', 10, 'cosine')";
    let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap()).join("\n");
    assert!(plan.contains("GpuVectorTopKExec"), "{plan}");
    for line in plan.lines().filter(|l| l.contains("[CPU")) {
        assert!(
            line.contains("DataSourceExec"),
            "a CPU compute node: {line}\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_topk_joins_back_to_its_tables_and_rejects_bad_calls() {
    let (data, _) = table(200, 31);
    let (queries, _) = table(12, 32);
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = engine(backend, "134217728", &data);
        engine
            .register_batches("queries", vec![queries.clone()])
            .unwrap();
        // Positions are rows in the order the tables are read: here the ids.
        let joined = engine
            .collect(
                "SELECT v.query_row, i.id, v.rank FROM vector_topk(items, f, queries, g, 3, l2) v \
                 JOIN items i ON v.item_row = i.id ORDER BY v.query_row, v.rank",
            )
            .await
            .unwrap();
        let direct = engine
            .collect(
                "SELECT query_row, CAST(item_row AS BIGINT), rank \
                 FROM vector_topk(items, f, queries, g, 3, l2) ORDER BY query_row, rank",
            )
            .await
            .unwrap();
        assert_eq!(ordered(&joined), ordered(&direct), "{backend:?}");
        assert!(!ordered(&direct).is_empty());
        // A quoted name keeps its case; a string names a table as SQL would.
        engine
            .collect(r#"CREATE VIEW "MyItems" AS SELECT * FROM items"#)
            .await
            .unwrap();
        for call in [
            r#"vector_topk("MyItems", f, 'queries', 'g', 3, 'l2')"#,
            "vector_topk(public.items, f, queries, g, 3, l2)",
        ] {
            let got = engine
                .collect(&format!(
                    "SELECT query_row, CAST(item_row AS BIGINT), rank FROM {call} \
                     ORDER BY query_row, rank"
                ))
                .await
                .unwrap();
            assert_eq!(ordered(&got), ordered(&direct), "{backend:?}: {call}");
        }
        for (sql, message) in [
            ("vector_topk(items, f, queries, g, 3)", "takes 6 arguments"),
            (
                "vector_topk(nope, f, queries, g, 3, l2)",
                "no table named 'nope'",
            ),
            (
                "vector_topk(items, nope, queries, g, 3, l2)",
                "has no column 'nope'",
            ),
            (
                "vector_topk(items, id, queries, g, 3, l2)",
                "not an embedding",
            ),
            (
                "vector_topk(items, h, queries, g, 3, l2)",
                "16 elements and the queries 8",
            ),
            ("vector_topk(items, f, queries, g, 0, l2)", "1 to 4096"),
            ("vector_topk(items, f, queries, g, 4097, l2)", "1 to 4096"),
            (
                "vector_topk(items, f, queries, g, 'x', l2)",
                "not a whole number",
            ),
            (
                "vector_topk(items, f, queries, g, 3.5, l2)",
                "not a whole number",
            ),
            (
                "vector_topk(items, f, queries, g, 3, hamming)",
                "unknown metric",
            ),
        ] {
            let err = engine
                .collect(&format!("SELECT * FROM {sql}"))
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{backend:?}: {sql}: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_topk_positions_follow_parquet_files_split_over_partitions() {
    let (data, columns) = table(1200, 41);
    let (queries, query_columns) = table(9, 42);
    let dir = tempfile::tempdir().unwrap();
    // Three files, ids in path order, small row groups: DataFusion splits them into byte
    // ranges over three partitions, and the positions must still be the ids.
    for (part, first) in [0, 400, 800].into_iter().enumerate() {
        let path = dir.path().join(format!("part-{part}.parquet"));
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(50))
            .build();
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            data.schema(),
            Some(properties),
        )
        .unwrap();
        writer.write(&data.slice(first, 400)).unwrap();
        writer.close().unwrap();
    }
    let (items, asked) = (&columns[2], &query_columns[3]);
    let mut want = Vec::new();
    for (q, vector) in asked.rows.iter().enumerate() {
        let Some(vector) = vector else { continue };
        for (rank, (id, d)) in nearest(items, "array_distance", vector, 5, |_| true)
            .into_iter()
            .enumerate()
        {
            want.push(format!("{q}|{id}|{}|{:?}", rank + 1, d.unwrap()));
        }
    }
    for backend in [Backend::Cpu, Backend::Emulated] {
        let engine = Engine::builder()
            .backend(backend)
            .target_partitions(3)
            .option("datafusion.optimizer.repartition_file_min_size", "1")
            .option("spate.gpu.batch_bytes", "4096")
            .build()
            .unwrap();
        engine.register("items", dir.path()).await.unwrap();
        engine
            .register_batches("queries", vec![queries.clone()])
            .unwrap();
        let plan = ordered(
            &engine
                .collect("EXPLAIN SELECT * FROM vector_topk(items, f, queries, g, 5, l2)")
                .await
                .unwrap(),
        )
        .join("\n");
        assert!(
            plan.contains("file_groups={3 groups"),
            "{backend:?}: {plan}"
        );
        let got = topk_rows(
            &engine
                .collect("SELECT * FROM vector_topk(items, f, queries, g, 5, l2)")
                .await
                .unwrap(),
        );
        assert_eq!(got, want, "{backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_topk_over_a_filtered_view_numbers_the_views_rows_in_order() {
    let (data, columns) = table(3000, 51);
    let (queries, query_columns) = table(9, 52);
    let kept: Vec<usize> = (0..3000).filter(|i| i % 3 != 0).collect();
    let (items, asked) = (&columns[2], &query_columns[3]);
    let mut want = Vec::new();
    for (q, vector) in asked.rows.iter().enumerate() {
        let Some(vector) = vector else { continue };
        let near = nearest(items, "array_distance", vector, 6, |i| i % 3 != 0);
        for (rank, (id, d)) in near.into_iter().enumerate() {
            let position = kept.binary_search(&(id as usize)).unwrap();
            want.push(format!("{q}|{position}|{}|{:?}", rank + 1, d.unwrap()));
        }
    }
    // One partition of many batches (DataFusion spreads it round-robin under the filter),
    // and two partitions of many batches each.
    let batches: Vec<RecordBatch> = (0..10).map(|b| data.slice(b * 300, 300)).collect();
    for partitions in [
        vec![batches.clone()],
        vec![batches[..5].to_vec(), batches[5..].to_vec()],
    ] {
        // The emulator on two devices too: vector_topk stays on one.
        for (backend, devices) in [
            (Backend::Cpu, 1),
            (Backend::Emulated, 1),
            (Backend::Emulated, 2),
        ] {
            let engine = Engine::builder()
                .backend(backend)
                .devices(spate::Devices::Count(devices))
                .batch_size(128)
                .target_partitions(4)
                .option("spate.gpu.batch_bytes", "4096")
                .build()
                .unwrap();
            engine
                .register_partitions("items", data.schema(), partitions.clone())
                .unwrap();
            engine
                .register_batches("queries", vec![queries.clone()])
                .unwrap();
            engine
                .collect("CREATE VIEW kept AS SELECT id, f FROM items WHERE id % 3 <> 0")
                .await
                .unwrap();
            // The same rows as a union of two filtered halves.
            engine
                .collect(
                    "CREATE VIEW halves AS \
                     SELECT id, f FROM items WHERE id < 1500 AND id % 3 <> 0 UNION ALL \
                     SELECT id, f FROM items WHERE id >= 1500 AND id % 3 <> 0",
                )
                .await
                .unwrap();
            for view in ["kept", "halves"] {
                let sql = format!("SELECT * FROM vector_topk({view}, f, queries, g, 6, l2)");
                // Nothing merges or spreads the view's partitions: it would reorder its rows.
                let plan = ordered(&engine.collect(&format!("EXPLAIN {sql}")).await.unwrap());
                let plan = plan.join("\n");
                assert!(
                    !plan.contains("Coalesce") && !plan.contains("RepartitionExec"),
                    "{backend:?} on {devices} devices: {plan}"
                );
                for run in 0..3 {
                    let got = topk_rows(&engine.collect(&sql).await.unwrap());
                    assert_eq!(
                        got,
                        want,
                        "{view}: {backend:?} on {devices} devices, {} partitions, run {run}",
                        partitions.len()
                    );
                }
            }
        }
    }
}

/// Distance bits of a row by the reference (`None`: no distance).
fn reference_bits(column: &Column, metric: &str, q: &[f32], id: i64) -> Option<u64> {
    let row = column.rows[id as usize].as_ref()?;
    reference(metric, row, q).map(f64::to_bits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_key_distance_top_k_preselects_rows_without_the_distance_column() {
    let (data, columns) = table(3000, 61);
    let cpu = engine(Backend::Cpu, "134217728", &data);
    for bytes in ["16384", "134217728"] {
        let gpu = engine(Backend::Emulated, bytes, &data);
        for column in &columns[..3] {
            let (q, literal) = query(column.dim, 200 + column.dim as u64);
            for metric in ["cosine_distance", "inner_product", "array_distance"] {
                let distance = format!("{metric}({}, {literal})", column.name);
                for (order, k, filter) in [
                    ("ASC NULLS LAST", 1, ""),
                    ("ASC NULLS LAST", 25, "WHERE id % 4 <> 1"),
                    ("ASC NULLS FIRST", 12, ""),
                    ("DESC NULLS LAST", 300, ""),
                    ("DESC NULLS FIRST", 40, "WHERE id % 4 <> 1"),
                    ("DESC", 7, ""),
                ] {
                    // The distance as a projected column, then as the key itself.
                    for sql in [
                        format!(
                            "SELECT id, {distance} AS d FROM items {filter} ORDER BY d {order} \
                             LIMIT {k}"
                        ),
                        format!(
                            "SELECT id FROM items {filter} ORDER BY {distance} {order} LIMIT {k}"
                        ),
                    ] {
                        let ids = |batches: &[RecordBatch]| -> Vec<i64> {
                            batches
                                .iter()
                                .flat_map(|b| {
                                    b.column(0).as_primitive::<Int64Type>().values().to_vec()
                                })
                                .collect()
                        };
                        let want = ids(&cpu.collect(&sql).await.unwrap());
                        let got = ids(&gpu.collect(&sql).await.unwrap());
                        // The same distances in the same order; rows tied on the distance may
                        // differ, as one sort key leaves them open.
                        let bits = |ids: &[i64]| -> Vec<Option<u64>> {
                            ids.iter()
                                .map(|&id| reference_bits(column, metric, &q, id))
                                .collect()
                        };
                        assert_eq!(bits(&got), bits(&want), "{sql}");
                        if !filter.is_empty() {
                            assert!(got.iter().all(|id| id % 4 != 1), "{sql}: {got:?}");
                        }
                        let plan = ordered(&gpu.collect(&format!("EXPLAIN {sql}")).await.unwrap())
                            .join("\n");
                        assert!(plan.contains("GpuNearestExec"), "{sql}: {plan}");
                        assert_gpu_top_k(&plan, &sql);
                    }
                }
            }
        }
    }
}
