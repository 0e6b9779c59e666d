use super::*;
use crate::reference::{self, NearestRow, Rng, nearest_items};
use crate::selftest::test_device;

/// The bits a NULL f32 element has on the device (`spate::vector::Elem::null_bits`).
const F32_NULL: u32 = 0x7FC5_A11E;

/// Random vectors: some rows NULL, some holding a NULL element, some all zeros, the rest with
/// values from a small set (so that distances tie) or from a wide range.
struct Table {
    /// Element bits per row (f32 bits, or bf16 bits in the low half).
    rows: Vec<Vec<u32>>,
    valid: Vec<bool>,
    elem: u32,
    dim: usize,
}

impl Table {
    fn random(n: usize, dim: usize, elem: u32, seed: u64) -> Table {
        let mut rng = Rng::new(seed);
        let mut rows = Vec::with_capacity(n);
        let mut valid = Vec::with_capacity(n);
        for _ in 0..n {
            valid.push(!rng.chance(0.05));
            let ties = rng.chance(0.3);
            let zero = rng.chance(0.03);
            let row: Vec<u32> = (0..dim)
                .map(|_| {
                    let v = if zero {
                        0.0
                    } else if ties {
                        (rng.below(3) as f32) - 1.0
                    } else {
                        (rng.below(2001) as f32 - 1000.0) / 37.0
                    };
                    if elem == 2 {
                        v.to_bits() >> 16
                    } else {
                        v.to_bits()
                    }
                })
                .collect();
            rows.push(row);
        }
        let mut table = Table {
            rows,
            valid,
            elem,
            dim,
        };
        for i in (0..n).step_by(97) {
            let null = if elem == 2 { 0x7FDB } else { F32_NULL };
            table.rows[i][dim / 2] = null;
        }
        table
    }

    fn value(&self, bits: u32) -> f32 {
        if self.elem == 2 {
            f32::from_bits(bits << 16)
        } else {
            f32::from_bits(bits)
        }
    }

    /// The rows as the reference takes them: `None` for a NULL row or one with a NULL element.
    fn reference(&self) -> Vec<Option<Vec<f32>>> {
        let null = if self.elem == 2 { 0x7FDB } else { F32_NULL };
        self.rows
            .iter()
            .zip(&self.valid)
            .map(|(row, &valid)| {
                (valid && !row.contains(&null))
                    .then(|| row.iter().map(|&b| self.value(b)).collect())
            })
            .collect()
    }

    fn bytes(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut out = Vec::new();
        for row in &self.rows[range] {
            for &b in row {
                if self.elem == 2 {
                    out.extend_from_slice(&(b as u16).to_le_bytes());
                } else {
                    out.extend_from_slice(&b.to_le_bytes());
                }
            }
        }
        out.push(0); // never an empty allocation
        out
    }

    fn validity(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let mut bits = reference::pack_bits(&self.valid[range]);
        bits.push(0);
        bits
    }
}

/// Runs the device top-k over `items` in batches of `batch` rows, against `queries`.
fn device_nearest(
    stream: &Stream,
    items: &Table,
    queries: &Table,
    metric: u32,
    k: usize,
    batch: usize,
    budget: usize,
) -> Vec<NearestRow> {
    let q_bytes = stream
        .from_host(&queries.bytes(0..queries.rows.len()))
        .unwrap();
    let q_valid = stream
        .from_host(&queries.validity(0..queries.rows.len()))
        .unwrap();
    let query_vectors = Vectors {
        bytes: q_bytes.as_slice(),
        validity: Some(DeviceBitmap::new(&q_valid)),
        rows: queries.rows.len(),
        dim: queries.dim,
        elem: queries.elem,
    };
    let mut top = NearestItems::new(stream, queries.rows.len(), k, metric).unwrap();
    let mut first = 0;
    while first < items.rows.len() {
        let end = (first + batch).min(items.rows.len());
        let bytes = stream.from_host(&items.bytes(first..end)).unwrap();
        let valid = stream.from_host(&items.validity(first..end)).unwrap();
        let vectors = Vectors {
            bytes: bytes.as_slice(),
            validity: Some(DeviceBitmap::new(&valid)),
            rows: end - first,
            dim: items.dim,
            elem: items.elem,
        };
        top.add_items(stream, vectors, query_vectors, budget)
            .unwrap();
        first = end;
    }
    assert_eq!(top.items(), items.rows.len() as u64);
    let out = top.finish(stream, 0).unwrap();
    let count = stream.to_vec(&out.count).unwrap()[0] as usize;
    assert!(count <= out.bound);
    let (q, i, r, d) = (
        stream.to_vec(&out.query).unwrap(),
        stream.to_vec(&out.item).unwrap(),
        stream.to_vec(&out.rank).unwrap(),
        stream.to_vec(&out.distance).unwrap(),
    );
    (0..count)
        .map(|j| NearestRow {
            query: q[j],
            item: i[j],
            rank: r[j],
            distance: d[j],
        })
        .collect()
}

