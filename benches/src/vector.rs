//! The vector search benchmark (`spate bench vector`): seeded embeddings, nearest-neighbour
//! queries in SQL on a Spate backend, the exact top-k they must equal, and numpy and faiss-cpu
//! as peers over the same vectors (`scripts/vector_peers.py`).
//!
//! The exact top-k is computed here by a plain loop, in the arithmetic the engine documents
//! (`spate::vector`): accumulated in f32 element by element, every operation rounded, finished
//! in f64; nearest first, ties by id. The engine's answer must equal it, ids and distances.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array, Float64Array,
    Int64Array, UInt16Array,
};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, UInt64Type};
use arrow::record_batch::RecordBatch;
use rayon::prelude::*;
use spate::{Backend, Engine};

/// The embedding's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F16,
    Bf16,
    F32,
}

impl Dtype {
    pub fn parse(text: &str) -> Result<Dtype, String> {
        match text {
            "f16" => Ok(Dtype::F16),
            "bf16" => Ok(Dtype::Bf16),
            "f32" => Ok(Dtype::F32),
            other => Err(format!("unknown dtype '{other}': f16, bf16 or f32")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
        }
    }

    /// `x` rounded to the nearest value of this type, as an f32.
    fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
            Dtype::F32 => x,
        }
    }

    fn bytes(self) -> usize {
        if self == Dtype::F32 { 4 } else { 2 }
    }
}

/// The distance the queries order by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Cosine,
    /// Inner product: larger is nearer.
    Ip,
    L2,
}

impl Metric {
    pub fn parse(text: &str) -> Result<Metric, String> {
        match text {
            "cosine" => Ok(Metric::Cosine),
            "ip" => Ok(Metric::Ip),
            "l2" => Ok(Metric::L2),
            other => Err(format!("unknown metric '{other}': cosine, ip or l2")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Ip => "ip",
            Metric::L2 => "l2",
        }
    }

    fn function(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine_distance",
            Metric::Ip => "inner_product",
            Metric::L2 => "array_distance",
        }
    }
}

/// What one run of the benchmark asks.
#[derive(Debug, Clone)]
pub struct Spec {
    pub rows: usize,
    pub dim: usize,
    pub queries: usize,
    pub k: usize,
    pub dtype: Dtype,
    pub metric: Metric,
    /// The fraction of items a `WHERE` keeps, if any.
    pub filter: Option<f64>,
    pub seed: u64,
}

/// The generated items and queries.
#[derive(Debug)]
pub struct Data {
    pub spec: Spec,
    /// `rows × dim` item elements, each already rounded to the dtype.
    pub items: Vec<f32>,
    /// Per item, a uniform number in [0, 1) the filter compares with.
    pub u: Vec<f64>,
    /// `queries × dim` query elements, multiples of 2^-12 (exact in SQL text).
    pub queries: Vec<f32>,
}

impl Data {
    pub fn generate(spec: &Spec) -> Data {
        let mut r = fastrand::Rng::with_seed(spec.seed);
        let items = (0..spec.rows * spec.dim)
            .map(|_| spec.dtype.round(r.f32() * 2.0 - 1.0))
            .collect();
        let u = (0..spec.rows).map(|_| r.f64()).collect();
        let queries = (0..spec.queries * spec.dim)
            .map(|_| (r.i32(-4096..4096)) as f32 / 4096.0)
            .collect();
        Data {
            spec: spec.clone(),
            items,
            u,
            queries,
        }
    }

    fn item(&self, i: usize) -> &[f32] {
        &self.items[i * self.spec.dim..(i + 1) * self.spec.dim]
    }

    pub fn query(&self, q: usize) -> &[f32] {
        &self.queries[q * self.spec.dim..(q + 1) * self.spec.dim]
    }

    fn kept(&self, i: usize) -> bool {
        self.spec.filter.is_none_or(|f| self.u[i] < f)
    }

