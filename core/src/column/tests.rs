//! Round trips of every supported type through device memory, with nulls, slices and empties.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Date64Array, Decimal128Array, Float16Array,
    Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeStringArray,
    StringArray, StringViewArray, TimestampMicrosecondArray, TimestampNanosecondArray, UInt8Array,
    UInt16Array, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use half::f16;
use spate_kernels::reference::Rng;
use spate_kernels::{Device, DeviceOptions};

use super::*;

fn opt<T>(r: &mut Rng, v: T) -> Option<T> {
    if r.chance(0.2) { None } else { Some(v) }
}

/// One array of every supported type, `n` rows, about 20% nulls, random values with extremes.
fn arrays(n: usize, seed: u64) -> Vec<ArrayRef> {
    let mut r = Rng::new(seed);
    let ints = |r: &mut Rng| -> Vec<Option<i64>> {
        (0..n)
            .map(|_| {
                let v = match r.below(8) {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    _ => r.next_u64() as i64,
                };
                opt(r, v)
            })
            .collect()
    };
    let i = ints(&mut r);
    let floats: Vec<Option<f64>> = (0..n)
        .map(|k| {
            let v = match k % 7 {
                0 => f64::NAN,
                1 => -0.0,
                2 => f64::NEG_INFINITY,
                _ => (r.next_u64() as i64) as f64 / 1e6,
            };
            opt(&mut r, v)
        })
        .collect();
    let strings: Vec<Option<String>> = (0..n)
        .map(|k| {
            let len = (r.below(40)) as usize;
            let s: String = (0..len)
                .map(|j| char::from(b'a' + ((k + j) % 26) as u8))
                .chain(if k % 5 == 0 { Some('é') } else { None })
                .collect();
            opt(&mut r, s)
        })
        .collect();
    let bools: Vec<Option<bool>> = (0..n)
        .map(|_| {
            let b = r.chance(0.5);
            opt(&mut r, b)
        })
        .collect();
    vec![
        Arc::new(Int8Array::from_iter(i.iter().map(|v| v.map(|x| x as i8)))),
        Arc::new(Int16Array::from_iter(i.iter().map(|v| v.map(|x| x as i16)))),
        Arc::new(Int32Array::from_iter(i.iter().map(|v| v.map(|x| x as i32)))),
        Arc::new(Int64Array::from_iter(i.iter().copied())),
        Arc::new(UInt8Array::from_iter(i.iter().map(|v| v.map(|x| x as u8)))),
        Arc::new(UInt16Array::from_iter(
            i.iter().map(|v| v.map(|x| x as u16)),
        )),
        Arc::new(UInt32Array::from_iter(
            i.iter().map(|v| v.map(|x| x as u32)),
        )),
        Arc::new(UInt64Array::from_iter(
            i.iter().map(|v| v.map(|x| x as u64)),
        )),
        Arc::new(Float16Array::from_iter(
            floats.iter().map(|v| v.map(f16::from_f64)),
        )),
        Arc::new(Float32Array::from_iter(
            floats.iter().map(|v| v.map(|x| x as f32)),
        )),
        Arc::new(Float64Array::from_iter(floats.iter().copied())),
        Arc::new(BooleanArray::from_iter(bools.iter().copied())),
        Arc::new(Date32Array::from_iter(
            i.iter().map(|v| v.map(|x| (x % 100_000) as i32)),
        )),
        Arc::new(Date64Array::from_iter(i.iter().copied())),
        Arc::new(TimestampMicrosecondArray::from_iter(i.iter().copied())),
        Arc::new(TimestampNanosecondArray::from_iter(i.iter().copied()).with_timezone("+05:30")),
        Arc::new(
            Decimal128Array::from_iter(i.iter().map(|v| v.map(|x| i128::from(x) * 1_000_003)))
                .with_precision_and_scale(38, 4)
                .unwrap(),
        ),
        Arc::new(
            Decimal128Array::from_iter(i.iter().map(|v| v.map(|x| i128::from(x % 1_000_000))))
                .with_precision_and_scale(15, 2)
                .unwrap(),
        ),
        Arc::new(StringArray::from_iter(strings.iter().cloned())),
        Arc::new(LargeStringArray::from_iter(strings.iter().cloned())),
        Arc::new(StringViewArray::from_iter(strings.iter().cloned())),
    ]
}

