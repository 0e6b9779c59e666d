//! Fidelity of the emulated backend: it must run correct CUDA the way a GPU does, and make the
//! classic kernel bugs fail here as they can on a GPU (missing barriers, reliance on warp
//! lock-step, barriers not reached by every thread, partial-mask warp operations, traps).
//!
//! The kernels below are generated source, so these tests also exercise the run-time host
//! compile (and NVRTC, where present, compiles the same source: see the last test).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate_kernels::{Device, DeviceOptions, KernelArg, KernelError, LaunchConfig, Stream};

const SOURCE: &str = r#"
#include "common/prelude.cuh"
#include "common/block_scan.cuh"

// Each thread reads its right neighbour's shared slot; `sync` decides whether a barrier
// separates the writes from the reads.
extern "C" __global__ void neighbour(u32 seed, u32 sync, u32* out) {
    __shared__ u32 s[256];
    s[threadIdx.x] = threadIdx.x + seed;
    if (sync) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % 256];
}
SPATE_EXPORT(neighbour)

// The pre-Volta "warp-synchronous" reduction: correct only under implicit lock-step.
extern "C" __global__ void lockstep_sum(const u32* in, u32* out) {
    __shared__ u32 s[32];
    u32 t = threadIdx.x;
    s[t] = in[t];
    if (t < 16) s[t] += s[t + 16];
    if (t < 8) s[t] += s[t + 8];
    if (t < 4) s[t] += s[t + 4];
    if (t < 2) s[t] += s[t + 2];
    if (t < 1) s[t] += s[t + 1];
    if (t == 0) out[0] = s[0];
}
SPATE_EXPORT(lockstep_sum)

// Threads beyond `n` return before the barrier the others wait at.
extern "C" __global__ void early_exit(u32 n, u32* out) {
    if (threadIdx.x >= n) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
SPATE_EXPORT(early_exit)

extern "C" __global__ void partial_mask(u32* out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, threadIdx.x, 0);
}
SPATE_EXPORT(partial_mask)

extern "C" __global__ void divergent_warp_ops(u32* out) {
    if (threadIdx.x % 2) out[threadIdx.x] = __ballot_sync(SPATE_FULL_MASK, 1);
    else out[threadIdx.x] = __shfl_sync(SPATE_FULL_MASK, threadIdx.x, 0);
}
SPATE_EXPORT(divergent_warp_ops)

extern "C" __global__ void trap_if(u32 row, u32* out) {
    if (threadIdx.x == row) __trap();
    out[threadIdx.x] = 2;
}
SPATE_EXPORT(trap_if)

// Every warp intrinsic the dialect offers, per lane, into 8 outputs per thread.
extern "C" __global__ void warp_intrinsics(i64* out) {
    u32 lane = threadIdx.x & 31;
    i64* o = out + 8 * (u64)(blockIdx.x * blockDim.x + threadIdx.x);
    o[0] = __shfl_sync(SPATE_FULL_MASK, (i64)lane * 10, 3);
    o[1] = __shfl_up_sync(SPATE_FULL_MASK, (int)lane, 1);
    o[2] = __shfl_down_sync(SPATE_FULL_MASK, (double)lane, 2, 8);
    o[3] = __shfl_xor_sync(SPATE_FULL_MASK, (int)lane, 5);
    o[4] = __ballot_sync(SPATE_FULL_MASK, lane % 3 == 0);
    o[5] = __any_sync(SPATE_FULL_MASK, lane == 31);
    o[6] = __all_sync(SPATE_FULL_MASK, lane < 31);
    o[7] = __popc(lane) + __clz(lane) * 100 + __ffs(lane) * 10000;
}
SPATE_EXPORT(warp_intrinsics)

// Atomics from every block, and a 2-D block with dynamic shared memory.
extern "C" __global__ void atomics(u64* counter, i32* lo, f64* fsum, u32* word) {
    atomicAdd(counter, 1ull);
    atomicMin(lo, -(i32)(blockIdx.x * blockDim.x + threadIdx.x));
    atomicAdd(fsum, 0.5);
    atomicOr(word, 1u << (threadIdx.x & 31));
}
SPATE_EXPORT(atomics)