    /// The items as a table `items(id, u, emb)`, `emb` of the dtype.
    pub fn batch(&self) -> Result<RecordBatch, String> {
        let dim = self.spec.dim;
        let (field, elements): (Field, ArrayRef) = match self.spec.dtype {
            Dtype::F32 => (
                Field::new("item", DataType::Float32, true),
                Arc::new(Float32Array::from(self.items.clone())),
            ),
            Dtype::F16 => (
                Field::new("item", DataType::Float16, true),
                Arc::new(Float16Array::from_iter_values(
                    self.items.iter().map(|&x| half::f16::from_f32(x)),
                )),
            ),
            Dtype::Bf16 => (
                Field::new("item", DataType::UInt16, true).with_metadata(
                    [(spate::vector::BFLOAT16_KEY.to_string(), "true".to_string())].into(),
                ),
                Arc::new(UInt16Array::from_iter_values(
                    self.items
                        .iter()
                        .map(|&x| half::bf16::from_f32(x).to_bits()),
                )),
            ),
        };
        let emb = FixedSizeListArray::try_new(Arc::new(field), dim as i32, elements, None)
            .map_err(|e| e.to_string())?;
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("u", DataType::Float64, false),
            Field::new("emb", emb.data_type().clone(), false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..self.spec.rows as i64)),
                Arc::new(Float64Array::from(self.u.clone())),
                Arc::new(emb),
            ],
        )
        .map_err(|e| e.to_string())
    }

    /// The queries as a table `queries(qid, emb)`, `emb` fp32 (each query's SQL literal is
    /// fp32 too), for `vector_topk`.
    pub fn queries_batch(&self) -> Result<RecordBatch, String> {
        let field = Field::new("item", DataType::Float32, true);
        let elements: ArrayRef = Arc::new(Float32Array::from(self.queries.clone()));
        let emb =
            FixedSizeListArray::try_new(Arc::new(field), self.spec.dim as i32, elements, None)
                .map_err(|e| e.to_string())?;
        let schema = Schema::new(vec![
            Field::new("qid", DataType::Int64, false),
            Field::new("emb", emb.data_type().clone(), false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..self.spec.queries as i64)),
                Arc::new(emb),
            ],
        )
        .map_err(|e| e.to_string())
    }

    /// The one `vector_topk` statement of every query, over the items a filter keeps (the view
    /// `kept`) or all of them.
    pub fn batched_sql(&self) -> String {
        let table = if self.spec.filter.is_some() {
            "kept"
        } else {
            "items"
        };
        format!(
            "SELECT query_row, item_row, distance FROM vector_topk({table}, emb, queries, emb, \
             {}, {})",
            self.spec.k,
            self.spec.metric.name()
        )
    }

    /// The SQL of query `q`.
    pub fn sql(&self, q: usize) -> String {
        let literal: Vec<String> = self
            .query(q)
            .iter()
            .map(|v| f64::from(*v).to_string())
            .collect();
        let distance = format!(
            "{}(emb, [{}])",
            self.spec.metric.function(),
            literal.join(", ")
        );
        let order = if self.spec.metric == Metric::Ip {
            "DESC"
        } else {
            "ASC"
        };
        let filter = self
            .spec
            .filter
            .map_or(String::new(), |f| format!(" WHERE u < {f}"));
        format!(
            "SELECT id, {distance} AS distance FROM items{filter} ORDER BY distance {order} NULLS LAST, id LIMIT {}",
            self.spec.k
        )
    }

    /// The exact top-k of query `q`: (id, distance), nearest first, ties by id.
    pub fn exact(&self, q: usize) -> Vec<(i64, f64)> {
        let query = self.query(q);
        let mut scored: Vec<(i64, f64)> = (0..self.spec.rows)
            .filter(|&i| self.kept(i))
            .filter_map(|i| Some((i as i64, distance(self.spec.metric, self.item(i), query)?)))
            .collect();
        let ip = self.spec.metric == Metric::Ip;
        scored.sort_by(|a, b| {
            let by = if ip {
                b.1.total_cmp(&a.1)
            } else {
                a.1.total_cmp(&b.1)
            };
            by.then(a.0.cmp(&b.0))
        });
        scored.truncate(self.spec.k);
        scored
    }

    /// The bytes one query must read: every item's embedding.
    pub fn scan_bytes(&self) -> usize {
        self.spec.rows * self.spec.dim * self.spec.dtype.bytes()
    }
}

/// A distance in f32 steps, finished in f64 (`None`: a cosine with a zero vector).
fn distance(metric: Metric, a: &[f32], b: &[f32]) -> Option<f64> {
    match metric {
        Metric::Cosine => {
            let (mut dot, mut sa, mut sb) = (0f32, 0f32, 0f32);
            for (&x, &y) in a.iter().zip(b) {
                dot += x * y;
                sa += x * x;
                sb += y * y;
            }
            (sa != 0.0 && sb != 0.0)
                .then(|| 1.0 - f64::from(dot) / (f64::from(sa).sqrt() * f64::from(sb).sqrt()))
        }
        Metric::Ip => Some(f64::from(a.iter().zip(b).fold(0f32, |s, (x, y)| s + x * y))),
        Metric::L2 => Some(
            f64::from(a.iter().zip(b).fold(0f32, |s, (x, y)| {
                let d = x - y;
                s + d * d
            }))
            .sqrt(),
        ),
    }
}

