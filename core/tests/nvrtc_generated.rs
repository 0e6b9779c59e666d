//! Compiles the CUDA the engine generates (expression kernels, aggregation programs) with NVRTC
//! for sm_80 and sm_90. The queries run on the emulated backend, which compiles the same
//! sources with the host compiler; this checks NVRTC accepts them too, so the CUDA backend does
//! not meet its first compile error on a GPU.
//!
//! With `SPATE_NVRTC_RECORDED=DIR` it compiles instead every distinct program the test suite
//! generated (recorded there by `SPATE_RECORD_KERNELS=DIR`, see `spate_kernels::compile`):
//! every one to PTX for compute_80 and compute_90 (NVRTC's front end, where a program the host
//! compiler accepted would fail on a GPU), batched so that the headers are parsed once per
//! batch, and one in thirty-two to a CUBIN for sm_90 with ptxas's report, counting register
//! spills. `scripts/test` runs it that way after the suite and prints how many programs there
//! were.
//!
//! Without NVRTC the test reports itself skipped, unless `SPATE_REQUIRE_NVRTC=1` (set by
//! `scripts/test`). `harness = false`, so a skip always shows in `cargo test`'s output.

use spate::kernels::{compile, source};
use spate::{Backend, Engine};

const ARCHS: &[&str] = &["sm_80", "sm_90"];

/// Queries whose plans generate every kind of kernel: predicates and projections over every
/// device type (checked decimal arithmetic, division, CASE, COALESCE, strings, dates),
/// aggregations with keys and aggregates of every supported type, and hash joins.
const QUERIES: &[&str] = &[
    "SELECT * FROM t WHERE (i > 1 AND d < 2.5) OR NOT p OR s LIKE 'x%' OR s IN ('a', 'b')",
    "SELECT * FROM t WHERE extract(year FROM dt) = 2024 AND m * w > 0 AND i / 2 <> 0",
    "SELECT * FROM t WHERE CASE WHEN i > 0 THEN b % i ELSE coalesce(b, 0) END > 1",
    "SELECT * FROM t WHERE f % 1.5 > 0 AND r / 2.0 < 1 AND m + m > 0.5 AND u < 7",
    "SELECT * FROM t WHERE CASE s WHEN 'x' THEN length(s) ELSE octet_length(s) END > 0 \
     AND dt + INTERVAL '1 month 2 days' > DATE '2000-01-01'",
    // Casts that can fail, each leftmost (on the right of AND they stay on the CPU).
    "SELECT * FROM t WHERE CAST(b AS INT) + CAST(d AS SMALLINT) > 0",
    "SELECT * FROM t WHERE CAST(m AS DECIMAL(5,1)) > CAST(i AS DECIMAL(5,1))",
    "SELECT * FROM t WHERE CAST(m AS INT) > 0",
    "SELECT * FROM t WHERE CAST(d AS DECIMAL(20,3)) > CAST(r AS DECIMAL(20,3))",
    "SELECT * FROM t WHERE m / w > 0.5",
    "SELECT * FROM t WHERE m % 0.7 > 0.5",
    "SELECT * FROM t WHERE substr(s, 2, 3) = 'yzx' OR s LIKE 'a\\_%' OR s LIKE '_b%'",
    "SELECT s, p, count(*), count(s), sum(i), sum(b), sum(d), sum(m), sum(w), min(i), max(b), \
     min(dt), max(m), min(t), max(u), avg(d), avg(m), avg(i) FROM t GROUP BY s, p",
    "SELECT d, r, dt, m, t, u, count(*) FROM t GROUP BY d, r, dt, m, t, u",
    "SELECT count(*), min(d), max(r), sum(i * 2 + t), avg(m) FROM t WHERE i > 0",
    "SELECT p, count(DISTINCT s), count(DISTINCT m), count(DISTINCT i) FROM t GROUP BY p",
    // MIN/MAX over decimals wider than 64 bits (the two-pass `wide` kernel).
    "SELECT p, min(CAST(i AS DECIMAL(30,0))), max(CAST(b AS DECIMAL(38,2))) FROM t GROUP BY p",
    // Hash joins on keys of every kind, inner, outer, semi and anti.
    "SELECT * FROM t a JOIN t b ON a.i = b.i AND a.s = b.s AND a.m = b.m AND a.p = b.p",
    "SELECT * FROM t a FULL JOIN t b ON a.dt = b.dt AND a.b = b.b",
    "SELECT * FROM t a JOIN t b ON a.d = b.d AND a.f = b.f",
    "SELECT * FROM t a WHERE a.i NOT IN (SELECT b.i FROM t b)",
    "SELECT * FROM t a WHERE NOT EXISTS (SELECT 1 FROM t b WHERE a.w = b.w AND a.u = b.u)",
    // String outputs (two passes: lengths, then bytes).
    "SELECT substr(s, 2, 3), i + 1, substr(s, 1) FROM t WHERE i > 0",
    "SELECT CASE WHEN i > 0 THEN s ELSE 'no' END, coalesce(s, substr(s, 2)) FROM t WHERE b > 0",
    // A sort (its NULL-key kernels).
    "SELECT i, s FROM t ORDER BY i DESC NULLS FIRST, s",
    // Scalar subquery results as kernel parameters (integer, decimal, float, date, boolean).
    "SELECT i * (SELECT max(i) FROM t) FROM t WHERE m > (SELECT avg(m) FROM t) \
     AND d < (SELECT min(d) FROM t) AND dt = (SELECT max(dt) FROM t) \
     AND p = (SELECT bool_or(p) FROM t)",
];

