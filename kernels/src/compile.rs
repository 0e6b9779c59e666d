//! Compiling kernels: NVRTC to CUBIN (with PTX kept as a fallback), the host C++ compiler for
//! generated kernels on the emulator, and the on-disk cache both share.
//!
//! Finding NVRTC: cudarc loads `libnvrtc.so.*` by name through the dynamic loader, which only
//! searches `LD_LIBRARY_PATH` and the system paths. Before the first NVRTC call we therefore
//! look in `SPATE_NVRTC_DIR`, `CUDA_HOME`/`CUDA_PATH`, `/usr/local/cuda`, and the lib folders of
//! NVIDIA's pip wheels (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`) in the active virtualenv,
//! `./.venv` and the system's site-packages, and preload the libraries we find by absolute path
//! (libnvrtc-builtins first). The loader then resolves cudarc's by-name `dlopen`, and NVRTC's own
//! `dlopen` of its builtins, to the already-loaded objects.
//!
//! The cache: `SPATE_KERNEL_CACHE` (or `off`), else `$XDG_CACHE_HOME/spate/kernels`
//! (`~/.cache/spate/kernels`). Entries are keyed by a BLAKE3 hash of the resolved source, the
//! options, the compiler version and the target, and are written atomically (temporary file,
//! then rename), so concurrent processes never see half an entry.

use std::collections::HashMap;
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{KernelError, Result};

/// Environment variable naming a directory that holds `libnvrtc.so.*`.
pub const NVRTC_DIR_ENV: &str = "SPATE_NVRTC_DIR";
/// Environment variable overriding the kernel cache directory (`off` disables it).
pub const CACHE_ENV: &str = "SPATE_KERNEL_CACHE";
/// `SPATE_RECORD_KERNELS=DIR`: every generated program compiled (on either backend) is also
/// written to DIR, once per distinct source, so that CI can compile each one with NVRTC for
/// the GPUs it never sees (`core/tests/nvrtc_generated.rs`).
pub const RECORD_ENV: &str = "SPATE_RECORD_KERNELS";

/// Options every NVRTC compile uses, besides the architecture. `--fmad=false`: no
/// multiply-add contraction, so float arithmetic rounds after every operation as on the CPU,
/// and GPU results equal the CPU's bit for bit by design rather than by accident.
pub const NVRTC_OPTIONS: &[&str] = &[
    "-std=c++17",
    "-default-device",
    "--device-int128",
    "--fmad=false",
];

/// NVRTC's version, once it has been found and loaded.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static FOUND: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    FOUND
        .get_or_init(find_nvrtc)
        .clone()
        .map_err(|reason| KernelError::NoDevice { reason })
}

fn find_nvrtc() -> std::result::Result<(i32, i32), String> {
    if let Some(dir) = std::env::var_os(NVRTC_DIR_ENV) {
        preload_from(Path::new(&dir))
            .map_err(|e| format!("{NVRTC_DIR_ENV}={}: {e}", Path::new(&dir).display()))?;
    }
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        let mut tried = Vec::new();
        for dir in candidate_dirs() {
            if preload_from(&dir).is_ok() {
                break;
            }
            tried.push(dir.display().to_string());
        }
    }
    // SAFETY: as above.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(format!(
            "NVRTC (libnvrtc.so.13) was not found: install the CUDA toolkit or \
             `pip install nvidia-cuda-nvrtc==13.0.88`, or set {NVRTC_DIR_ENV} to the folder \
             holding libnvrtc.so.13"
        ));
    }
    catch_unwind(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map(|()| (major, minor))
            .map_err(|e| format!("nvrtcVersion failed: {e:?}"))
    })
    .unwrap_or_else(|_| Err("the NVRTC library could not be used (missing symbols)".into()))
}

