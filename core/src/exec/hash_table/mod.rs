//! The GPU hash table that aggregation and joins share, as cuco is shared by libcudf's: rows
//! are hashed by their keys, inserted into an open-addressing table (linear probing, a slot
//! claimed with `atomicCAS` by the first row of its group), and the occupied slots, numbered by
//! a prefix scan, are the groups of equal keys (NULL equals NULL; floats by bit pattern after
//! -0.0 becomes +0.0; strings by bytes). Aggregation folds each group's rows into accumulators;
//! a join's build side keeps each group's rows for the probe.
//!
//! [`codegen`] generates the kernels (they go into the program of the operator that uses
//! them); [`build_table`] runs them.

pub(crate) mod codegen;

use spate_kernels::{DeviceBuffer, Kernel, KernelArg, LaunchConfig, Stream as DeviceStream};

use crate::column::{DeviceColumn, RowCount};
use crate::error::{Result, SpateError};
use crate::expr::column_args;

/// The compiled kernels of one generated program, by the names in its `codegen` docs.
pub(crate) struct Kernels {
    pub(crate) program: std::collections::HashMap<String, Kernel>,
    pub(crate) computed: Option<Kernel>,
}

impl Kernels {
    /// Compiles (once per session) the program `source` with its `(name, entry)` kernels.
    pub(crate) fn compile(
        gpu: &crate::device::GpuContext,
        source: &str,
        entries: &[(String, String)],
    ) -> Result<std::collections::HashMap<String, Kernel>> {
        let names: Vec<&str> = entries.iter().map(|(_, e)| e.as_str()).collect();
        let compiled = gpu.generated_kernels(source, &names)?;
        Ok(entries
            .iter()
            .map(|(name, _)| name.clone())
            .zip(compiled)
            .collect())
    }

    pub(crate) fn get(&self, name: &str) -> Result<&Kernel> {
        self.program.get(name).ok_or_else(|| SpateError::Internal {
            message: format!("the generated program has no `{name}` kernel"),
        })
    }
}

/// Launches a generated grid-stride kernel over `n` items (nothing when `n` is 0).
pub(crate) fn launch(
    stream: &DeviceStream,
    kernel: &Kernel,
    n: usize,
    args: &[KernelArg],
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
    // SAFETY: every caller passes the parameters its generated entry point declares (see
    // `codegen`), with buffers sized for the `n` items the kernel strides over.
    unsafe { stream.launch(kernel, cfg, args)? };
    Ok(())
}

/// Numbers the groups of `keys` with the `hash` and `build` kernels named: per row its group,
/// per group its first row, and the count.
pub(crate) fn group_rows(
    stream: &DeviceStream,
    kernels: &Kernels,
    names: (&str, &str),
    keys: &[DeviceColumn],
    n: usize,
) -> Result<(DeviceBuffer<u32>, DeviceBuffer<u32>, usize)> {
    let g = build_table(
        stream,
        kernels,
        names,
        keys,
        &RowCount::Host(n),
        GroupCount::ReadBack,
    )?;
    let groups = match g.groups {
        Groups::Exact(groups) => groups,
        Groups::AtMost(_) => {
            return Err(SpateError::Internal {
                message: "a grouping built to read its count back did not".into(),
            });
        }
    };
    Ok((g.gid, g.reps, groups))
}

/// Whether [`build_table`] reads its group count back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupCount {
    /// Read it back (one host synchronisation): an aggregation sizes its output by it.
    ReadBack,
    /// Leave it on the device and size the per-group buffers by the row count, which bounds
    /// it: a join build needs room for its groups, not their number.
    OnDevice,
}

/// How many groups a [`Grouping`] holds, as far as the host knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Groups {
    /// Read back from the device.
    Exact(usize),
    /// Left on the device: at most this many (the row count).
    AtMost(usize),
}

impl Groups {
    /// How many groups a per-group buffer must have room for.
    pub(crate) fn capacity(self) -> usize {
        match self {
            Groups::Exact(n) | Groups::AtMost(n) => n,
        }
    }
}

/// A hash table over rows' keys, and the groups of equal keys it found.
pub(crate) struct Grouping {
    /// Per row, its group.
    pub(crate) gid: DeviceBuffer<u32>,
    /// Per group, its first row.
    pub(crate) reps: DeviceBuffer<u32>,
    /// Groups: per-group buffers (`reps` here) have room for `groups.capacity()`.
    pub(crate) groups: Groups,
    /// Per row, its key hash.
    pub(crate) hashes: DeviceBuffer<u64>,
    /// The open-addressing table: `row + 1` of a group's first row, 0 when empty.
    pub(crate) table: DeviceBuffer<u32>,
    /// Per slot, the group it holds (meaningful for occupied slots).
    pub(crate) group_of_slot: DeviceBuffer<u32>,
}

/// Builds the table over `keys` (`rows`: n rows, or up to a device count of at most n, when
/// the table is sized by the bound) with the `hash` and `build` kernels named, and numbers its
/// groups; `count` says whether the host learns how many there are.
pub(crate) fn build_table(
    stream: &DeviceStream,
    kernels: &Kernels,
    (hash, build): (&str, &str),
    keys: &[DeviceColumn],
    rows: &RowCount,
    count: GroupCount,
) -> Result<Grouping> {
    let n = rows.bound();
    let mut key_args = Vec::with_capacity(keys.len() * 5 + 6);
    for k in keys {
        column_args(k, &mut key_args);
    }
    let hashes = stream.alloc::<u64>(n.max(1))?;
    let mut args = key_args.clone();
    args.extend([rows.live_arg(), KernelArg::U64(n as u64), (&hashes).into()]);
    launch(stream, kernels.get(hash)?, n, &args)?;

    let cap = (2 * n).max(64).next_power_of_two();
    let table = stream.alloc_zeroed::<u32>(cap)?;
    let slot_of_row = stream.alloc::<u32>(n.max(1))?;
    let mut args = key_args;
    args.extend([
        rows.live_arg(),
        KernelArg::U64(n as u64),
        (&hashes).into(),
        (&table).into(),
        KernelArg::U64(cap as u64 - 1),
        (&slot_of_row).into(),
    ]);
    launch(stream, kernels.get(build)?, n, &args)?;

    let flags = stream.alloc::<u32>(cap)?;
    launch(
        stream,
        kernels.get("flags")?,
        cap,
        &[(&table).into(), KernelArg::U64(cap as u64), (&flags).into()],
    )?;
    let (group_of_slot, groups) = match count {
        GroupCount::ReadBack => {
            let (group_of_slot, groups) =
                spate_kernels::scan::exclusive_sum_with_total(stream, flags.as_slice())?;
            (group_of_slot, Groups::Exact(groups as usize))
        }
        GroupCount::OnDevice => (
            spate_kernels::scan::exclusive_sum(stream, flags.as_slice())?,
            Groups::AtMost(n),
        ),
    };
    let gid = stream.alloc::<u32>(n.max(1))?;
    let reps = stream.alloc::<u32>(groups.capacity().max(1))?;
    launch(
        stream,
        kernels.get("assign")?,
        n.max(cap),
        &[
            (&table).into(),
            (&group_of_slot).into(),
            KernelArg::U64(cap as u64),
            (&slot_of_row).into(),
            rows.live_arg(),
            KernelArg::U64(n as u64),
            (&gid).into(),
            (&reps).into(),
        ],
    )?;
    Ok(Grouping {
        gid,
        reps,
        groups,
        hashes,
        table,
        group_of_slot,
    })
}