fn batch_of(arrays: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> = arrays
        .iter()
        .enumerate()
        .map(|(k, a)| Field::new(format!("c{k}"), a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

fn stream() -> spate_kernels::Stream {
    Device::emulated(DeviceOptions::default())
        .unwrap()
        .new_stream()
        .unwrap()
}

#[test]
fn every_type_round_trips_with_nulls() {
    let stream = stream();
    for n in [0usize, 1, 7, 33, 1000] {
        let batch = batch_of(arrays(n, n as u64));
        let device = upload_batch(&stream, &batch).unwrap();
        assert_eq!(device.host_rows(), Some(n));
        let back = download_batch(&stream, &device).unwrap();
        assert_eq!(back.schema(), batch.schema());
        for (k, (a, b)) in batch.columns().iter().zip(back.columns()).enumerate() {
            assert_eq!(
                a.as_ref(),
                b.as_ref(),
                "column {k} ({}) n={n}",
                a.data_type()
            );
            assert_eq!(a.null_count(), b.null_count());
        }
    }
}

#[test]
fn sliced_arrays_upload_only_their_rows() {
    let stream = stream();
    let full = arrays(500, 9);
    for (offset, len) in [(3usize, 100usize), (13, 0), (64, 300), (499, 1)] {
        let sliced: Vec<ArrayRef> = full.iter().map(|a| a.slice(offset, len)).collect();
        let batch = batch_of(sliced);
        let device = upload_batch(&stream, &batch).unwrap();
        let back = download_batch(&stream, &device).unwrap();
        for (a, b) in batch.columns().iter().zip(back.columns()) {
            assert_eq!(
                a.as_ref(),
                b.as_ref(),
                "{} at {offset}+{len}",
                a.data_type()
            );
        }
        // Strings are rebased: offsets on the device start at 0 and hold only the slice's bytes.
        let s = &device.columns()[18];
        if let DeviceValues::Utf8 { offsets, bytes } = s.values() {
            let host: Vec<i32> = stream.to_vec(offsets.typed::<i32>().unwrap()).unwrap();
            assert_eq!(host.first().copied(), Some(0));
            assert_eq!(*host.last().unwrap() as usize, bytes.len());
        } else {
            panic!("Utf8 column stored as {:?}", s.values());
        }
    }
}

#[test]
fn all_null_and_no_null_columns() {
    let stream = stream();
    let none: ArrayRef = Arc::new(Int32Array::from(vec![None::<i32>; 70]));
    let all: ArrayRef = Arc::new(Int32Array::from((0..70).collect::<Vec<i32>>()));
    let up = upload_column(&stream, &none).unwrap();
    assert_eq!(up.null_count(), Some(70));
    assert_eq!(
        download_column(&stream, &up).unwrap().as_ref(),
        none.as_ref()
    );
    let up = upload_column(&stream, &all).unwrap();
    assert!(up.validity().is_none());
    assert_eq!(
        download_column(&stream, &up).unwrap().as_ref(),
        all.as_ref()
    );
}

#[test]
fn one_allocation_per_batch_and_staging_is_reused() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let batch = batch_of(arrays(300, 4));
    let up = upload_batch(&stream, &batch).unwrap();
    let stats = device.memory_stats();
    assert!(stats.allocated_bytes >= up.device_bytes());
    // Every column of the batch shares the one arena.
    assert!(stats.allocated_bytes < up.device_bytes() + 64 * 3 * batch.num_columns() + 64);
    drop(up);
    assert_eq!(device.memory_stats().allocated_bytes, 0);
    assert!(device.pinned_pool().cached_bytes() > 0);
}

#[test]
fn unsupported_types_name_the_column() {
    let stream = stream();
    let list: ArrayRef = Arc::new(arrow::array::ListArray::from_iter_primitive::<
        arrow::datatypes::Int32Type,
        _,
        _,
    >(vec![Some(vec![Some(1)])]));
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            "tags",
            list.data_type().clone(),
            true,
        )])),
        vec![list],
    )
    .unwrap();
    let err = upload_batch(&stream, &batch).unwrap_err();
    assert!(matches!(err, SpateError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("column `tags`"), "{err}");
    assert!(device_layout(&DataType::Utf8View).is_some());
}

