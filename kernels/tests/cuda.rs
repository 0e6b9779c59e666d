//! The CUDA backend's differential test: every primitive on a real GPU against its CPU
//! reference. It needs a GPU; without one it reports itself SKIPPED in its summary line (never
//! a silent pass). `harness = false` so that the skip shows in `cargo test`'s output.

use std::process::ExitCode;

use spate_kernels::{Device, DeviceOptions, KernelError, selftest};

fn main() -> ExitCode {
    let device = match Device::cuda(DeviceOptions::default()) {
        Ok(d) => d,
        Err(KernelError::NoDevice { reason }) => {
            println!("\nrunning 1 test\ntest cuda_selftest ... SKIPPED (no CUDA device: {reason})");
            println!("\ntest result: ok. 0 passed; 0 failed; 1 skipped (needs a GPU)\n");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!(
                "test cuda_selftest ... FAILED: a GPU is present but could not be opened: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    println!("\nrunning 1 test on {}", device.description());
    let mut sizes = selftest::SIZES.to_vec();
    sizes.extend([1 << 20, 1 << 24]);
    let results = match selftest::run(&device, &sizes) {
        Ok(r) => r,
        Err(e) => {
            println!("test cuda_selftest ... FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed: Vec<_> = results.iter().filter(|r| r.failure.is_some()).collect();
    for f in &failed {
        println!(
            "  {} rows={}: {}",
            f.check,
            f.rows,
            f.failure.as_deref().unwrap_or("")
        );
    }
    if failed.is_empty() && results.len() == selftest::CHECKS.len() * sizes.len() {
        println!(
            "test cuda_selftest ... ok ({} checks)\n\ntest result: ok. 1 passed; 0 failed\n",
            results.len()
        );
        ExitCode::SUCCESS
    } else {
        println!("test cuda_selftest ... FAILED\n\ntest result: FAILED. 0 passed; 1 failed\n");
        ExitCode::FAILURE
    }
}
