//! Compiles every kernel program with NVRTC for sm_80 (A100) and sm_90 (H100/H200), and
//! records registers and spills per kernel. No GPU is needed, only NVRTC (the pinned
//! `nvidia-cuda-nvrtc` wheel that `scripts/test` installs into `.venv`).
//!
//! This catches what the host compiler accepts but NVRTC would not (and the reverse is caught
//! by the emulated build). Without NVRTC the test reports itself skipped, unless
//! `SPATE_REQUIRE_NVRTC=1` (set by `scripts/test`), which makes a missing NVRTC a failure.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate_kernels::{compile, source};

const ARCHS: &[&str] = &["sm_80", "sm_90"];

/// Kernels whose compile log shows spilling. Spills on these paths are a performance bug.
fn spills(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("bytes spill") && !l.contains("0 bytes spill stores, 0 bytes spill loads")
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_program_compiles_for_sm80_and_sm90() {
    let required = std::env::var("SPATE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    let version = match compile::nvrtc_version() {
        Ok(v) => v,
        Err(e) if !required => {
            println!("SKIPPED nvrtc_compile: {e}");
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
        let resolved = source::resolve(program.path, program.text, false).unwrap();
        for arch in ARCHS {
            let out = compile::nvrtc_compile(program.path, &resolved, arch, &["-Xptxas=-v"])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                out.cubin.starts_with(b"\x7fELF"),
                "{} {arch}: not an ELF cubin",
                program.path
            );
            assert!(
                out.ptx.contains(".version 9.0"),
                "{} {arch}: PTX ISA is not 9.0",
                program.path
            );
            for entry in program.entries {
                assert!(
                    out.ptx.contains(&format!(".entry {entry}(")),
                    "{} {arch}: entry {entry} missing from the PTX",
                    program.path
                );
            }
            let spilled = spills(&out.log);
            assert!(
                spilled.is_empty(),
                "{} {arch} spills registers:\n{}",
                program.path,
                spilled.join("\n")
            );
            for line in out
                .log
                .lines()
                .filter(|l| l.contains("Used") || l.contains("Compiling entry"))
            {
                report.push_str(&format!("{arch} {}: {}\n", program.path, line.trim()));
            }
        }
    }
    println!(
        "NVRTC {}.{} register usage:\n{report}",
        version.0, version.1
    );
}
