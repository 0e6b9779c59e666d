//! The emulator is as strict as a GPU: each test plants one class of GPU bug and checks that
//! the emulator catches it (a wrong result or a clear error naming the kernel and the buffer),
//! and that the correct version of the same code passes.
//!
//! Classes: a host read without the synchronisation it needs; a stream reading another's
//! output without an event; a use after free; a buffer freed on one stream while another still
//! uses it (and the hand-over that orders the free on the user); out-of-bounds writes (past the guard page, and small overruns into the guard
//! zone); a block that waits for a block that never runs (the watchdog); a kernel that assumes
//! blocks run in order (strict mode); launches a GPU would refuse.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use std::time::Duration;

use spate_kernels::{
    Device, DeviceOptions, EmulatorOptions, Kernel, KernelArg, KernelError, LaunchConfig, Stream,
};

const SOURCE: &str = r#"
#include "common/prelude.cuh"

// Burns time, so that work queued behind it on the same stream runs late.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) spin(u64 iterations, u64* sink) {
    volatile u64 acc = 0;
    for (u64 i = 0; i < iterations; ++i) acc = acc + i;
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] = acc;
}
SPATE_EXPORT(spin)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) fill(u32* out, u64 n, u32 value) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) out[i] = value + (u32)i;
}
SPATE_EXPORT(fill)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) copy_u32(const u32* in, u32* out, u64 n) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) out[i] = in[i];
}
SPATE_EXPORT(copy_u32)

// Block b waits until block b + 1 has finished: correct only if blocks ran from the last to
// the first, which no GPU (and no emulator) promises.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) chain_wait(u32* done) {
    if (threadIdx.x == 0) {
        if (blockIdx.x + 1 < gridDim.x) {
            volatile u32* next = done + blockIdx.x + 1;
            while (*next == 0) {}
        }
        atomicExch(&done[blockIdx.x], 1u);
    }
}
SPATE_EXPORT(chain_wait)

// Records the order in which blocks ran.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) block_order(u32* counter, u32* order) {
    if (threadIdx.x == 0) order[atomicAdd(counter, 1u)] = blockIdx.x;
}
SPATE_EXPORT(block_order)

extern "C" __global__ void __launch_bounds__(64) small_blocks(u32* out) {
    out[threadIdx.x] = threadIdx.x;
}
SPATE_EXPORT(small_blocks)

extern "C" __global__ void big_shared(u32* out) {
    SPATE_DYNAMIC_SHARED(u32, s);
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}
SPATE_EXPORT(big_shared)
"#;

const ENTRIES: &[&str] = &[
    "spin",
    "fill",
    "copy_u32",
    "chain_wait",
    "block_order",
    "small_blocks",
    "big_shared",
];

/// Enough iterations to keep a stream busy for a good fraction of a second.
const SLOW: u64 = 300_000_000;

struct Gpu {
    device: Device,
    kernels: Vec<Kernel>,
}

fn gpu(options: EmulatorOptions) -> Gpu {
    let device = Device::emulated(DeviceOptions {
        emulator: options,
        ..DeviceOptions::default()
    })
    .unwrap();
    let kernels = device
        .compile_generated("strict_planted_bugs", SOURCE, ENTRIES)
        .unwrap();
    Gpu { device, kernels }
}

fn default_gpu() -> Gpu {
    gpu(EmulatorOptions::default())
}

impl Gpu {
    fn kernel(&self, name: &str) -> &Kernel {
        self.kernels.iter().find(|k| k.name() == name).unwrap()
    }

    fn launch(&self, s: &Stream, name: &str, cfg: LaunchConfig, args: &[KernelArg]) {
        // SAFETY: every test passes buffers of the sizes its kernel uses, except where the
        // test plants a bug on purpose; the emulator catches those.
        unsafe { s.launch(self.kernel(name), cfg, args) }.unwrap();
    }

