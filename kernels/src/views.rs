//! Utf8View columns into Arrow offsets + bytes: `kernels/cuda/strings/views.cu`.
//!
//! A Utf8View column is uploaded as it is on the host: its 16-byte views and its data buffers
//! (laid end to end, with where each starts). Three steps turn it into the offsets + bytes
//! every other kernel reads: each row's length, a u64 scan of them into the output starts,
//! then the copy, which also writes the offsets. The host knows the byte total already (it
//! sums the views' lengths while it stages them), so nothing is read back.

use crate::error::{Result, ensure_arg};
use crate::gather::{OffsetElem, StringBuffers};
use crate::launch::{KernelArg, LaunchConfig};
use crate::memory::{DeviceBitmap, DeviceSlice};
use crate::scan;
use crate::stream::Stream;

/// Bytes of one view.
pub const VIEW_BYTES: usize = 16;

/// A Utf8View column in device memory.
#[derive(Debug, Clone, Copy)]
pub struct DeviceViews<'a> {
    /// [`VIEW_BYTES`] per row.
    pub views: DeviceSlice<'a, u8>,
    /// The column's validity, or `None` when no row is null. A null row's view is ignored.
    pub validity: Option<DeviceBitmap<'a>>,
    /// The data buffers, end to end.
    pub data: DeviceSlice<'a, u8>,
    /// Where each data buffer starts in `data`, by a view's buffer index.
    pub buffer_starts: DeviceSlice<'a, u64>,
}

impl DeviceViews<'_> {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.views.len() / VIEW_BYTES
    }
}

/// The strings of `views` as offsets + bytes, `total` bytes in all.
///
/// # Safety
///
/// - `total` must be the sum of the valid rows' lengths: the bytes are allocated for it and the
///   copy writes that many.
/// - Every valid row longer than 12 bytes must name a buffer of `buffer_starts` and a range
///   inside it, as in an array Arrow has validated.
pub unsafe fn views_to_strings<O: OffsetElem>(
    stream: &Stream,
    views: DeviceViews<'_>,
    total: u64,
) -> Result<StringBuffers<O>> {
    ensure_arg!(
        views.views.len().is_multiple_of(VIEW_BYTES),
        "{} bytes of views are not whole views",
        views.views.len()
    );
    crate::gather::fits::<O>(total)?;
    let n = views.rows();
    if let Some(v) = &views.validity {
        v.check_covers(n, "a Utf8View column's validity")?;
    }
    let grid = LaunchConfig::blocks(stream.device().grid_stride_blocks(n + 1));
    let validity_offset = KernelArg::U64(views.validity.map_or(0, |v| v.offset as u64));
    let lengths = stream.alloc::<u64>(n + 1)?;
    let lengths_kernel = stream.device().kernel("view_lengths")?;
    // SAFETY: `views` holds n views and the validity covers n rows (checked above); `lengths`
    // holds n + 1 values.
    unsafe {
        stream.launch(
            &lengths_kernel,
            grid,
            &[
                views.views.into(),
                views.validity.into(),
                validity_offset,
                KernelArg::U64(n as u64),
                (&lengths).into(),
            ],
        )?;
    }
    // n + 1 lengths, the last 0: the scan's last value is the total.
    let starts = scan::exclusive_sum(stream, lengths.as_slice())?;
    let offsets = stream.alloc::<O>(n + 1)?;
    let bytes = stream.alloc::<u8>(total as usize)?;
    let copy = stream
        .device()
        .kernel(&format!("view_bytes_{}", O::SUFFIX))?;
    // SAFETY: `starts` holds n + 1 values whose last is `total` (the caller's contract), the
    // size of `bytes`; the views address their buffers (the caller's contract).
    unsafe {
        stream.launch(
            &copy,
            grid,
            &[
                views.views.into(),
                views.validity.into(),
                validity_offset,
                views.data.into(),
                views.buffer_starts.into(),
                (&starts).into(),
                KernelArg::U64(n as u64),
                (&offsets).into(),
                (&bytes).into(),
            ],
        )?;
    }
    Ok(StringBuffers { offsets, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::DeviceBitmap;
    use crate::selftest::{SIZES, test_device};

    /// A view of `s`, inline or at `offset` of buffer `buffer`.
    fn view(s: &[u8], buffer: u32, offset: u32) -> [u8; VIEW_BYTES] {
        let mut v = [0u8; VIEW_BYTES];
        v[..4].copy_from_slice(&(s.len() as u32).to_le_bytes());
        if s.len() <= 12 {
            v[4..4 + s.len()].copy_from_slice(s);
        } else {
            v[4..8].copy_from_slice(&s[..4]);
            v[8..12].copy_from_slice(&buffer.to_le_bytes());
            v[12..16].copy_from_slice(&offset.to_le_bytes());
        }
        v
    }

    #[test]
    fn views_become_offsets_and_bytes_and_null_views_are_ignored() {
        let device = test_device();
        let stream = device.new_stream().unwrap();
        for &n in SIZES {
            // Two buffers of long strings; every fifth row null, its view garbage that would
            // point past every buffer.
            let (mut buffers, mut views, mut valid) =
                (vec![Vec::new(), Vec::new()], Vec::new(), Vec::new());
            let mut want = Vec::new();
            for i in 0..n {
                let s: Vec<u8> = (0..(i * 7) % 31)
                    .map(|k| b'a' + ((i + k) % 26) as u8)
                    .collect();
                if i % 5 == 4 {
                    views.extend_from_slice(&[0xEE; VIEW_BYTES]);
                    valid.push(false);
                    continue;
                }
                let b = i % 2;
                let at = buffers[b].len() as u32;
                if s.len() > 12 {
                    buffers[b].extend_from_slice(&s);
                }
                views.extend_from_slice(&view(&s, b as u32, at));
                valid.push(true);
                want.push(s);
            }
            let starts = [0u64, buffers[0].len() as u64];
            let data: Vec<u8> = buffers.concat();
            let bits: Vec<u8> = valid
                .chunks(8)
                .map(|c| c.iter().enumerate().map(|(k, v)| u8::from(*v) << k).sum())
                .collect();
            let total: u64 = want.iter().map(|s| s.len() as u64).sum();
            let (views_d, data_d) = (
                stream.from_host(&views).unwrap(),
                stream.from_host(&data).unwrap(),
            );
            let (starts_d, bits_d) = (
                stream.from_host(&starts).unwrap(),
                stream.from_host(&bits).unwrap(),
            );
            let input = DeviceViews {
                views: views_d.as_slice(),
                validity: Some(DeviceBitmap::new(bits_d.as_slice())),
                data: data_d.as_slice(),
                buffer_starts: starts_d.as_slice(),
            };
            let out = unsafe { views_to_strings::<i32>(&stream, input, total) }.unwrap();
            let offsets = stream.to_vec(&out.offsets).unwrap();
            let bytes = stream.to_vec(&out.bytes).unwrap();
            assert_eq!(offsets.len(), n + 1, "n={n}");
            let mut valid_rows = 0;
            for i in 0..n {
                let got = &bytes[offsets[i] as usize..offsets[i + 1] as usize];
                if valid[i] {
                    assert_eq!(got, want[valid_rows].as_slice(), "row {i} of {n}");
                    valid_rows += 1;
                } else {
                    assert!(got.is_empty(), "null row {i} of {n}");
                }
            }
            assert_eq!(offsets[n] as u64, total);
            // A total past the offsets' reach is refused before anything runs.
            let err = unsafe { views_to_strings::<i32>(&stream, input, 1 << 40) };
            assert!(err.is_err());
        }
    }
}