extern "C" __global__ void two_d(u32* out) {
    SPATE_DYNAMIC_SHARED(u32, tile);
    u32 t = threadIdx.y * blockDim.x + threadIdx.x;
    tile[t] = threadIdx.x * 1000 + threadIdx.y;
    __syncthreads();
    u32 total = 0;
    u32 count = __syncthreads_count(threadIdx.x == 0);
    out[blockIdx.y * gridDim.x * blockDim.x * blockDim.y + blockIdx.x * blockDim.x * blockDim.y + t] =
        tile[blockDim.x * blockDim.y - 1 - t] + count * 1000000 + total;
}
SPATE_EXPORT(two_d)
"#;

const ENTRIES: &[&str] = &[
    "neighbour",
    "lockstep_sum",
    "early_exit",
    "partial_mask",
    "divergent_warp_ops",
    "trap_if",
    "warp_intrinsics",
    "atomics",
    "two_d",
];

struct Fixture {
    device: Device,
    stream: Stream,
    kernels: Vec<spate_kernels::Kernel>,
}

fn fixture() -> Fixture {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let kernels = device
        .compile_generated("emulator_fidelity", SOURCE, ENTRIES)
        .unwrap();
    let stream = device.new_stream().unwrap();
    Fixture {
        device,
        stream,
        kernels,
    }
}

impl Fixture {
    fn kernel(&self, name: &str) -> &spate_kernels::Kernel {
        self.kernels.iter().find(|k| k.name() == name).unwrap()
    }

    /// Launches and waits: launches are asynchronous on both backends, so a kernel's own
    /// failure shows at the next synchronisation, as on a GPU.
    fn run(&self, name: &str, cfg: LaunchConfig, args: &[KernelArg]) -> Result<(), KernelError> {
        // SAFETY: each test passes buffers sized for its kernel.
        unsafe { self.stream.launch(self.kernel(name), cfg, args) }?;
        self.stream.synchronize()
    }
}

fn block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[test]
fn a_missing_barrier_gives_wrong_results_and_the_barrier_fixes_them() {
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(256).unwrap();
    for seed in [1000u32, 2000] {
        let want: Vec<u32> = (0..256).map(|t| (t + 1) % 256 + seed).collect();
        f.run(
            "neighbour",
            block(256),
            &[seed.into(), 1u32.into(), (&out).into()],
        )
        .unwrap();
        assert_eq!(f.stream.to_vec(&out).unwrap(), want);
        f.run(
            "neighbour",
            block(256),
            &[(seed + 7).into(), 0u32.into(), (&out).into()],
        )
        .unwrap();
        let racy = f.stream.to_vec(&out).unwrap();
        let want_racy: Vec<u32> = (0..256).map(|t| (t + 1) % 256 + seed + 7).collect();
        assert_ne!(racy, want_racy, "the race went unnoticed");
    }
}

#[test]
fn warp_synchronous_code_without_syncwarp_is_caught() {
    let f = fixture();
    let input: Vec<u32> = (1..=32).collect();
    let d_in = f.stream.from_host(&input).unwrap();
    let out = f.stream.alloc_zeroed::<u32>(1).unwrap();
    f.run("lockstep_sum", block(32), &[(&d_in).into(), (&out).into()])
        .unwrap();
    assert_ne!(
        f.stream.to_vec(&out).unwrap()[0],
        528,
        "implicit lock-step was emulated"
    );
}

#[test]
fn a_barrier_some_threads_never_reach_is_an_error_not_a_hang() {
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(64).unwrap();
    let err = f
        .run("early_exit", block(64), &[40u32.into(), (&out).into()])
        .unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
    // Kernel errors are sticky, as on a GPU.
    assert!(matches!(
        f.device.check_health(),
        Err(KernelError::DeviceUnhealthy { .. })
    ));
    assert!(matches!(
        f.stream.alloc::<u8>(1),
        Err(KernelError::DeviceUnhealthy { .. })
    ));

    // A new device: its own buffer (another device's would be refused).
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(64).unwrap();
    f.run("early_exit", block(64), &[64u32.into(), (&out).into()])
        .unwrap();
}

#[test]
fn partial_masks_and_divergent_warp_ops_are_rejected() {
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(32).unwrap();
    let err = f
        .run("partial_mask", block(32), &[(&out).into()])
        .unwrap_err();
    assert!(err.to_string().contains("full-warp masks"), "{err}");
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(32).unwrap();
    let err = f
        .run("divergent_warp_ops", block(32), &[(&out).into()])
        .unwrap_err();
    assert!(
        err.to_string().contains("divergent warp operations"),
        "{err}"
    );
}