    /// Keeps `s` busy for a while: work queued after this runs late.
    fn stall(&self, s: &Stream) -> spate_kernels::DeviceBuffer<u64> {
        let sink = s.alloc_zeroed::<u64>(1).unwrap();
        self.launch(s, "spin", one_block(32), &[SLOW.into(), (&sink).into()]);
        sink
    }
}

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn fill_args(out: &spate_kernels::DeviceBuffer<u32>, value: u32) -> Vec<KernelArg> {
    vec![out.into(), (out.len() as u64).into(), value.into()]
}

#[test]
fn a_host_read_without_its_synchronisation_sees_poison() {
    let g = default_gpu();
    let s = g.device.new_stream().unwrap();
    let out = s.alloc::<u32>(1024).unwrap();
    let _sink = g.stall(&s);
    g.launch(&s, "fill", LaunchConfig::blocks(4), &fill_args(&out, 7));
    let mut staging = g.device.pinned(4096).unwrap();
    s.download_pinned(out.as_slice(), &mut staging).unwrap();
    // Planted bug: the host reads the staging buffer before the copy's event.
    // SAFETY: the race is the point of the test; the bytes are only compared.
    let early = unsafe { staging.as_bytes_unsynchronized() }.to_vec();
    assert!(
        early.iter().all(|b| *b == 0xCD),
        "an unsynchronised read must see poison, not the data"
    );
    // The fix: wait for the copy.
    let bytes = staging.as_bytes().unwrap();
    let got: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..1024).map(|i| 7 + i).collect::<Vec<u32>>());
}

#[test]
fn a_stream_that_reads_another_streams_output_needs_an_event() {
    let g = default_gpu();
    let (a, b) = (
        g.device.new_stream().unwrap(),
        g.device.new_stream().unwrap(),
    );
    let data = a.alloc::<u32>(256).unwrap();
    let _sink = g.stall(&a);
    g.launch(&a, "fill", LaunchConfig::blocks(1), &fill_args(&data, 100));
    // Planted bug: stream b copies a's output without waiting for a.
    let early = b.to_vec(&data).unwrap();
    assert!(
        early.iter().all(|v| *v == 0xCDCD_CDCD),
        "the read ran before the kernel and saw poison"
    );
    // The fix: order b behind a with an event.
    b.wait_event(&a.record_event().unwrap()).unwrap();
    assert_eq!(
        b.to_vec(&data).unwrap(),
        (0..256).map(|i| 100 + i).collect::<Vec<u32>>()
    );
}

fn expect_fault(result: spate_kernels::Result<()>, kernel: &str, what: &[&str]) -> String {
    let err = result.expect_err("the emulator must report the planted bug");
    let text = err.to_string();
    assert!(text.contains(kernel), "names the kernel: {text}");
    for w in what {
        assert!(text.contains(w), "says `{w}`: {text}");
    }
    text
}

#[test]
fn a_use_after_free_is_reported_with_the_buffer() {
    let g = default_gpu();
    let s = g.device.new_stream().unwrap();
    // Sizes of their own: in strict mode a freed mapping goes to the next allocation of its
    // size, and another test running alongside must not take this one.
    let out = s.alloc_zeroed::<u32>(5000).unwrap();
    let freed = s.alloc::<u32>(5000).unwrap();
    let stale = freed.address();
    drop(freed);
    s.synchronize().unwrap();
    // Planted bug: a kernel is given the address of a buffer that was freed.
    g.launch(
        &s,
        "copy_u32",
        LaunchConfig::blocks(1),
        &[KernelArg::Ptr(stale), (&out).into(), 5000u64.into()],
    );
    expect_fault(
        s.synchronize(),
        "copy_u32",
        &["use after free", "read", "u32 x 5000"],
    );
    assert!(matches!(
        g.device.check_health(),
        Err(KernelError::DeviceUnhealthy { .. })
    ));
}

