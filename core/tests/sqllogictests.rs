//! Runs every `testdata/slt/**/*.slt` file against a fresh Spate engine.
//!
//! Uses the `sqllogictest` crate with DataFusion's runner, normalizer and validator, so files
//! follow DataFusion's `.slt` conventions. Paths inside files are relative to the workspace root.
//!
//! Arguments (after `--`) are substring filters on file paths. Every file runs on the `cpu`
//! backend and again on `emulated` (GPU operators, their kernels run by the emulator), with the
//! same expected results; `SPATE_SLT_BACKEND` restricts the run to one backend. Files under a
//! folder named `emulated` (EXPLAIN markings, fallback policies) run on `emulated` only.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use datafusion_sqllogictest::{DataFusion, df_value_validator, value_normalizer};
use indicatif::ProgressBar;
use spate::{Backend, Engine};
use sqllogictest::strict_column_validator;

fn slt_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            slt_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "slt") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Err(e) = std::env::set_current_dir(&root) {
        eprintln!("cannot enter the workspace root: {e}");
        return ExitCode::FAILURE;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let backends: Vec<Backend> = match std::env::var("SPATE_SLT_BACKEND") {
        Ok(name) => match name.parse() {
            Ok(b) => vec![b],
            Err(e) => {
                eprintln!("SPATE_SLT_BACKEND: {e}");
                return ExitCode::FAILURE;
            }
        },
        Err(_) => vec![Backend::Cpu, Backend::Emulated],
    };

    let mut files = Vec::new();
    if let Err(e) = slt_files(Path::new("testdata/slt"), &mut files) {
        eprintln!("cannot list testdata/slt: {e}");
        return ExitCode::FAILURE;
    }
    files.sort();
    files.retain(|f| filters.is_empty() || filters.iter().any(|p| f.to_string_lossy().contains(p)));

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut all_ok = true;
    for backend in backends {
        let (mut passed, mut failed) = (0usize, 0usize);
        for file in &files {
            if emulated_only(file) && backend != Backend::Emulated {
                continue;
            }
            match runtime.block_on(run_file(file, backend)) {
                Ok(()) => {
                    passed += 1;
                    println!("slt [{backend}] {} ... ok", file.display());
                }
                Err(e) => {
                    failed += 1;
                    println!("slt [{backend}] {} ... FAILED\n{e}", file.display());
                }
            }
        }
        println!("sqllogictests ({backend}): {passed} passed, {failed} failed");
        all_ok &= failed == 0 && passed > 0;
    }
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Files about GPU placement: they mean nothing on the CPU backend.
fn emulated_only(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "emulated")
}

async fn run_file(path: &Path, backend: Backend) -> Result<(), String> {
    let engine = Engine::builder()
        .backend(backend)
        // A fixed partition count keeps plans (and so any EXPLAIN output) the same on every
        // machine.
        .target_partitions(4)
        .build()
        .map_err(|e| e.to_string())?;
    let relative = path.to_path_buf();
    let mut runner = sqllogictest::Runner::new(|| {
        let ctx = engine.context().clone();
        let relative = relative.clone();
        async move { Ok(DataFusion::new(ctx, relative, ProgressBar::hidden())) }
    });
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);
    runner
        .run_file_async(path)
        .await
        .map_err(|e| e.display(false).to_string())
}
