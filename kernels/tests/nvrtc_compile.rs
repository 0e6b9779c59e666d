//! Compiles every kernel program with NVRTC for sm_80 (A100) and sm_90 (H100/H200), and
//! records registers, shared memory and spills per kernel. No GPU is needed, only NVRTC (the
//! pinned `nvidia-cuda-nvrtc` wheel that `scripts/test` installs into `.venv`).
//!
//! This catches what the host compiler accepts but NVRTC would not (and the reverse is caught
//! by the emulated build). Without NVRTC the test reports itself skipped, unless
//! `SPATE_REQUIRE_NVRTC=1` (set by `scripts/test`), which makes a missing NVRTC a failure.
//! `harness = false`, so the register report and a skip always show in `cargo test`'s output.

use spate_kernels::{compile, source};

const ARCHS: &[&str] = &["sm_80", "sm_90"];

/// Lines of the ptxas log that report spilling. Spills in these kernels are a performance bug.
fn spills(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("bytes spill") && !l.contains("0 bytes spill stores, 0 bytes spill loads")
        })
        .map(str::to_string)
        .collect()
}

/// One line per kernel: registers, shared memory and stack, from ptxas's `-v` log.
fn summarise(arch: &str, log: &str) -> String {
    let mut out = String::new();
    let mut entry = "";
    let mut frame = "";
    for line in log.lines().map(str::trim) {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().unwrap_or("");
        } else if let Some(at) = line.find(|c: char| c.is_ascii_digit())
            && line.contains("bytes stack frame")
        {
            frame = &line[at..];
        } else if let Some(used) = line.split(": Used ").nth(1) {
            out.push_str(&format!("  {arch} {entry:<28} {used}; {frame}\n"));
        }
    }
    out
}

fn main() {
    println!("\nrunning 1 test");
    let required = std::env::var("SPATE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    let version = match compile::nvrtc_version() {
        Ok(v) => v,
        Err(e) if !required => {
            println!("test nvrtc_compile ... SKIPPED ({e})");
            println!("\ntest result: ok. 0 passed; 0 failed; 1 skipped (needs NVRTC)\n");
            return;
        }
        Err(e) => panic!("SPATE_REQUIRE_NVRTC=1 but NVRTC is unavailable: {e}"),
    };
    assert_eq!(
        version.0, 13,
        "NVRTC {version:?}: the project pins CUDA 13.0 (PTX ISA 9.0)"
    );
    let mut report = String::new();
    for program in source::programs() {
        let resolved =
            source::resolve(program.path, program.text, false).unwrap_or_else(|e| panic!("{e}"));
        for arch in ARCHS {
            let out = compile::nvrtc_compile(program.path, &resolved, arch, &["-Xptxas=-v"])
                .unwrap_or_else(|e| panic!("{e}"));
            let what = format!("{} for {arch}", program.path);
            assert!(
                out.cubin.starts_with(b"\x7fELF"),
                "{what}: not an ELF cubin"
            );
            assert!(
                out.ptx.contains(".version 9.0"),
                "{what}: PTX ISA is not 9.0"
            );
            for entry in program.entries {
                assert!(
                    out.ptx.contains(&format!(".entry {entry}(")),
                    "{what}: entry {entry} missing from the PTX"
                );
            }
            let spilled = spills(&out.log);
            assert!(spilled.is_empty(), "{what} spills:\n{}", spilled.join("\n"));
            report.push_str(&summarise(arch, &out.log));
        }
    }
    let kernels = source::all_entries().count();
    println!(
        "NVRTC {}.{}: {kernels} kernels, per architecture:\n{report}",
        version.0, version.1
    );
    println!("test nvrtc_compile ... ok\n\ntest result: ok. 1 passed; 0 failed\n");
}