#[test]
fn a_buffer_freed_on_one_stream_while_another_uses_it_is_caught() {
    let g = default_gpu();
    let (owner, user) = (
        g.device.new_stream().unwrap(),
        g.device.new_stream().unwrap(),
    );
    let shared = owner.from_host(&vec![5u32; 6000]).unwrap();
    owner.synchronize().unwrap();
    let out = user.alloc::<u32>(6000).unwrap();
    let _sink = g.stall(&user);
    g.launch(
        &user,
        "copy_u32",
        LaunchConfig::blocks(8),
        &[(&shared).into(), (&out).into(), 6000u64.into()],
    );
    // Planted bug: the owner frees it, ordered only on its own stream, while the user's
    // kernel is still queued.
    drop(shared);
    expect_fault(
        user.synchronize(),
        "copy_u32",
        &["use after free", "freed on stream"],
    );
}

#[test]
fn the_same_free_after_an_event_is_fine() {
    let g = default_gpu();
    let (owner, user) = (
        g.device.new_stream().unwrap(),
        g.device.new_stream().unwrap(),
    );
    let shared = owner.from_host(&vec![5u32; 4096]).unwrap();
    user.wait_event(&owner.record_event().unwrap()).unwrap();
    let out = user.alloc::<u32>(4096).unwrap();
    let _sink = g.stall(&user);
    g.launch(
        &user,
        "copy_u32",
        LaunchConfig::blocks(8),
        &[(&shared).into(), (&out).into(), 4096u64.into()],
    );
    // The fix: the owner waits for the user before freeing.
    owner.wait_event(&user.record_event().unwrap()).unwrap();
    drop(shared);
    assert_eq!(user.to_vec(&out).unwrap(), vec![5u32; 4096]);
}

#[test]
fn a_buffer_handed_over_to_its_user_is_freed_in_the_users_order() {
    let g = default_gpu();
    let (copier, user) = (
        g.device.new_stream().unwrap(),
        g.device.new_stream().unwrap(),
    );
    // A copy stream fills the buffer; the user waits for it and reads it later.
    let shared = copier.from_host(&vec![9u32; 7000]).unwrap();
    user.wait_event(&copier.record_event().unwrap()).unwrap();
    let out = user.alloc::<u32>(7000).unwrap();
    let _sink = g.stall(&user);
    g.launch(
        &user,
        "copy_u32",
        LaunchConfig::blocks(8),
        &[(&shared).into(), (&out).into(), 7000u64.into()],
    );
    // Handed over, the free is queued behind the user's kernel instead of on the idle copy
    // stream (where it would run at once, as in the test above).
    shared.free_on(&user).unwrap();
    drop(shared);
    assert_eq!(user.to_vec(&out).unwrap(), vec![9u32; 7000]);
    // A stream of another device cannot take it.
    let other = Device::emulated(DeviceOptions::default()).unwrap();
    let elsewhere = other.new_stream().unwrap();
    let mine = copier.alloc::<u32>(4).unwrap();
    assert!(matches!(
        mine.free_on(&elsewhere),
        Err(KernelError::InvalidArgument { .. })
    ));
}

#[test]
fn an_out_of_bounds_write_names_the_buffer_and_the_element() {
    let g = default_gpu();
    let s = g.device.new_stream().unwrap();
    let out = s.alloc::<u32>(1024).unwrap();
    // Planted bug: the kernel is told the buffer is longer than it is.
    g.launch(
        &s,
        "fill",
        LaunchConfig::blocks(4),
        &[(&out).into(), 1025u64.into(), 0u32.into()],
    );
    expect_fault(
        s.synchronize(),
        "fill",
        &["out-of-bounds write", "element 1024", "u32 x 1024"],
    );
}

