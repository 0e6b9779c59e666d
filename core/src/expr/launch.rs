//! Running generated expression kernels: their launch arguments, output buffers and the one
//! readback that brings back string totals and the error word together.

use super::abi::{ErrorBits, input_args};
use super::builder::{PredicateKernel, ValueKernel};

/// Runs a value kernel over a device batch and returns its output columns, one value per row.
pub fn evaluate_values(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    values: &ValueKernel,
    batch: &crate::column::DeviceBatch,
) -> crate::error::Result<Vec<crate::column::DeviceColumn>> {
    evaluate_values_at(
        stream,
        kernel,
        values,
        batch,
        None,
        batch.row_count().live(),
    )
}

/// [`evaluate_values`] for the listed rows only (in that order): a gather fused into the
/// kernel. Every index in `rows` must be below the batch's row count (they come from a
/// filter's compaction), as the kernel reads the columns at them unchecked. `live` is the
/// device count of the rows computed (of `rows` when given, else of the batch), or `None` when
/// all `n` are.
pub(crate) fn evaluate_values_at(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    values: &ValueKernel,
    batch: &crate::column::DeviceBatch,
    rows: Option<spate_kernels::DeviceSlice<'_, u32>>,
    live: Option<spate_kernels::DeviceSlice<'_, u32>>,
) -> crate::error::Result<Vec<crate::column::DeviceColumn>> {
    use crate::column::{DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, device_layout};
    use spate_kernels::gather::bitmap_bytes;
    use spate_kernels::{DeviceBuffer, KernelArg, LaunchConfig};

    let n = rows.map_or(batch.bound(), |r| r.len());
    let (mut args, _vectors) = input_args(
        &values.inputs,
        &values.scalars,
        &values.vectors,
        batch,
        stream,
    )?;
    args.push(live.map_or_else(KernelArg::null, KernelArg::from));
    args.push(KernelArg::U64(n as u64));
    args.push(rows.map_or_else(KernelArg::null, KernelArg::from));
    let pass_arg = args.len();
    args.push(KernelArg::U32(0));
    /// Where one output's values go.
    enum Buffers {
        /// Values (or bits) and validity.
        Fixed(DeviceBuffer<u8>, DeviceBuffer<u8>),
        /// Lengths, then offsets (`n + 1`); the bytes once their total is known; validity.
        Strings(
            DeviceBuffer<u64>,
            Option<DeviceBuffer<u8>>,
            DeviceBuffer<u8>,
        ),
    }
    let mut buffers = Vec::with_capacity(values.outputs.len());
    // Argument index of each string output's byte pointer, filled in for pass 1.
    let mut byte_args = Vec::new();
    for data_type in &values.outputs {
        let validity = stream.alloc::<u8>(bitmap_bytes(n).max(4))?;
        match device_layout(data_type) {
            Some(crate::column::Layout::Strings | crate::column::Layout::LargeStrings) => {
                let offsets = stream.alloc_zeroed::<u64>(n + 1)?;
                args.push((&offsets).into());
                byte_args.push(args.len());
                args.push(KernelArg::null());
                args.push((&validity).into());
                buffers.push(Buffers::Strings(offsets, None, validity));
            }
            layout => {
                let bytes = match layout {
                    Some(crate::column::Layout::Fixed(width)) => n * width,
                    Some(crate::column::Layout::Bits) => bitmap_bytes(n),
                    _ => {
                        return Err(crate::error::SpateError::Internal {
                            message: format!("value kernels cannot produce {data_type}"),
                        });
                    }
                };
                // At least one 16-byte value, so that an empty column still views as any
                // width.
                let data = stream.alloc::<u8>(bytes.max(16))?;
                args.push((&data).into());
                args.push((&validity).into());
                buffers.push(Buffers::Fixed(data, validity));
            }
        }
    }
    // Everything the host reads after the first launch comes back in one readback: each string
    // output's byte total, then the error word (a u32 in the last u64). A kernel with neither
    // reads nothing back: its null counts stay on the device.
    // Without string outputs, the error word comes back alone: 4 bytes, not a u64.
    let strings = byte_args.len();
    let checked = !values.checks.is_empty();
    // Kept alive to the end: pass 1 may still write the error word.
    let mut readback = match strings {
        0 => None,
        _ => Some(stream.alloc_zeroed::<u64>(strings + usize::from(checked))?),
    };
    let error_alone = match (checked, &readback) {
        (true, None) => Some(stream.alloc_zeroed::<u32>(1)?),
        _ => None,
    };
    match (checked, &readback, &error_alone) {
        (true, Some(r), _) => args.push(KernelArg::Ptr(r.slice(strings..)?.address())),
        (true, None, Some(word)) => args.push(word.into()),
        _ => {}
    }
    if n > 0 {
        let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
        // SAFETY: the arguments follow `ValueKernel`'s documented layout; inputs hold the
        // batch's rows of the types the generated code reads, `rows` (when given) holds `n`
        // indices of those rows (a filter's kept rows), outputs `n` values (or bits, or
        // string lengths) and a validity word per 32 of them.
        unsafe { stream.launch(kernel, cfg, &args)? };
        if let Some(word) = &error_alone {
            ErrorFlag::raise(
                stream.to_vec(word)?.first().copied().unwrap_or(0),
                &values.checks,
            )?;
        }
        let mut totals = Vec::new();
        if let Some(readback) = &mut readback {
            // Every string output's lengths become offsets, their totals go next to the error
            // word, and all of it comes back at once.
            let mut k = 0;
            for b in &mut buffers {
                if let Buffers::Strings(offsets, _, _) = b {
                    spate_kernels::scan::exclusive_sum_in_place(stream, offsets)?;
                    stream.copy_device(offsets.slice(n..)?, readback, k)?;
                    k += 1;
                }
            }
            totals = stream.to_vec(&*readback)?;
            if checked {
                // Little-endian: the u32 error word is the low half of the last u64. Raised
                // before any string buffer is sized from totals an error left meaningless.
                let error_word = totals.pop().unwrap_or(0) as u32;
                ErrorFlag::raise(error_word, &values.checks)?;
            }
        }
        if strings > 0 {
            for (b, (&at, &total)) in buffers
                .iter_mut()
                .filter(|b| matches!(b, Buffers::Strings(..)))
                .zip(byte_args.iter().zip(&totals))
            {
                let Buffers::Strings(_, bytes, _) = b else {
                    continue;
                };
                // Exactly `total` bytes: Arrow validates the whole buffer as UTF-8.
                let out = stream.alloc::<u8>(total as usize)?;
                args[at] = (&out).into();
                *bytes = Some(out);
            }
            args[pass_arg] = KernelArg::U32(1);
            // SAFETY: as above; each string output now has its offsets and room for its
            // bytes.
            unsafe { stream.launch(kernel, cfg, &args)? };
        }
    }
    let mut columns = Vec::with_capacity(buffers.len());
    for (b, data_type) in buffers.into_iter().zip(&values.outputs) {
        let validity_of = |validity| {
            Some(DeviceValidity {
                bytes: DeviceBytes::new(validity),
                offset: 0,
            })
        };
        let (values, validity) = match b {
            Buffers::Strings(offsets, bytes, validity) => {
                let bytes = match bytes {
                    Some(bytes) => bytes,
                    None => stream.alloc::<u8>(0)?,
                };
                (
                    DeviceValues::LargeUtf8 {
                        offsets: DeviceBytes::new(offsets.into_bytes()),
                        bytes: DeviceBytes::new(bytes),
                    },
                    validity_of(validity),
                )
            }
            Buffers::Fixed(data, validity) => (
                match device_layout(data_type) {
                    Some(crate::column::Layout::Fixed(width)) => DeviceValues::Fixed {
                        bytes: DeviceBytes::new(data),
                        width,
                    },
                    _ => DeviceValues::Bits {
                        bytes: DeviceBytes::new(data),
                        offset: 0,
                    },
                },
                validity_of(validity),
            ),
        };
        columns.push(DeviceColumn::with_uncounted_nulls(
            data_type.clone(),
            n,
            validity,
            values,
        ));
    }
    Ok(columns)
}