fn assert_same(got: &[NearestRow], want: &[NearestRow], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: row counts");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.query == w.query
                && g.item == w.item
                && g.rank == w.rank
                && g.distance.to_bits() == w.distance.to_bits(),
            "{what}: row {j}: got {g:?}, want {w:?}"
        );
    }
}

#[test]
fn every_metric_and_k_equals_the_reference() {
    let device = test_device();
    let stream = device.new_stream().unwrap();
    let queries = Table::random(4, 5, 0, 1);
    for (n, batch) in [(0, 100), (1, 1), (33, 7), (2049, 5000), (5000, 1800)] {
        let items = Table::random(n, 5, 0, 2 + n as u64);
        for metric in 0..3 {
            for k in [1, 7, 300, 2048, 2500] {
                let want = nearest_items(&items.reference(), &queries.reference(), metric, k);
                let got = device_nearest(&stream, &items, &queries, metric, k, batch, 1 << 24);
                assert_same(&got, &want, &format!("n {n}, metric {metric}, k {k}"));
            }
        }
    }
}

#[test]
fn bf16_items_against_f32_queries_in_small_query_groups() {
    let device = test_device();
    let stream = device.new_stream().unwrap();
    let items = Table::random(4100, 8, 2, 9);
    let queries = Table::random(6, 8, 0, 10);
    for metric in 0..3 {
        let want = nearest_items(&items.reference(), &queries.reference(), metric, 10);
        // A budget of one byte: one query per launch.
        let got = device_nearest(&stream, &items, &queries, metric, 10, 3000, 1);
        assert_same(&got, &want, &format!("bf16, metric {metric}"));
    }
}

#[test]
fn bad_arguments_are_errors() {
    let device = test_device();
    let stream = device.new_stream().unwrap();
    for k in [0, MAX_K + 1] {
        assert!(NearestItems::new(&stream, 3, k, 0).is_err(), "k = {k}");
    }
    assert!(NearestItems::new(&stream, 3, 5, 3).is_err());
    let bytes = stream.from_host(&[0u8; 64]).unwrap();
    let v = |dim: usize, rows: usize| Vectors {
        bytes: bytes.as_slice(),
        validity: None,
        rows,
        dim,
        elem: 0,
    };
    let mut top = NearestItems::new(&stream, 2, 5, 0).unwrap();
    let err = top
        .add_items(&stream, v(4, 2), v(2, 2), 1 << 20)
        .unwrap_err();
    assert!(err.to_string().contains("elements"), "{err}");
    let err = top
        .add_items(&stream, v(4, 5), v(4, 2), 1 << 20)
        .unwrap_err();
    assert!(err.to_string().contains("fewer than"), "{err}");
    let err = top
        .add_items(&stream, v(4, 1), v(4, 3), 1 << 20)
        .unwrap_err();
    assert!(err.to_string().contains("query vectors"), "{err}");
}