/// Folders that may hold NVRTC, in the order they are tried.
pub fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(&v).join("lib64"));
            dirs.push(PathBuf::from(&v).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(v));
    }
    if let Ok(cwd) = std::env::current_dir() {
        prefixes.push(cwd.join(".venv"));
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/{debug,release}/spate -> the repository's .venv; <env>/bin/python (the Python
        // bindings, in any virtual environment) -> <env>, where pip put the NVRTC wheels.
        for up in exe.ancestors().skip(1).take(4) {
            prefixes.push(up.to_path_buf());
            prefixes.push(up.join(".venv"));
        }
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    if let Some(home) = dirs::home_dir() {
        prefixes.push(home.join(".local"));
    }
    for prefix in prefixes {
        for site in site_packages(&prefix) {
            dirs.push(site.join("nvidia/cu13/lib"));
            dirs.push(site.join("nvidia/cuda_nvrtc/lib"));
        }
    }
    dirs
}

fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
        return out;
    };
    let mut pythons: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    for p in pythons {
        out.push(p.join("site-packages"));
        out.push(p.join("dist-packages"));
    }
    out
}

/// Preloads libnvrtc-builtins and libnvrtc from `dir` by absolute path.
fn preload_from(dir: &Path) -> std::result::Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read: {e}"))?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.contains(".alt."))
        .collect();
    names.sort();
    let pick = |prefix: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(prefix))
            .find(|n| n.contains(".so.13"))
            .or_else(|| {
                names
                    .iter()
                    .find(|n| n.starts_with(prefix) && n.contains(".so.12"))
            })
            .cloned()
    };
    let nvrtc = pick("libnvrtc.so").ok_or_else(|| "no libnvrtc.so.13 or .12 here".to_string())?;
    let builtins = pick("libnvrtc-builtins.so");
    for name in builtins.iter().chain(std::iter::once(&nvrtc)) {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading NVIDIA's library runs its initialisers, which have no preconditions.
        let lib = unsafe { Library::open(Some(dir.join(name)), RTLD_NOW | RTLD_GLOBAL) }
            .map_err(|e| format!("cannot load {name}: {e}"))?;
        // Keep it loaded for the life of the process: cudarc holds symbols from it.
        std::mem::forget(lib);
    }
    Ok(())
}

/// What NVRTC produced for one program.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    /// The CUBIN for the exact architecture.
    pub cubin: Vec<u8>,
    /// The PTX from the same compile, for GPUs the CUBIN does not run on.
    pub ptx: String,
    /// The compiler log (warnings, and `ptxas info` lines with `-Xptxas=-v`).
    pub log: String,
}