/// Runs a compiled predicate over a device batch (the operator's input) and returns a byte
/// mask: 1 where the predicate is TRUE.
pub fn evaluate_predicate(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    predicate: &PredicateKernel,
    batch: &crate::column::DeviceBatch,
) -> crate::error::Result<spate_kernels::DeviceBuffer<u8>> {
    use spate_kernels::{KernelArg, LaunchConfig};

    let n = batch.bound();
    let out = stream.alloc::<u8>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let (mut args, _vectors) = input_args(
        &predicate.inputs,
        &predicate.scalars,
        &predicate.vectors,
        batch,
        stream,
    )?;
    args.push(batch.row_count().live_arg());
    args.push(KernelArg::U64(n as u64));
    args.push((&out).into());
    let err = ErrorFlag::new(stream, &predicate.checks, &mut args)?;
    let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
    // SAFETY: the arguments follow `PredicateKernel::inputs`' documented layout; each column
    // holds `n` rows of the type the generated code reads (checked when it was generated), and
    // `out` holds `n` bytes.
    unsafe { stream.launch(kernel, cfg, &args)? };
    err.check(stream, &predicate.checks)?;
    Ok(out)
}

/// The `err` word of a kernel whose expressions can fail: a bit per kind of error.
struct ErrorFlag(Option<spate_kernels::DeviceBuffer<u32>>);