#[test]
fn sql_orders_keep_the_first_rows_of_the_sort_nulls_and_nan_included() {
    let device = test_device();
    let stream = device.new_stream().unwrap();
    let mut items = Table::random(3000, 4, 0, 61);
    // NaN distances: an infinite element against itself.
    for i in (5..3000).step_by(211) {
        items.rows[i][0] = f32::INFINITY.to_bits();
        items.rows[i][1] = f32::INFINITY.to_bits();
    }
    let mut query = Table::random(1, 4, 0, 62);
    query.rows[0] = [1.0f32, -0.5, 0.25, 2.0].map(f32::to_bits).to_vec();
    query.valid[0] = true;
    let q = query.reference()[0].clone().unwrap();
    let reference = items.reference();
    let bytes = stream.from_host(&items.bytes(0..3000)).unwrap();
    let valid = stream.from_host(&items.validity(0..3000)).unwrap();
    let q_bytes = stream.from_host(&query.bytes(0..1)).unwrap();
    for metric in 0..3 {
        for descending in [false, true] {
            for nulls_first in [false, true] {
                for k in [1, 9, 400, 3000] {
                    // The SQL order: numbers in total order (NaN above them), reversed when
                    // descending, NULLs first or last; the first k, then by row.
                    let mut keyed: Vec<(u64, usize)> = reference
                        .iter()
                        .enumerate()
                        .map(|(i, row)| {
                            let d = row
                                .as_ref()
                                .and_then(|r| reference::vector_distance(metric, r, &q));
                            let key = match d {
                                None if nulls_first => 0,
                                None => u64::MAX - 1,
                                Some(d) if descending => !reference::order_key_f64(d),
                                Some(d) => reference::order_key_f64(d),
                            };
                            (key, i)
                        })
                        .collect();
                    keyed.sort();
                    let mut want: Vec<u32> = keyed.iter().take(k).map(|&(_, i)| i as u32).collect();
                    want.sort();
                    let order = Order::Sql {
                        descending,
                        nulls_first,
                    };
                    let mut top = NearestItems::ordered(&stream, 1, k, metric, order).unwrap();
                    let vectors = Vectors {
                        bytes: bytes.as_slice(),
                        validity: Some(DeviceBitmap::new(&valid)),
                        rows: 3000,
                        dim: 4,
                        elem: 0,
                    };
                    let query_vectors = Vectors {
                        bytes: q_bytes.as_slice(),
                        validity: None,
                        rows: 1,
                        dim: 4,
                        elem: 0,
                    };
                    top.add_items(&stream, vectors, query_vectors, 1 << 24)
                        .unwrap();
                    let (rows, count) = top.rows(&stream).unwrap();
                    let count = stream.to_vec(&count).unwrap()[0] as usize;
                    let got = stream.to_vec(&rows).unwrap()[..count].to_vec();
                    assert_eq!(
                        got, want,
                        "metric {metric}, descending {descending}, nulls first {nulls_first}, k {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_row_count_on_the_device_bounds_the_items() {
    let device = test_device();
    let stream = device.new_stream().unwrap();
    let items = Table::random(3000, 4, 0, 71);
    let mut query = Table::random(1, 4, 0, 72);
    query.rows[0] = [0.5f32, 1.0, -2.0, 0.125].map(f32::to_bits).to_vec();
    query.valid[0] = true;
    let q = query.reference()[0].clone().unwrap();
    let bytes = stream.from_host(&items.bytes(0..3000)).unwrap();
    let valid = stream.from_host(&items.validity(0..3000)).unwrap();
    let q_bytes = stream.from_host(&query.bytes(0..1)).unwrap();
    let live = stream.from_host(&[1700u32]).unwrap();
    let vectors = Vectors {
        bytes: bytes.as_slice(),
        validity: Some(DeviceBitmap::new(&valid)),
        rows: 3000,
        dim: 4,
        elem: 0,
    };
    let query_vectors = Vectors {
        bytes: q_bytes.as_slice(),
        validity: None,
        rows: 1,
        dim: 4,
        elem: 0,
    };
    let order = Order::Sql {
        descending: false,
        nulls_first: false,
    };
    for k in [20, 2500] {
        let mut keyed: Vec<(u64, usize)> = items.reference()[..1700]
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let d = row
                    .as_ref()
                    .and_then(|r| reference::vector_distance(2, r, &q));
                (d.map_or(u64::MAX - 1, reference::order_key_f64), i)
            })
            .collect();
        keyed.sort();
        let mut want: Vec<u32> = keyed.iter().take(k).map(|&(_, i)| i as u32).collect();
        want.sort();
        let mut top = NearestItems::ordered(&stream, 1, k, 2, order).unwrap();
        top.add_counted(
            &stream,
            vectors,
            Some(live.as_slice()),
            query_vectors,
            1 << 24,
        )
        .unwrap();
        // Its rows place no later batch.
        let err = top
            .add_items(&stream, vectors, query_vectors, 1 << 24)
            .unwrap_err();
        assert!(
            err.to_string().contains("row count is on the device"),
            "{err}"
        );
        let (rows, count) = top.rows(&stream).unwrap();
        let count = stream.to_vec(&count).unwrap()[0] as usize;
        assert_eq!(count, want.len(), "k {k}");
        assert_eq!(stream.to_vec(&rows).unwrap()[..count], want[..], "k {k}");
    }
}
