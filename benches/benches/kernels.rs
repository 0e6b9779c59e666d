//! Criterion micro-benchmarks, one group per kernel family: `scan`, `compaction`, `hash`, `sort`,
//! `aggregate` (the grouped-aggregation inner loop) and `join` (hash join build + probe).
//!
//! On a machine with an NVIDIA GPU (the `cuda` backend is picked when discovery finds a device):
//!
//! ```text
//! cargo bench -p spate-bench --bench kernels
//! cargo bench -p spate-bench --bench kernels -- sort      # one group (criterion's filter)
//! ```
//!
//! On a host without one, the host emulator runs the same kernels. That checks the benches, not
//! speed: the numbers describe the emulator only.
//!
//! ```text
//! SPATE_BENCH_BACKEND=emulated SPATE_BENCH_ROWS=1000000 cargo bench -p spate-bench --bench kernels
//! ```
//!
//! Settings, from the environment:
//!
//! - `SPATE_BENCH_BACKEND`: `cuda` or `emulated`. Unset: `cuda` when a device is discovered;
//!   otherwise one `kernels: SKIPPED: no GPU (...)` line is printed and the bench exits with
//!   success, running nothing. A backend asked for (or a discovered device) that cannot be
//!   opened is an error.
//! - `SPATE_BENCH_ROWS`: comma-separated row counts, e.g. `1000000,16M` (`K` = 2^10, `M` = 2^20).
//!   Default on `cuda`: 1M, 16M, 64M and 256M; a size whose working set does not fit in the
//!   device's memory budget is skipped with a printed note. Default on `emulated`: 1M. In
//!   criterion's test mode (no `--bench` argument, as under `cargo test --benches`, where every
//!   benchmark runs once) the default is 64K rows so CI stays fast.
//!
//! What is measured: every iteration issues the operation and then synchronizes its stream (or,
//! for the engine groups, collects the query's result to the host), so the wall time criterion
//! records is the real completion time, launch overhead and stream-ordered allocation included.
//! Throughput is `Throughput::BytesDecimal`: the bytes the operation must read and write at
//! least (each input once, each output once), so criterion prints GB/s (10^9 bytes per second)
//! comparable with the device's copy bandwidth, as `spate_kernels::throughput` does. Algorithms
//! that make several passes (reduce-then-scan, the radix sort's per-digit passes) move more
//! than that; the figure is an effective bandwidth, not a measure of memory traffic.
//!
//! Input data is random (never zeros) and seeded. A benchmark prepares its data the first time
//! criterion runs it (so `--list` and a filter cost nothing for the others): it generates the
//! input on the host, uploads it (the engine groups register their tables and cache them in
//! GPU memory), runs the operation once and checks a cheap property of the result (the last
//! prefix sum, the kept count, the smallest and largest sorted key, the query's result) before
//! any timing. The data is dropped when the benchmark is done, so only one benchmark's data is
//! resident at a time.

use std::cell::OnceCell;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::datatypes::{Field, Int64Type, Schema};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use spate::{Backend, CacheLocation, Engine};
use spate_kernels::compact::{self, Mask};
use spate_kernels::hash::{self, HashColumn};
use spate_kernels::{
    BackendKind, Device, DeviceBitmap, DeviceBuffer, DeviceCopy, DeviceOptions, KernelError,
    Stream, probe, reference, scan, sort,
};
use tokio::runtime::Runtime;

/// Chooses the backend: `cuda` or `emulated`.
const BACKEND_ENV: &str = "SPATE_BENCH_BACKEND";
/// Overrides the row counts: a comma-separated list.
const ROWS_ENV: &str = "SPATE_BENCH_ROWS";

const MI: usize = 1 << 20;
const CUDA_ROWS: [usize; 4] = [MI, 16 * MI, 64 * MI, 256 * MI];
/// The emulator runs a GPU grid on a few host threads: one size is plenty.
const EMULATED_ROWS: [usize; 1] = [MI];
/// Rows per benchmark in criterion's test mode (`cargo test --benches`).
const TEST_MODE_ROWS: usize = 1 << 16;