impl ErrorFlag {
    /// A zeroed flag passed as the kernel's last argument, when it has checks.
    fn new(
        stream: &spate_kernels::Stream,
        checks: &[(u32, String)],
        args: &mut Vec<spate_kernels::KernelArg>,
    ) -> crate::error::Result<Self> {
        if checks.is_empty() {
            return Ok(ErrorFlag(None));
        }
        let flag = stream.alloc_zeroed::<u32>(1)?;
        args.push((&flag).into());
        Ok(ErrorFlag(Some(flag)))
    }

    /// Fails as the CPU's checked kernels do when a check fired (waits for the stream).
    fn check(
        self,
        stream: &spate_kernels::Stream,
        checks: &[(u32, String)],
    ) -> crate::error::Result<()> {
        let Some(flag) = self.0 else {
            return Ok(());
        };
        let bits = stream.to_vec(&flag)?.first().copied().unwrap_or(0);
        Self::raise(bits, checks)
    }

    /// The error the CPU raises for the error word `bits` (none when it is zero).
    fn raise(bits: u32, checks: &[(u32, String)]) -> crate::error::Result<()> {
        use arrow::error::ArrowError;
        if bits == 0 {
            return Ok(());
        }
        // The CPU fails on the first error it meets; with several kinds in one batch, report
        // the most specific.
        let message = |code: u32| {
            checks
                .iter()
                .filter(|(c, _)| *c == code)
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        };
        Err(if bits & ErrorBits::DIVIDE_BY_ZERO != 0 {
            ArrowError::DivideByZero
        } else if bits & ErrorBits::CAST != 0 {
            ArrowError::CastError(message(ErrorBits::CAST))
        } else if bits & ErrorBits::PRECISION != 0 {
            ArrowError::InvalidArgumentError(message(ErrorBits::PRECISION))
        } else if bits & ErrorBits::COMPUTE != 0 {
            ArrowError::ComputeError(message(ErrorBits::COMPUTE))
        } else {
            ArrowError::ArithmeticOverflow(message(ErrorBits::OVERFLOW))
        }
        .into())
    }
}
