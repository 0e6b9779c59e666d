//! `spate-kernels`: Spate's CUDA kernels and the runtime that compiles and launches them.
//!
//! ```text
//!   spate (core) ── GPU operators ──▶ spate-kernels ──▶ cuda backend (cudarc: driver + NVRTC)
//!                                                   └─▶ emulated backend (host C++ compiler)
//! ```
//!
//! This crate is being built up in stages. Today it holds device discovery ([`probe`]), which
//! must work (and never panic) on machines with no NVIDIA driver at all. The kernel sources,
//! the two backends and the launchers arrive with the kernel runtime.
//!
//! ```
//! // On a machine without a GPU this reports why, instead of panicking.
//! match spate_kernels::probe::discover() {
//!     Ok(devices) => println!("{} CUDA device(s)", devices.len()),
//!     Err(e) => println!("no GPU: {e}"),
//! }
//! ```

pub mod error;
pub mod probe;

pub use error::{KernelError, Result};