/// Distinct keys of the aggregation benchmark.
const AGG_GROUPS: u32 = 1000;
/// Aggregated values are below this, so no SUM can overflow i64 at any size benchmarked.
const AGG_VALUE_BOUND: u32 = 1_000_000;
/// The join's build side has `rows / JOIN_BUILD_FRACTION` unique keys (6.25%).
const JOIN_BUILD_FRACTION: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Criterion's own rule (`configure_from_args`): without `--bench` it runs each benchmark
    // once as a test; `cargo bench` passes `--bench`, `cargo test --benches` does not.
    let test_mode = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");

    let backend = match choose_backend() {
        Ok(Some(backend)) => backend,
        Ok(None) => return,
        Err(message) => fail(&message),
    };
    let sizes = row_counts(backend, test_mode).unwrap_or_else(|message| fail(&message));
    let mut criterion = configure(backend);

    let budget_bytes = {
        let device = Device::open(backend, DeviceOptions::default())
            .unwrap_or_else(|e| fail(&format!("could not open the {backend} device: {e}")));
        println!("kernels: {}", device.description());
        let stream = device
            .new_stream()
            .unwrap_or_else(|e| fail(&format!("could not create a stream: {e}")));
        bench_scan(&mut criterion, &stream, &sizes);
        bench_compaction(&mut criterion, &stream, &sizes);
        bench_hash(&mut criterion, &stream, &sizes);
        bench_sort(&mut criterion, &stream, &sizes);
        // The device and its stream are dropped here, before the engine opens its own device
        // (with the same default budget), so no buffer of theirs is still held.
        device.memory_stats().budget_bytes
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the engine benchmarks");
    let engine = LazyEngine::new(backend, &sizes);
    bench_aggregate(&mut criterion, &runtime, &engine, budget_bytes, &sizes);
    bench_join(&mut criterion, &runtime, &engine, budget_bytes, &sizes);

    criterion.final_summary();
}

fn fail(message: &str) -> ! {
    eprintln!("kernels: {message}");
    std::process::exit(1)
}

/// The backend to run on, or `None` after printing why the benchmarks are skipped.
fn choose_backend() -> Result<Option<BackendKind>, String> {
    let requested = match std::env::var(BACKEND_ENV) {
        Ok(v) => v.trim().to_ascii_lowercase(),
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(e) => return Err(format!("{BACKEND_ENV}: {e}")),
    };
    match requested.as_str() {
        "cuda" => Ok(Some(BackendKind::Cuda)),
        "emulated" => Ok(Some(BackendKind::Emulated)),
        "" => match probe::discover() {
            Ok(_) => Ok(Some(BackendKind::Cuda)),
            Err(e) => {
                let reason = match e {
                    KernelError::NoDevice { reason } => reason,
                    other => other.to_string(),
                };
                println!(
                    "kernels: SKIPPED: no GPU ({reason}); set {BACKEND_ENV}=emulated to run on \
                     the host emulator"
                );
                Ok(None)
            }
        },
        other => Err(format!(
            "{BACKEND_ENV}={other:?} is not a backend; use cuda or emulated (or leave it unset \
             to use a GPU when one is present)"
        )),
    }
}

/// The row counts to benchmark, from `SPATE_BENCH_ROWS` or the backend's defaults.
fn row_counts(backend: BackendKind, test_mode: bool) -> Result<Vec<usize>, String> {
    if let Ok(list) = std::env::var(ROWS_ENV)
        && !list.trim().is_empty()
    {
        return list.split(',').map(parse_rows).collect();
    }
    Ok(match (test_mode, backend) {
        (true, _) => vec![TEST_MODE_ROWS],
        (false, BackendKind::Cuda) => CUDA_ROWS.to_vec(),
        (false, BackendKind::Emulated) => EMULATED_ROWS.to_vec(),
    })
}

/// `1000000`, `64K` or `16M` (binary suffixes).
fn parse_rows(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, scale) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&text[..i], 1 << 20),
        _ => (text, 1),
    };
    let rows = digits
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{ROWS_ENV}: {text:?} is not a row count like 1000000 or 16M"))?;
    // Device batches index rows with u32 (see `compact.rs` and `sort.rs`).
    if rows == 0 || rows >= u32::MAX as usize {
        return Err(format!(
            "{ROWS_ENV}: {text:?} rows is out of range (1 to 2^32 - 2 rows)"
        ));
    }
    Ok(rows)
}

/// `16M`, `64K`, or the plain number.
fn rows_label(rows: usize) -> String {
    if rows >= MI && rows.is_multiple_of(MI) {
        format!("{}M", rows / MI)
    } else if rows >= 1 << 10 && rows.is_multiple_of(1 << 10) {
        format!("{}K", rows >> 10)
    } else {
        rows.to_string()
    }
}