#[test]
fn a_small_overrun_into_the_guard_zone_is_caught_after_the_launch() {
    let g = default_gpu();
    let s = g.device.new_stream().unwrap();
    // 10 elements: the 11th lies in the rounding slack, before the guard page.
    let out = s.alloc::<u32>(10).unwrap();
    g.launch(
        &s,
        "fill",
        LaunchConfig::blocks(1),
        &[(&out).into(), 11u64.into(), 0u32.into()],
    );
    expect_fault(
        s.synchronize(),
        "fill",
        &["out-of-bounds write", "element 10", "guard zone"],
    );
}

#[test]
fn a_wait_on_a_block_that_never_runs_is_stopped_by_the_watchdog() {
    let g = gpu(EmulatorOptions {
        watchdog: Duration::from_millis(1500),
        threads: Some(4),
        ..EmulatorOptions::default()
    });
    let s = g.device.new_stream().unwrap();
    let flags = s.alloc_zeroed::<u32>(64).unwrap();
    let cfg = LaunchConfig {
        grid: (64, 1, 1),
        block: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    g.launch(&s, "chain_wait", cfg, &[(&flags).into()]);
    expect_fault(s.synchronize(), "chain_wait", &["watchdog"]);
}

#[test]
fn strict_mode_runs_blocks_out_of_order() {
    let order_of = |options: EmulatorOptions| {
        let g = gpu(options);
        let s = g.device.new_stream().unwrap();
        let counter = s.alloc_zeroed::<u32>(1).unwrap();
        let order = s.alloc_zeroed::<u32>(64).unwrap();
        let cfg = LaunchConfig {
            grid: (64, 1, 1),
            block: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        g.launch(
            &s,
            "block_order",
            cfg,
            &[(&counter).into(), (&order).into()],
        );
        s.to_vec(&order).unwrap()
    };
    let in_order: Vec<u32> = (0..64).collect();
    let relaxed = EmulatorOptions {
        strict: None,
        threads: Some(1),
        ..EmulatorOptions::default()
    };
    assert_eq!(order_of(relaxed), in_order);
    let strict = |seed| EmulatorOptions {
        strict: Some(seed),
        threads: Some(1),
        ..EmulatorOptions::default()
    };
    let (first, second) = (order_of(strict(7)), order_of(strict(11)));
    assert_ne!(first, in_order, "seed 7 keeps index order");
    assert_ne!(first, second, "two seeds give the same order");
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, in_order, "every block ran once");
}

#[test]
fn launch_limits_are_those_of_a_gpu() {
    let g = default_gpu();
    let s = g.device.new_stream().unwrap();
    let out = s.alloc_zeroed::<u32>(1024).unwrap();
    let launch = |name: &str, cfg: LaunchConfig| {
        // SAFETY: `out` holds a u32 per thread of any block below.
        unsafe { s.launch(g.kernel(name), cfg, &[(&out).into()]) }
    };
    let err = launch("small_blocks", one_block(128)).unwrap_err();
    assert!(err.to_string().contains("limit of 64"), "{err}");
    launch("small_blocks", one_block(64)).unwrap();

    let shared = |bytes: u32| LaunchConfig {
        shared_mem_bytes: bytes,
        ..one_block(256)
    };
    let err = launch("big_shared", shared(64 << 10)).unwrap_err();
    assert!(
        err.to_string().contains("set_max_dynamic_shared_bytes"),
        "{err}"
    );
    assert!(
        g.kernel("big_shared")
            .set_max_dynamic_shared_bytes(300 << 10)
            .is_err(),
        "beyond the H200's 227 KiB"
    );
    g.kernel("big_shared")
        .set_max_dynamic_shared_bytes(64 << 10)
        .unwrap();
    launch("big_shared", shared(64 << 10)).unwrap();
    assert_eq!(
        s.to_vec(&out).unwrap()[..256],
        (0..256).rev().collect::<Vec<u32>>()
    );

    let err = launch(
        "small_blocks",
        LaunchConfig {
            grid: (1, 70_000, 1),
            ..one_block(32)
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("grid dimensions"), "{err}");
}
