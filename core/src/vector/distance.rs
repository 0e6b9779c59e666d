//! The distance arithmetic of embeddings, shared by the CPU functions, the tests' references
//! and, operation for operation, the GPU's `kernels/cuda/common/vector.cuh`.

/// A distance function over two vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// `cosine_distance`: `1 - a·b / (|a| |b|)`, NULL when either norm is zero.
    Cosine,
    /// `inner_product` (`dot_product`): `a·b`.
    Inner,
    /// `array_distance` (`list_distance`): the Euclidean distance `|a - b|`.
    L2,
}

impl Metric {
    /// The metric a SQL function computes, by DataFusion's names and aliases.
    pub fn of_function(name: &str) -> Option<Metric> {
        match name {
            "cosine_distance" => Some(Metric::Cosine),
            "inner_product" | "dot_product" => Some(Metric::Inner),
            "array_distance" | "list_distance" => Some(Metric::L2),
            _ => None,
        }
    }

    /// The metric's SQL function.
    pub fn function(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine_distance",
            Metric::Inner => "inner_product",
            Metric::L2 => "array_distance",
        }
    }

    /// The number the device's `vector.cuh` helpers know this metric by.
    pub fn code(self) -> u32 {
        match self {
            Metric::Cosine => 0,
            Metric::Inner => 1,
            Metric::L2 => 2,
        }
    }
}

/// The distance between `a` and `b` (of equal lengths): accumulated in f32, element by
/// element in order, every operation rounded, then finished in f64. `None` (NULL) for the
/// cosine distance when either vector's sum of squares is 0 in f32 (all zeros, or elements
/// too small to square). A NaN result is always the one NaN [`CANONICAL_NAN`]: a CPU carries
/// an input NaN's sign and payload through, a GPU does not, and a sort would tell them apart.
pub fn score(metric: Metric, a: &[f32], b: &[f32]) -> Option<f64> {
    raw_score(metric, a, b).map(|d| if d.is_nan() { CANONICAL_NAN } else { d })
}

/// The NaN every distance that is not a number is: `f64::NAN`'s bits, positive and quiet.
pub const CANONICAL_NAN: f64 = f64::NAN;

fn raw_score(metric: Metric, a: &[f32], b: &[f32]) -> Option<f64> {
    debug_assert_eq!(a.len(), b.len());
    match metric {
        Metric::Cosine => {
            let (mut dot, mut sa, mut sb) = (0f32, 0f32, 0f32);
            for (&x, &y) in a.iter().zip(b) {
                dot += x * y;
                sa += x * x;
                sb += y * y;
            }
            if sa == 0.0 || sb == 0.0 {
                return None;
            }
            Some(1.0 - f64::from(dot) / (f64::from(sa).sqrt() * f64::from(sb).sqrt()))
        }
        Metric::Inner => {
            let mut dot = 0f32;
            for (&x, &y) in a.iter().zip(b) {
                dot += x * y;
            }
            Some(f64::from(dot))
        }
        Metric::L2 => {
            let mut sum = 0f32;
            for (&x, &y) in a.iter().zip(b) {
                let diff = x - y;
                sum += diff * diff;
            }
            Some(f64::from(sum).sqrt())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_on_small_vectors() {
        let (a, b) = ([1.0, 0.0, 2.0], [0.0, 3.0, 4.0]);
        assert_eq!(score(Metric::Inner, &a, &b), Some(8.0));
        assert_eq!(score(Metric::L2, &a, &b), Some(14f64.sqrt()));
        let cos = 1.0 - 8.0 / (5f64.sqrt() * 25f64.sqrt());
        assert_eq!(score(Metric::Cosine, &a, &b), Some(cos));
        assert_eq!(score(Metric::Cosine, &a, &[0.0; 3]), None);
        assert_eq!(Metric::of_function("dot_product"), Some(Metric::Inner));
        assert_eq!(Metric::of_function("list_distance"), Some(Metric::L2));
    }

    #[test]
    fn a_nan_distance_is_the_canonical_nan() {
        let negative_nan = f32::from_bits(0xFFC0_0001);
        let d = score(Metric::Inner, &[negative_nan], &[1.0]).unwrap();
        assert_eq!(d.to_bits(), 0x7FF8_0000_0000_0000);
    }

    #[test]
    fn accumulation_is_in_f32() {
        // 1 + 2^-30 is 1 in f32: an f64 accumulation would keep the small term.
        let a = [1.0, 2f32.powi(-15)];
        assert_eq!(score(Metric::Inner, &a, &a), Some(1.0));
    }
}