/// Few samples (the large sizes take long), and a measurement time that suits the backend.
/// Command-line options (`--sample-size`, `--measurement-time`) still override these.
fn configure(backend: BackendKind) -> Criterion {
    let measurement = match backend {
        BackendKind::Cuda => Duration::from_secs(3),
        BackendKind::Emulated => Duration::from_secs(10),
    };
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(measurement)
        .configure_from_args()
}

/// One benchmark: what runs, over how many rows, the bytes it must read and write at least
/// (its throughput) and about how much device memory it needs (to skip sizes that do not fit).
struct Case<'a> {
    name: &'a str,
    rows: usize,
    bytes: u64,
    device_bytes: u64,
}

impl Case<'_> {
    /// Whether the case fits in `free_bytes` of device memory; prints a note if not.
    fn fits(&self, free_bytes: usize) -> bool {
        if self.device_bytes <= free_bytes as u64 {
            return true;
        }
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        println!(
            "kernels: skipping {} rows={}: it needs about {:.1} GiB of device memory and the \
             budget has {:.1} GiB free",
            self.name,
            rows_label(self.rows),
            gib(self.device_bytes),
            gib(free_bytes as u64)
        );
        false
    }

    /// Sets the group's throughput to this case's bytes and returns its id (`name/rows=16M`).
    fn start(&self, group: &mut BenchmarkGroup<'_, WallTime>) -> BenchmarkId {
        group.throughput(Throughput::BytesDecimal(self.bytes));
        BenchmarkId::new(self.name, format!("rows={}", rows_label(self.rows)))
    }
}

/// Benchmarks `op` on `stream` over the data `prepare` returns. `prepare` runs the first time
/// criterion runs the benchmark (never for one that is filtered out or only listed); it
/// uploads the input, runs the operation once and checks its result. Each timed iteration
/// runs `op` and waits for the stream, so the time is the operation's completion, not its
/// launch; the output is freed (stream-ordered) inside the iteration, as an operator frees it.
fn bench_kernel<D, T>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    stream: &Stream,
    case: Case<'_>,
    prepare: impl FnOnce() -> D,
    mut op: impl FnMut(&D) -> spate_kernels::Result<T>,
) {
    if !case.fits(stream.device().memory_stats().free_bytes()) {
        return;
    }
    let id = case.start(group);
    let name = case.name;
    let mut prepare = Some(prepare);
    let mut data = None;
    group.bench_function(id, |b| {
        let data = data.get_or_insert_with(|| prepare.take().expect("prepared only once")());
        b.iter(|| {
            let out = op(data).unwrap_or_else(|e| panic!("{name}: {e}"));
            drop(out);
            stream
                .synchronize()
                .unwrap_or_else(|e| panic!("{name}: synchronize: {e}"));
        })
    });
}

fn upload<T: DeviceCopy>(stream: &Stream, data: &[T]) -> DeviceBuffer<T> {
    stream
        .from_host(data)
        .unwrap_or_else(|e| panic!("upload of {} values: {e}", data.len()))
}

/// Element `i` of a device buffer, read back to the host.
fn element<T: DeviceCopy + Default>(stream: &Stream, buffer: &DeviceBuffer<T>, i: usize) -> T {
    let slice = buffer
        .slice(i..i + 1)
        .unwrap_or_else(|e| panic!("element {i} of {}: {e}", buffer.len()));
    stream.to_vec(slice).expect("read back one element")[0]
}

