//! The embedded kernel sources: every program under `kernels/cuda/`, its entry points, and the
//! textual `#include` resolution that turns a program into one self-contained translation unit.
//!
//! Nothing is read from disk at run time: the build script embeds every source with
//! `include_str!`. NVRTC receives the resolved text, so it needs no include path, and so does
//! the host compiler for generated kernels.

use std::collections::HashSet;

use crate::error::{KernelError, Result};

/// One kernel program: a `.cu` file under `kernels/cuda/`.
#[derive(Debug)]
pub struct ProgramSource {
    /// Path relative to `kernels/cuda/`, e.g. `scan/prefix_sum.cu`.
    pub path: &'static str,
    /// The file's text, with its `#include`s unresolved.
    pub text: &'static str,
    /// The `extern "C"` entry points it exports, in source order.
    pub entries: &'static [&'static str],
}

/// An entry point of the fixed kernels, compiled into this binary for the emulated backend.
#[derive(Debug)]
pub(crate) struct EmuEntry {
    pub(crate) name: &'static str,
    pub(crate) launch: EmuLaunchFn,
    pub(crate) params: EmuParamsFn,
    /// Its `__launch_bounds__`, or 1024.
    pub(crate) max_threads: u32,
}

use crate::backend::emulated::LaunchArgs as EmuLaunchArgs;

/// `int spate_emu_launch_NAME(struct spate_emu_launch* launch)`
pub(crate) type EmuLaunchFn = unsafe extern "C" fn(*mut EmuLaunchArgs) -> std::ffi::c_int;
/// `unsigned spate_emu_params_NAME(unsigned* sizes, unsigned max)`
pub(crate) type EmuParamsFn = unsafe extern "C" fn(*mut u32, u32) -> u32;

include!(concat!(env!("OUT_DIR"), "/kernel_registry.rs"));

/// Every kernel program, in path order.
pub fn programs() -> &'static [ProgramSource] {
    PROGRAMS
}

/// The program that exports `entry`.
pub fn program_of(entry: &str) -> Result<&'static ProgramSource> {
    PROGRAMS
        .iter()
        .find(|p| p.entries.contains(&entry))
        .ok_or_else(|| KernelError::Internal {
            message: format!("no kernel program exports an entry point named `{entry}`"),
        })
}

/// Every entry point of every program.
pub fn all_entries() -> impl Iterator<Item = &'static str> {
    PROGRAMS.iter().flat_map(|p| p.entries.iter().copied())
}

pub(crate) fn emu_entry(name: &str) -> Option<&'static EmuEntry> {
    EMU_ENTRIES.iter().find(|e| e.name == name)
}

/// The emulator header (`kernels/emu/spate_emu.h`).
pub fn emulator_header() -> &'static str {
    EMU_HEADER
}

/// Resolves `#include "..."` lines against the embedded headers, each header once
/// (`#pragma once` semantics), and returns one translation unit. `spate_emu.h` is inlined only
/// when `emulated` is set; NVRTC never sees it (the prelude includes it under SPATE_EMULATED).
pub fn resolve(name: &str, text: &str, emulated: bool) -> Result<String> {
    let mut out = String::with_capacity(text.len() * 2);
    let mut seen = HashSet::new();
    if emulated {
        out.push_str("#define SPATE_EMULATED 1\n");
    } else {
        out.push_str("#define SPATE_NVRTC 1\n");
    }
    resolve_into(name, text, emulated, &mut seen, &mut out, 0)?;
    Ok(out)
}

fn resolve_into(
    name: &str,
    text: &str,
    emulated: bool,
    seen: &mut HashSet<String>,
    out: &mut String,
    depth: usize,
) -> Result<()> {
    if depth > 16 {
        return Err(KernelError::Internal {
            message: format!("#include nesting deeper than 16 levels at {name}"),
        });
    }
    for (line_no, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#pragma once") {
            continue;
        }
        let Some(rest) = trimmed.strip_prefix("#include") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('<') {
            // System headers appear only inside spate_emu.h, which the host compiler reads.
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let target = rest.trim_matches('"');
        if !seen.insert(target.to_string()) {
            continue;
        }
        let body = if target == "spate_emu.h" {
            if !emulated {
                continue;
            }
            EMU_HEADER
        } else {
            HEADERS
                .iter()
                .find(|(path, _)| *path == target)
                .map(|(_, text)| *text)
                .ok_or_else(|| KernelError::Compile {
                    entry: name.to_string(),
                    arch: if emulated { "host" } else { "nvrtc" }.to_string(),
                    log: format!(
                        "{name}:{}: #include \"{target}\": no such kernel header (headers live in \
                         kernels/cuda/common/)",
                        line_no + 1
                    ),
                })?
        };
        resolve_into(target, body, emulated, seen, out, depth + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_resolves_and_exports_entries() {
        assert!(programs().len() >= 6);
        for p in programs() {
            assert!(!p.entries.is_empty(), "{}", p.path);
            let nvrtc = resolve(p.path, p.text, false).unwrap();
            assert!(!nvrtc.contains("#include \""), "{}", p.path);
            assert!(!nvrtc.contains("namespace spate_emu"), "{}", p.path);
            let host = resolve(p.path, p.text, true).unwrap();
            assert!(host.contains("namespace spate_emu"), "{}", p.path);
            for e in p.entries {
                assert!(emu_entry(e).is_some(), "{e} not linked for the emulator");
            }
        }
    }

    #[test]
    fn entry_names_are_unique() {
        let mut seen = HashSet::new();
        for e in all_entries() {
            assert!(seen.insert(e), "duplicate entry point {e}");
        }
    }

    #[test]
    fn every_global_function_is_exported() {
        // A `__global__` without SPATE_EXPORT would compile for CUDA but be missing on the
        // emulated backend. Macro-generated kernels are counted by their SPATE_EXPORT lines.
        for p in programs() {
            let globals = p.text.matches("__global__").count();
            let exports = p.text.matches("SPATE_EXPORT(").count();
            assert_eq!(
                globals, exports,
                "{}: {globals} __global__ vs {exports} SPATE_EXPORT",
                p.path
            );
        }
    }

    #[test]
    fn missing_header_is_a_compile_error() {
        let err = resolve("x.cu", "#include \"common/nope.cuh\"\n", false).unwrap_err();
        assert!(err.to_string().contains("no such kernel header"), "{err}");
    }

    #[test]
    fn block_size_matches_the_prelude() {
        let prelude = HEADERS
            .iter()
            .find(|(p, _)| *p == "common/prelude.cuh")
            .unwrap()
            .1;
        let want = format!(
            "#define SPATE_BLOCK_THREADS {}",
            crate::launch::BLOCK_THREADS
        );
        assert!(prelude.contains(&want), "prelude lost `{want}`");
        let want = format!(
            "#define SPATE_ITEMS_PER_THREAD {}",
            crate::launch::ITEMS_PER_THREAD
        );
        assert!(prelude.contains(&want), "prelude lost `{want}`");
    }
}