fn main() {
    println!("\nrunning 1 test");
    let required = std::env::var("SPATE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if let Err(e) = compile::nvrtc_version() {
        if required {
            panic!("SPATE_REQUIRE_NVRTC=1 but NVRTC is unavailable: {e}");
        }
        println!("test nvrtc_generated ... SKIPPED ({e})");
        println!("\ntest result: ok. 0 passed; 0 failed; 1 skipped (needs NVRTC)\n");
        return;
    }
    if let Some(dir) = std::env::var_os("SPATE_NVRTC_RECORDED") {
        return compile_recorded(std::path::Path::new(&dir));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("{e}"));
    let engine = Engine::builder()
        .backend(Backend::Emulated)
        // One partition: single-stage aggregations, which COUNT(DISTINCT) needs.
        .target_partitions(1)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    runtime.block_on(async {
        engine
            .collect(
                "CREATE TABLE t (i INT, b BIGINT, d DOUBLE, r REAL, p BOOLEAN, dt DATE, \
                 m DECIMAL(12,2), w DECIMAL(38,0), t TINYINT, u SMALLINT UNSIGNED, \
                 f DOUBLE, s VARCHAR) AS VALUES \
                 (1, 2, 1.5, 2.5, true, DATE '2024-01-01', 1.25, 10, 3, 4, 0.5, 'x'), \
                 (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for sql in QUERIES {
            engine
                .collect(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    });
    let gpu = engine.gpu().unwrap_or_else(|| panic!("no GPU context"));
    let sources = gpu.generated_sources();
    assert!(
        sources.len() >= QUERIES.len(),
        "only {} programs were generated; did the queries fall back to the CPU?",
        sources.len()
    );
    let mut aggregates = 0;
    for (name, text) in &sources {
        aggregates += usize::from(text.contains("spate::exec::aggregate"));
        let resolved = source::resolve(name, text, false).unwrap_or_else(|e| panic!("{e}"));
        for arch in ARCHS {
            let out = compile::nvrtc_compile(name, &resolved, arch, &[])
                .unwrap_or_else(|e| panic!("{name} for {arch}: {e}\n{text}"));
            assert!(out.cubin.starts_with(b"\x7fELF"), "{name} for {arch}");
        }
    }
    assert!(
        aggregates >= 3,
        "{aggregates} aggregation programs were generated"
    );
    println!(
        "compiled {} generated programs ({aggregates} aggregations) for {}",
        sources.len(),
        ARCHS.join(" and ")
    );
    println!("test nvrtc_generated ... ok\n\ntest result: ok. 1 passed; 0 failed\n");
}

/// Lines of ptxas's `-v` log that report spilling.
fn spills(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("bytes spill") && !l.contains("0 bytes spill stores, 0 bytes spill loads")
        })
        .count()
}

/// Programs compiled together into one translation unit: the headers are parsed once per
/// batch instead of once per program, which is most of NVRTC's time on small programs.
const BATCH: usize = 32;
/// Programs compiled to a CUBIN with ptxas's report, to look for register spills: one in this
/// many (ptxas doubles the time of a compile).
const CUBIN_EVERY: usize = 32;

/// One translation unit of several recorded programs: their includes once at the top, each
/// program in a namespace of its own, and its entry points renamed apart (programs of one name
/// may differ, and extern "C" names ignore namespaces).
fn batch_source(programs: &[(usize, &(String, String))]) -> String {
    let mut includes: Vec<&str> = Vec::new();
    for (_, (_, text)) in programs {
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("#include"))
        {
            if !includes.contains(&line) {
                includes.push(line);
            }
        }
    }
    let mut out = includes.join("\n");
    out.push('\n');
    for (i, (_, text)) in programs {
        let body: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("#include"))
            .collect();
        let mut body = body.join("\n");
        // Every exported entry point, renamed wherever it appears as a whole identifier.
        let entries: Vec<String> = text
            .split("SPATE_EXPORT(")
            .skip(1)
            .filter_map(|rest| Some(rest.split(')').next()?.trim().to_string()))
            .collect();
        for entry in entries {
            body = rename_identifier(&body, &entry, &format!("{entry}_b{i}"));
        }
        out.push_str(&format!("namespace spate_batch_{i} {{\n{body}\n}}\n"));
    }
    out
}