/// Compiles a resolved program with NVRTC for `arch` (e.g. `sm_90`).
pub fn nvrtc_compile(name: &str, source: &str, arch: &str, extra: &[&str]) -> Result<NvrtcOutput> {
    nvrtc_version()?;
    let compile_error = |log: String| KernelError::Compile {
        entry: name.to_string(),
        arch: arch.to_string(),
        log,
    };
    let src = CString::new(source).map_err(|_| compile_error("source holds a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| compile_error("name holds a NUL byte".into()))?;
    let mut options: Vec<String> = vec![format!("--gpu-architecture={arch}")];
    options.extend(NVRTC_OPTIONS.iter().map(|s| s.to_string()));
    options.extend(extra.iter().map(|s| s.to_string()));
    let run = || -> Result<NvrtcOutput> {
        let prog = nvrtc::create_program(&src, Some(&cname))
            .map_err(|e| compile_error(format!("nvrtcCreateProgram: {e:?}")))?;
        // SAFETY: `prog` is live until destroy_program below, on every path.
        let outcome = unsafe { nvrtc::compile_program(prog, &options) };
        let log = unsafe { nvrtc::get_program_log(prog) }
            .map(|chars| {
                let bytes: Vec<u8> = chars
                    .iter()
                    .take_while(|c| **c != 0)
                    .map(|c| *c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        let result = outcome
            .map_err(|e| compile_error(format!("{e:?}\n{log}")))
            .and_then(|()| {
                let mut size = 0usize;
                // SAFETY: NVRTC writes the size, then fills a buffer of exactly that size.
                unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
                    .result()
                    .map_err(|e| compile_error(format!("nvrtcGetCUBINSize: {e:?}")))?;
                let mut cubin = vec![0u8; size];
                if size > 0 {
                    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }
                        .result()
                        .map_err(|e| compile_error(format!("nvrtcGetCUBIN: {e:?}")))?;
                }
                let ptx_chars = unsafe { nvrtc::get_ptx(prog) }
                    .map_err(|e| compile_error(format!("nvrtcGetPTX: {e:?}")))?;
                let ptx_bytes: Vec<u8> = ptx_chars
                    .iter()
                    .take_while(|c| **c != 0)
                    .map(|c| *c as u8)
                    .collect();
                Ok(NvrtcOutput {
                    cubin,
                    ptx: String::from_utf8_lossy(&ptx_bytes).into_owned(),
                    log: log.clone(),
                })
            });
        // SAFETY: destroyed once.
        let _ = unsafe { nvrtc::destroy_program(prog) };
        result
    };
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| {
        Err(compile_error(
            "NVRTC panicked (a symbol is missing from the loaded library)".into(),
        ))
    })
}

/// Writes a generated program to the [`RECORD_ENV`] folder, when it is set, as
/// `<name>-<hash>.cu` with the program's name on its first line. Failures are logged: the
/// recording is for tests, and the query goes on.
pub fn record_generated(name: &str, source: &str) {
    let Some(dir) = std::env::var_os(RECORD_ENV).filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let key = cache_key(&[source.as_bytes()]);
    let path = dir.join(format!("{}-{key}.cu", file_stem(name)));
    if path.exists() {
        return;
    }
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{key}.{}.tmp", unique_suffix()));
        std::fs::write(&tmp, format!("// spate program: {name}\n{source}"))?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        log::warn!(
            "{RECORD_ENV}: cannot record {name} in {}: {e}",
            dir.display()
        );
    }
}

/// The programs [`record_generated`] wrote to `dir`: (name, source), in file-name order.
pub fn recorded_programs(dir: &Path) -> std::io::Result<Vec<(String, String)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f)?;
            let (first, rest) = text.split_once('\n').unwrap_or(("", &text));
            let name = first
                .strip_prefix("// spate program: ")
                .unwrap_or("generated")
                .to_string();
            Ok((name, rest.to_string()))
        })
        .collect()
}

/// The kernel cache directory, or `None` when disabled or unavailable.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os(CACHE_ENV) {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => dirs::cache_dir().map(|d| d.join("spate").join("kernels")),
    }
}

/// A cache key: BLAKE3 over every input that changes the compiled output.
pub fn cache_key(parts: &[&[u8]]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().to_hex()[..32].to_string()
}

fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Reads a cache entry.
pub fn cache_load(file: &str) -> Option<Vec<u8>> {
    std::fs::read(cache_dir()?.join(file)).ok()
}

/// A name no other thread or process uses at the same time: temporary files get it before
/// they are renamed into place.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    file_stem(&format!(
        "{}-{:?}-{}",
        std::process::id(),
        std::thread::current().id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// One lock per program being compiled in this process: a thread that asks for a program
/// another thread is compiling waits for it and then finds it in the cache, instead of
/// compiling it a second time.
fn compile_lock(key: &str) -> Arc<Mutex<()>> {
    static IN_FLIGHT: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    let map = IN_FLIGHT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    Arc::clone(map.entry(key.to_string()).or_default())
}

/// Writes a cache entry atomically. Failures only cost a recompile later, so they are logged
/// and ignored.
pub fn cache_store(file: &str, bytes: &[u8]) {
    let Some(dir) = cache_dir() else { return };
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{file}.{}.tmp", unique_suffix()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(file))
    };
    if let Err(e) = write() {
        log::warn!(
            "kernel cache: could not write {}: {e}",
            dir.join(file).display()
        );
    }
}