#[test]
fn a_trap_fails_the_launch_and_the_process_survives() {
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(64).unwrap();
    let err = f
        .run("trap_if", block(64), &[5u32.into(), (&out).into()])
        .unwrap_err();
    match &err {
        KernelError::Launch { entry, message, .. } => {
            assert_eq!(entry, "trap_if");
            assert!(message.contains("__trap"), "{message}");
        }
        other => panic!("expected a launch error, got {other}"),
    }
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(64).unwrap();
    f.run("trap_if", block(64), &[999u32.into(), (&out).into()])
        .unwrap();
    assert_eq!(f.stream.to_vec(&out).unwrap(), vec![2; 64]);
}

#[test]
fn warp_intrinsics_follow_cuda_semantics() {
    let f = fixture();
    let blocks = 3u32;
    let threads = 64u32;
    let out = f
        .stream
        .alloc_zeroed::<i64>((blocks * threads * 8) as usize)
        .unwrap();
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    f.run("warp_intrinsics", cfg, &[(&out).into()]).unwrap();
    let got = f.stream.to_vec(&out).unwrap();
    let ballot: i64 = (0..32).filter(|l| l % 3 == 0).map(|l| 1i64 << l).sum();
    for t in 0..(blocks * threads) as usize {
        let lane = (t % 32) as i64;
        let o = &got[t * 8..t * 8 + 8];
        assert_eq!(o[0], 30, "shfl idx");
        assert_eq!(o[1], if lane >= 1 { lane - 1 } else { lane }, "shfl up");
        let seg = lane % 8;
        assert_eq!(
            o[2],
            if seg + 2 < 8 { lane + 2 } else { lane },
            "shfl down width 8"
        );
        assert_eq!(o[3], lane ^ 5, "shfl xor");
        assert_eq!(o[4] as u32 as i64, ballot, "ballot");
        assert_eq!(o[5], 1, "any");
        assert_eq!(o[6], 0, "all");
        let l = lane as u32;
        let clz = if l == 0 { 32 } else { l.leading_zeros() } as i64;
        let ffs = if l == 0 {
            0
        } else {
            l.trailing_zeros() as i64 + 1
        };
        assert_eq!(
            o[7],
            i64::from(l.count_ones()) + clz * 100 + ffs * 10000,
            "bit ops"
        );
    }
}

#[test]
fn atomics_are_atomic_across_concurrent_blocks() {
    let f = fixture();
    let counter = f.stream.alloc_zeroed::<u64>(1).unwrap();
    let lo = f.stream.alloc_zeroed::<i32>(1).unwrap();
    let fsum = f.stream.alloc_zeroed::<f64>(1).unwrap();
    let word = f.stream.alloc_zeroed::<u32>(1).unwrap();
    let blocks = 64u32;
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    f.run(
        "atomics",
        cfg,
        &[
            (&counter).into(),
            (&lo).into(),
            (&fsum).into(),
            (&word).into(),
        ],
    )
    .unwrap();
    let n = u64::from(blocks) * 128;
    assert_eq!(f.stream.to_vec(&counter).unwrap()[0], n);
    assert_eq!(f.stream.to_vec(&lo).unwrap()[0], -(n as i32 - 1));
    assert_eq!(f.stream.to_vec(&fsum).unwrap()[0], n as f64 * 0.5);
    assert_eq!(f.stream.to_vec(&word).unwrap()[0], u32::MAX);
}

#[test]
fn multi_dimensional_launches_with_dynamic_shared_memory() {
    let f = fixture();
    let (bx, by, gx, gy) = (16u32, 4u32, 3u32, 2u32);
    let total = (bx * by * gx * gy) as usize;
    let out = f.stream.alloc_zeroed::<u32>(total).unwrap();
    let cfg = LaunchConfig {
        grid: (gx, gy, 1),
        block: (bx, by, 1),
        shared_mem_bytes: bx * by * 4,
    };
    f.run("two_d", cfg, &[(&out).into()]).unwrap();
    let got = f.stream.to_vec(&out).unwrap();
    for b in 0..(gx * gy) as usize {
        for t in 0..(bx * by) as usize {
            let src = (bx * by) as usize - 1 - t;
            let (x, y) = (src % bx as usize, src / bx as usize);
            let want = (x * 1000 + y) as u32 + by * 1_000_000;
            assert_eq!(
                got[b * (bx * by) as usize + t],
                want,
                "block {b} thread {t}"
            );
        }
    }
}