/// `text` with every whole-identifier occurrence of `from` replaced by `to`.
fn rename_identifier(text: &str, from: &str, to: &str) -> String {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + from.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(ident) || after.is_some_and(ident) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

/// Compiles every recorded program with NVRTC: all of them to PTX for compute_80 and
/// compute_90 (what NVRTC's front end accepts is what fails on a GPU first), in batches, and
/// one in [`CUBIN_EVERY`] to a CUBIN for sm_90 with ptxas's report, counting register spills.
fn compile_recorded(dir: &std::path::Path) {
    let programs = compile::recorded_programs(dir)
        .unwrap_or_else(|e| panic!("SPATE_NVRTC_RECORDED={}: {e}", dir.display()));
    assert!(
        !programs.is_empty(),
        "SPATE_NVRTC_RECORDED={}: no recorded programs (was SPATE_RECORD_KERNELS set?)",
        dir.display()
    );
    let started = std::time::Instant::now();
    let indexed: Vec<(usize, &(String, String))> = programs.iter().enumerate().collect();
    let mut jobs: Vec<Job> = indexed
        .chunks(BATCH)
        .flat_map(|batch| ["compute_80", "compute_90"].map(|arch| Job::Ptx(batch.to_vec(), arch)))
        .collect();
    jobs.extend(
        indexed
            .iter()
            .filter(|(i, _)| i % CUBIN_EVERY == 0)
            .map(|p| Job::Cubin(*p)),
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let spilled = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else {
                        return;
                    };
                    if let Some(report) = job.run() {
                        spilled
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(report);
                    }
                }
            });
        }
    });
    let spilled = spilled.into_inner().unwrap_or_else(|p| p.into_inner());
    let cubins = programs.len().div_ceil(CUBIN_EVERY);
    println!(
        "NVRTC compiled every program the tests generated: {} distinct programs to PTX for \
         compute_80 and compute_90, and {cubins} of them to CUBINs for sm_90, in {:.0} s; {} \
         spill registers{}",
        programs.len(),
        started.elapsed().as_secs_f64(),
        spilled.len(),
        if spilled.is_empty() {
            String::new()
        } else {
            format!(":\n  {}", spilled.join("\n  "))
        }
    );
    println!("test nvrtc_generated ... ok\n\ntest result: ok. 1 passed; 0 failed\n");
}

enum Job<'a> {
    /// A batch of programs to PTX for a virtual architecture.
    Ptx(Vec<(usize, &'a (String, String))>, &'static str),
    /// One program to a CUBIN for sm_90, with ptxas's report.
    Cubin((usize, &'a (String, String))),
}

impl Job<'_> {
    /// Compiles; panics on a compile error (naming the program), returns a spill report.
    fn run(&self) -> Option<String> {
        match self {
            Job::Ptx(batch, arch) => {
                let text = batch_source(batch);
                let resolved =
                    source::resolve("recorded", &text, false).unwrap_or_else(|e| panic!("{e}"));
                if compile::nvrtc_compile("recorded", &resolved, arch, &[]).is_ok() {
                    return None;
                }
                // Find the program the batch failed on, alone.
                for (_, (name, text)) in batch {
                    let resolved =
                        source::resolve(name, text, false).unwrap_or_else(|e| panic!("{e}"));
                    if let Err(e) = compile::nvrtc_compile(name, &resolved, arch, &[]) {
                        panic!("{name} for {arch}: {e}\n{text}");
                    }
                }
                let resolved =
                    source::resolve("recorded", &text, false).unwrap_or_else(|e| panic!("{e}"));
                let e = compile::nvrtc_compile("recorded", &resolved, arch, &[]).err();
                panic!(
                    "a batch of programs that compile alone fails together for {arch} (the \
                     batching of this test is wrong): {e:?}"
                );
            }
            Job::Cubin((_, (name, text))) => {
                let resolved = source::resolve(name, text, false).unwrap_or_else(|e| panic!("{e}"));
                let out = compile::nvrtc_compile(name, &resolved, "sm_90", &["-Xptxas=-v"])
                    .unwrap_or_else(|e| panic!("{name} for sm_90: {e}\n{text}"));
                assert!(out.cubin.starts_with(b"\x7fELF"), "{name} for sm_90");
                let n = spills(&out.log);
                (n > 0).then(|| format!("{name} for sm_90: {n} kernel(s) spill"))
            }
        }
    }
}
