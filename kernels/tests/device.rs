//! The device API on the emulated backend: memory budget and OutOfMemory, reservations,
//! copies and slices, pinned staging buffers, events, and `cuda` without a GPU.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate_kernels::{
    BackendKind, Device, DeviceOptions, KernelError, MemoryBudget, reference, sort,
};

fn small_device(budget: usize) -> Device {
    Device::emulated(DeviceOptions {
        memory_budget: MemoryBudget::Bytes(budget),
        ..DeviceOptions::default()
    })
    .unwrap()
}

#[test]
fn over_budget_allocation_is_out_of_memory_and_releases_cleanly() {
    let device = small_device(1 << 20);
    let stream = device.new_stream().unwrap();
    let held = stream.alloc::<u8>(600 << 10).unwrap();
    match stream.alloc::<u64>(100 << 10) {
        Err(KernelError::OutOfMemory {
            requested_bytes,
            free_bytes,
        }) => {
            assert_eq!(requested_bytes, 800 << 10);
            assert_eq!(free_bytes, (1 << 20) - (600 << 10));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    drop(held);
    assert_eq!(device.memory_stats().allocated_bytes, 0);
    assert_eq!(device.memory_stats().peak_bytes, 600 << 10);
}

#[test]
fn a_primitive_that_runs_out_of_memory_fails_cleanly_and_frees_its_scratch() {
    let device = small_device(256 << 10);
    let stream = device.new_stream().unwrap();
    let keys = stream.from_host(&reference::random_u64(12_000, 1)).unwrap();
    let err = sort::sort_pairs(&stream, keys.as_slice(), None, 64).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(device.memory_stats().allocated_bytes, keys.num_bytes());
    // The device stays healthy: OutOfMemory is for operators to react to.
    device.check_health().unwrap();
    let small = stream.from_host(&reference::random_u64(100, 2)).unwrap();
    sort::sort_pairs(&stream, small.as_slice(), None, 64).unwrap();
}

#[test]
fn reservations_hold_budget_for_later() {
    let device = small_device(1000);
    let stream = device.new_stream().unwrap();
    let r = device.reserve(900).unwrap();
    assert!(stream.alloc::<u8>(200).unwrap_err().is_out_of_memory());
    drop(r);
    stream.alloc::<u8>(200).unwrap();
    assert!(device.reserve(2000).unwrap_err().is_out_of_memory());
}

#[test]
fn copies_slices_and_bounds() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let data: Vec<i32> = (0..100).collect();
    let buf = stream.from_host(&data).unwrap();
    assert_eq!(
        stream.to_vec(buf.slice(10..13).unwrap()).unwrap(),
        vec![10, 11, 12]
    );
    assert!(buf.slice(90..101).is_err());
    let mut dst = stream.alloc_zeroed::<i32>(10).unwrap();
    stream
        .copy_device(buf.slice(50..55).unwrap(), &mut dst, 5)
        .unwrap();
    assert_eq!(
        stream.to_vec(&dst).unwrap(),
        vec![0, 0, 0, 0, 0, 50, 51, 52, 53, 54]
    );
    assert!(
        stream
            .copy_device(buf.slice(0..6).unwrap(), &mut dst, 5)
            .is_err()
    );
    assert!(stream.copy_from_host(&[1, 2, 3], &mut dst, 8).is_err());
    let mut small = [0i32; 3];
    assert!(stream.copy_to_host(buf.as_slice(), &mut small).is_err());
}

#[test]
fn pinned_staging_round_trip_with_events() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let values: Vec<u64> = reference::random_u64(1000, 3);
    let mut pinned = device.pinned(8000).unwrap();
    for (chunk, v) in pinned.as_bytes_mut().unwrap().chunks_mut(8).zip(&values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    let mut dev = stream.alloc::<u64>(1000).unwrap();
    let start = stream.record_event().unwrap();
    stream.upload_pinned(&mut pinned, &mut dev).unwrap();
    let mut back = device.pinned(8000).unwrap();
    stream.download_pinned(dev.as_slice(), &mut back).unwrap();
    let end = stream.record_event().unwrap();
    end.synchronize().unwrap();
    assert!(end.is_complete());
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    let bytes = back.as_bytes().unwrap();
    let round: Vec<u64> = bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(round, values);
    let mut wrong = device.pinned(16).unwrap();
    assert!(stream.download_pinned(dev.as_slice(), &mut wrong).is_err());
}

#[test]
fn cuda_without_a_gpu_is_a_typed_error_not_a_panic() {
    match Device::open(BackendKind::Cuda, DeviceOptions::default()) {
        Ok(d) => println!("a GPU is present: {}", d.description()),
        Err(KernelError::NoDevice { reason }) => {
            assert!(!reason.is_empty());
            println!("no GPU, as expected here: {reason}");
        }
        Err(other) => panic!("expected NoDevice, got {other}"),
    }
}

#[test]
fn unknown_kernels_and_bad_budgets_are_errors() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    assert!(matches!(
        device.kernel("no_such_kernel"),
        Err(KernelError::Internal { .. })
    ));
    let bad = Device::emulated(DeviceOptions {
        memory_budget: MemoryBudget::FractionOfFree(1.5),
        ..DeviceOptions::default()
    });
    assert!(matches!(bad, Err(KernelError::InvalidArgument { .. })));
}