/// NVRTC output for a program, from the cache when present.
pub fn nvrtc_cached(name: &str, source: &str, arch: &str) -> Result<NvrtcOutput> {
    let (major, minor) = nvrtc_version()?;
    let version = format!("{major}.{minor}");
    let opts = NVRTC_OPTIONS.join(" ");
    let key = cache_key(&[
        source.as_bytes(),
        opts.as_bytes(),
        version.as_bytes(),
        arch.as_bytes(),
    ]);
    let stem = format!("{}-{arch}-{key}", file_stem(name));
    let cached = || {
        let (cubin, ptx) = (
            cache_load(&format!("{stem}.cubin"))?,
            cache_load(&format!("{stem}.ptx"))?,
        );
        Some(NvrtcOutput {
            cubin,
            ptx: String::from_utf8_lossy(&ptx).into_owned(),
            log: String::new(),
        })
    };
    if let Some(hit) = cached() {
        return Ok(hit);
    }
    let lock = compile_lock(&stem);
    let _compiling = lock.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = cached() {
        return Ok(hit);
    }
    let out = nvrtc_compile(name, source, arch, &[])?;
    cache_store(&format!("{stem}.ptx"), out.ptx.as_bytes());
    cache_store(&format!("{stem}.cubin"), &out.cubin);
    Ok(out)
}

/// Code-generation flags for run-time host compiles of generated kernels (and their
/// precompiled header, which must match). `-O1`: these kernels run the emulator's small test
/// inputs, and compile time dominates (a cold `cargo test` compiles over a thousand).
const HOST_CODEGEN_FLAGS: &[&str] = &[
    "-std=c++17",
    "-O1",
    // No fused multiply-add, as NVRTC is told (`--fmad=false`): floats round as on the CPU.
    "-ffp-contract=off",
    "-fPIC",
    "-fno-omit-frame-pointer",
    "-w",
];

/// The system headers `spate_emu.h` includes, precompiled once per cache folder: parsing them
/// is about a third of a generated kernel's host compile. A kernel's own includes of them are
/// then no-ops (include guards).
const PRECOMPILED_HEADER: &str = "#include <algorithm>\n#include <atomic>\n#include <cmath>\n\
#include <cstddef>\n#include <cstdint>\n#include <cstdio>\n#include <cstdlib>\n#include <csignal>\n\
#include <cstring>\n#include <type_traits>\n#include <utility>\n#include <vector>\n\
#include <sys/mman.h>\n#include <unistd.h>\n";

/// The header to pass with `-include` (its `.gch` beside it), building it on first use; `None`
/// when it cannot be built, and kernels then compile without it.
fn precompiled_header(compiler: &str, dir: &Path, version: &str) -> Option<PathBuf> {
    let key = cache_key(&[
        PRECOMPILED_HEADER.as_bytes(),
        HOST_CODEGEN_FLAGS.join(" ").as_bytes(),
        version.as_bytes(),
    ]);
    let header = dir.join(format!("spate-system-{key}.h"));
    let gch = dir.join(format!("spate-system-{key}.h.gch"));
    if header.exists() && gch.exists() {
        return Some(header);
    }
    // Written under unique names and renamed, so concurrent builders never see a partial file.
    let unique = unique_suffix();
    let tmp_header = dir.join(format!(".spate-system-{key}.{unique}.h"));
    let tmp_gch = dir.join(format!(".spate-system-{key}.{unique}.h.gch"));
    std::fs::write(&tmp_header, PRECOMPILED_HEADER).ok()?;
    let built = Command::new(compiler)
        .args(HOST_CODEGEN_FLAGS)
        .args(["-x", "c++-header"])
        .arg(&tmp_header)
        .arg("-o")
        .arg(&tmp_gch)
        .output()
        .is_ok_and(|o| o.status.success());
    let placed = built
        && std::fs::rename(&tmp_header, &header).is_ok()
        && std::fs::rename(&tmp_gch, &gch).is_ok();
    let _ = std::fs::remove_file(&tmp_header);
    let _ = std::fs::remove_file(&tmp_gch);
    placed.then_some(header)
}

