//! The row pairs of a cross join: `kernels/cuda/join/cross.cu`.

use crate::error::{Result, ensure_arg};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::DeviceBuffer;
use crate::stream::Stream;

/// Left and right row indices of the pairs of left rows `first_left..first_left + left_rows`
/// with every one of `right_rows` right rows, left-major: all of left row `first_left`'s pairs
/// first.
pub fn cross_pairs(
    stream: &Stream,
    first_left: usize,
    left_rows: usize,
    right_rows: usize,
) -> Result<(DeviceBuffer<u32>, DeviceBuffer<u32>)> {
    let n = left_rows
        .checked_mul(right_rows)
        .filter(|n| *n < u32::MAX as usize)
        .ok_or_else(|| crate::error::KernelError::InvalidArgument {
            message: format!(
                "a cross join output of {left_rows} × {right_rows} rows passes a batch's 2^32 - 1"
            ),
        })?;
    ensure_arg!(
        first_left + left_rows <= u32::MAX as usize,
        "left row {} is past a batch's rows",
        first_left + left_rows
    );
    let (left, right) = (stream.alloc::<u32>(n)?, stream.alloc::<u32>(n)?);
    if n == 0 {
        return Ok((left, right));
    }
    let kernel = stream.device().kernel("cross_pairs")?;
    // SAFETY: both outputs hold n indices.
    unsafe {
        stream.launch(
            &kernel,
            LaunchConfig::blocks(stream.device().grid_stride_blocks(n)),
            &[
                KernelArg::U64(first_left as u64),
                KernelArg::U64(right_rows as u64),
                KernelArg::U64(n as u64),
                (&left).into(),
                (&right).into(),
            ],
        )?;
    }
    Ok((left, right))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selftest::test_device;

    #[test]
    fn pairs_are_left_major() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for (first, l, r) in [(0usize, 3usize, 4usize), (5, 2, 1), (0, 0, 3), (7, 1000, 3)] {
            let (left, right) = cross_pairs(&stream, first, l, r).unwrap();
            let (left, right) = (
                stream.to_vec(&left).unwrap(),
                stream.to_vec(&right).unwrap(),
            );
            let want: Vec<(u32, u32)> = (first..first + l)
                .flat_map(|a| (0..r).map(move |b| (a as u32, b as u32)))
                .collect();
            let got: Vec<(u32, u32)> = left.into_iter().zip(right).collect();
            assert_eq!(got, want, "{first} + {l} × {r}");
        }
        assert!(cross_pairs(&stream, 0, 1 << 20, 1 << 20).is_err());
    }
}
