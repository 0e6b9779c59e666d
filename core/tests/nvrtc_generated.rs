//! Compiles the CUDA the engine generates (expression kernels, aggregation programs) with NVRTC
//! for sm_80 and sm_90. The queries run on the emulated backend, which compiles the same
//! sources with the host compiler; this checks NVRTC accepts them too, so the CUDA backend does
//! not meet its first compile error on a GPU.
//!
//! With `SPATE_NVRTC_RECORDED=DIR` it compiles instead every distinct program the test suite
//! generated (recorded there by `SPATE_RECORD_KERNELS=DIR`, see `spate_kernels::compile`):
//! `scripts/test` runs it that way after the suite, so every kernel CI ran on the emulator is
//! also NVRTC's, and prints how many there were and which spill registers.
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

/// Compiles every recorded program for both architectures, on as many threads as there are
/// cores, and fails on the first that NVRTC rejects.
fn compile_recorded(dir: &std::path::Path) {
    let programs = compile::recorded_programs(dir)
        .unwrap_or_else(|e| panic!("SPATE_NVRTC_RECORDED={}: {e}", dir.display()));
    assert!(
        !programs.is_empty(),
        "SPATE_NVRTC_RECORDED={}: no recorded programs (was SPATE_RECORD_KERNELS set?)",
        dir.display()
    );
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let spilled = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, text)) = programs.get(i) else {
                        return;
                    };
                    let resolved =
                        source::resolve(name, text, false).unwrap_or_else(|e| panic!("{e}"));
                    for arch in ARCHS {
                        let out = compile::nvrtc_compile(name, &resolved, arch, &["-Xptxas=-v"])
                            .unwrap_or_else(|e| panic!("{name} for {arch}: {e}\n{text}"));
                        assert!(out.cubin.starts_with(b"\x7fELF"), "{name} for {arch}");
                        let n = spills(&out.log);
                        if n > 0 {
                            spilled
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(format!("{name} for {arch}: {n} kernel(s) spill"));
                        }
                    }
                }
            });
        }
    });
    let spilled = spilled.into_inner().unwrap_or_else(|p| p.into_inner());
    println!(
        "NVRTC compiled every program the tests generated: {} distinct programs for {} in \
         {:.0} s; {} spill registers{}",
        programs.len(),
        ARCHS.join(" and "),
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