/// `scan`: exclusive prefix sums of random u32 and u64 columns. Bytes: n values read, n sums
/// written (the reduce-then-scan reads the input twice).
fn bench_scan(c: &mut Criterion, stream: &Stream, sizes: &[usize]) {
    let mut group = c.benchmark_group("scan");
    for &n in sizes {
        let rows = n as u64;
        let case = Case {
            name: "exclusive_sum u32",
            rows: n,
            bytes: 2 * 4 * rows,
            device_bytes: 2 * 4 * rows + rows / 64,
        };
        let prepare = || {
            let host = reference::random_u32(n, 11, u32::MAX);
            let values = upload(stream, &host);
            let sums = scan::exclusive_sum(stream, values.as_slice()).expect("scan u32");
            let expected = host[..n - 1].iter().fold(0u32, |a, v| a.wrapping_add(*v));
            assert_eq!(
                element(stream, &sums, n - 1),
                expected,
                "last u32 prefix sum"
            );
            values
        };
        bench_kernel(&mut group, stream, case, prepare, |values| {
            scan::exclusive_sum(stream, values.as_slice())
        });

        let case = Case {
            name: "exclusive_sum u64",
            rows: n,
            bytes: 2 * 8 * rows,
            device_bytes: 2 * 8 * rows + rows / 32,
        };
        let prepare = || {
            let host = reference::random_u64(n, 12);
            let values = upload(stream, &host);
            let sums = scan::exclusive_sum(stream, values.as_slice()).expect("scan u64");
            let expected = host[..n - 1].iter().fold(0u64, |a, v| a.wrapping_add(*v));
            assert_eq!(
                element(stream, &sums, n - 1),
                expected,
                "last u64 prefix sum"
            );
            values
        };
        bench_kernel(&mut group, stream, case, prepare, |values| {
            scan::exclusive_sum(stream, values.as_slice())
        });
    }
    group.finish();
}

/// A random 50% bitmap mask over `n` rows, on the device, and the number of rows it keeps.
fn half_mask(stream: &Stream, n: usize) -> (DeviceBuffer<u8>, usize) {
    let host = reference::random_bitmap(n, 0, 22, 0.5);
    let kept = (0..n)
        .filter(|&i| reference::bit(Some(&host), 0, i))
        .count();
    (upload(stream, &host), kept)
}

/// `compaction`: keeping the rows a random 50% bitmap mask selects, as u64 values and as u32
/// indices. Bytes: the values and the mask read once, the kept values (or indices) written,
/// counting the nominal n/2 kept rows (the actual count differs by about sqrt(n)).
fn bench_compaction(c: &mut Criterion, stream: &Stream, sizes: &[usize]) {
    let mut group = c.benchmark_group("compaction");
    for &n in sizes {
        let (rows, mask_bytes) = (n as u64, (n as u64).div_ceil(8));
        let case = Case {
            name: "compact_values u64 keep=50%",
            rows: n,
            bytes: 8 * rows + mask_bytes + 8 * (rows / 2),
            device_bytes: 8 * rows + mask_bytes + 8 * rows + rows / 64,
        };
        let prepare = || {
            let values = upload(stream, &reference::random_u64(n, 21));
            let (mask, kept) = half_mask(stream, n);
            let out = compact::compact_values(
                stream,
                values.as_slice(),
                Mask::Bits(DeviceBitmap::new(&mask)),
                None,
            )
            .expect("compact u64");
            assert_eq!(out.len(), kept, "rows kept by compact_values");
            (values, mask)
        };
        bench_kernel(&mut group, stream, case, prepare, |(values, mask)| {
            let mask = Mask::Bits(DeviceBitmap::new(mask));
            compact::compact_values(stream, values.as_slice(), mask, None)
        });

        let case = Case {
            name: "select_indices keep=50%",
            rows: n,
            bytes: mask_bytes + 4 * (rows / 2),
            device_bytes: mask_bytes + 4 * rows + rows / 64,
        };
        let prepare = || {
            let (mask, kept) = half_mask(stream, n);
            let out =
                compact::select_indices(stream, Mask::Bits(DeviceBitmap::new(&mask)), None, n)
                    .expect("select indices");
            assert_eq!(out.len(), kept, "rows kept by select_indices");
            mask
        };
        bench_kernel(&mut group, stream, case, prepare, |mask| {
            compact::select_indices(stream, Mask::Bits(DeviceBitmap::new(mask)), None, n)
        });
    }
    group.finish();
}

/// `hash`: 64-bit row hashes (XXH64 per value, combined) of one random u64 key column and of
/// two. Bytes: the key columns read once, one u64 hash per row written.
fn bench_hash(c: &mut Criterion, stream: &Stream, sizes: &[usize]) {
    let mut group = c.benchmark_group("hash");
    for &n in sizes {
        let rows = n as u64;
        for columns in [1u64, 2] {
            let name = if columns == 1 {
                "hash_columns u64"
            } else {
                "hash_columns u64,u64"
            };
            let case = Case {
                name,
                rows: n,
                bytes: (columns * 8 + 8) * rows,
                device_bytes: (columns * 8 + 8) * rows,
            };
            let prepare = || {
                let keys: Vec<DeviceBuffer<u64>> = (0..columns)
                    .map(|c| upload(stream, &reference::random_u64(n, 31 + c)))
                    .collect();
                let hashes = hash::hash_columns(stream, &key_columns(&keys), hash::DEFAULT_SEED)
                    .expect("hash");
                assert_eq!(hashes.len(), n, "one hash per row");
                keys
            };
            bench_kernel(&mut group, stream, case, prepare, |keys| {
                hash::hash_columns(stream, &key_columns(keys), hash::DEFAULT_SEED)
            });
        }
    }
    group.finish();
}