/// One engine's run of every query.
#[derive(Debug)]
pub struct EngineRun {
    /// The backend the queries ran on (`auto` resolved).
    pub backend: Backend,
    pub selection: String,
    /// Time of each query, after one untimed warm-up (kernel compiles).
    pub times: Vec<Duration>,
    /// Each query's rows: (id, distance).
    pub results: Vec<Vec<(i64, Option<f64>)>>,
    /// Whether EXPLAIN of the first query shows a GPU top-k.
    pub gpu_top_k: bool,
}

/// An engine on `backend` with the table `items`, cached on the device on a GPU backend (so
/// the items cross the bus once), and its selection line.
async fn items_engine(backend: Backend, data: &Data) -> Result<(Engine, String), String> {
    let err = |e: spate::SpateError| e.to_string();
    let engine = Engine::builder().backend(backend).build().map_err(err)?;
    let selection = engine.backend().to_string();
    engine
        .register_batches("items", vec![data.batch()?])
        .map_err(err)?;
    if engine.backend().resolved != Backend::Cpu {
        engine.cache_table("items").await.map_err(err)?;
    }
    Ok((engine, selection))
}

/// The text of `EXPLAIN sql`.
async fn explain(engine: &Engine, sql: &str) -> Result<String, String> {
    let plan = engine
        .collect(&format!("EXPLAIN {sql}"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(arrow::util::pretty::pretty_format_batches(&plan)
        .map_err(|e| e.to_string())?
        .to_string())
}

/// Runs every query of `data` on `backend`, one statement each.
pub async fn run_engine(backend: Backend, data: &Data) -> Result<EngineRun, String> {
    let err = |e: spate::SpateError| e.to_string();
    let (engine, selection) = items_engine(backend, data).await?;
    let resolved = engine.backend().resolved;
    let plan = explain(&engine, &data.sql(0)).await?;
    engine.collect(&data.sql(0)).await.map_err(err)?;
    let mut times = Vec::with_capacity(data.spec.queries);
    let mut results = Vec::with_capacity(data.spec.queries);
    for q in 0..data.spec.queries {
        let sql = data.sql(q);
        let start = Instant::now();
        let batches = engine.collect(&sql).await.map_err(err)?;
        times.push(start.elapsed());
        results.push(rows(&batches));
    }
    Ok(EngineRun {
        backend: resolved,
        selection,
        times,
        results,
        gpu_top_k: plan.contains("GpuSortExec: TopK"),
    })
}

/// Runs every query of `data` on `backend` as one `vector_topk` statement: one untimed run
/// (kernel compiles), then three timed ones; `times` holds the median's time per query.
pub async fn run_engine_batched(backend: Backend, data: &Data) -> Result<EngineRun, String> {
    let err = |e: spate::SpateError| e.to_string();
    let (engine, selection) = items_engine(backend, data).await?;
    let resolved = engine.backend().resolved;
    engine
        .register_batches("queries", vec![data.queries_batch()?])
        .map_err(err)?;
    if let Some(f) = data.spec.filter {
        engine
            .collect(&format!(
                "CREATE VIEW kept AS SELECT emb FROM items WHERE u < {f}"
            ))
            .await
            .map_err(err)?;
    }
    let sql = data.batched_sql();
    let plan = explain(&engine, &sql).await?;
    engine.collect(&sql).await.map_err(err)?;
    let mut runs = Vec::new();
    let mut last = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        last = engine.collect(&sql).await.map_err(err)?;
        runs.push(start.elapsed());
    }
    runs.sort();
    let per_query = runs[1] / data.spec.queries.max(1) as u32;
    // Positions among the kept items, in table order, back to ids.
    let ids: Vec<i64> = (0..data.spec.rows)
        .filter(|&i| data.kept(i))
        .map(|i| i as i64)
        .collect();
    let mut results = vec![Vec::new(); data.spec.queries];
    for b in &last {
        let q = b.column(0).as_primitive::<UInt64Type>();
        let item = b.column(1).as_primitive::<UInt64Type>();
        let d = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let id = ids.get(item.value(i) as usize).copied().unwrap_or(-1);
            if let Some(rows) = results.get_mut(q.value(i) as usize) {
                rows.push((id, Some(d.value(i))));
            }
        }
    }
    Ok(EngineRun {
        backend: resolved,
        selection,
        times: vec![per_query; data.spec.queries],
        results,
        gpu_top_k: plan.contains("GpuVectorTopKExec"),
    })
}