#[test]
fn runtime_calls_are_counted_on_the_device_and_in_the_innermost_scope() {
    use spate_kernels::{CounterSnapshot, Counters, counters};
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let before = device.counters();
    let scope = Counters::new();
    let values: Vec<u64> = reference::random_u64(1000, 5);
    let back = counters::in_scope(&scope, || {
        // One allocation and 8000 bytes up.
        let input = stream.from_host(&values).unwrap();
        // A copy on the device: one more allocation.
        let mut copy = stream.alloc::<u64>(1000).unwrap();
        stream.copy_device(input.as_slice(), &mut copy, 0).unwrap();
        // Zero-byte buffers allocate nothing.
        let _empty = stream.alloc::<u64>(0).unwrap();
        // One synchronising read of 8000 bytes.
        stream.to_vec(copy.as_slice()).unwrap()
    });
    assert_eq!(back, values);
    let mut pinned = device.pinned(8).unwrap();
    let small = stream.alloc::<u64>(1).unwrap();
    stream
        .download_pinned(small.as_slice(), &mut pinned)
        .unwrap();
    // Reading the pinned buffer waits for its event: a synchronisation outside the scope.
    pinned.as_bytes().unwrap();
    stream.synchronize().unwrap();

    let inside = scope.snapshot();
    assert_eq!(
        inside,
        CounterSnapshot {
            launches: 0,
            host_syncs: 1,
            allocations: 2,
            h2d_bytes: 8000,
            d2h_bytes: 8000,
            d2d_bytes: 8000,
            peer_bytes: 0,
            // The two 8000-byte buffers of the scope, and what the device held before them.
            peak_device_bytes: inside.peak_device_bytes,
        }
    );
    assert!(inside.peak_device_bytes >= 16_000, "{inside:?}");
    let all = device.counters() - before;
    assert_eq!(all.allocations, 3);
    assert_eq!(all.d2h_bytes, 8008);
    assert_eq!(all.host_syncs, 3, "{all:?}");
    assert_eq!(all.bus_bytes(), 16_008);
}

#[test]
fn a_memory_peak_can_be_restarted() {
    let device = small_device(1 << 20);
    let stream = device.new_stream().unwrap();
    let big = stream.alloc::<u8>(4096).unwrap();
    drop(big);
    let held = stream.alloc::<u8>(100).unwrap();
    assert_eq!(device.reset_memory_peak(), 4096);
    assert_eq!(device.memory_stats().peak_bytes, 100);
    drop(held);
}

#[test]
fn one_device_cannot_use_another_devices_memory_or_kernels() {
    let a = small_device(1 << 20);
    let b = small_device(1 << 20);
    assert_ne!(a.id(), b.id());
    let on_a = a.new_stream().unwrap();
    let on_b = b.new_stream().unwrap();
    let keys = on_a.from_host(&reference::random_u64(1000, 3)).unwrap();
    // A kernel on b passed a's buffer: refused before anything is queued, naming both.
    let err = sort::sort_pairs(&on_b, keys.as_slice(), None, 64).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KernelError::Internal { .. }), "{text}");
    assert!(text.contains("belongs to emulated device"), "{text}");
    // A copy between the devices' buffers is refused the same way.
    let mut there = on_b.alloc::<u64>(1000).unwrap();
    let err = on_b
        .copy_device(keys.as_slice(), &mut there, 0)
        .unwrap_err();
    assert!(
        err.to_string().contains("belongs to emulated device"),
        "{err}"
    );
    // A kernel a loaded launches only on a's streams.
    let kernel = a.kernel("scan_tile_sums_u32").unwrap();
    let n = on_b.from_host(&[1u32, 2, 3]).unwrap();
    let mut out = on_b.alloc::<u32>(3).unwrap();
    let err = unsafe {
        on_b.launch(
            &kernel,
            spate_kernels::LaunchConfig::blocks(1),
            &[
                spate_kernels::KernelArg::from(&n),
                spate_kernels::KernelArg::U64(3),
                spate_kernels::KernelArg::from(&mut out),
            ],
        )
    }
    .unwrap_err();
    assert!(err.to_string().contains("another device"), "{err}");
    // Both devices stay healthy, and each still works on its own memory.
    a.check_health().unwrap();
    b.check_health().unwrap();
    sort::sort_pairs(&on_a, keys.as_slice(), None, 64).unwrap();
}

#[test]
fn peer_copies_move_memory_between_devices_and_are_counted() {
    let a = small_device(1 << 20);
    let b = small_device(1 << 20);
    assert!(a.peer_access(&b) && b.peer_access(&a));
    let on_a = a.new_stream().unwrap();
    let on_b = b.new_stream().unwrap();
    let values = reference::random_u64(1000, 4);
    let src = on_a.from_host(&values).unwrap();
    let before = b.counters();
    let mut dst = on_b.alloc::<u64>(1000).unwrap();
    on_b.copy_peer(src.as_slice(), &on_a, &mut dst, 0).unwrap();
    // The source may go at once: its free waits for the copy on `a`'s stream.
    drop(src);
    assert_eq!(on_b.to_vec(&dst).unwrap(), values);
    let counted = b.counters() - before;
    assert_eq!(counted.peer_bytes, 8000);
    assert_eq!(counted.bus_bytes(), 8000, "the readback only");
    // Emulated devices without peer access refuse it: the caller goes through the host.
    let lone = Device::emulated(DeviceOptions {
        emulator: spate_kernels::EmulatorOptions {
            peer_access: false,
            ..Default::default()
        },
        ..DeviceOptions::default()
    })
    .unwrap();
    assert!(!lone.peer_access(&a));
    let on_lone = lone.new_stream().unwrap();
    let mut there = on_lone.alloc::<u64>(1000).unwrap();
    let err = on_lone
        .copy_peer(dst.as_slice(), &on_b, &mut there, 0)
        .unwrap_err();
    assert!(err.to_string().contains("without peer access"), "{err}");
}