#[test]
fn device_batches_concatenate_like_arrow() {
    let stream = stream();
    let full = arrays(400, 21);
    let pieces: Vec<RecordBatch> = [(0usize, 37usize), (37, 0), (37, 200), (237, 163)]
        .iter()
        .map(|(o, n)| batch_of(full.iter().map(|a| a.slice(*o, *n)).collect()))
        .collect();
    let schema = pieces[0].schema();
    let on_device: Vec<DeviceBatch> = pieces
        .iter()
        .map(|b| upload_batch(&stream, b).unwrap())
        .collect();
    let joined = concat_device_batches(&stream, &schema, on_device).unwrap();
    let back = download_batch(&stream, &joined).unwrap();
    let want = arrow::compute::concat_batches(&schema, &pieces).unwrap();
    assert_eq!(back.num_rows(), 400);
    for (k, (a, b)) in want.columns().iter().zip(back.columns()).enumerate() {
        assert_eq!(a.as_ref(), b.as_ref(), "column {k} ({})", a.data_type());
    }
    let empty = concat_device_batches(&stream, &schema, Vec::new()).unwrap();
    assert_eq!(empty.host_rows(), Some(0));
}

/// Batches of one schema may store a string column with 32-bit offsets in one batch and
/// 64-bit in the next (an operator's output, and the same rows back from the host): they
/// concatenate into 64-bit offsets, in order. (Found by TPC-DS q23 under a small budget, where
/// the 32-bit part's offsets were read as 64-bit ones.)
#[test]
fn strings_stored_with_either_offset_width_concatenate() {
    let stream = stream();
    let narrow: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("ccc")]));
    let wide: ArrayRef = Arc::new(LargeStringArray::from(vec![Some("dddd"), Some(""), None]));
    let narrow = upload_batch(&stream, &batch_of(vec![narrow])).unwrap();
    let schema = Arc::clone(narrow.schema());
    // The same Utf8 column, stored with 64-bit offsets.
    let wide = upload_batch(&stream, &batch_of(vec![wide])).unwrap();
    let c = &wide.columns()[0];
    let column = DeviceColumn::with_uncounted_nulls(
        DataType::Utf8,
        3,
        c.validity().cloned(),
        c.values().clone(),
    );
    let wide = DeviceBatch::try_new(Arc::clone(&schema), vec![column], 3).unwrap();
    for (parts, want) in [
        (
            vec![narrow.clone(), wide.clone()],
            vec![Some("a"), None, Some("ccc"), Some("dddd"), Some(""), None],
        ),
        (
            vec![wide, narrow],
            vec![Some("dddd"), Some(""), None, Some("a"), None, Some("ccc")],
        ),
    ] {
        let joined = concat_device_batches(&stream, &schema, parts).unwrap();
        assert!(matches!(
            joined.columns()[0].values(),
            DeviceValues::LargeUtf8 { .. }
        ));
        let back = download_batch(&stream, &joined).unwrap();
        let got: Vec<Option<String>> = (0..back.num_rows())
            .map(|i| {
                let c = back.column(0);
                c.is_valid(i)
                    .then(|| arrow::util::display::array_value_to_string(c, i).unwrap())
            })
            .collect();
        let want: Vec<Option<String>> = want.into_iter().map(|s| s.map(String::from)).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn fixed_width_values_view_exactly_their_rows() {
    // Operators allocate at least 16 bytes per output; a column must still view only its rows,
    // or a consumer sizing its work by the view (the sort did) reads rows that do not exist.
    let stream = stream();
    for rows in [0usize, 1] {
        let bytes = DeviceBytes::new(stream.alloc_zeroed::<u8>(16).unwrap());
        let column = DeviceColumn::new(
            DataType::Int64,
            rows,
            0,
            None,
            DeviceValues::Fixed { bytes, width: 8 },
        );
        let DeviceValues::Fixed { bytes, .. } = column.values() else {
            panic!("fixed-width values expected");
        };
        assert_eq!(bytes.len(), rows * 8);
        assert_eq!(bytes.typed::<i64>().unwrap().len(), rows);
    }
}

/// `batch` uploaded and filtered on the device by `keep`, its count left there (a filter's
/// output).
fn device_filtered(
    stream: &spate_kernels::Stream,
    batch: &RecordBatch,
    keep: &[u8],
) -> DeviceBatch {
    use spate_kernels::compact::{self, Mask};
    let up = upload_batch(stream, batch).unwrap();
    let n = batch.num_rows().max(1);
    let mut mask = keep.to_vec();
    mask.resize(n, 0);
    let mask = stream.from_host(&mask).unwrap();
    let word = DeviceCount::new(stream.alloc::<u32>(1).unwrap()).unwrap();
    let kept = compact::select_indices_on_device(
        stream,
        Mask::Bytes(mask.as_slice()),
        None,
        batch.num_rows().max(1),
        word.as_slice(),
    )
    .unwrap();
    let gathers: Vec<Gather<'_>> = up
        .columns()
        .iter()
        .map(|c| Gather::rows(c, kept.slice(..batch.num_rows()).unwrap()))
        .collect();
    let rows = RowCount::Device {
        bound: batch.num_rows(),
        word,
    };
    gather_batch(stream, batch.schema(), &gathers, &rows).unwrap()
}

/// Device-counted batches (and host-counted ones among them) append on the device into one
/// batch whose count stays there: nothing is read back, NULLs and booleans keep their bits,
/// and the rows are the parts' kept rows in order. String columns are not appended.
#[test]
fn device_counted_batches_append_without_a_readback() {
    let stream = stream();
    // Every fixed-width and boolean type; the three string types come last.
    let mut full = arrays(400, 33);
    let strings = full.split_off(full.len() - 3);
    let cuts = [(0usize, 37usize), (37, 0), (37, 200), (237, 40), (277, 123)];
    let (mut parts, mut want) = (Vec::new(), Vec::new());
    for (k, (o, n)) in cuts.iter().enumerate() {
        let piece = batch_of(full.iter().map(|a| a.slice(*o, *n)).collect());
        if k == 3 {
            // A host-counted part among them.
            parts.push(upload_batch(&stream, &piece).unwrap());
            want.push(piece);
            continue;
        }
        // Part 2 keeps nothing; the others every row whose index is not a multiple of k + 2.
        let keep: Vec<u8> = (0..*n)
            .map(|i| u8::from(k != 2 && i % (k + 2) != 0))
            .collect();
        parts.push(device_filtered(&stream, &piece, &keep));
        let mask = BooleanArray::from(keep.iter().map(|&b| b == 1).collect::<Vec<_>>());
        want.push(arrow::compute::filter_record_batch(&piece, &mask).unwrap());
    }
    let schema = want[0].schema();
    let before = stream.device().counters();
    let joined = append_device_batches(&stream, &schema, &parts)
        .unwrap()
        .expect("fixed-width and boolean columns append");
    let spent = stream.device().counters() - before;
    assert_eq!(spent.host_syncs, 0);
    // One launch per column and per bitmap, whatever the parts.
    assert_eq!(spent.launches, append_launches(&parts) as u64);
    assert!(append_launches(&parts) <= 2 * schema.fields().len());
    assert!(joined.host_rows().is_none());
    assert_eq!(joined.bound(), 400);
    let back = download_batch(&stream, &joined).unwrap();
    let want = arrow::compute::concat_batches(&schema, &want).unwrap();
    assert_eq!(back.num_rows(), want.num_rows());
    for (k, (a, b)) in want.columns().iter().zip(back.columns()).enumerate() {
        assert_eq!(a.as_ref(), b.as_ref(), "column {k} ({})", a.data_type());
    }
    // Past what one launch takes, the caller reads the counts back instead.
    let many = vec![parts[0].clone(); spate_kernels::gather::APPEND_PARTS + 1];
    assert!(
        append_device_batches(&stream, &schema, &many)
            .unwrap()
            .is_none()
    );
    // With a string column, the same.
    let with_strings = batch_of(vec![Arc::clone(&full[0]), Arc::clone(&strings[0])]);
    let keep = vec![1u8; 400];
    let part = device_filtered(&stream, &with_strings, &keep);
    let parts = [part.clone(), part];
    assert!(
        append_device_batches(&stream, &with_strings.schema(), &parts)
            .unwrap()
            .is_none()
    );
}

/// Parts of one upload: slices at odd bit offsets, an empty one, and one whose columns have no
/// nulls beside parts that have them.
fn upload_parts() -> Vec<RecordBatch> {
    let full = arrays(600, 31);
    let valid = arrays(90, 32)
        .iter()
        .map(|a| arrow::compute::filter(a, &arrow::compute::is_not_null(a).unwrap()).unwrap())
        .collect::<Vec<_>>();
    let shortest = valid.iter().map(|a| a.len()).min().unwrap();
    let mut parts: Vec<RecordBatch> = [(3usize, 117usize), (120, 0), (121, 300), (421, 5)]
        .iter()
        .map(|(o, n)| batch_of(full.iter().map(|a| a.slice(*o, *n)).collect()))
        .collect();
    let schema = parts[0].schema();
    let no_nulls = valid.iter().map(|a| a.slice(0, shortest)).collect();
    parts.insert(2, RecordBatch::try_new(schema, no_nulls).unwrap());
    parts
}

#[test]
fn batches_upload_as_one_with_their_parts_end_to_end() {
    let stream = stream();
    let parts = upload_parts();
    let schema = parts[0].schema();
    assert!(parts[2].columns().iter().all(|c| c.null_count() == 0));
    let before = stream.device().counters();
    let device = upload_batches(&stream, &schema, &parts).unwrap();
    let spent = stream.device().counters() - before;
    // One copy for the arena and one for the Utf8View column's views, no wait.
    assert_eq!(spent.host_syncs, 0);
    let want = arrow::compute::concat_batches(&schema, &parts).unwrap();
    assert_eq!(device.host_rows(), Some(want.num_rows()));
    let back = download_batch(&stream, &device).unwrap();
    assert_eq!(back.schema(), schema);
    for (k, (a, b)) in want.columns().iter().zip(back.columns()).enumerate() {
        assert_eq!(a.as_ref(), b.as_ref(), "column {k} ({})", a.data_type());
        assert_eq!(a.null_count(), b.null_count(), "column {k}");
        assert_eq!(device.columns()[k].null_count(), Some(a.null_count()));
    }
    // No parts, or only empty ones, make an empty batch.
    let empty = upload_batches(&stream, &schema, &[]).unwrap();
    assert_eq!(empty.host_rows(), Some(0));
    assert_eq!(download_batch(&stream, &empty).unwrap().num_rows(), 0);
}

/// Utf8View strings of `n` rows, about 20% null, long and short ones, in data buffers of
/// `block` bytes each.
fn views(n: usize, block: u32, seed: u64) -> StringViewArray {
    let mut r = Rng::new(seed);
    let mut b = arrow::array::StringViewBuilder::new().with_fixed_block_size(block);
    for k in 0..n {
        if r.chance(0.2) {
            b.append_null();
        } else {
            let len = r.below(40) as usize;
            b.append_value(
                (0..len)
                    .map(|j| char::from(b'a' + ((k + j) % 26) as u8))
                    .collect::<String>(),
            );
        }
    }
    b.finish()
}

#[test]
fn utf8_views_cross_the_bus_as_views_and_buffers() {
    let stream = stream();
    let parts: Vec<StringViewArray> =
        vec![views(300, 256, 1), views(0, 256, 2), views(500, 1024, 3)];
    assert!(
        parts[0].data_buffers().len() > 1,
        "several buffers per part"
    );
    let batches: Vec<RecordBatch> = parts
        .iter()
        .map(|a| batch_of(vec![Arc::new(a.clone()) as ArrayRef]))
        .collect();
    let schema = batches[0].schema();
    let before = stream.device().counters();
    let device = upload_batches(&stream, &schema, &batches).unwrap();
    let spent = stream.device().counters() - before;
    assert_eq!(spent.host_syncs, 0);
    // The views and the buffers as they are, and the validity: nothing converted on the host.
    let views_and_buffers: usize = parts
        .iter()
        .map(|a| a.len() * 16 + a.data_buffers().iter().map(|b| b.len()).sum::<usize>())
        .sum();
    assert!(spent.h2d_bytes as usize >= views_and_buffers, "{spent:?}");
    assert!(
        spent.h2d_bytes as usize <= views_and_buffers + 1024,
        "{spent:?}"
    );
    // Lengths, a scan and the copy.
    assert!(spent.launches >= 3, "{spent:?}");
    let back = download_batch(&stream, &device).unwrap();
    let want = arrow::compute::concat_batches(&schema, &batches).unwrap();
    assert_eq!(back.column(0).data_type(), &DataType::Utf8View);
    assert_eq!(back.column(0).as_ref(), want.column(0).as_ref());

    // A slice of a large array does not carry the whole of its buffers over the bus.
    let big = views(20_000, 1 << 20, 4);
    let slice: ArrayRef = Arc::new(big.slice(100, 50));
    let batch = batch_of(vec![Arc::clone(&slice)]);
    let before = stream.device().counters();
    let device = upload_batch(&stream, &batch).unwrap();
    let spent = stream.device().counters() - before;
    assert!(spent.h2d_bytes < 64 * 1024, "{spent:?}");
    let back = download_batch(&stream, &device).unwrap();
    assert_eq!(back.column(0).as_ref(), slice.as_ref());
}

/// A device batch cut into row ranges (`DeviceBatch::slice`) and concatenated again is the
/// batch: each range's string bytes are exactly its rows', so no range's last string runs into
/// the next range's bytes.
#[test]
fn device_slices_concatenate_back_to_the_batch() {
    let stream = stream();
    let full = arrays(300, 41);
    let host = batch_of(full);
    let device = upload_batch(&stream, &host).unwrap();
    let cuts = [(0usize, 90usize), (90, 0), (90, 1), (91, 150), (241, 59)];
    let parts: Vec<DeviceBatch> = cuts
        .iter()
        .map(|&(o, n)| device.slice(&stream, o, n).unwrap())
        .collect();
    let joined = concat_device_batches(&stream, device.schema(), parts).unwrap();
    let back = download_batch(&stream, &joined).unwrap();
    for (k, (a, b)) in host.columns().iter().zip(back.columns()).enumerate() {
        assert_eq!(a.as_ref(), b.as_ref(), "column {k} ({})", a.data_type());
    }
}

/// What dropping a batch frees: its allocations, unless something else views them too.
#[test]
fn unshared_bytes_leave_out_allocations_viewed_elsewhere() {
    let stream = stream();
    let batch = upload_batch(&stream, &batch_of(arrays(50, 7))).unwrap();
    assert!(batch.held_bytes() > 0);
    assert_eq!(batch.unshared_bytes(), batch.held_bytes());
    let other = batch.clone();
    assert_eq!(batch.unshared_bytes(), 0);
    drop(other);
    let part = batch.slice(&stream, 10, 20).unwrap();
    // The slice's fixed-width columns view the batch's arena.
    assert!(batch.unshared_bytes() < batch.held_bytes());
    drop(part);
    assert_eq!(batch.unshared_bytes(), batch.held_bytes());
}

/// Embedding columns, `n` rows, about 20% null rows (their elements arbitrary, some null) and
/// about 2% null elements in set rows:
/// fp16 × 3 (6-byte rows), fp32 × 4 (16), fp32 × 5 (20), fp16 × 768 (1,536), fp32 × 6 (24) and
/// bf16 × 8 (a UInt16 element field marked `spate.bfloat16`).
fn embeddings(n: usize, seed: u64) -> Vec<ArrayRef> {
    use arrow::array::FixedSizeListArray;
    use arrow::buffer::NullBuffer;
    let mut r = Rng::new(seed);
    let mut column = |element: Field, d: usize| -> ArrayRef {
        let rows: Vec<bool> = (0..n).map(|_| !r.chance(0.2)).collect();
        let elements: ArrayRef = match element.data_type() {
            DataType::Float16 => Arc::new(Float16Array::from_iter((0..n * d).map(|k| {
                // Elements under a null row may be null themselves, as writers leave them.
                let set = if rows[k / d] {
                    !r.chance(0.02)
                } else {
                    r.chance(0.5)
                };
                set.then(|| f16::from_f32(r.below(2000) as f32 / 8.0))
            }))),
            DataType::Float32 => Arc::new(Float32Array::from_iter((0..n * d).map(|k| {
                let set = if rows[k / d] {
                    !r.chance(0.02)
                } else {
                    r.chance(0.5)
                };
                set.then(|| r.below(1 << 20) as f32 - 5e5)
            }))),
            _ => Arc::new(UInt16Array::from_iter((0..n * d).map(|k| {
                // Any bits but the null ones (a NaN upload refuses).
                let set = if rows[k / d] {
                    !r.chance(0.02)
                } else {
                    r.chance(0.5)
                };
                set.then(|| r.below(1 << 16) as u16)
                    .filter(|&b| u32::from(b) != crate::vector::Elem::Bf16.null_bits())
            }))),
        };
        Arc::new(
            FixedSizeListArray::try_new(
                Arc::new(element),
                d as i32,
                elements,
                Some(NullBuffer::from(rows)),
            )
            .unwrap(),
        )
    };
    let bf16 = Field::new("item", DataType::UInt16, true)
        .with_metadata([("spate.bfloat16".to_string(), "true".to_string())].into());
    vec![
        column(Field::new("item", DataType::Float16, true), 3),
        column(Field::new("item", DataType::Float32, true), 4),
        column(Field::new("element", DataType::Float32, true), 5),
        column(Field::new("item", DataType::Float16, true), 768),
        // 24-byte rows: gathered in u64 words.
        column(Field::new("item", DataType::Float32, true), 6),
        column(bf16, 8),
    ]
}

/// Rows `picks` of `device` (`u32::MAX`: a null row), gathered on the device and downloaded.
fn gather_rows(stream: &spate_kernels::Stream, device: &DeviceBatch, picks: &[u32]) -> RecordBatch {
    let d_picks = stream.from_host(picks).unwrap();
    let gathers: Vec<Gather<'_>> = device
        .columns()
        .iter()
        .map(|c| Gather::rows_or_null(c, d_picks.as_slice()))
        .collect();
    let columns = gather_columns(stream, &gathers).unwrap();
    let gathered = DeviceBatch::try_new(Arc::clone(device.schema()), columns, picks.len()).unwrap();
    download_batch(stream, &gathered).unwrap()
}

#[test]
fn embeddings_round_trip_slice_concatenate_and_gather() {
    let stream = stream();
    let full = embeddings(300, 4);
    for (offset, len) in [(0usize, 300usize), (3, 100), (13, 0), (299, 1)] {
        let batch = batch_of(full.iter().map(|a| a.slice(offset, len)).collect());
        let device = upload_batch(&stream, &batch).unwrap();
        let back = download_batch(&stream, &device).unwrap();
        assert_eq!(back.schema(), batch.schema(), "at {offset}+{len}");
        for (a, b) in batch.columns().iter().zip(back.columns()) {
            assert_eq!(
                a.as_ref(),
                b.as_ref(),
                "{} at {offset}+{len}",
                a.data_type()
            );
            assert_eq!(a.null_count(), b.null_count());
        }
        // Gathered rows (and NULL_INDEX, a null row) equal Arrow's `take`.
        let picks: Vec<u32> = (0..len as u32)
            .rev()
            .chain([u32::MAX, 0].into_iter().filter(|_| len > 0))
            .collect();
        let back = gather_rows(&stream, &device, &picks);
        let take = UInt32Array::from(
            picks
                .iter()
                .map(|&p| (p != u32::MAX).then_some(p))
                .collect::<Vec<_>>(),
        );
        for (a, b) in batch.columns().iter().zip(back.columns()) {
            let want = arrow::compute::take(a.as_ref(), &take, None).unwrap();
            assert_eq!(
                want.as_ref(),
                b.as_ref(),
                "{} gathered at {offset}+{len}",
                a.data_type()
            );
        }
    }
    // Gathered from a slice of a device batch: the slice's rows, not the batch's.
    let batch = batch_of(full.clone());
    let device = upload_batch(&stream, &batch).unwrap();
    let part = device.slice(&stream, 41, 150).unwrap();
    let picks: Vec<u32> = (0..150u32).rev().step_by(3).collect();
    let back = gather_rows(&stream, &part, &picks);
    let take = UInt32Array::from(picks.iter().map(|&p| p + 41).collect::<Vec<_>>());
    for (a, b) in batch.columns().iter().zip(back.columns()) {
        let want = arrow::compute::take(a.as_ref(), &take, None).unwrap();
        assert_eq!(
            want.as_ref(),
            b.as_ref(),
            "{} gathered from a slice",
            a.data_type()
        );
    }
    // Concatenated on the device like Arrow's concat.
    let pieces: Vec<RecordBatch> = [(0usize, 37usize), (37, 0), (37, 263)]
        .iter()
        .map(|(o, n)| batch_of(full.iter().map(|a| a.slice(*o, *n)).collect()))
        .collect();
    let schema = pieces[0].schema();
    let on_device = pieces
        .iter()
        .map(|b| upload_batch(&stream, b).unwrap())
        .collect();
    let joined = download_batch(
        &stream,
        &concat_device_batches(&stream, &schema, on_device).unwrap(),
    )
    .unwrap();
    let want = arrow::compute::concat_batches(&schema, &pieces).unwrap();
    assert_eq!(joined.columns(), want.columns());
}

#[test]
fn embedding_null_elements_round_trip_and_their_bits_are_refused_as_values() {
    use arrow::array::FixedSizeListArray;
    let stream = stream();
    let one = |emb: ArrayRef| {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "emb",
                emb.data_type().clone(),
                true,
            )])),
            vec![emb],
        )
        .unwrap()
    };
    let list = |elements: Vec<Option<f32>>| -> ArrayRef {
        Arc::new(
            FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                2,
                Arc::new(Float32Array::from(elements)),
                None,
            )
            .unwrap(),
        )
    };
    // A NULL element in a set row comes back NULL, in slices too.
    let column = list(vec![
        Some(1.0),
        None,
        Some(3.0),
        Some(4.0),
        None,
        Some(f32::NAN),
    ]);
    for (offset, len) in [(0, 3), (1, 2), (2, 1)] {
        let batch = one(column.slice(offset, len));
        let back = download_batch(&stream, &upload_batch(&stream, &batch).unwrap()).unwrap();
        assert_eq!(
            back.column(0).as_ref(),
            batch.column(0).as_ref(),
            "{offset}+{len}"
        );
        use arrow::array::AsArray;
        let elements = Arc::clone(back.column(0).as_fixed_size_list().values());
        let copied = arrow::compute::concat(&[batch.column(0).as_ref()]).unwrap();
        let nulls = copied.as_fixed_size_list().values().null_count();
        assert_eq!(elements.null_count(), nulls, "{offset}+{len}");
    }
    // A set element with the null bits would read back as NULL: refused, naming its row.
    let null_bits = f32::from_bits(crate::vector::Elem::F32.null_bits());
    let column = list(vec![Some(1.0), Some(2.0), Some(3.0), Some(null_bits)]);
    let err = upload_batch(&stream, &one(Arc::clone(&column))).unwrap_err();
    assert!(matches!(err, SpateError::Unsupported { .. }), "{err}");
    assert!(
        err.to_string().contains("`emb`") && err.to_string().contains("row 1"),
        "{err}"
    );
    let err = upload_batch(&stream, &one(column.slice(1, 1))).unwrap_err();
    assert!(err.to_string().contains("row 0"), "{err}");
    upload_batch(&stream, &one(column.slice(0, 1))).unwrap();
    // Under a NULL row those bits mean nothing.
    let elements = Float32Array::from(vec![Some(null_bits), Some(2.0)]);
    let null_row: ArrayRef = Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            Arc::new(elements),
            Some(vec![false].into()),
        )
        .unwrap(),
    );
    upload_batch(&stream, &one(null_row)).unwrap();
    // Lists of other elements, and of no elements, stay on the CPU.
    let f64_list =
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float64, true)), 4);
    assert!(device_layout(&f64_list).is_none());
    let empty = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 0);
    assert!(device_layout(&empty).is_none());
}
