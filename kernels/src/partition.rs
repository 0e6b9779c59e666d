//! Rows split into partitions by bits of their key hashes: `kernels/cuda/partition/partition.cu`.
//!
//! Operators that spill part of their state to the host (a grace hash join's sides, an
//! aggregation's groups) split rows by the hash of their keys, so that equal keys always land in
//! the same partition and each partition can be processed on its own. [`partition_rows`] returns
//! the permutation that groups the rows by partition (stably: rows keep their order within a
//! partition) and each partition's row count.

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBuffer, DeviceSlice};
use crate::sort::sort_pairs;
use crate::stream::Stream;

/// The most hash bits one split uses: 256 partitions.
pub const MAX_PARTITION_BITS: u32 = 8;

/// Rows grouped by partition.
#[derive(Debug)]
pub struct Partitioned {
    /// Row indices, partition 0's first, each partition's in row order.
    pub order: DeviceBuffer<u32>,
    /// Rows per partition (`2^bits` of them); partition `p`'s rows are
    /// `order[counts[..p].sum()..][..counts[p]]`.
    pub counts: Vec<usize>,
}

impl Partitioned {
    /// The index range of partition `p` in [`Partitioned::order`].
    pub fn range(&self, p: usize) -> std::ops::Range<usize> {
        let start: usize = self.counts[..p].iter().sum();
        start..start + self.counts[p]
    }
}

/// Splits rows into `2^bits` partitions by bits `shift..shift + bits` of their `hashes`. Reads
/// the counts back, so this waits for the stream once.
pub fn partition_rows(
    stream: &Stream,
    hashes: DeviceSlice<'_, u64>,
    shift: u32,
    bits: u32,
) -> Result<Partitioned> {
    ensure_arg!(
        (1..=MAX_PARTITION_BITS).contains(&bits),
        "{bits} partition bits: use 1 to {MAX_PARTITION_BITS}"
    );
    ensure_arg!(
        shift + bits <= 64,
        "partition bits {shift}..{} are past a 64-bit hash",
        shift + bits
    );
    let n = hashes.len();
    ensure_arg!(
        n < u32::MAX as usize,
        "{n} rows exceed a device batch's limit of 2^32 - 1"
    );
    let partitions = 1usize << bits;
    let pids = stream.alloc::<u32>(n)?;
    let counts = stream.alloc_zeroed::<u32>(partitions)?;
    if n > 0 {
        let device = stream.device();
        let kernel = device.kernel("partition_ids")?;
        // SAFETY: `hashes` and `pids` hold n elements, `counts` one per partition; the mask is
        // below the kernel's 256 shared counters.
        unsafe {
            stream.launch(
                &kernel,
                LaunchConfig::blocks(device.grid_stride_blocks(n)),
                &[
                    hashes.into(),
                    KernelArg::U64(n as u64),
                    KernelArg::U32(shift),
                    KernelArg::U32((partitions - 1) as u32),
                    (&pids).into(),
                    (&counts).into(),
                ],
            )?;
        }
    }
    let sorted = sort_pairs::<u32>(stream, pids.as_slice(), None, bits)?;
    let counts = stream
        .to_vec(&counts)?
        .into_iter()
        .map(|c| c as usize)
        .collect();
    Ok(Partitioned {
        order: sorted.values,
        counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::selftest::{SIZES, test_device};

    #[test]
    fn rows_are_grouped_by_their_hash_bits_in_row_order() {
        let device = test_device();
        let s = device.new_stream().unwrap();
        for &n in SIZES {
            for (shift, bits) in [(56, 4), (60, 4), (0, 1), (32, 8)] {
                let hashes = reference::random_u64(n, 41 + n as u64);
                let d = s.from_host(&hashes).unwrap();
                let p = partition_rows(&s, d.as_slice(), shift, bits).unwrap();
                let (order, counts) = (s.to_vec(&p.order).unwrap(), p.counts.clone());
                assert_eq!(
                    (order, counts),
                    reference::partition_rows(&hashes, shift, bits),
                    "n={n} shift={shift} bits={bits}"
                );
            }
        }
    }

    #[test]
    fn bad_bit_counts_are_refused() {
        let device = test_device();
        let s = device.new_stream().unwrap();
        let d = s.from_host(&[1u64, 2, 3]).unwrap();
        for (shift, bits) in [(0, 0), (0, 9), (60, 8)] {
            assert!(partition_rows(&s, d.as_slice(), shift, bits).is_err());
        }
    }
}