#[test]
fn wrong_argument_sizes_are_caught_before_launch() {
    let f = fixture();
    let out = f.stream.alloc_zeroed::<u32>(256).unwrap();
    let err = f
        .run(
            "neighbour",
            block(256),
            &[1u64.into(), 1u32.into(), (&out).into()],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("parameters of sizes [4, 4, 8]"),
        "{err}"
    );
    let err = f.run(
        "neighbour",
        block(100),
        &[1u32.into(), 1u32.into(), (&out).into()],
    );
    assert!(err.unwrap_err().to_string().contains("multiple of 32"));
}

#[test]
fn compile_errors_carry_the_compiler_log() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let err = device
        .compile_generated(
            "broken",
            "#include \"common/prelude.cuh\"\nthis is not C++;\n",
            &[],
        )
        .unwrap_err();
    match err {
        KernelError::Compile { arch, log, .. } => {
            assert_eq!(arch, "host");
            assert!(log.contains("error"), "{log}");
        }
        other => panic!("expected a compile error, got {other}"),
    }
    // A program that did not compile is not recorded for the NVRTC pass (scripts/test sets
    // the recording folder for the whole run).
    if let Some(dir) = std::env::var_os(spate_kernels::compile::RECORD_ENV) {
        let recorded = spate_kernels::compile::recorded_programs(std::path::Path::new(&dir))
            .unwrap_or_default();
        assert!(
            recorded.iter().all(|(name, _)| name != "broken"),
            "a program that failed to compile was recorded"
        );
    }
}

#[test]
fn the_same_generated_source_compiles_with_nvrtc() {
    if spate_kernels::compile::nvrtc_version().is_err() {
        println!("SKIPPED: NVRTC not found");
        return;
    }
    let resolved = spate_kernels::source::resolve("emulator_fidelity", SOURCE, false).unwrap();
    let out = spate_kernels::compile::nvrtc_compile("emulator_fidelity", &resolved, "sm_90", &[])
        .unwrap();
    for e in ENTRIES {
        assert!(out.ptx.contains(&format!(".entry {e}(")), "{e}");
    }
}

/// Lines of `/proc/self/maps`: the process's memory mappings.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().count())
        .unwrap_or(0)
}

/// Fiber stacks (a guard page each) are leased from one pool for the process, for the length
/// of a launch: a stream's thread keeps none between its launches. Each thread used to keep its
/// own stacks for good (513 mappings), and a large TPC-DS query, with scores of streams alive,
/// ran out of the kernel's limit on mappings (`vm.max_map_count`, 65,530) with "could not map
/// 256 fiber stacks".
#[test]
fn fiber_stacks_are_leased_for_a_launch_not_kept_per_thread() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let modules: Vec<_> = (0..2)
        .map(|k| {
            let source = format!(
                "#include \"common/prelude.cuh\"\n\
                 extern \"C\" __global__ void stacks_{k}(u32* out) {{ out[threadIdx.x] = threadIdx.x + {k}u; }}\n\
                 SPATE_EXPORT(stacks_{k})\n"
            );
            let name = format!("stacks_{k}");
            device
                .compile_generated(&name, &source, &[name.as_str()])
                .unwrap()
                .remove(0)
        })
        .collect();
    let streams: Vec<Stream> = (0..40).map(|_| device.new_stream().unwrap()).collect();
    let out = streams[0].alloc_zeroed::<u32>(256).unwrap();
    streams[0].synchronize().unwrap();
    let before = mappings();
    // One launch at a time, every module on every stream's thread.
    for stream in &streams {
        for kernel in &modules {
            // SAFETY: the kernel writes 256 u32s, which `out` holds.
            unsafe { stream.launch(kernel, block(256), &[KernelArg::from(&out)]) }.unwrap();
            stream.synchronize().unwrap();
        }
    }
    let grown = mappings().saturating_sub(before);
    // 40 threads keeping 256 guarded stacks each were over 20,000 mappings; the regions leased
    // one launch at a time are a few at most.
    assert!(
        grown < 5_000,
        "{grown} more mappings after 80 launches on 40 streams"
    );
    let got = streams[39].to_vec(&out).unwrap();
    assert_eq!(got[5], 5 + 1);
}
