//! One item scored against several queries at once, for `VectorTopKExec` on the CPU.
//!
//! [`QueryLanes`] holds up to [`LANES`] query vectors transposed, element `j` of every query
//! side by side, so that the loop over an item's elements updates one accumulator per query
//! in the same step: the compiler turns it into vector instructions. Each accumulator still
//! adds its products one element after the other in element order, each operation rounded
//! (no fused multiply-add), so every distance equals [`super::score`]'s bit for bit.

use super::distance::{CANONICAL_NAN, Metric};

/// Queries scored together.
pub(crate) const LANES: usize = 8;

/// Up to [`LANES`] queries, transposed (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct QueryLanes {
    metric: Metric,
    /// Element `j` of lane `l` at `j * LANES + l`; lanes past the queries hold zeros.
    elements: Vec<f32>,
    /// Each lane's sum of squares in f32 (the cosine's norm), accumulated in order.
    squares: [f32; LANES],
    /// The queries' positions, one per lane in use.
    queries: Vec<usize>,
}

impl QueryLanes {
    /// The lanes of `vectors` (at most [`LANES`]: each a query's position and its elements,
    /// all of one length).
    pub(crate) fn new(metric: Metric, vectors: &[(usize, &[f32])]) -> QueryLanes {
        debug_assert!(vectors.len() <= LANES);
        let dim = vectors.first().map_or(0, |(_, v)| v.len());
        let mut elements = vec![0f32; dim * LANES];
        let mut squares = [0f32; LANES];
        for (lane, (_, vector)) in vectors.iter().enumerate() {
            for (j, &y) in vector.iter().enumerate() {
                elements[j * LANES + lane] = y;
                squares[lane] += y * y;
            }
        }
        QueryLanes {
            metric,
            elements,
            squares,
            queries: vectors.iter().map(|(q, _)| *q).collect(),
        }
    }

    /// The positions of the queries, lane by lane.
    pub(crate) fn queries(&self) -> &[usize] {
        &self.queries
    }

    /// The distance of `item` to each lane's query (`None`: no distance), in `out`.
    pub(crate) fn score(&self, item: &[f32], out: &mut [Option<f64>; LANES]) {
        let canonical = |d: f64| if d.is_nan() { CANONICAL_NAN } else { d };
        match self.metric {
            Metric::Inner | Metric::Cosine => {
                let mut dot = [0f32; LANES];
                for (x, lanes) in item.iter().zip(self.elements.chunks_exact(LANES)) {
                    for l in 0..LANES {
                        dot[l] += x * lanes[l];
                    }
                }
                if self.metric == Metric::Inner {
                    for l in 0..LANES {
                        out[l] = Some(canonical(f64::from(dot[l])));
                    }
                    return;
                }
                let mut sa = 0f32;
                for x in item {
                    sa += x * x;
                }
                for l in 0..LANES {
                    let sb = self.squares[l];
                    out[l] = (sa != 0.0 && sb != 0.0).then(|| {
                        canonical(
                            1.0 - f64::from(dot[l]) / (f64::from(sa).sqrt() * f64::from(sb).sqrt()),
                        )
                    });
                }
            }
            Metric::L2 => {
                let mut sum = [0f32; LANES];
                for (x, lanes) in item.iter().zip(self.elements.chunks_exact(LANES)) {
                    for l in 0..LANES {
                        let diff = x - lanes[l];
                        sum[l] += diff * diff;
                    }
                }
                for l in 0..LANES {
                    out[l] = Some(canonical(f64::from(sum[l]).sqrt()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::score;

    #[test]
    fn lanes_equal_the_scalar_distance_bit_for_bit() {
        let mut rng = spate_kernels::reference::Rng::new(5);
        let mut value = || match rng.below(40) {
            0 => 0.0,
            1 => f32::INFINITY,
            2 => f32::NAN,
            n => (rng.below(2001) as f32 - 1000.0) / (n as f32 + 0.37),
        };
        for dim in [1, 3, 16, 37] {
            let queries: Vec<Vec<f32>> = (0..LANES)
                .map(|_| (0..dim).map(|_| value()).collect())
                .collect();
            let mut items: Vec<Vec<f32>> = (0..50)
                .map(|_| (0..dim).map(|_| value()).collect())
                .collect();
            items.push(vec![0.0; dim]);
            for metric in [Metric::Cosine, Metric::Inner, Metric::L2] {
                for used in [1, 5, LANES] {
                    let vectors: Vec<(usize, &[f32])> = queries[..used]
                        .iter()
                        .enumerate()
                        .map(|(q, v)| (q, v.as_slice()))
                        .collect();
                    let lanes = QueryLanes::new(metric, &vectors);
                    let mut out = [None; LANES];
                    for item in &items {
                        lanes.score(item, &mut out);
                        for (l, query) in queries[..used].iter().enumerate() {
                            assert_eq!(
                                out[l].map(f64::to_bits),
                                score(metric, item, query).map(f64::to_bits),
                                "{metric:?}, dim {dim}, lane {l}"
                            );
                        }
                    }
                }
            }
        }
    }
}