fn rows(batches: &[RecordBatch]) -> Vec<(i64, Option<f64>)> {
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

/// How many of `run`'s queries equal the exact top-k, ids and distances (bit for bit).
pub fn verify(data: &Data, run: &EngineRun) -> usize {
    (0..data.spec.queries)
        .into_par_iter()
        .filter(|&q| {
            let want: Vec<(i64, Option<u64>)> = data
                .exact(q)
                .into_iter()
                .map(|(i, d)| (i, Some(d.to_bits())))
                .collect();
            let got: Vec<(i64, Option<u64>)> = run.results[q]
                .iter()
                .map(|(i, d)| (*i, d.map(f64::to_bits)))
                .collect();
            got == want
        })
        .count()
}

/// A peer's result: queries per second and each query's ids, or why it did not run.
#[derive(Debug)]
pub enum Peer {
    Ran { qps: f64, ids: Vec<Vec<i64>> },
    Skipped(String),
}

/// Runs numpy and faiss over `data` with `python` (scripts in `root`), files in `dir`.
pub fn run_peers(
    python: &Path,
    root: &Path,
    dir: &Path,
    data: &Data,
) -> Result<Vec<(String, Peer)>, String> {
    let dim = data.spec.dim;
    let write =
        |name: &str, shape: &[usize], descr: &str, bytes: &[u8]| -> Result<PathBuf, String> {
            let path = dir.join(name);
            write_npy(&path, shape, descr, bytes)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };
    let as_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let items = write(
        "items.npy",
        &[data.spec.rows, dim],
        "<f4",
        &as_bytes(&data.items),
    )?;
    let queries = write(
        "queries.npy",
        &[data.spec.queries, dim],
        "<f4",
        &as_bytes(&data.queries),
    )?;
    let mut command = Command::new(python);
    command
        .arg(root.join("scripts/vector_peers.py"))
        .arg("--items")
        .arg(&items)
        .arg("--queries")
        .arg(&queries)
        .args(["--k", &data.spec.k.to_string()])
        .args(["--metric", data.spec.metric.name()]);
    if data.spec.filter.is_some() {
        let mask: Vec<u8> = (0..data.spec.rows)
            .map(|i| u8::from(data.kept(i)))
            .collect();
        command
            .arg("--mask")
            .arg(write("mask.npy", &[data.spec.rows], "|b1", &mask)?);
    }
    let output = command
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !output.status.success() {
        return Err(format!(
            "scripts/vector_peers.py failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("scripts/vector_peers.py printed no JSON: {e}"))?;
    let mut peers = Vec::new();
    for name in ["numpy", "faiss"] {
        let peer = &json[name];
        let result = if let Some(why) = peer["skipped"].as_str() {
            Peer::Skipped(why.to_string())
        } else {
            let ids = peer["ids"]
                .as_array()
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            r.as_array()
                                .map(|v| v.iter().filter_map(|x| x.as_i64()).collect())
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default();
            Peer::Ran {
                qps: peer["qps"].as_f64().unwrap_or(0.0),
                ids,
            }
        };
        peers.push((name.to_string(), result));
    }
    Ok(peers)
}

/// Writes a `.npy` file (format 1.0) of a C-ordered array.
fn write_npy(path: &Path, shape: &[usize], descr: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    file.write_all(b"\x93NUMPY\x01\x00")?;
    file.write_all(&(header.len() as u16).to_le_bytes())?;
    file.write_all(header.as_bytes())?;
    file.write_all(bytes)?;
    file.flush()
}

/// How many of a peer's queries found the same ids as the exact top-k (as sets: a peer's
/// floating-point order may swap near ties).
pub fn peer_agreement(data: &Data, ids: &[Vec<i64>]) -> usize {
    (0..data.spec.queries.min(ids.len()))
        .filter(|&q| {
            let mut want: Vec<i64> = data.exact(q).into_iter().map(|(i, _)| i).collect();
            let mut got = ids[q].clone();
            want.sort_unstable();
            got.sort_unstable();
            want == got
        })
        .count()
}