fn key_columns(keys: &[DeviceBuffer<u64>]) -> Vec<HashColumn<'_>> {
    keys.iter()
        .map(|k| HashColumn::fixed(k.as_slice(), None))
        .collect()
}

/// Sorts `keys` once (with `payload` as values, if any) and checks that the output holds the
/// smallest and the largest key at its ends.
fn check_sort<K: sort::RadixKey + Ord + std::fmt::Debug>(
    stream: &Stream,
    host: &[K],
    keys: &DeviceBuffer<K>,
    payload: Option<&DeviceBuffer<u32>>,
) {
    let n = host.len();
    let sorted = sort::sort_pairs(
        stream,
        keys.as_slice(),
        payload.map(|p| p.as_slice()),
        K::BITS,
    )
    .expect("sort");
    assert_eq!(sorted.keys.len(), n, "sorted keys");
    assert_eq!(sorted.values.len(), n, "sorted values");
    let (min, max) = (host.iter().min(), host.iter().max());
    assert_eq!(Some(&element(stream, &sorted.keys, 0)), min, "smallest key");
    assert_eq!(
        Some(&element(stream, &sorted.keys, n - 1)),
        max,
        "largest key"
    );
}

/// `sort`: stable LSD radix sort (8-bit digits, one pass each) of random full-range keys: u32
/// and u64 keys with the row indices `0..n` (what `argsort` and ORDER BY run), and u64 keys
/// carrying a u32 payload (a later pass of a multi-column sort). Bytes: the keys (and payload)
/// read once, the sorted keys and the indices written once; every pass moves them again.
fn bench_sort(c: &mut Criterion, stream: &Stream, sizes: &[usize]) {
    let mut group = c.benchmark_group("sort");
    for &n in sizes {
        let rows = n as u64;
        // Input keys, two ping-pong buffers of keys and indices, and the per-tile histograms.
        let device_bytes = |key: u64| key * rows + 2 * (key + 4) * rows + rows;

        let case = Case {
            name: "sort_pairs u32 keys + row ids passes=4",
            rows: n,
            bytes: 4 * rows + (4 + 4) * rows,
            device_bytes: device_bytes(4),
        };
        let prepare = || {
            let host = reference::random_u32(n, 41, u32::MAX);
            let keys = upload(stream, &host);
            check_sort(stream, &host, &keys, None);
            keys
        };
        bench_kernel(&mut group, stream, case, prepare, |keys| {
            sort::sort_pairs(stream, keys.as_slice(), None, 32)
        });

        let case = Case {
            name: "sort_pairs u64 keys + row ids passes=8",
            rows: n,
            bytes: 8 * rows + (8 + 4) * rows,
            device_bytes: device_bytes(8),
        };
        let prepare = || {
            let host = reference::random_u64(n, 42);
            let keys = upload(stream, &host);
            check_sort(stream, &host, &keys, None);
            keys
        };
        bench_kernel(&mut group, stream, case, prepare, |keys| {
            sort::sort_pairs(stream, keys.as_slice(), None, 64)
        });

        let case = Case {
            name: "sort_pairs u64 keys + u32 values passes=8",
            rows: n,
            bytes: 2 * (8 + 4) * rows,
            device_bytes: device_bytes(8) + 4 * rows,
        };
        let prepare = || {
            let host = reference::random_u64(n, 43);
            let keys = upload(stream, &host);
            let payload = upload(stream, &reference::random_u32(n, 44, u32::MAX));
            check_sort(stream, &host, &keys, Some(&payload));
            (keys, payload)
        };
        bench_kernel(&mut group, stream, case, prepare, |(keys, payload)| {
            sort::sort_pairs(stream, keys.as_slice(), Some(payload.as_slice()), 64)
        });
    }
    group.finish();
}