/// Host compiles this process has run (cache misses), by program name.
static HOST_COMPILES: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// How many times this process has run the host compiler for programs named `name`.
pub fn host_compiles(name: &str) -> u64 {
    HOST_COMPILES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(name).copied())
        .unwrap_or(0)
}

/// The host C++ compiler: `$CXX`, else `c++`.
fn host_compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// Compiles a resolved emulated program to a shared object and returns its path (cached).
pub fn host_compile(name: &str, source: &str) -> Result<PathBuf> {
    let compiler = host_compiler();
    let version = Command::new(&compiler)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .map_err(|e| KernelError::Compile {
            entry: name.to_string(),
            arch: "host".into(),
            log: format!(
                "the host C++ compiler `{compiler}` could not run ({e}); the emulated backend \
                 needs one for generated kernels (set CXX)"
            ),
        })?;
    let key = cache_key(&[
        source.as_bytes(),
        HOST_CODEGEN_FLAGS.join(" ").as_bytes(),
        version.as_bytes(),
    ]);
    let stem = format!("{}-host-{key}", file_stem(name));
    let dir = cache_dir().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("spate-kernels-{}", std::process::id()))
    });
    let so = dir.join(format!("{stem}.so"));
    if so.exists() {
        return Ok(so);
    }
    let lock = compile_lock(&stem);
    let _compiling = lock.lock().unwrap_or_else(|p| p.into_inner());
    if so.exists() {
        return Ok(so);
    }
    let io_error = |what: &str, e: std::io::Error| KernelError::Compile {
        entry: name.to_string(),
        arch: "host".into(),
        log: format!("{what} in {}: {e}", dir.display()),
    };
    std::fs::create_dir_all(&dir).map_err(|e| io_error("cannot create the cache folder", e))?;
    let unique = unique_suffix();
    let cpp = dir.join(format!(".{stem}.{unique}.cpp"));
    let tmp_so = dir.join(format!(".{stem}.{unique}.so"));
    std::fs::write(&cpp, source).map_err(|e| io_error("cannot write the source", e))?;
    let mut command = Command::new(&compiler);
    command.args(HOST_CODEGEN_FLAGS).arg("-shared");
    if let Some(header) = precompiled_header(&compiler, &dir, &version) {
        command.arg("-include").arg(header);
    }
    *HOST_COMPILES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(name.to_string())
        .or_default() += 1;
    let output = command
        .args(["-x", "c++"])
        .arg(&cpp)
        .arg("-o")
        .arg(&tmp_so)
        .output()
        .map_err(|e| io_error("cannot run the host compiler", e))?;
    let _ = std::fs::remove_file(&cpp);
    if !output.status.success() {
        let _ = std::fs::remove_file(&tmp_so);
        return Err(KernelError::Compile {
            entry: name.to_string(),
            arch: "host".into(),
            log: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    std::fs::rename(&tmp_so, &so).map_err(|e| io_error("cannot move the shared object", e))?;
    Ok(so)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_compiled_by_several_threads_at_once_compiles_once() {
        // A source no other run has cached: the nanoseconds make it new.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let source =
            format!("// {nanos}\nextern \"C\" int spate_single_flight() {{ return 1; }}\n");
        let name = format!("single_flight_{nanos}");
        let paths: Vec<PathBuf> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| host_compile(&name, &source)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic").expect("compiles"))
                .collect()
        });
        assert!(paths.windows(2).all(|w| w[0] == w[1]));
        assert!(paths[0].exists());
        assert_eq!(
            host_compiles(&name),
            1,
            "the other threads waited for the first"
        );
        let again = host_compile(&name, &source).expect("cached");
        assert_eq!(again, paths[0]);
        assert_eq!(
            host_compiles(&name),
            1,
            "a cached program does not compile again"
        );
    }

    #[test]
    fn temporary_names_are_unique_per_call() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