// The `aggregate` and `join` groups go through the engine: grouped aggregation and the hash
// join are programs that `spate` generates per query (`core/src/exec/aggregate/codegen.rs`,
// `core/src/exec/join/`), not launchers of `spate-kernels`, so a query is the only way to run
// their inner loops. (`reduce::segmented` exists, but it is not what GROUP BY runs.)
//
// The tables are cached in GPU memory (`Engine::cache_table`) before timing, so the queries
// read device-resident columns: without that, every iteration would also upload the table
// through pinned staging, and the figure would mostly be the host→device bus. What the timings
// still include around the kernels: planning, the operators' stream setup, and the download
// of the (small) result.

/// The engine both groups share, built on first use so that `--list` and filters that skip
/// both groups do not open it. One engine, so generated kernels compile once per query shape.
struct LazyEngine {
    backend: Backend,
    batch_bytes: usize,
    engine: OnceCell<Engine>,
}

impl LazyEngine {
    fn new(backend: BackendKind, sizes: &[usize]) -> Self {
        let largest_table_bytes = sizes.iter().max().copied().unwrap_or(0) * (4 + 8);
        LazyEngine {
            backend: match backend {
                BackendKind::Cuda => Backend::Cuda,
                BackendKind::Emulated => Backend::Emulated,
            },
            batch_bytes: largest_table_bytes.max(128 * MI) + MI,
            engine: OnceCell::new(),
        }
    }

    /// One partition, so a query is one stream over one device batch: the inner loop without
    /// DataFusion's repartitioning. `spate.gpu.batch_bytes` holds the largest table whole, and
    /// an operator left on the CPU fails the query instead of skewing the figure.
    fn get(&self) -> &Engine {
        self.engine.get_or_init(|| {
            Engine::builder()
                .backend(self.backend)
                .target_partitions(1)
                .option("spate.gpu.batch_bytes", self.batch_bytes.to_string())
                .option("spate.gpu.fallback", "error")
                .build()
                .unwrap_or_else(|e| fail(&format!("could not build the engine: {e}")))
        })
    }
}

fn collect(runtime: &Runtime, engine: &Engine, sql: &str) -> Vec<RecordBatch> {
    runtime
        .block_on(engine.collect(sql))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Registers one in-memory batch as table `name` and caches it in GPU memory.
fn register(runtime: &Runtime, engine: &Engine, name: &str, columns: Vec<(&str, ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(column, array)| Field::new(*column, array.data_type().clone(), false))
        .collect();
    let arrays: Vec<ArrayRef> = columns.into_iter().map(|(_, array)| array).collect();
    let rows = arrays.first().map_or(0, |a| a.len());
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .unwrap_or_else(|e| panic!("table {name}: {e}"));
    engine
        .register_batches(name, vec![batch])
        .unwrap_or_else(|e| panic!("register {name}: {e}"));
    let cached = runtime
        .block_on(engine.cache_table(name))
        .unwrap_or_else(|e| panic!("cache {name}: {e}"));
    assert_eq!(cached.location, CacheLocation::Gpu, "table {name} cached");
    assert_eq!(cached.rows, rows, "rows of table {name} cached");
}

/// Drops a table registered by [`register`], freeing its GPU memory.
fn drop_table(engine: &Engine, name: &str) {
    engine
        .uncache_table(name)
        .unwrap_or_else(|e| panic!("uncache {name}: {e}"));
    engine
        .deregister(name)
        .unwrap_or_else(|e| panic!("deregister {name}: {e}"));
}

/// Benchmarks `sql`: each iteration plans and runs it and collects the result on the host.
/// `prepare` registers and caches `tables` and checks the query's result (which also compiles
/// its generated kernels) the first time criterion runs the benchmark; the tables are dropped
/// afterwards.
fn bench_query(
    group: &mut BenchmarkGroup<'_, WallTime>,
    runtime: &Runtime,
    engine: &LazyEngine,
    case: Case<'_>,
    budget_bytes: usize,
    (sql, tables): (&str, &[&str]),
    prepare: impl FnOnce(&Engine),
) {
    if !case.fits(budget_bytes) {
        return;
    }
    let id = case.start(group);
    let mut prepare = Some(prepare);
    group.bench_function(id, |b| {
        if let Some(prepare) = prepare.take() {
            prepare(engine.get());
        }
        b.iter(|| collect(runtime, engine.get(), sql))
    });
    if prepare.is_none() {
        for table in tables {
            drop_table(engine.get(), table);
        }
    }
}

fn int64_sum(batches: &[RecordBatch], column: usize) -> i64 {
    batches
        .iter()
        .flat_map(|b| b.column(column).as_primitive::<Int64Type>().iter())
        .map(|v| v.expect("no NULL in the result"))
        .sum()
}

/// `aggregate`: `SELECT k, sum(v) FROM t GROUP BY k` over a random u32 key of 1000 groups and
/// a random i64 value. Bytes: the two input columns, read once.
fn bench_aggregate(
    c: &mut Criterion,
    runtime: &Runtime,
    engine: &LazyEngine,
    budget_bytes: usize,
    sizes: &[usize],
) {
    const SQL: &str = "SELECT k, sum(v) FROM t GROUP BY k";
    let mut group = c.benchmark_group("aggregate");
    for &n in sizes {
        let rows = n as u64;
        let case = Case {
            name: "group by u32 sum(i64) groups=1000",
            rows: n,
            bytes: (4 + 8) * rows,
            // The uploaded columns, row hashes, the hash table and per-row group numbers: a
            // rough, generous bound on the query's working set.
            device_bytes: 4 * (4 + 8) * rows,
        };
        let prepare = |engine: &Engine| {
            let keys = reference::random_u32(n, 51, AGG_GROUPS);
            let values: Vec<i64> = reference::random_u32(n, 52, AGG_VALUE_BOUND)
                .into_iter()
                .map(i64::from)
                .collect();
            let mut present = vec![false; AGG_GROUPS as usize];
            keys.iter().for_each(|&k| present[k as usize] = true);
            let groups = present.iter().filter(|&&p| p).count();
            let total: i64 = values.iter().sum();
            register(
                runtime,
                engine,
                "t",
                vec![
                    ("k", Arc::new(UInt32Array::from(keys)) as ArrayRef),
                    ("v", Arc::new(Int64Array::from(values)) as ArrayRef),
                ],
            );
            let result = collect(runtime, engine, SQL);
            let result_rows: usize = result.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(result_rows, groups, "groups of `{SQL}`");
            assert_eq!(int64_sum(&result, 1), total, "sum of the sums of `{SQL}`");
        };
        bench_query(
            &mut group,
            runtime,
            engine,
            case,
            budget_bytes,
            (SQL, &["t"]),
            prepare,
        );
    }
    group.finish();
}

/// `join`: `SELECT count(*) FROM probe JOIN build ON probe.k = build.k`. The build side has
/// `rows / 16` unique i64 keys, the probe side `rows` keys drawn from them at random, so every
/// probe row matches exactly one build row. Bytes: both key columns, read once.
fn bench_join(
    c: &mut Criterion,
    runtime: &Runtime,
    engine: &LazyEngine,
    budget_bytes: usize,
    sizes: &[usize],
) {
    const SQL: &str = "SELECT count(*) FROM probe JOIN build ON probe.k = build.k";
    let mut group = c.benchmark_group("join");
    for &n in sizes {
        let m = (n / JOIN_BUILD_FRACTION).max(1);
        let case = Case {
            name: "inner i64 build=6.25% unique, 1 match per probe row",
            rows: n,
            bytes: 8 * (n + m) as u64,
            // Probe keys, their hashes and group numbers, match offsets, the (probe, build) row
            // pairs, and the build side's table: a rough, generous bound.
            device_bytes: 6 * 8 * (n + m) as u64,
        };
        let prepare = |engine: &Engine| {
            // Multiplying by an odd constant is a bijection on u64: the keys are unique and
            // spread over the whole range.
            let build: Vec<i64> = (0..m as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) as i64)
                .collect();
            let mut rng = reference::Rng::new(61);
            let probe: Vec<i64> = (0..n)
                .map(|_| build[rng.below(m as u64) as usize])
                .collect();
            register(
                runtime,
                engine,
                "build",
                vec![("k", Arc::new(Int64Array::from(build)) as ArrayRef)],
            );
            register(
                runtime,
                engine,
                "probe",
                vec![("k", Arc::new(Int64Array::from(probe)) as ArrayRef)],
            );
            let result = collect(runtime, engine, SQL);
            assert_eq!(int64_sum(&result, 0), n as i64, "`{SQL}`");
        };
        bench_query(
            &mut group,
            runtime,
            engine,
            case,
            budget_bytes,
            (SQL, &["build", "probe"]),
            prepare,
        );
    }
    group.finish();
}
